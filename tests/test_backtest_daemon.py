"""The backtest's replay against a real daemon watching the same lineage on the fake Hub.

A daemon (`monitor.service.Daemon`, one `--once` pass after each publication, the passes
sharing one warm scoring worker, as `lstar demo` runs it) watches one lineage of five tiny checkpoints published one at a time as step branches,
with a hand-built L* curve whose level the lineage crosses (clear, clear, at_risk, at_risk,
emerged). From the daemon's own store (its score runs in order: L* and SE) a history CSV is
written and replayed by `run_backtest` with the same curve and the same policy. Per checkpoint
the state, p̂ and interval must be equal (to 1e-12), the alerts the same (key, kind, state,
status, in order), and each receiver must get as many notifications. Negative controls: the
same replay with a larger SE, or at another level, differs, so the equality is not vacuous.

Time differs, and does not matter here: the daemon's passes run on the wall clock seconds
apart, the replay's ticks on a synthetic clock an hour apart (`monitor.backtest.replay`). The
policy's timers make the two alike: group_wait and group_interval are 0 (a pass and a tick both
flush what they raised), and repeat_interval (24h) is longer than either run, so no alert is
repeated in one and not the other. The commits differ too: the daemon's are the fake Hub's, the
replay's are derived from (lineage, step) (`checkpoint_sha`); the alert keys are compared with
the daemon's commit replaced by the replay's for the same step.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from monitor.backtest import load_history, run_backtest, spec_from_options, spec_from_policy
from monitor.backtest.scores import checkpoint_sha
from monitor.curves import load_curve
from monitor.curves.artifact import Band, Knots, ScoringRef, save_curve
from monitor.curves.fit import fit_curve
from monitor.curves.importers import write_labels_csv
from monitor.curves.labels import Label
from monitor.demo.fakehub import FakeHub
from monitor.demo.hub_repos import BASE_TIME, tiny_model_files
from monitor.demo.receivers import SmtpReceiver, WebhookReceiver
from monitor.demo.run import run_daemon_once
from monitor.errors import CurveError
from monitor.scoring import ScoreRequest
from monitor.scoring.scoring_driver import corpus_selection
from monitor.service import DaemonConfig
from monitor.service.daemon import make_scoring_backend
from monitor.store import Store

pytestmark = pytest.mark.slow   # five daemon passes, each scoring a tiny checkpoint in a warm child

REPO = "fake-org/tiny"
STEPS = (1000, 2000, 3000, 4000, 5000)
# The weights' scale falls along the lineage, so L* falls too: measured here 6.753, 6.199,
# 5.866, 5.732, 5.590 (SE 0.002-0.016) on the first 2 documents of calib-v0, 32-token windows.
INIT_STD = (0.4, 0.05)
EXPECTED_STATES = ["clear", "clear", "at_risk", "at_risk", "emerged"]
# The curve: g(L*) linear from 0.7535 at L* = 5 to 0.1535 at 7 (slope 0.3 per nat), band
# ±0.0555, level 0.25 + 0.25 = 0.5. The band's upper edge reaches 0.5 at L* = 6.03 and its lower
# edge at 5.66: each of the L* above is at least 0.07 nats (over 4 SE) from those edges.
KNOT_X, KNOT_Y, HALF_BAND = [5.0, 7.0], [0.7535, 0.1535], 0.0555
POLICY = """\
name: equal
watch:
  - name: tiny
    author: fake-org
    revisions: {{branches: "step\\\\d+"}}
tasks:
  - name: arith
    curve: arith.json
    margin: {margin}
route:
  receiver: hook
  group_by: [policy, lineage]
  group_wait: 0s
  group_interval: 0s
  repeat_interval: 24h
  routes:
    - matchers: ['state=~"at_risk|emerged"']
      receiver: hook
      continue: true
    - matchers: ['state="emerged"']
      receiver: audit
      continue: true
    - matchers: ['state=~"at_risk|emerged"']
      receiver: mail
receivers:
  - name: hook
    webhook: {{url: "{hook}", timeout: 5s}}
  - name: mail
    email: {{to: [governance@example.invalid], from: lstar@example.invalid, host: 127.0.0.1, port: {smtp},
             tls: none, timeout: 5s}}
  - name: audit
    file: {{path: audit.jsonl}}
"""


def hand_curve(corpus_sha256: str, spec: ScoringRef, out: Path) -> Path:
    """The curve above, pinned to the corpus selection and scoring spec the daemon scores with
    (fitted first for its metadata, then its knots and band replaced, as in test_axes)."""
    rows = [Label(checkpoint=f"c{i}", value=v, family="f", task="arith", metric="acc", lstar=x, n=400)
            for i, (x, v) in enumerate([(7.0, 0.15), (6.5, 0.3), (6.0, 0.45), (5.5, 0.6), (5.0, 0.75)])]
    base = fit_curve(rows, task="arith", metric="acc", baseline=0.25, margin=0.25, resamples=50, lofo=False,
                     corpus_sha256=corpus_sha256, scoring_spec=spec, now=datetime(2025, 1, 1, tzinfo=timezone.utc))
    curve = base.model_copy(update={
        "x_range": (KNOT_X[0], KNOT_X[-1]), "knots": Knots(x=KNOT_X, y=KNOT_Y),
        "band": Band(x=KNOT_X, fit=KNOT_Y, lower=[y - HALF_BAND for y in KNOT_Y],
                     upper=[y + HALF_BAND for y in KNOT_Y])})
    curve = curve.model_copy(update={"curve_id": curve.content_id()})
    save_curve(curve, out)
    return out


@pytest.fixture(scope="module")
def daemon_run(tmp_path_factory, calib_v0) -> dict[str, Any]:
    """The daemon watching REPO: one pass after each step is published. Returns what its store
    holds (score runs, predictions, alerts, delivered notifications), what the local webhook
    and SMTP receivers got, and the sha of each step."""
    tmp = tmp_path_factory.mktemp("equal")
    policies, state = tmp / "policies", tmp / "state"
    policies.mkdir()
    template = ScoreRequest(corpus_dir=calib_v0, docs=2, max_context=32, device="cpu", dtype="float32",
                            with_tcb=False, n_boot=10, progress=False)
    # the curve pinned to the corpus selection and scoring spec this template scores with
    spec = ScoringRef(spec_version="lstar-score/1", window=32, stride=16, prefix_policy="bos")
    hand_curve(corpus_selection(template).sha256, spec, policies / "arith.json")
    sha_of: dict[int, str] = {}
    with FakeHub() as hub, WebhookReceiver() as hook, SmtpReceiver() as smtp:
        (policies / "equal.yaml").write_text(POLICY.format(margin=0.25, hook=hook.url, smtp=smtp.port))
        config = DaemonConfig(policies_dir=policies, state_dir=state, endpoint=hub.url, api_port=0, once=True,
                              once_summary=False, cache_dir=tmp / "hf-cache", template=template)
        backend = make_scoring_backend(config)   # lent to every pass, as the demo does
        try:
            for i, step in enumerate(STEPS):   # published one at a time, the daemon polling once after each
                std = INIT_STD[0] + (INIT_STD[1] - INIT_STD[0]) * i / (len(STEPS) - 1)
                files = tiny_model_files("gpt-neox", seed=1000 + i, init_std=round(std, 4))
                when = BASE_TIME + timedelta(hours=i)
                if i == 0:
                    sha_of[step] = hub.add_repo(REPO, files, branch=f"step{step}", last_modified=when,
                                                pipeline_tag="text-generation")
                else:
                    sha_of[step] = hub.add_commit(REPO, files, branch=f"step{step}", replace=True, date=when)
                hub.add_branch(REPO, "main", revision=f"step{step}")
                code, errors = run_daemon_once(config, backend)
                assert (code, errors) == (0, {}), errors
        finally:
            backend.close()
        assert backend.started == 1   # one worker scored all five: torch imported once
        webhook_posts = sum(1 for r in hook.requests if r.method == "POST")
        mails = len(smtp.mails)
    with Store.open(state / "lstar.duckdb", read_only=True) as store:
        runs = store.query("SELECT model_repo, model_sha, lstar, se_ce, corpus_sha256, spec_version, window_len, "
                           "stride, prefix_policy FROM score_runs ORDER BY finished_at")
        predictions = store.query("SELECT p.commit_sha, p.lineage, p.lstar, p.se, p.state, p.p_hat, p.lo, p.hi "
                                  "FROM predictions p JOIN score_runs r ON r.run_id = p.run_id "
                                  "WHERE p.policy = 'equal' ORDER BY r.finished_at")
        alerts = store.query("SELECT alert_key, commit_sha, state, kind, status FROM alerts WHERE policy = 'equal' "
                             "ORDER BY created_at, id")
        notified = store.query("SELECT receiver, count(*) AS n FROM notifications WHERE policy = 'equal' "
                               "AND status = 'delivered' GROUP BY receiver")
    return {"tmp": tmp, "policies": policies, "sha_of": sha_of, "runs": runs, "predictions": predictions,
            "alerts": alerts, "notifications": {r["receiver"]: int(r["n"]) for r in notified},
            "webhook_posts": webhook_posts, "mails": mails,
            "audit_lines": len((policies / "audit.jsonl").read_text().splitlines())
            if (policies / "audit.jsonl").exists() else 0}


def write_daemon_history(daemon: dict[str, Any], path: Path, *, se_shift: float = 0.0) -> Path:
    """The history a team would export from the daemon's store: per score run (in order) its
    lineage (the repo), the step its commit was published as, L* and its SE (floats written
    exactly). The task value and n are placeholders (0.3 of 100): what is compared is the
    monitor's predictions and alerts, not the observations."""
    step_of = {sha: step for step, sha in daemon["sha_of"].items()}
    labels = [Label(checkpoint=f"step{step_of[r['model_sha']]}", family="tiny", value=0.3, n=100, task="arith",
                    metric="acc", lstar=float(r["lstar"]), lstar_se=float(r["se_ce"]) + se_shift,
                    lineage=r["model_repo"], step=float(step_of[r["model_sha"]]))
              for r in daemon["runs"]]
    return write_labels_csv(labels, path)


def replay(daemon: dict[str, Any], tmp: Path, *, se_shift: float = 0.0, margin: float = 0.25) -> dict[str, Any]:
    """`run_backtest` over the daemon's history with the daemon's own curve and policy (the
    policy file rewritten with another margin for a control): per checkpoint (state, p̂, lo,
    hi), the alerts and the notifications per receiver from the replay's file sink."""
    tmp.mkdir(parents=True, exist_ok=True)
    policy = daemon["policies"] / "equal.yaml"
    if margin != 0.25:
        policy = daemon["policies"] / f"equal-{margin}.yaml"
        policy.write_text((daemon["policies"] / "equal.yaml").read_text().replace("margin: 0.25", f"margin: {margin}"))
    spec = spec_from_policy(policy)
    history = load_history(write_daemon_history(daemon, tmp / "history.csv", se_shift=se_shift),
                           reference=None, target=REPO, axis=spec.axis)
    curve = load_curve(daemon["policies"] / "arith.json")
    result = run_backtest(history, spec, curves={"arith": curve}, alerts_out=tmp / "alerts.jsonl")
    (lineage,) = result.results
    lines = [json.loads(line) for line in (tmp / "alerts.jsonl").read_text().splitlines()]
    return {"points": [row.predicted for row in lineage.rows], "alerts": result.alerts,
            "notifications": dict(Counter(line["receiver"] for line in lines)), "result": result}


def differences(daemon: dict[str, Any], got: dict[str, Any]) -> list[str]:
    """Every way the replay differs from the daemon (empty: the same)."""
    out = []
    sha_for = {daemon["sha_of"][step]: checkpoint_sha(REPO, float(step)) for step in STEPS}
    preds, points = daemon["predictions"], got["points"]
    if len(preds) != len(points):
        return [f"{len(preds)} daemon predictions, {len(points)} replayed"]
    for step, p, q in zip(STEPS, preds, points):
        if q is None or q.commit != sha_for[p["commit_sha"]] or q.lineage != p["lineage"]:
            out.append(f"step {step}: not the same checkpoint ({q})")
            continue
        if q.state != p["state"]:
            out.append(f"step {step}: state {p['state']} in the daemon, {q.state} replayed")
        for name, a, b in (("p_hat", p["p_hat"], q.p_hat), ("lo", p["lo"], q.lo), ("hi", p["hi"], q.hi),
                           ("L*", p["lstar"], q.value), ("SE", p["se"], q.se)):
            if b is None or abs(a - b) > 1e-12:
                out.append(f"step {step}: {name} {a!r} in the daemon, {b!r} replayed")
    daemon_alerts = [(a["alert_key"].replace(a["commit_sha"], sha_for[a["commit_sha"]]), a["kind"], a["state"],
                      a["status"]) for a in daemon["alerts"]]
    replayed = [(a["alert_key"], a["kind"], a["state"], a["status"]) for a in got["alerts"]]
    if daemon_alerts != replayed:
        out.append(f"alerts: {daemon_alerts} in the daemon, {replayed} replayed")
    if daemon["notifications"] != got["notifications"]:
        out.append(f"notifications: {daemon['notifications']} in the daemon, {got['notifications']} replayed")
    return out


def test_the_daemon_saw_the_lineage_cross_and_told_each_receiver(daemon_run):
    """The run the comparison rests on: five scores in order, on the curve's corpus, the
    states of the design, and the receivers' own counts equal to the store's."""
    assert [r["model_sha"] for r in daemon_run["runs"]] == [daemon_run["sha_of"][s] for s in STEPS]
    assert {r["corpus_sha256"] for r in daemon_run["runs"]} == {load_curve(
        daemon_run["policies"] / "arith.json").corpus_sha256}
    lstars = [r["lstar"] for r in daemon_run["runs"]]
    assert lstars == sorted(lstars, reverse=True)
    # the predictions read the score runs' own L* and SE
    assert [(p["lstar"], p["se"]) for p in daemon_run["predictions"]] == [(r["lstar"], r["se_ce"])
                                                                           for r in daemon_run["runs"]]
    assert [p["state"] for p in daemon_run["predictions"]] == EXPECTED_STATES
    assert [(a["state"], a["kind"], a["status"]) for a in daemon_run["alerts"]] == \
        [("at_risk", "fire", "firing"), ("emerged", "fire", "firing")]
    counts = daemon_run["notifications"]
    assert counts == {"hook": daemon_run["webhook_posts"], "mail": daemon_run["mails"],
                      "audit": daemon_run["audit_lines"]}
    assert counts["hook"] >= 2 and counts["mail"] >= 2 and counts["audit"] >= 1


def test_the_replay_equals_the_daemon(daemon_run, tmp_path):
    got = replay(daemon_run, tmp_path / "same")
    assert differences(daemon_run, got) == []
    assert [p.state for p in got["points"]] == EXPECTED_STATES
    # ... and its comparison with the (placeholder) observations ran on every checkpoint
    data = got["result"].as_dict()
    assert data["curves"]["arith"]["curve_id"] == load_curve(daemon_run["policies"] / "arith.json").curve_id
    assert [p["predicted_state"] for p in data["results"][0]["points"]] == EXPECTED_STATES
    assert data["references"] == [] and data["not_evaluated"] == []


def test_a_larger_se_or_another_level_is_told_apart(daemon_run, tmp_path):
    """Negative controls: the comparison fails where the replay is given other numbers.

    SE + 0.2 widens each interval by z·SE ≈ 0.33 nats on either side (z = 1.645): from step
    2000 on the band's upper edge (reached at L* ≤ 6.03) is in reach and its lower edge (L* ≤
    5.66) no longer is, so every state from there on is at_risk. Margin 0.35 (level 0.6): g
    + 0.0555 ≥ 0.6 only where L* ≤ 5.697, g − 0.0555 ≥ 0.6 only where L* ≤ 5.327: only the
    last step (5.590) is at_risk, none emerged."""
    wider = replay(daemon_run, tmp_path / "se", se_shift=0.2)
    assert [p.state for p in wider["points"]] == ["clear"] + ["at_risk"] * 4
    assert any(d.startswith("step 5000: state emerged in the daemon, at_risk") for d in differences(daemon_run, wider))
    higher = replay(daemon_run, tmp_path / "level", margin=0.35)
    assert [p.state for p in higher["points"]] == ["clear"] * 4 + ["at_risk"]
    found = differences(daemon_run, higher)
    assert "step 3000: state at_risk in the daemon, clear replayed" in found
    assert any(d.startswith("alerts: ") for d in found) and any(d.startswith("notifications: ") for d in found)


def test_given_curves_must_match_the_tasks(daemon_run, tmp_path):
    history = load_history(write_daemon_history(daemon_run, tmp_path / "h.csv"), reference=None, target=REPO,
                           axis="lstar")
    curve = load_curve(daemon_run["policies"] / "arith.json")
    spec = spec_from_options(task="arith", baseline=0.25, margin=0.25)
    with pytest.raises(CurveError, match=r"missing: arith; not a task: other"):
        run_backtest(history, spec, curves={"other": curve})
    with pytest.raises(CurveError, match=r"at baseline 0.25, the backtest's of 'arith' at 0.2"):
        run_backtest(history, dataclasses.replace(spec, tasks=(dataclasses.replace(spec.tasks[0], baseline=0.2),)),
                     curves={"arith": curve})
