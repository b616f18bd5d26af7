"""`lstar demo`: the whole loop, offline, in under five minutes on a 2-core CPU, watching a real emergence.

1. Train one checkpoint family with the emergence lab (`monitor.lab.demo`: small causal
   transformers with the gpt2 tokenizer, two seeds, on a byte stream that is mostly the lab's
   additions in words, `seven plus two is nine`). The models learn the additions with a jump:
   accuracy stays at the commonest answer's frequency, then rises to about 0.8 inside the budget.
   Seed 0 is the labelled history (scored, and evaluated on the 55 additions); seed 1 is the
   live lineage, published on an in-process fake Hub one checkpoint at a time as step branches
   of `demo-org/gpt2-lab`.
2. Fit the additions curve (accuracy against L*) on the history (`fit_curve`). The level
   b + ε is derived from the fitted curve: b is the task's chance level (1/10), ε half the
   curve's rise above it. Whether the threshold is resolved by the data is reported; a curve
   whose threshold is not resolved says so in the alerts and the report.
3. Write a policy: watch demo-org's step branches, apply the curve, route at-risk/emerged
   alerts (grouped per policy and lineage) to a local webhook receiver and a local SMTP
   server, and a report schedule. The task's items are written beside it as a multiple-choice
   JSONL file (`tasks/add.jsonl`), what `lstar eval` runs.
4. For each checkpoint of the live lineage: publish it, then run the daemon once
   (`Daemon(..., once=True)`): discovery → gate → fetch → score → predict → alert → dispatch;
   the last pass also writes the report. The summary lists the lineage's predicted states in
   order (`clear` → `at_risk` → `emerged` when the demo shows what it is meant to) and checks
   what each receiver got.

The fake Hub is on 127.0.0.1, so the demo reaches it whatever `HF_HUB_OFFLINE` says. A demo that
fails says at which stage and why (`DemoFailed`, or `failed_stage` and `failure` in the summary).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from monitor.demo.failure import DemoFailed, diagnose, stage as _stage
from monitor.errors import LstarError

HISTORY_SEED, LIVE_SEED = 0, 1
TASK = "add-words"          # the lab's additions in words (monitor.lab.tasks.ADD_TASK)
METRIC = "acc"
ORG = "demo-org"
# The policy folder's files: the curve and the task's multiple-choice items.
CURVE_FILE = "curves/add.json"
TASK_FILE = "tasks/add.jsonl"
# The documents every demo score reads: the prose and encyclopedic slices of calib-v0, every
# 4th (20 documents). The code and math slices make L*'s standard error several times larger
# for a model this small (docs/lab.md, "The demo's size"), wider than the distance L* travels
# across the jump, so no checkpoint could be told apart from the threshold.
SCORING_SLICES = ("prose", "encyclopedic")
SCORING_EVERY = 4
STATE_ORDER = ("clear", "at_risk", "emerged")


def run_daemon_once(config: Any) -> tuple[int, dict[str, str]]:
    """One pass of the daemon (`config.once`) against the demo's fake Hub on this machine.

    huggingface_hub's offline mode (`HF_HUB_OFFLINE`, common where the demo is run for want of
    a network) is lifted in this process for that loopback endpoint; child processes keep it.
    Returns the exit code and the error of each job that failed, by job name.
    """
    from monitor.environment import local_hub_online
    from monitor.service import Daemon

    daemon = Daemon(config)
    with local_hub_online(config.endpoint):
        exit_code = daemon.run()
    return exit_code, {name: job.last_error for name, job in daemon.jobs.items() if job.last_error}


def _score_request(corpus_dir: Path) -> Any:
    from monitor.scoring import ScoreRequest

    return ScoreRequest(corpus_dir=corpus_dir, slices=list(SCORING_SLICES), every=SCORING_EVERY, max_context=64,
                        n_boot=200, tcb_positions=64, progress=False, device="cpu", dtype="float32")


def _folder_files(folder: Path) -> dict[str, bytes]:
    from monitor.sandbox.hub_repos import model_card

    files = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    files["README.md"] = model_card()
    return files


def publish_step(hub: Any, repo: str, step: int, folder: Path, index: int) -> str:
    """Publish one checkpoint as the step branch `step<step>` (the `index`-th of its lineage, an
    hour after the one before) and move `main` to it; returns the commit sha."""
    from datetime import timedelta

    from monitor.sandbox.hub_repos import BASE_TIME

    when = BASE_TIME + timedelta(hours=index)
    if index == 0:
        sha = hub.add_repo(repo, _folder_files(folder), branch=f"step{step}", last_modified=when,
                           pipeline_tag="text-generation")
    else:
        sha = hub.add_commit(repo, _folder_files(folder), branch=f"step{step}", replace=True, date=when)
    hub.add_branch(repo, "main", revision=f"step{step}")
    return sha


def _label_history(db: Path, request: Any, task_path: Path, folders: dict[str, list[Path]]) -> list[Any]:
    from monitor.curves import evaluate_checkpoint, evaluation_labels, label_rows
    from monitor.scoring import score_checkpoint
    from monitor.store import Store

    labels = []
    for family, paths in folders.items():
        for folder in paths:
            run = score_checkpoint(replace(request, model=str(folder)), db_path=db)
            evaluation = evaluate_checkpoint(str(folder), task_path, device="cpu", dtype="float32")
            rows = [label for label in evaluation_labels(evaluation, family=family, run_id=run["run_id"])
                    if label.metric == METRIC]
            with Store.open(db) as store:
                store.record_labels(label_rows(rows, source_ref=f"demo:{run['run_id']}"))
            labels += rows
    return labels


def fit_demo_curve(db: Path, labels: list[Any], out: Path) -> tuple[Any, dict[str, Any]]:
    """Fit the task curve on the history; b = chance, ε = half the fitted rise above chance."""
    from monitor.curves import ScoringRef, join_scores, save_curve
    from monitor.curves.fit import fit_curve
    from monitor.store import Store

    with Store.open(db, read_only=True) as store:
        joined, pins = join_scores(labels, store)
    spec = ScoringRef(spec_version=pins["spec_version"], window=pins["window"], stride=pins["stride"],
                      prefix_policy=pins["prefix_policy"])
    chance = float(joined[0].details["baseline"])
    common = dict(task=joined[0].task, metric=METRIC, baseline=chance, confidence=0.9, resamples=200,
                  lofo_resamples=50, corpus_sha256=pins["corpus_sha256"], scoring_spec=spec)
    first = fit_curve(joined, margin=0.01, **common)
    rise = max(first.band.fit) - chance
    if rise <= 0.01:
        raise LstarError(f"the fitted {TASK} curve rises only {rise:.4f} above chance ({chance:.3f}); "
                         "no emergence level can be set from it",
                         hint="train the demo's lab longer (monitor.lab.demo.demo_config)")
    margin = round(rise / 2.0, 4)
    curve = fit_curve(joined, margin=margin, **common)
    save_curve(curve, out)
    return curve, {"chance": chance, "rise": rise, "margin": margin, "level": curve.level,
                   "corpus_sha256": pins["corpus_sha256"], "spec": spec.describe()}


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
tasks:
  - name: add-words
    curve: {curve}
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


def evaluation_policy() -> dict[str, Any]:
    """EVALUATION WIRING, the one place: the policy blocks that would have the daemon run the
    additions task itself on an at-risk or emerged checkpoint (the built-in multiple-choice
    evaluator on `TASK_FILE`, accuracy) and compare what it observes with the prediction.

    Not used yet: the policy loader accepts neither `evaluations` nor `evaluate` today. Once it
    does, `run_demo` merges this into the policy it writes and fills the summary's `evaluation`.
    """
    return {"evaluations": {"per_day": 20},
            "tasks": [{"name": TASK, "curve": CURVE_FILE,
                       "evaluate": {"kind": "multiple_choice", "file": TASK_FILE, "metric": METRIC,
                                    "on": ["at_risk", "emerged"]}}]}


def states_in_order(states: list[str]) -> bool:
    """Whether a lineage's predicted states show the whole emergence in order: each of clear,
    at_risk and emerged at least once, and never a step back (clear after at_risk, ...)."""
    ranks = [STATE_ORDER.index(s) for s in states if s in STATE_ORDER]
    return len(ranks) == len(states) and set(ranks) == {0, 1, 2} and ranks == sorted(ranks)


def run_demo(workdir: str | Path, *, shared_dir: str | Path | None = None,
             log: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """Run the demo in `workdir` (emptied first) and return a summary of every artefact.

    `summary["ok"]` is True when the loop closed: each local receiver got at least one
    alert and a report was written; when not, `failed_stage` and `failure` say where and why.
    Raises `DemoFailed` when a stage raised before the loop could run.
    """
    from monitor.environment import harden_environment

    harden_environment()
    from monitor.curves.artifact import unresolved_warnings
    from monitor.lab.demo import demo_task_file, train_demo_lineages
    from monitor.sandbox.fakehub import FakeHub
    from monitor.sandbox.receivers import SmtpReceiver, WebhookReceiver
    from monitor.service import DaemonConfig
    from monitor.store import Store

    started = time.perf_counter()
    shared = Path(shared_dir) if shared_dir else Path(__file__).resolve().parents[3] / "shared"
    workdir = Path(workdir).resolve()
    with _stage("prepare"):
        if workdir.exists():
            shutil.rmtree(workdir)
        request = _score_request(shared / "corpus" / "calib-v0")
    state, models, policies = workdir / "state", workdir / "models", workdir / "policies"
    db = state / "lstar.duckdb"

    log("training gpt2-tokenizer models on the lab's additions in words with the emergence lab "
        "(two seeds, one per core; about a minute on 2 cores)")
    with _stage("train"):
        lineages_by_seed = train_demo_lineages(models, shared=shared)
    history = {family: list(steps.values()) for (family, seed), steps in lineages_by_seed.items()
               if seed == HISTORY_SEED}
    live = {family: steps for (family, seed), steps in lineages_by_seed.items() if seed == LIVE_SEED}

    log(f"labelling seed {HISTORY_SEED}'s checkpoints with the additions task and scoring them")
    with _stage("label"):
        task_path = policies / TASK_FILE
        task_path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(demo_task_file(models), task_path)   # the items `lstar eval` runs, beside the policy
        labels = _label_history(db, request, demo_task_file(models), history)
    curve_path = policies / CURVE_FILE
    with _stage("fit"):
        curve, fit = fit_demo_curve(db, labels, curve_path)
    log(f"fitted the {TASK} curve: level b + ε = {fit['chance']:.4f} + {fit['margin']:.4f} = {fit['level']:.4f}")
    unresolved = unresolved_warnings(curve)
    threshold = curve.threshold
    if unresolved:
        # the alerts and the report say so too; the demo says it first
        log(f"the curve's threshold is UNRESOLVED ({len(unresolved)} warnings), so at-risk calls "
            f"from it are not established: {unresolved[0].message}")
    else:
        log(f"the curve's threshold is resolved: L* = {threshold.estimate:.3f} "
            f"[{threshold.lower:.3f}, {threshold.upper:.3f}] ({threshold.confidence:.0%})")
    fit["unresolved_warnings"] = [w.message for w in unresolved]

    summary: dict[str, Any] = {"workdir": str(workdir), "state": str(state), "db": str(db),
                               "policy": str(policies / "demo.yaml"), "curve": str(curve_path),
                               "task_file": str(task_path), "fit": fit,
                               "threshold": {"resolved": not unresolved, "axis": curve.axis,
                                             "estimate": threshold.estimate, "lower": threshold.lower,
                                             "upper": threshold.upper, "confidence": threshold.confidence,
                                             "level": curve.level, "status": threshold.status},
                               # the direct evaluation of the task on the lineage's at-risk checkpoint:
                               # null until the daemon evaluates tasks (see `evaluation_policy`)
                               "evaluation": None}
    (family, folders), = live.items()
    repo = f"{ORG}/{family}-lab"
    steps: list[dict[str, Any]] = []
    job_errors: dict[str, str] = {}
    exit_code = 0
    with contextlib.ExitStack() as stack:
        with _stage("publish"):
            hub = stack.enter_context(FakeHub())
            hook = stack.enter_context(WebhookReceiver())
            smtp = stack.enter_context(SmtpReceiver())
            policy_path = policies / "demo.yaml"
            fields = dict(org=ORG, corpus=fit["corpus_sha256"], curve=CURVE_FILE, webhook=hook.url,
                          smtp_port=smtp.port, audit=str(workdir / "received" / "audit.jsonl"))
        config = DaemonConfig(policies_dir=policy_path.parent, state_dir=state, endpoint=hub.url, api_port=0,
                              once=True, once_summary=False, cache_dir=workdir / "hf-cache", template=request)
        log(f"fake Hub at {hub.url}; publishing {repo} one checkpoint at a time, the daemon polling "
            "once after each (discover, gate, score, predict, alert; the report after the last)")
        refs: dict[str, str] = {}
        for index, (step, folder) in enumerate(sorted(folders.items())):
            last = index == len(folders) - 1
            with _stage("publish"):
                refs[f"step{step}"] = sha = publish_step(hub, repo, step, folder, index)
                policy_path.write_text((POLICY if last else POLICY_WITHOUT_REPORTS).format(**fields))
            with _stage("daemon"):
                code, errors = run_daemon_once(config)
            exit_code = exit_code or code
            job_errors = {**errors, **job_errors}
            with _stage("collect"), Store.open(db, read_only=True) as store:
                rows = store.query("SELECT lstar, se, p_hat, lo, hi, state FROM predictions "
                                   "WHERE policy = 'demo' AND task = ? AND repo = ? AND commit_sha = ?",
                                   [TASK, repo, sha])
            row = rows[0] if rows else None
            steps.append({"checkpoint": f"{repo}@step{step}", "step": step, "sha": sha,
                          "lstar": row["lstar"] if row else None, "lstar_se": row["se"] if row else None,
                          "p_hat": row["p_hat"] if row else None, "lo": row["lo"] if row else None,
                          "hi": row["hi"] if row else None, "state": row["state"] if row else None})
            log(f"  step{step}: " + (f"L* {row['lstar']:.3f} ± {row['se']:.3f}, predicted {METRIC} "
                                     f"{row['p_hat']:.2f} [{row['lo']:.2f}, {row['hi']:.2f}] -> {row['state']}"
                                     if row else "no prediction"))
            if code != 0 or errors:
                break            # `diagnose` names the stage below
        refs["main"] = refs[max(refs, key=lambda ref: int(ref[4:]))]
        with _stage("collect"):
            alerts = [r.json() for r in hook.requests if "alerts" in r.json()]
            mails = list(smtp.mails)
            alert_mails = [m for m in mails if m.message["X-Lstar-Report"] is None]
            report_mails = [m for m in mails if m.message["X-Lstar-Report"] is not None]
        summary["hub"] = {"url": hub.url, "lineages": {repo: refs}}
    states = [s["state"] for s in steps]
    summary["lineage"] = {"repo": repo, "seed": LIVE_SEED, "states": steps, "in_order": states_in_order(states)}
    with _stage("collect"):
        received = workdir / "received"
        received.mkdir(parents=True, exist_ok=True)
        (received / "webhook.json").write_text(json.dumps(alerts, indent=2))
        for i, m in enumerate(mails):
            (received / f"mail-{i}.eml").write_bytes(m.raw)
        with Store.open(db, read_only=True) as store:
            scores = store.query("SELECT count(*) AS n FROM score_runs WHERE model_repo LIKE ?", [f"{ORG}/%"])[0]["n"]
            predictions = store.query("SELECT state, count(*) AS n FROM predictions GROUP BY state ORDER BY state")
            reports = store.reports()
            checkpoints = store.checkpoint_counts()
            failed = diagnose(store, org=ORG, exit_code=exit_code, job_errors=job_errors, alerts=len(alerts),
                              alert_mails=len(alert_mails), reports=len(reports))
    summary.update({
        "daemon_exit_code": exit_code, "checkpoints": checkpoints, "hub_scores": int(scores),
        "predictions": {r["state"]: int(r["n"]) for r in predictions},
        "webhook": {"alert_messages": len(alerts), "lineages": sorted({a["groupLabels"].get("lineage", "")
                                                                       for a in alerts}),
                    "file": str(received / "webhook.json")},
        "email": {"alert_messages": len(alert_mails), "report_messages": len(report_mails),
                  "files": [str(received / f"mail-{i}.eml") for i in range(len(mails))]},
        "reports": [{"folder": r.folder, "summary": r.summary, "deliveries": r.deliveries} for r in reports],
        "audit_log": str(received / "audit.jsonl"),
        "wall_s": round(time.perf_counter() - started, 1),
    })
    summary["ok"] = bool(alerts) and bool(alert_mails) and bool(reports) and exit_code == 0
    if not summary["ok"]:  # `diagnose` names a stage whenever one of these checks fails
        assert failed is not None
        summary["failed_stage"], summary["failure"] = failed
    return summary
