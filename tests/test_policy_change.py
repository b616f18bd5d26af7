"""A policy change re-evaluates what it affects (issue 38, item 2).

The real daemon on the fake Hub with the real webhook receiver: a checkpoint is at risk under
the curve's own margin (level 0.25 + 0.05 = 0.30: P̂ 0.3233, interval [0.2854, 0.3611]); the
policy file then says `margin: 0.25` (level 0.50, above the interval's top 0.3611), so the state
no longer holds. The reload must re-evaluate, send the resolve through the outbox, log what it
did, and the report (header and rows) and `lstar policy test` must agree on the level and state.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from monitor.commands.policy import policy_decisions
from monitor.demo.fakehub import FakeHub
from monitor.demo.receivers import WebhookReceiver
from monitor.store import Store
from support.daemon_harness import DaemonProcess, wait_for
from support.scores import record_fake_score

CURVE = Path(__file__).resolve().parent / "fixtures" / "policies" / "curves" / "arith.json"
SECRET_ENV = {"LSTAR_TEST_WEBHOOK_SECRET": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}
LSTAR, SE = -2.0, 0.01


def policy_text(url: str, margin: float | None = None) -> str:
    return f"""\
name: watcher
watch:
  - name: tiny
    author: fake-org
    revisions: {{branches: "step\\\\d+"}}
tasks:
  - name: arith
    curve: {CURVE}
{f"    margin: {margin}" if margin is not None else ""}
route: {{receiver: hook, group_wait: 0s, group_interval: 0s, repeat_interval: 4h}}
receivers:
  - name: hook
    webhook: {{url: "{url}", secret_env: LSTAR_TEST_WEBHOOK_SECRET, timeout: 5s}}
"""


def test_the_summary_names_each_changed_setting_and_the_counts() -> None:
    from monitor.service.policy_change import TaskChange, changed_tasks

    before = {"level": 0.30, "margin": 0.05, "curve_id": "a" * 64, "confidence": 0.9, "budget": None,
              "derivatives": "base"}
    after = {**before, "level": 0.50, "margin": 0.25}
    [change] = changed_tasks({("watch", "arith"): before, ("watch", "gone"): before},
                             {("watch", "arith"): after, ("watch", "new"): after, ("watch", "same"): before})
    assert (change.policy, change.task) == ("watch", "arith")
    change.reevaluated, change.resolved = 2, 1
    assert change.summary == ("policy watch: task arith level 0.3000 → 0.5000 (margin 0.0500 → 0.2500); "
                              "re-evaluated 2 checkpoints; 1 alert resolved")
    other = TaskChange("watch", "arith", before, {**before, "curve_id": "b" * 64}, reevaluated=1, fired=1)
    assert other.summary == ("policy watch: task arith curve id aaaaaaaaaaaa → bbbbbbbbbbbb; "
                             "re-evaluated 1 checkpoint; 0 alerts resolved; 1 alert raised")


@pytest.mark.slow   # the daemon in a subprocess
def test_a_margin_change_resolves_the_alert_and_says_so(tmp_path) -> None:
    with FakeHub() as hub, WebhookReceiver() as hook:
        policies = tmp_path / "policies"
        policies.mkdir()
        (policies / "watcher.yaml").write_text(policy_text(hook.url))
        with Store.open(tmp_path / "state" / "lstar.duckdb") as store:
            record_fake_score(store, repo="fake-org/model", sha="a" * 40, lstar=LSTAR, se=SE,
                              finished_at=datetime.now(timezone.utc) - timedelta(minutes=1))
        with DaemonProcess(policies, tmp_path / "state", endpoint=hub.url, env=SECRET_ENV,
                           args=["--poll-every", "1h", "--score-every", "1h", "--max-context", "128"]) as daemon:
            wait_for(lambda: len(hook.requests) >= 1, timeout=60, what="the at-risk alert")
            fired = hook.requests[0].json()
            assert fired["status"] == "firing"
            assert [a["labels"]["state"] for a in fired["alerts"]] == ["at_risk"]

            (policies / "watcher.yaml").write_text(policy_text(hook.url, margin=0.25))
            wait_for(lambda: len(hook.requests) >= 2, timeout=60, what="the resolve after the margin change")
            resolved = hook.requests[1].json()
            assert resolved["status"] == "resolved"
            assert [(a["status"], a["labels"]["task"]) for a in resolved["alerts"]] == [("resolved", "arith")]

            line = ("policy watcher: task arith level 0.3000 → 0.5000 (margin 0.0500 → 0.2500); "
                    "re-evaluated 1 checkpoint; 1 alert resolved")
            wait_for(lambda: line in daemon.log(), timeout=30, what="the change's log line")
            assert not re.search(r"Traceback", daemon.log())

            # The report (the API's /report, what `lstar report` shows while the daemon runs):
            # the header's level is the rows' threshold, the state is the new one, the change is told.
            [report] = daemon.get_json("/report?policy=watcher")
            [task] = report["tasks"]
            assert task["level"] == pytest.approx(0.50)
            [row] = task["lineages"]
            assert (row["state"], row["threshold"]) == ("clear", pytest.approx(task["level"]))
            assert [c["summary"] for c in report["policy_changes"]] == [line]
            assert not [p for p in report["problems"] if "judged at level" in p]
            daemon.stop()
        assert daemon.log().count("policy watcher:") == 1   # told once, not on every reload tick

        # Changed while no daemon runs: the next start compares with what the stored predictions
        # were judged by, and re-evaluates (the state stays clear: nothing to resolve or raise).
        (policies / "watcher.yaml").write_text(policy_text(hook.url, margin=0.3))
        with DaemonProcess(policies, tmp_path / "state", endpoint=hub.url, env=SECRET_ENV,
                           args=["--poll-every", "1h", "--score-every", "1h", "--max-context", "128"]) as again:
            restarted = ("policy watcher: task arith level 0.5000 → 0.5500 (margin 0.2500 → 0.3000); "
                         "re-evaluated 1 checkpoint; 0 alerts resolved")
            wait_for(lambda: restarted in again.log(), timeout=60, what="the change made while stopped")
            [report] = again.get_json("/report?policy=watcher")
            [row] = report["tasks"][0]["lineages"]
            assert (row["state"], row["threshold"]) == ("clear", pytest.approx(0.55))
            assert len(hook.requests) == 2   # nothing more was sent
    # `lstar policy test` with the same L* says what the report says
    decided = policy_decisions(policies / "watcher.yaml", lstar=LSTAR, se=SE, repo="fake-org/model",
                               commit="a" * 40)
    [test_task] = decided["tasks"]
    assert (test_task["state"], test_task["threshold"]) == (row["state"], pytest.approx(row["threshold"]))


def test_the_report_tells_the_change_and_never_prints_rows_at_another_level(tmp_path) -> None:
    """Library level, on the report state (three lineages judged at level 0.2955): before the
    re-evaluation the report names each row judged at the old level; after it, every row's
    threshold is the header's level, the states are `lstar policy test`'s, and the Markdown and
    HTML list the change."""
    from monitor.policy.load import load_policy
    from monitor.reports.report import build_report, to_html, to_markdown
    from monitor.service.policy_change import changed_tasks, reevaluate_change, settings_in_force
    from support.report_state import T0, build_report_state

    made = build_report_state(tmp_path)
    try:
        before = settings_in_force([made.policy])
        path = made.folder / "policy.yaml"
        path.write_text(path.read_text().replace("    curve: curves/cloze.json\n",
                                                 "    curve: curves/cloze.json\n    margin: 0.3\n"))
        policy = load_policy(path)
        start, later = T0 - timedelta(hours=1), made.now + timedelta(hours=1)
        stale = build_report(made.store, policy, now=later, period_start=start)
        assert stale["tasks"][0]["level"] == pytest.approx(0.55)
        assert len([p for p in stale["problems"] if "judged at level 0.2955, not at the level 0.5500" in p]) == 3

        [change] = changed_tasks(before, settings_in_force([policy]))
        done = reevaluate_change(made.store, policy, change, now=later)
        assert done.reevaluated == 3
        data = build_report(made.store, policy, now=later + timedelta(minutes=1), period_start=start)
    finally:
        made.store.close()
    [task] = data["tasks"]
    assert not [p for p in data["problems"] if "judged at level" in p]
    for row in task["lineages"]:
        assert row["threshold"] == pytest.approx(task["level"]) == pytest.approx(0.55)
        decided = policy_decisions(path, lstar=row["lstar"], se=row["se"], repo=row["repo"], commit=row["commit"])
        assert decided["tasks"][0]["state"] == row["state"]
    assert [c["summary"] for c in data["policy_changes"]] == [done.summary]
    assert done.summary.startswith("policy governance: task cloze level 0.2955 → 0.5500 (margin 0.0455 → 0.3000); "
                                   "re-evaluated 3 checkpoints;")
    assert f"- {(later).strftime('%Y-%m-%d %H:%M')} UTC: {done.summary}" in to_markdown(data)
    assert done.summary in to_html(data, {})
