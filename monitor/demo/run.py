"""`lstar demo`: the whole loop, offline, on a 2-core CPU, watching a real emergence (its measured cost: docs/lab.md).

1. The history: the additions curve (accuracy on the lab's 55 additions in words, `seven plus
   two is nine`, against L*) fitted on seed 0 of the demo's lab (`monitor.demo.history`). It is
   shipped with the package, as a watcher's curves are fitted before it runs; `--fit-history`
   trains, labels and fits seed 0 here instead. b is the task's chance level (1/10), ε half the
   curve's rise above it; whether the threshold is resolved by the data is reported.
2. Train the live lineage: seed 1 of the same lab (`monitor.lab.demo`: a small causal
   transformer with the gpt2 tokenizer on a byte stream that is mostly those additions). It
   learns them with a jump: accuracy stays near the commonest answer's frequency, then rises.
3. Write a policy: watch demo-org's step branches, apply the curve, evaluate the task directly
   on each checkpoint predicted at risk or emerged (`evaluate:`, the built-in multiple-choice
   evaluator on `tasks/add.jsonl` beside the policy), route alerts (grouped per policy and
   lineage) to a local webhook receiver and a local SMTP server, and a report schedule.
4. For each checkpoint of the live lineage: publish it on an in-process fake Hub as a step
   branch of `demo-org/gpt2-lab`, then run the daemon once (`Daemon(..., once=True)`):
   discovery → gate → fetch → score → predict → observe → alert → dispatch; the last pass also
   writes the report. The summary lists the lineage's predicted states in order (`clear` →
   `at_risk` → `emerged` when the demo shows what it is meant to), the evaluations with their
   verdicts, and what each receiver got.

The fake Hub is on 127.0.0.1, so the demo reaches it whatever `HF_HUB_OFFLINE` says. A demo that
fails says at which stage and why (`DemoFailed`, or `failed_stage` and `failure` in the summary).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from monitor.demo.failure import DemoFailed, diagnose, stage as _stage
from monitor.demo.history import HISTORY_SEED, METRIC, TASK
from monitor.demo.progress import Pace, duration_text, progress_bar
from monitor.errors import LstarError

LIVE_SEED = 1
ORG = "demo-org"
# The policy folder's files: the curve and the task's multiple-choice items.
CURVE_FILE = "curves/add.json"
TASK_FILE = "tasks/add.jsonl"
# The documents every demo score reads: all 78 of the prose and encyclopedic slices of
# calib-v0. The code and math slices make L*'s standard error several times larger for a model
# this small (docs/lab.md, "The demo's size"), wider than the distance L* travels across the
# jump. Every 4th document (20) halves a score's time but leaves the last checkpoint's
# `emerged` resting on 0.09 standard errors; all 78 give it more than one.
SCORING_SLICES = ("prose", "encyclopedic")
SCORING_EVERY = None
STATE_ORDER = ("clear", "at_risk", "emerged")
# The policy's budget of active evaluations: enough for every checkpoint predicted at risk or
# emerged in one demo, as one UTC day.
EVALUATIONS_PER_DAY = 20
# Written first into the demo's folder: only a folder holding it (or an empty one) is emptied,
# and then only of the entries the demo makes.
WORKDIR_MARKER = ".lstar-demo"
DEMO_ENTRIES = frozenset({WORKDIR_MARKER, "state", "models", "policies", "received", "hf-cache"})
# The demo's torch processes (the training worker, the scoring worker, the evaluations) run many
# small operations on two threads, and torch's thread pool (GNU OpenMP) keeps a waiting thread
# spinning by default: where other work shares the cores, the spinning thread takes the core the
# working one needs. Waiting passively changes no number (the same threads split the same work),
# only who gets the core: seed 1 trained on 100 kB of the lab's stream at a load average of about
# 10 took 154 CPU-seconds spinning and 25 passive, the checkpoints the same to the bit
# (docs/lab.md, "The demo's size"). A policy the user set is kept.
THREAD_WAIT_POLICY = ("OMP_WAIT_POLICY", "PASSIVE")


def published_steps(steps: list[int], count: int | None = None) -> list[int]:
    """The live lineage's checkpoints the demo publishes, in order: all of them, or `count` of
    them (2 to all; more is refused) evenly spaced from the first to the last (the last
    checkpoint, the one furthest past the jump, is always published; rounding to the nearest
    index, halves to even).

    Fewer checkpoints mean fewer daemon passes, each nearly all one score of the 78 documents:
    a quicker run (the end-to-end test publishes three: 95, 665 and 1139, clear, at risk,
    emerged) that still shows the whole emergence, since each checkpoint's score and
    prediction do not depend on the others published."""
    steps = list(steps)
    if count is None or count == len(steps):
        return steps
    hint = f"use --checkpoints 2 to {len(steps)} (4 or more show clear, at risk and emerged)"
    if count < 2:
        raise LstarError(f"--checkpoints {count}: the demo publishes at least the first and the last checkpoint",
                         hint=hint)
    if count > len(steps):   # refused: a run that quietly published fewer than asked would mislead
        raise LstarError(f"--checkpoints {count}: the live lineage has {len(steps)} checkpoints", hint=hint)
    last = len(steps) - 1
    return [steps[round(i * last / (count - 1))] for i in range(count)]


def demo_environment() -> None:
    """The settings the demo's processes run with, set before any of them starts (each torch
    process reads the thread wait policy when it loads torch): the hardened environment every
    process touching the Hub or a model has, and passive OpenMP waits unless the user chose."""
    from monitor.environment import harden_environment

    harden_environment()
    os.environ.setdefault(*THREAD_WAIT_POLICY)


def run_daemon_once(config: Any, backend: Any = None) -> tuple[int, dict[str, str]]:
    """One pass of the daemon (`config.once`) against the demo's fake Hub on this machine
    (`backend`: a scoring backend lent for the pass, kept open after it; None: the pass makes
    its own and closes it).

    huggingface_hub's offline mode (`HF_HUB_OFFLINE`, common where the demo is run for want of
    a network) is lifted in this process for that loopback endpoint; child processes keep it.
    Returns the exit code and the error of each job that failed, by job name.
    """
    from monitor.environment import local_hub_online
    from monitor.service import Daemon

    daemon = Daemon(config, backend=backend)
    with local_hub_online(config.endpoint):
        exit_code = daemon.run()
    return exit_code, {name: job.last_error for name, job in daemon.jobs.items() if job.last_error}


def _score_request(corpus_dir: Path) -> Any:
    from monitor.scoring import ScoreRequest

    return ScoreRequest(corpus_dir=corpus_dir, slices=list(SCORING_SLICES), every=SCORING_EVERY, max_context=64,
                        n_boot=200, tcb_positions=64, progress=False, device="cpu", dtype="float32")


def _folder_files(folder: Path) -> dict[str, bytes]:
    from monitor.demo.hub_repos import model_card

    files = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    files["README.md"] = model_card()
    return files


def publish_step(hub: Any, repo: str, step: int, folder: Path, index: int) -> str:
    """Publish one checkpoint as the step branch `step<step>` (the `index`-th of its lineage, an
    hour after the one before) and move `main` to it; returns the commit sha."""
    from datetime import timedelta

    from monitor.demo.hub_repos import BASE_TIME

    when = BASE_TIME + timedelta(hours=index)
    if index == 0:
        sha = hub.add_repo(repo, _folder_files(folder), branch=f"step{step}", last_modified=when,
                           pipeline_tag="text-generation")
    else:
        sha = hub.add_commit(repo, _folder_files(folder), branch=f"step{step}", replace=True, date=when)
    hub.add_branch(repo, "main", revision=f"step{step}")
    return sha


POLICY = """\
# Written by `lstar demo`: watch the fake Hub's demo-org, apply the fitted additions curve, and
# tell the local webhook receiver and SMTP server about at-risk or emerged lineages.
name: demo
description: offline demo of the whole loop
watch:
  - name: demo-steps
    author: {org}
    revisions:
      branches: "step\\\\d+"
corpora:
  public: {corpus}
evaluations:
  per_day: {per_day}
tasks:
  - name: add-words
    curve: {curve}
    evaluate:
      kind: multiple_choice
      file: {task_file}
      metric: acc
      on: [at_risk, emerged]
route:
  receiver: demo-webhook
  group_by: [policy, lineage]
  group_wait: 0s
  group_interval: 0s
  repeat_interval: 4h
  routes:
    - matchers: ['state=~"at_risk|emerged"']
      receiver: demo-webhook
      continue: true
    - matchers: ['state=~"at_risk|emerged"']
      receiver: demo-email
    # what the daemon's own evaluation of the task observed, against the prediction
    - matchers: ['alertname=~"LstarPrediction(Confirmed|Contradicted)"']
      receiver: demo-webhook
receivers:
  - name: demo-webhook
    webhook:
      url: {webhook}
      timeout: 5s
  - name: demo-email
    email:
      to: [governance@demo.invalid]
      from: lstar-demo@demo.invalid
      host: 127.0.0.1
      port: {smtp_port}
      tls: none
      timeout: 5s
  - name: demo-audit
    file:
      path: {audit}
reports:
  - name: demo-report
    schedule:
      every: 1d
    receivers: [demo-audit, demo-email]
    format: html
    window: 7d
"""
# The daemon passes before the last run without the report schedule, so that the one report
# is written by the last pass and covers the whole lineage.
POLICY_WITHOUT_REPORTS = POLICY[:POLICY.index("reports:\n")]


def _is_demo_folder(workdir: Path, names: set[str]) -> bool:
    """Its entries are all the demo's own, and it is marked, or laid out as an older demo left it."""
    if not names <= DEMO_ENTRIES:
        return False
    return WORKDIR_MARKER in names or ((workdir / "state" / "lstar.duckdb").is_file()
                                       and (workdir / "policies" / "demo.yaml").is_file())


def prepare_workdir(workdir: Path) -> None:
    """Make `workdir` ready for a new demo: a new or empty folder is used as it is; a folder an
    earlier demo made (every entry one of `DEMO_ENTRIES`, and the `WORKDIR_MARKER` or an older
    demo's layout) has those entries removed, the folder itself kept. Any other folder, a
    symbolic link (to a folder or not), or anything that is not a folder, is refused and left
    as it is. `workdir` is the path as named, not resolved, so that a link can be seen."""
    hint = "name a new or empty folder, or one an earlier `lstar demo` made"
    if workdir.is_symlink():
        # `workdir` as given, not resolved: emptying through a link would empty whatever it
        # points at, and the checks below would judge the target, not what was named
        raise LstarError(f"--workdir {workdir} is a symbolic link (to {os.readlink(workdir)}); the demo empties its "
                         "folder, so it runs only in a folder named as itself; the link and its target are left "
                         "as they are", hint="name the folder itself, or a new one")
    if workdir.exists() and not workdir.is_dir():
        raise LstarError(f"--workdir {workdir} is not a folder; it is left as it is", hint=hint)
    if workdir.exists():
        names = {p.name for p in workdir.iterdir()}
        if names and not _is_demo_folder(workdir, names):
            others = sorted(names - DEMO_ENTRIES)
            what = (f"holds {', '.join(others[:3])}{' ...' if len(others) > 3 else ''}, which the demo does not make"
                    if others else f"has no {WORKDIR_MARKER} and is not laid out as a demo's folder")
            raise LstarError(f"--workdir {workdir} {what}; the demo empties its folder first, so it leaves this "
                             "one as it is", hint=hint)
        for name in sorted(names):
            entry = workdir / name
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / WORKDIR_MARKER).write_text("a folder made by `lstar demo`; the next demo in it empties it\n")


def check_save_path(path: Path, workdir: Path) -> Path:
    """Where `--save-history-curve` writes, checked before minutes of fitting: outside the
    demo's folder (the next demo would empty it), not a folder, in a folder that exists."""
    path = path.resolve()
    if path == workdir or workdir in path.parents:
        raise LstarError(f"--save-history-curve {path} is inside the demo's folder {workdir}, which the next "
                         "demo empties", hint="write the curve outside --workdir")
    if path.is_dir():
        raise LstarError(f"--save-history-curve {path} is a folder", hint="name a file, e.g. add-words-curve.json")
    if not path.parent.is_dir():
        raise LstarError(f"--save-history-curve {path}: its folder {path.parent} does not exist",
                         hint="create the folder first")
    return path


def states_in_order(states: list[str]) -> bool:
    """Whether a lineage's predicted states show the whole emergence in order: each of clear,
    at_risk and emerged at least once, and never a step back (clear after at_risk, ...)."""
    ranks = [STATE_ORDER.index(s) for s in states if s in STATE_ORDER]
    return len(ranks) == len(states) and set(ranks) == {0, 1, 2} and ranks == sorted(ranks)


def _history_curve(request: Any, *, fit_history: bool, models: Path, db: Path, shared: Path,
                   log: Callable[[str], None], progress: bool = False) -> Any:
    """The curve the demo applies: the shipped one (checked against the documents it scores),
    or with `fit_history` one fitted here on seed 0 (trained first, then the live seed)."""
    from monitor.demo.history import fit_history as fit_on_seed0, shipped_curve
    from monitor.lab.demo import demo_config, demo_task_file, train_demo_lineages
    from monitor.scoring.scoring_driver import corpus_selection

    if not fit_history:
        with _stage("history"):
            return shipped_curve(corpus_selection(request).sha256)
    log(f"--fit-history: training seed {HISTORY_SEED} of the demo's lab, then scoring and evaluating "
        "each of its checkpoints (about as long again as the demo itself)")
    config = demo_config(shared, seeds=(HISTORY_SEED,))
    with _stage("train"):
        lineages = train_demo_lineages(models, shared=shared, seeds=config.seeds, threads=config.threads,
                                       progress=progress)
    with _stage("fit"):
        (family,) = config.families
        return fit_on_seed0(db, request, demo_task_file(models), list(lineages[(family, HISTORY_SEED)].values()),
                            config)


def _evaluations(store: Any, repo: str, step_of: dict[str, int]) -> list[dict[str, Any]]:
    """The daemon's active evaluations of the lineage, in the order of its steps."""
    rows = store.query("SELECT commit_sha, status, reason, predicted_state, predicted_lo, predicted_hi, level, "
                       "observed, n, k, observed_lo, observed_hi, observed_state, verdict, inside FROM observations "
                       "WHERE policy = 'demo' AND task = ? AND repo = ?", [TASK, repo])
    out = [{"checkpoint": f"{repo}@step{step_of[r['commit_sha']]}", "step": step_of[r["commit_sha"]], **r}
           for r in rows if r["commit_sha"] in step_of]
    return sorted(out, key=lambda r: r["step"])


@dataclasses.dataclass
class _LivePasses:
    """What publishing the live lineage and polling the daemon after each checkpoint left."""
    hub_url: str
    steps: list[dict[str, Any]]
    refs: dict[str, str]
    step_of: dict[str, int]
    exit_code: int
    job_errors: dict[str, str]
    alerts: list[dict[str, Any]]
    mails: list[Any]
    alert_mails: list[Any]
    report_mails: list[Any]


def _prepare(named: Path, workdir: Path, shared: Path, *, checkpoints: int | None,
             save_history_curve: str | Path | None) -> tuple[Any, Path | None]:
    """The `prepare` stage: the arguments refused before minutes of training, the demo's
    folder emptied, the score request built. Returns the request and the checked save path."""
    with _stage("prepare"):
        if checkpoints is not None:     # refused before minutes of training, not after
            from monitor.lab.demo import DEMO_FRACTIONS

            published_steps(list(range(len(DEMO_FRACTIONS))), checkpoints)
        if save_history_curve is not None:
            save_history_curve = check_save_path(Path(save_history_curve), workdir)
        prepare_workdir(named)
        request = _score_request(shared / "corpus" / "calib-v0")
    return request, save_history_curve


def _save_history_curve(curve: Any, curve_path: Path, save_history_curve: Path | None) -> None:
    """The history curve written beside the policy (and where `--save-history-curve` asked)."""
    from monitor.curves import save_curve

    with _stage("history"):
        save_curve(curve, curve_path)
        if save_history_curve is not None:
            save_curve(curve, save_history_curve)


def _log_curve_fit(fit: dict[str, Any], threshold: dict[str, Any], *, fit_history: bool,
                   log: Callable[[str], None]) -> None:
    """The curve's level, and whether its threshold is resolved, told before training."""
    log(f"the {TASK} curve ({'fitted here' if fit_history else 'shipped'}, on seed {HISTORY_SEED}): "
        f"level b + ε = {fit['chance']:.4f} + {fit['margin']:.4f} = {fit['level']:.4f}")
    if fit["unresolved_warnings"]:
        # the alerts and the report say so too; the demo says it first
        log(f"the curve's threshold is UNRESOLVED ({len(fit['unresolved_warnings'])} warnings), so at-risk "
            f"calls from it are not established: {fit['unresolved_warnings'][0]}")
    else:
        log(f"the curve's threshold is resolved: L* = {threshold['estimate']:.3f} "
            f"[{threshold['lower']:.3f}, {threshold['upper']:.3f}] ({threshold['confidence']:.0%})")


def _train_live_lineage(models: Path, policies: Path, shared: Path, *, progress: bool,
                        log: Callable[[str], None]) -> tuple[str, dict[int, Path], Path]:
    """The `train` stage: the live seed trained with its pace told, and the task file copied
    beside the policy. Returns the family, its checkpoint folders by step, and the task file."""
    from monitor.lab.demo import demo_task_file, train_demo_lineages

    # No duration is promised: it is measured as the steps are done (a bar on a terminal, a line
    # at each quarter elsewhere), as the daemon passes below are.
    training = Pace(0)

    def trained_step(lineage: str, step: int, total: int) -> None:
        training.advance_to(step, total)
        line = None if progress else training.milestone("training steps")
        if line is not None:
            log(f"  training: {line}")

    log(f"training the live lineage (seed {LIVE_SEED}) on the lab's additions in words; the time left is "
        "estimated from the steps done so far")
    with _stage("train"):
        (family, folders), = {family: steps for (family, seed), steps in
                              train_demo_lineages(models, shared=shared, seeds=(LIVE_SEED,), progress=progress,
                                                  on_step=trained_step).items()
                              if seed == LIVE_SEED}.items()
    log(f"trained {training.done} steps in {duration_text(training.elapsed_s)}")
    with _stage("train"):
        task_path = policies / TASK_FILE
        task_path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(demo_task_file(models), task_path)   # what the daemon evaluates, beside the policy
    return family, folders, task_path


def _checkpoint_record(curve: Any, repo: str, step: int, sha: str, row: dict[str, Any] | None) -> dict[str, Any]:
    """One published checkpoint's prediction as the summary lists it (None values: no prediction)."""
    from monitor.demo.history import emerged_margin

    # how far from the edge of `emerged` (the demo's outcome must not rest on a hair)
    margin = emerged_margin(curve, row["lstar"], row["se"]) if row else {"lstar": None, "se_units": None}
    return {"checkpoint": f"{repo}@step{step}", "step": step, "sha": sha,
            "lstar": row["lstar"] if row else None, "lstar_se": row["se"] if row else None,
            "p_hat": row["p_hat"] if row else None, "lo": row["lo"] if row else None,
            "hi": row["hi"] if row else None, "state": row["state"] if row else None,
            "emerged_margin": margin["lstar"], "emerged_margin_se": margin["se_units"]}


def _checkpoint_line(step: int, row: dict[str, Any] | None, observed: list[dict[str, Any]]) -> str:
    """The log line of one daemon pass: the prediction, then each evaluation that ran."""
    return (f"  step{step}: " + (f"L* {row['lstar']:.3f} ± {row['se']:.3f}, predicted {METRIC} "
                                 f"{row['p_hat']:.2f} [{row['lo']:.2f}, {row['hi']:.2f}] -> {row['state']}"
                                 if row else "no prediction")
            + "".join(f"; evaluated: {METRIC} {o['observed']:.2f} [{o['observed_lo']:.2f}, "
                      f"{o['observed_hi']:.2f}] -> {o['observed_state']} ({o['verdict']})"
                      for o in observed if o["status"] == "done"))


def _publish_and_poll(*, workdir: Path, state: Path, db: Path, policies: Path, request: Any, fit: dict[str, Any],
                      curve: Any, repo: str, folders: dict[int, Path], checkpoints: int | None,
                      progress: bool, log: Callable[[str], None]) -> _LivePasses:
    """The `publish`, `daemon` and `collect` stages of the live loop: the fake Hub and the two
    receivers up, each chosen checkpoint published then one daemon pass, until the last or the
    first pass that failed; then what the receivers got, read before they close."""
    from monitor.demo.fakehub import FakeHub
    from monitor.demo.receivers import SmtpReceiver, WebhookReceiver
    from monitor.service import DaemonConfig
    from monitor.service.daemon import make_scoring_backend
    from monitor.store import Store

    steps: list[dict[str, Any]] = []
    job_errors: dict[str, str] = {}
    exit_code = 0
    with contextlib.ExitStack() as stack:
        with _stage("publish"):
            hub = stack.enter_context(FakeHub())
            hook = stack.enter_context(WebhookReceiver())
            smtp = stack.enter_context(SmtpReceiver())
            policy_path = policies / "demo.yaml"
            fields = dict(org=ORG, corpus=fit["corpus_sha256"], curve=CURVE_FILE, task_file=TASK_FILE,
                          per_day=EVALUATIONS_PER_DAY, webhook=hook.url, smtp_port=smtp.port,
                          audit=str(workdir / "received" / "audit.jsonl"))
        config = DaemonConfig(policies_dir=policy_path.parent, state_dir=state, endpoint=hub.url, api_port=0,
                              once=True, once_summary=False, cache_dir=workdir / "hf-cache", template=request)
        published = {step: folders[step] for step in published_steps(sorted(folders), checkpoints)}
        log(f"fake Hub at {hub.url}; publishing {len(published)} checkpoints of {repo} one at a time, the "
            "daemon polling once after each (discover, gate, score, predict, evaluate, alert; the report "
            "after the last)")
        refs: dict[str, str] = {}
        step_of: dict[str, int] = {}
        passes = Pace(len(published))
        # One scoring backend for every pass: its warm worker imports torch and transformers
        # once for the demo, not once per pass (about 5 CPU-seconds each).
        backend = make_scoring_backend(config)
        stack.callback(backend.close)
        bar = stack.enter_context(progress_bar(progress))
        bar_task = bar.add_task("checkpoints published and polled", total=len(published))
        for index, (step, folder) in enumerate(published.items()):
            last = index == len(published) - 1
            with _stage("publish"):
                refs[f"step{step}"] = sha = publish_step(hub, repo, step, folder, index)
                step_of[sha] = step
                policy_path.write_text((POLICY if last else POLICY_WITHOUT_REPORTS).format(**fields))
            with _stage("daemon"):
                code, errors = run_daemon_once(config, backend)
            exit_code = exit_code or code
            job_errors = {**errors, **job_errors}
            with _stage("collect"), Store.open(db, read_only=True) as store:
                rows = store.query("SELECT lstar, se, p_hat, lo, hi, state FROM predictions "
                                   "WHERE policy = 'demo' AND task = ? AND repo = ? AND commit_sha = ?",
                                   [TASK, repo, sha])
                observed = [o for o in _evaluations(store, repo, step_of) if o["step"] == step]
            row = rows[0] if rows else None
            steps.append(_checkpoint_record(curve, repo, step, sha, row))
            log(_checkpoint_line(step, row, observed))
            passes.advance_to(index + 1)
            bar.update(bar_task, completed=index + 1)
            if not last:
                log(f"  {passes.describe('checkpoints')}")
            if code != 0 or errors:
                break            # `diagnose` names the stage below
        if refs:
            refs["main"] = refs[max(refs, key=lambda ref: int(ref[4:]))]
        with _stage("collect"):
            alerts = [r.json() for r in hook.requests if "alerts" in r.json()]
            mails = list(smtp.mails)
            alert_mails = [m for m in mails if m.message["X-Lstar-Report"] is None]
            report_mails = [m for m in mails if m.message["X-Lstar-Report"] is not None]
    return _LivePasses(hub_url=hub.url, steps=steps, refs=refs, step_of=step_of, exit_code=exit_code,
                       job_errors=job_errors, alerts=alerts, mails=mails, alert_mails=alert_mails,
                       report_mails=report_mails)


def _collect_outcome(summary: dict[str, Any], live: _LivePasses, *, workdir: Path, db: Path,
                     started: float) -> None:
    """The `collect` stage's end: what the receivers got written under `received/`, the store's
    totals, and whether the loop closed (else the failed stage and why), into `summary`."""
    from monitor.store import Store

    with _stage("collect"):
        received = workdir / "received"
        received.mkdir(parents=True, exist_ok=True)
        (received / "webhook.json").write_text(json.dumps(live.alerts, indent=2))
        for i, m in enumerate(live.mails):
            (received / f"mail-{i}.eml").write_bytes(m.raw)
        with Store.open(db, read_only=True) as store:
            scores = store.query("SELECT count(*) AS n FROM score_runs WHERE model_repo LIKE ?", [f"{ORG}/%"])[0]["n"]
            predictions = store.query("SELECT state, count(*) AS n FROM predictions GROUP BY state ORDER BY state")
            reports = store.reports()
            checkpoints = store.checkpoint_counts()
            failed = diagnose(store, org=ORG, exit_code=live.exit_code, job_errors=live.job_errors,
                              alerts=len(live.alerts), alert_mails=len(live.alert_mails), reports=len(reports))
    summary.update({
        "daemon_exit_code": live.exit_code, "checkpoints": checkpoints, "hub_scores": int(scores),
        "predictions": {r["state"]: int(r["n"]) for r in predictions},
        "webhook": {"alert_messages": len(live.alerts), "lineages": sorted({a["groupLabels"].get("lineage", "")
                                                                            for a in live.alerts}),
                    "file": str(received / "webhook.json")},
        "email": {"alert_messages": len(live.alert_mails), "report_messages": len(live.report_mails),
                  "files": [str(received / f"mail-{i}.eml") for i in range(len(live.mails))]},
        "reports": [{"folder": r.folder, "summary": r.summary, "deliveries": r.deliveries} for r in reports],
        "audit_log": str(received / "audit.jsonl"),
        "wall_s": round(time.perf_counter() - started, 1),
    })
    summary["ok"] = bool(live.alerts) and bool(live.alert_mails) and bool(reports) and live.exit_code == 0
    if not summary["ok"]:  # `diagnose` names a stage whenever one of these checks fails
        assert failed is not None
        summary["failed_stage"], summary["failure"] = failed


def run_demo(workdir: str | Path, *, shared_dir: str | Path | None = None, fit_history: bool = False,
             save_history_curve: str | Path | None = None, checkpoints: int | None = None,
             log: Callable[[str], None] = lambda _: None, progress: bool = False) -> dict[str, Any]:
    """Run the demo in `workdir` (emptied first) and return a summary of every artefact.

    `summary["ok"]` is True when the loop closed: each local receiver got at least one
    alert and a report was written; when not, `failed_stage` and `failure` say where and why.
    `fit_history` fits the history curve here (seed 0) instead of using the shipped one;
    `save_history_curve` then also writes it there. `checkpoints` publishes that many of the live
    lineage's checkpoints, evenly spaced from the first to the last (`published_steps`; None:
    all of them); the lineage is trained in full either way. `progress` draws bars on stderr for training
    and for the daemon passes (counts, elapsed, time left as measured); without it `log` gets a
    line at each quarter of training and after each pass, with the time left at the pace measured. Raises `DemoFailed` when a stage raised
    (preparing, the history, training, or a publication or daemon pass that could not run).
    """
    demo_environment()
    from monitor.demo.history import curve_facts
    from monitor.store import Store

    started = time.perf_counter()
    shared = Path(shared_dir).resolve() if shared_dir else Path(__file__).resolve().parents[3] / "shared"
    named = Path(workdir).absolute()      # as given: `prepare_workdir` refuses a symbolic link
    workdir = named.resolve()
    request, save_history_curve = _prepare(named, workdir, shared, checkpoints=checkpoints,
                                           save_history_curve=save_history_curve)
    state, models, policies = workdir / "state", workdir / "models", workdir / "policies"
    db = state / "lstar.duckdb"

    curve = _history_curve(request, fit_history=fit_history, models=models, db=db, shared=shared, log=log,
                           progress=progress)
    curve_path = policies / CURVE_FILE
    _save_history_curve(curve, curve_path, save_history_curve)
    facts = curve_facts(curve)
    fit, threshold = facts["fit"], facts["threshold"]
    _log_curve_fit(fit, threshold, fit_history=fit_history, log=log)

    family, folders, task_path = _train_live_lineage(models, policies, shared, progress=progress, log=log)
    summary: dict[str, Any] = {"workdir": str(workdir), "state": str(state), "db": str(db),
                               "policy": str(policies / "demo.yaml"), "curve": str(curve_path),
                               "history": "fitted" if fit_history else "shipped",
                               "task_file": str(task_path), "fit": fit, "threshold": threshold}
    repo = f"{ORG}/{family}-lab"
    live = _publish_and_poll(workdir=workdir, state=state, db=db, policies=policies, request=request, fit=fit,
                             curve=curve, repo=repo, folders=folders, checkpoints=checkpoints, progress=progress,
                             log=log)
    summary["hub"] = {"url": live.hub_url, "lineages": {repo: live.refs}}
    states = [s["state"] for s in live.steps]
    with _stage("collect"), Store.open(db, read_only=True) as store:
        summary["evaluation"] = _evaluations(store, repo, live.step_of)
    summary["lineage"] = {"repo": repo, "seed": LIVE_SEED, "states": live.steps, "in_order": states_in_order(states)}
    _collect_outcome(summary, live, workdir=workdir, db=db, started=started)
    return summary
