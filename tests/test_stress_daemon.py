"""A curve flagged by a stress limit: the daemon's alert on it carries the caveat, in the webhook
payload and in the email text rendered from it.

The caveat is added where the daemon evaluates a stored score against the policy's curves
(`monitor.alerts.evaluation_tick`), whatever scored it: the daemon here evaluates a score run
recorded before it starts, as one it scored itself would be. Scoring a checkpoint from the fake
Hub in the daemon (`tests/test_daemon_events.py` runs that same daemon) cost this test a warm
pool importing torch and transformers and a tiny model built in the test's process: 20.4
CPU-seconds measured, 12.9 of them in the daemon's process tree."""

from __future__ import annotations

import subprocess
from datetime import datetime, timedelta, timezone
from html import escape as html_escape

import pytest

from monitor.alerts.channels.base import Outgoing
from monitor.alerts.channels.email import render
from monitor.curves.artifact import load_curve
from monitor.demo.fakehub import FakeHub
from monitor.demo.receivers import WebhookReceiver
from monitor.store import Store
from monitor.stress.storage import save_stress_report
from monitor.stress.subject import SCHEMA
from support.daemon_harness import DaemonProcess
from support.scores import CALIB_V0_SHA256, record_fake_score
from tests.test_daemon_events import SECRET_ENV, fit_arith_curve, policy_text

pytestmark = pytest.mark.slow  # the daemon in a subprocess

# An L* at which `fit_arith_curve`'s interval holds the level (near 5.6): the score is at risk.
LSTAR, SE = 5.0, 0.01


def test_daemon_alert_on_a_flagged_curve_carries_the_stress_caveat(tmp_path):
    with FakeHub() as hub, WebhookReceiver() as hook:
        (tmp_path / "policies").mkdir()
        corpus = CALIB_V0_SHA256
        curve = fit_arith_curve(corpus, tmp_path / "policies" / "arith.json")
        curve_id = load_curve(curve).curve_id
        (tmp_path / "policies" / "watcher.yaml").write_text(policy_text(hook.url, corpus=corpus, curve=curve))
        with Store.open(tmp_path / "state" / "lstar.duckdb") as store:
            save_stress_report(store, {"schema": SCHEMA, "subject": {"kind": "model", "name": "m", "curve_id": curve_id},
                                       "sections": {"task_format": {"test": "task_format", "tasks": [
                                           {"task": "arith", "formats": [], "instability": 0.3,
                                            "accuracy_upper_bound": 0.7, "n_items": 50}]}}})
            record_fake_score(store, repo="fake-org/tiny", sha="a" * 40, lstar=LSTAR, se=SE,
                              finished_at=datetime.now(timezone.utc) - timedelta(minutes=1))
        daemon = DaemonProcess(
            tmp_path / "policies", tmp_path / "state", endpoint=hub.url, env=SECRET_ENV, fast=False,
            args=["--once", "--cache-dir", str(tmp_path / "cache"), "--max-context", "128"])
        done = subprocess.run(daemon.command(), capture_output=True, text=True, env=daemon.env, timeout=300)
        assert done.returncode == 0, done.stderr[-4000:]
        assert len(hook.requests) == 1, (done.stdout, done.stderr[-4000:])
        body = hook.requests[0].json()
    expected = "stress: task arith has format instability 0.300 > 0.10"
    [alert] = body["alerts"]
    assert expected in alert["annotations"]["caveats"]
    assert f"Caveat: {expected}" in alert["annotations"]["description"]
    [numbers] = body["lstar"]["alerts"]
    assert any(c.startswith(expected) for c in numbers["caveats"])
    _, text, html = render(Outgoing(id="n1", policy="watcher", receiver="hook", body=body))
    assert expected in text and html_escape(expected) in html
    with Store.open(tmp_path / "state" / "lstar.duckdb", read_only=True) as store:
        [detail] = store.query_json("SELECT detail FROM predictions", [], ("detail",))
    assert any(c.startswith(expected) for c in detail["detail"]["caveats"])
