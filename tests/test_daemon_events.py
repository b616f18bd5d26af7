"""What the daemon says about its work: the event log (`--log-format json`), `lstar run --once`
waiting for the alerts it raised and ending with a summary, and the outbox, dead-letter, rule
and policy-reload metrics at /metrics."""

from __future__ import annotations

import pytest

import json
import logging
import re
import subprocess
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

from monitor.demo.fakehub import FakeHub
from monitor.demo.hub_repos import add_lineage
from monitor.demo.receivers import Reply, WebhookReceiver
from monitor.scoring.corpus import load_corpus
from monitor.store import Store
from support.daemon_harness import DaemonProcess, wait_for
from support.scores import CALIB_V0_SHA256, record_fake_score

pytestmark = pytest.mark.slow  # the daemon or the scoring stack in subprocesses

CURVES = Path(__file__).resolve().parent / "fixtures" / "policies" / "curves"
SECRET_ENV = {"LSTAR_TEST_WEBHOOK_SECRET": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}


WATCH = """\
watch:
  - name: tiny
    author: fake-org
    revisions: {branches: "step\\\\d+"}
"""


def policy_text(url: str, *, group_wait: str = "0s", watch: bool = True, corpus: str = CALIB_V0_SHA256,
                curve: Path = CURVES / "arith.json") -> str:
    return f"""\
name: watcher
{WATCH if watch else ""}corpora: {{public: {corpus}}}
tasks:
  - name: arith
    curve: {curve}
route: {{receiver: hook, group_wait: {group_wait}, group_interval: 0s, repeat_interval: 4h}}
receivers:
  - name: hook
    webhook: {{url: "{url}", secret_env: LSTAR_TEST_WEBHOOK_SECRET, timeout: 5s}}
"""


def fit_arith_curve(corpus_sha256: str, out: Path) -> Path:
    """A curve on `corpus_sha256` under which a barely trained model (L* of a few nats) is at
    risk: noise-free labels that rise slowly through the 0.3 level (floor 0.25 + margin 0.05)
    as L* falls from 10 to 0, crossing it near 5.6, so the interval holds the level there."""
    from monitor.curves.artifact import ScoringRef, save_curve
    from monitor.curves.fit import fit_curve
    from monitor.curves.labels import Label

    rows = []
    for i in range(24):
        x = 10.0 * i / 23
        p = 0.30 + 0.005 * (5.6 - x)
        rows.append(Label(checkpoint=f"synthetic/arith-{i:02d}", value=round(p * 300) / 300, family="synthetic",
                          task="arith", metric="acc", n=300, lstar=x, lstar_se=0.01))
    spec = ScoringRef(spec_version="lstar-score/1", window=128, stride=64, prefix_policy="bos")
    curve = fit_curve(rows, task="arith", metric="acc", baseline=0.25, margin=0.05, confidence=0.9,
                      resamples=50, seed=0, corpus_sha256=corpus_sha256, scoring_spec=spec, lofo=False,
                      grid_size=31, now=datetime(2025, 1, 1, tzinfo=timezone.utc))
    save_curve(curve, out)
    return out


def summary_counts(stdout: str) -> dict[str, int]:
    """The `--once` summary's lines (`  label   N`) as {label: N}."""
    lines = stdout.split("summary of this run:\n", 1)[1].splitlines()
    return {m.group(1): int(m.group(2)) for m in (re.match(r"  (.+?)\s+(\d+)$", line) for line in lines) if m}


def test_an_event_is_one_human_line_or_one_json_object_with_its_fields():
    from monitor.events import JsonFormatter, event, subscribe

    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("lstar.events")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)   # as the daemon's logging set-up does
    seen: list[tuple[str, dict]] = []
    stop = subscribe(lambda kind, fields: seen.append((kind, dict(fields))))
    try:
        event("refused", checkpoint=3, repo="org/x", commit="c0ffee", reason="too big: 9 GB > 8 GB",
              rule=None, at=datetime(2030, 1, 1, tzinfo=timezone.utc), se=float("nan"))
    finally:
        stop()
        logger.removeHandler(handler)
        logger.setLevel(level)
    [record] = records
    assert record.getMessage() == ('refused checkpoint=3 repo=org/x commit=c0ffee reason="too big: 9 GB > 8 GB" '
                                   'at=2030-01-01T00:00:00+00:00 se=-')
    data = json.loads(JsonFormatter().format(record))
    assert {k: data[k] for k in ("event", "checkpoint", "repo", "commit", "reason", "se", "logger")} == {
        "event": "refused", "checkpoint": 3, "repo": "org/x", "commit": "c0ffee",
        "reason": "too big: 9 GB > 8 GB", "se": None, "logger": "lstar.events"}
    assert "rule" not in data   # None values are left out
    assert seen == [("refused", {"checkpoint": 3, "repo": "org/x", "commit": "c0ffee",
                                 "reason": "too big: 9 GB > 8 GB", "at": "2030-01-01T00:00:00+00:00", "se": None})]


def test_once_waits_for_its_alert_logs_every_event_as_json_and_summarises(tmp_path, shared_dir):
    with FakeHub() as hub, WebhookReceiver() as hook:
        add_lineage(hub, "fake-org/tiny", steps=(1000,))
        (tmp_path / "policies").mkdir()
        corpus = load_corpus(shared_dir / "corpus" / "calib-v0").select(first=2).sha256   # --docs 2
        curve = fit_arith_curve(corpus, tmp_path / "policies" / "arith.json")
        # The group waits 3 s after its first alert: longer than the run's jobs take to hand it over.
        (tmp_path / "policies" / "watcher.yaml").write_text(policy_text(hook.url, group_wait="3s",
                                                                         corpus=corpus, curve=curve))
        daemon = DaemonProcess(
            tmp_path / "policies", tmp_path / "state", endpoint=hub.url, env=SECRET_ENV, fast=False,
            args=["--once", "--log-format", "json", "--cache-dir", str(tmp_path / "cache"),
                  "--corpus", str(shared_dir / "corpus" / "calib-v0"), "--docs", "2", "--max-context", "128",
                  "--n-boot", "10"])
        done = subprocess.run(daemon.command(), capture_output=True, text=True, env=daemon.env, timeout=300)
        assert done.returncode == 0, done.stderr[-4000:]
        # The receiver had the alert before the process ended.
        assert len(hook.requests) == 1, (done.stdout, done.stderr[-4000:])
        sent = hook.requests[0].json()
        assert [a["labels"]["task"] for a in sent["alerts"]] == ["arith"]

    assert "waiting up to 60 s (--once-wait) for 1 pending outbox entry to be sent" in done.stdout

    # Every line of the log is one JSON object; the events carry their ids.
    records = [json.loads(line) for line in done.stderr.splitlines() if line.strip()]
    events: dict[str, list[dict]] = {}
    for record in records:
        assert {"ts", "level", "logger", "message"} <= record.keys()
        if "event" in record:
            events.setdefault(record["event"], []).append(record)

    with Store.open(tmp_path / "state" / "lstar.duckdb", read_only=True) as store:
        checkpoints = store.query("SELECT id, repo, sha, status, rule FROM checkpoints")
        runs = store.query("SELECT run_id, checkpoint_id, lstar, se_ce FROM score_runs")
        predictions = store.query("SELECT policy, task, run_id, state FROM predictions")
        alerts = store.query("SELECT alert_key FROM alerts")
        notifications = store.query("SELECT id, status, receiver FROM notifications")

    assert len(checkpoints) == 1 and len(runs) == 1 and len(predictions) == 1 and len(alerts) == 1
    cp, run, prediction = checkpoints[0], runs[0], predictions[0]
    assert [(e["checkpoint"], e["repo"], e["commit"], e["rule"]) for e in events["discovered"]] == [
        (cp["id"], cp["repo"], cp["sha"], "tiny")]
    assert [(e["checkpoint"], e["repo"], e["commit"]) for e in events["gated"]] == [(cp["id"], cp["repo"], cp["sha"])]
    [scored] = events["scored"]
    assert (scored["checkpoint"], scored["run"]) == (cp["id"], run["run_id"])
    assert abs(scored["lstar"] - run["lstar"]) < 1e-6 and abs(scored["se"] - run["se_ce"]) < 1e-6
    assert scored["tokens_per_s"] > 0
    assert [(e["policy"], e["task"], e["run"], e["state"], e["previous"], e["changed"]) for e in events["state"]] == [
        (prediction["policy"], prediction["task"], prediction["run_id"], prediction["state"], "none", True)]
    assert [e["alert"] for e in events["alert_raised"]] == [alerts[0]["alert_key"]]
    assert [(e["notification"], e["receiver"], e["alerts"]) for e in events["delivered"]] == [
        (notifications[0]["id"], "hook", 1)]
    assert notifications[0]["status"] == "delivered"
    assert SECRET_ENV["LSTAR_TEST_WEBHOOK_SECRET"] not in done.stderr

    # The summary's counts are the database's.
    counts = summary_counts(done.stdout)
    assert counts["discovered"] == len(checkpoints)
    assert counts["gated"] == counts["scored"] == len(runs)
    assert counts["refused"] == counts["score failures"] == 0
    assert counts[f"task state {prediction['state']}"] == 1
    assert counts["alerts raised"] == len(alerts)
    assert counts["notifications delivered"] == sum(n["status"] == "delivered" for n in notifications)
    assert counts["outbox still pending"] == 0


def test_once_gives_up_on_alerts_due_after_its_wait_and_says_what_is_pending(tmp_path):
    with WebhookReceiver() as hook:
        (tmp_path / "policies").mkdir()
        (tmp_path / "policies" / "watcher.yaml").write_text(policy_text(hook.url, group_wait="1h", watch=False))
        with Store.open(tmp_path / "state" / "lstar.duckdb") as store:
            record_fake_score(store, repo="org/model", sha="a" * 40, lstar=-2.0, se=0.01,
                              finished_at=datetime.now(timezone.utc) - timedelta(minutes=1))
        daemon = DaemonProcess(tmp_path / "policies", tmp_path / "state", env=SECRET_ENV, fast=False,
                               args=["--once", "--once-wait", "30s", "--max-context", "128"])
        started = time.monotonic()
        done = subprocess.run(daemon.command(), capture_output=True, text=True, env=daemon.env, timeout=300)
        assert done.returncode == 0, done.stderr[-4000:]
        assert time.monotonic() - started < 25   # due in an hour: no point waiting the 30 s
        assert hook.requests == []
    assert "gave up waiting for the outbox" in done.stdout and "1 entry still pending" in done.stdout
    counts = summary_counts(done.stdout)
    assert (counts["alerts raised"], counts["notifications delivered"], counts["outbox still pending"]) == (1, 0, 1)


def metric(text: str, name: str) -> float | None:
    """The value of one sample (`name` with its labels, as exposed), or None when absent."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_metrics_expose_outbox_dead_letters_skips_rule_polls_and_policy_reloads(tmp_path):
    # The receiver refuses for good (400): the notification is dead-lettered at once.
    with FakeHub() as hub, WebhookReceiver(default=Reply(400)) as hook:
        (tmp_path / "policies").mkdir()
        (tmp_path / "policies" / "watcher.yaml").write_text(policy_text(hook.url))
        now = datetime.now(timezone.utc)
        with Store.open(tmp_path / "state" / "lstar.duckdb") as store:
            record_fake_score(store, repo="fake-org/model", sha="a" * 40, lstar=-2.0, se=0.01,
                              finished_at=now - timedelta(minutes=2))
            # Scored with another window than the curve's: its evaluation is refused.
            # (Both repos are fake-org's, so the policy's watch rule covers them.)
            record_fake_score(store, repo="fake-org/other", sha="b" * 40, lstar=-2.0, se=0.01,
                              finished_at=now - timedelta(minutes=1), spec={"window_len": 64, "stride": 32})
        with DaemonProcess(tmp_path / "policies", tmp_path / "state", endpoint=hub.url, env=SECRET_ENV,
                           args=["--poll-every", "1h", "--score-every", "1h", "--max-context", "128"]) as daemon:
            # The at-risk alert and the operator's note of the refused evaluation each go to the
            # hook once, are refused for good, and stay dead letters: the outbox is then empty.
            def settled() -> str | None:
                text = daemon.request("/metrics")[1].decode()
                # /metrics may serve a render up to a second old (api_cache.MAX_AGE): wait for one
                # rendered after both dead letters were recorded, not only after the hook heard them.
                empty = (metric(text, 'lstar_outbox_depth{stage="notification"}') == 0
                         and metric(text, 'lstar_outbox_depth{stage="delivery"}') == 0)
                settled = empty and (metric(text, "lstar_dead_letters_open") or 0) >= 2
                return text if settled and len(hook.requests) >= 2 else None

            text = wait_for(settled, timeout=60, what="the refused notifications to settle")
            assert metric(text, "lstar_dead_letters_open") == len(hook.requests) == 2
            assert metric(text, 'lstar_evaluations_skipped_total{reason="curve_refused"}') == 1
            polled = metric(text, 'lstar_rule_last_success_timestamp_seconds{rule="tiny"}')
            assert polled is not None and abs(polled - time.time()) < 120
            assert metric(text, "lstar_config_last_reload_successful") == 1
            good_reload = metric(text, "lstar_config_last_reload_success_timestamp_seconds")
            assert good_reload is not None and good_reload > 0

            (tmp_path / "policies" / "broken.yaml").write_text("name: [unclosed\n")
            text = wait_for(lambda: (t := daemon.request("/metrics")[1].decode()) and
                            metric(t, "lstar_config_last_reload_successful") == 0 and t,
                            timeout=60, what="the failed reload in /metrics")
            assert metric(text, "lstar_config_last_reload_success_timestamp_seconds") == good_reload
            assert '"event": "dead_lettered"' not in daemon.log()   # text format by default
            assert re.search(r"dead_lettered notification=\S+ policy=watcher receiver=hook attempt=1", daemon.log())
