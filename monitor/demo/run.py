"""`lstar demo`: the whole loop, offline, in a few minutes on a laptop CPU.

1. Train two checkpoint families with the emergence lab (`monitor.lab.demo`: small causal
   transformers with the gpt2 and the toy unigram tokenizer, on the same bytes), two seeds
   each. Seed 0 of each family is the labelled history (scored, evaluated on the cloze items
   of the documents the lab held out of training); seed 1 is the live lineage, published on an
   in-process fake Hub as step branches of `demo-org/<family>-lab`.
2. Fit the cloze curve on the history (`fit_curve`). The level b + ε is derived from the
   fitted curve: b is the task's chance level, ε half the curve's rise above it. The curve's
   own warnings (an unresolved threshold, ε below the resolution) travel with it into the
   report and the alerts.
3. Write a policy: watch demo-org's step branches, apply the curve, route at-risk/emerged
   alerts (grouped per policy and lineage) to a local webhook receiver and a local SMTP
   server, and a report schedule.
4. Run the daemon once (`Daemon(..., once=True)`): discovery → gate → fetch → score →
   predict → alert → dispatch → report, then check what each receiver got.

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
METRIC = "prob_correct"
ORG = "demo-org"


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

    # every 24th document: 9 documents from all five slices (the first 8 would all be code)
    return ScoreRequest(corpus_dir=corpus_dir, every=24, max_context=64, n_boot=200, tcb_positions=64,
                        progress=False, device="cpu", dtype="float32")


def _folder_files(folder: Path) -> dict[str, bytes]:
    from monitor.sandbox.hub_repos import model_card

    files = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    files["README.md"] = model_card()
    return files


def _publish(hub: Any, repo: str, folders: dict[int, Path]) -> dict[str, str]:
    """Publish a lineage's checkpoints as step branches, an hour apart, and `main` at the last."""
    from datetime import timedelta

    from monitor.sandbox.hub_repos import BASE_TIME

    refs = {}
    for i, (step, folder) in enumerate(sorted(folders.items())):
        when = BASE_TIME + timedelta(hours=i)
        if i == 0:
            refs[f"step{step}"] = hub.add_repo(repo, _folder_files(folder), branch=f"step{step}", last_modified=when,
                                               pipeline_tag="text-generation")
        else:
            refs[f"step{step}"] = hub.add_commit(repo, _folder_files(folder), branch=f"step{step}", replace=True,
                                                 date=when)
    refs["main"] = hub.add_branch(repo, "main", revision=f"step{max(folders)}")
    return refs


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
    """Fit the cloze curve on the history; b = chance, ε = half the fitted rise above chance."""
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
        raise LstarError(f"the fitted cloze curve rises only {rise:.4f} above chance ({chance:.3f}); "
                         "no emergence level can be set from it",
                         hint="train the demo's lab longer (monitor.lab.demo.demo_config)")
    margin = round(rise / 2.0, 4)
    curve = fit_curve(joined, margin=margin, **common)
    save_curve(curve, out)
    return curve, {"chance": chance, "rise": rise, "margin": margin, "level": curve.level,
                   "corpus_sha256": pins["corpus_sha256"], "spec": spec.describe()}


POLICY = """\
# Written by `lstar demo`: watch the fake Hub's demo-org, apply the fitted cloze curve, and tell
# the local webhook receiver and SMTP server about at-risk or emerged lineages.
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
  - name: cloze
    curve: {curve}
route:
  receiver: demo-webhook
  group_by: [policy, lineage]
  group_wait: 0s
  group_interval: 1m
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
    from monitor.lab.demo import heldout_cloze_file, train_demo_lineages
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
    state, models = workdir / "state", workdir / "models"
    db = state / "lstar.duckdb"

    log("training two checkpoint families with the emergence lab (gpt2 and the toy unigram "
        "tokenizer, two seeds each; about a minute and a half on 2 cores)")
    with _stage("train"):
        lineages_by_seed = train_demo_lineages(models, shared=shared)
    history = {family: list(steps.values()) for (family, seed), steps in lineages_by_seed.items()
               if seed == HISTORY_SEED}
    live = {family: steps for (family, seed), steps in lineages_by_seed.items() if seed == LIVE_SEED}

    log("labelling the history with the cloze task and scoring it")
    with _stage("label"):
        labels = _label_history(db, request, heldout_cloze_file(models), history)
    curve_path = workdir / "policies" / "curves" / "cloze.json"
    with _stage("fit"):
        curve, fit = fit_demo_curve(db, labels, curve_path)
    log(f"fitted the cloze curve: level b + ε = {fit['chance']:.4f} + {fit['margin']:.4f} = {fit['level']:.4f}")
    unresolved = unresolved_warnings(curve)
    if unresolved:
        # the alerts and the report say so too; the demo says it first
        log(f"the curve's threshold is UNRESOLVED ({len(unresolved)} warnings), so at-risk calls "
            f"from it are not established: {unresolved[0].message}")
    fit["unresolved_warnings"] = [w.message for w in unresolved]

    summary: dict[str, Any] = {"workdir": str(workdir), "state": str(state), "db": str(db),
                               "policy": str(workdir / "policies" / "demo.yaml"), "curve": str(curve_path), "fit": fit}
    with contextlib.ExitStack() as stack:
        with _stage("publish"):
            hub = stack.enter_context(FakeHub())
            hook = stack.enter_context(WebhookReceiver())
            smtp = stack.enter_context(SmtpReceiver())
            lineages = {}
            for family, folders in live.items():
                lineages[f"{ORG}/{family}-lab"] = _publish(hub, f"{ORG}/{family}-lab", folders)
            policy_path = workdir / "policies" / "demo.yaml"
            policy_path.write_text(POLICY.format(org=ORG, corpus=fit["corpus_sha256"], curve="curves/cloze.json",
                                                 webhook=hook.url, smtp_port=smtp.port,
                                                 audit=str(workdir / "received" / "audit.jsonl")))
        log(f"fake Hub at {hub.url}; running the daemon once (discover, gate, score, predict, alert, report)")
        config = DaemonConfig(policies_dir=policy_path.parent, state_dir=state, endpoint=hub.url, api_port=0,
                              once=True, once_summary=False, cache_dir=workdir / "hf-cache", template=request)
        with _stage("daemon"):
            exit_code, job_errors = run_daemon_once(config)
        with _stage("collect"):
            alerts = [r.json() for r in hook.requests if "alerts" in r.json()]
            mails = list(smtp.mails)
            alert_mails = [m for m in mails if m.message["X-Lstar-Report"] is None]
            report_mails = [m for m in mails if m.message["X-Lstar-Report"] is not None]
        summary["hub"] = {"url": hub.url, "lineages": lineages}
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
