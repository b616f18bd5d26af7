"""The real daemon (`lstar run`) in a subprocess against the fake Hub: the loop, the lock,
the API used by the read commands while it runs, the Hub webhook, SIGTERM, and a SIGKILL
in the middle of a score (docs/reliability.md rows 3, 4, 5)."""

from __future__ import annotations

import json
import signal
import traceback
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from monitor.cli import app
from monitor.demo.fakehub import FakeHub
from monitor.demo.hub_repos import add_lineage
from monitor.store import Store
from support.daemon_harness import UNSCORED_WATCHER_POLICY, WATCHER_POLICY as POLICY, DaemonProcess, wait_for

pytestmark = pytest.mark.slow

SECRET = "hub-webhook-secret-for-tests"


def write_policy(folder: Path, policy: str = POLICY) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "watcher.yaml").write_text(policy)
    return folder


def score_args(tmp: Path, shared_dir: Path) -> list[str]:
    return ["--cache-dir", str(tmp / "cache"), "--corpus", str(shared_dir / "corpus" / "calib-v0"),
            "--docs", "2", "--max-context", "64", "--n-boot", "10"]


def lstar(*args: str) -> SimpleNamespace:
    """`lstar ARGS` run in this process by typer's runner (returncode, stdout, stderr): the
    command's path to the daemon's API is what is checked, and a `python -m monitor.cli`
    child per call only added its imports."""
    result = CliRunner().invoke(app, list(args))
    error = "".join(traceback.format_exception(result.exception)) if result.exception else ""
    return SimpleNamespace(returncode=result.exit_code, stdout=result.stdout, stderr=result.stderr + error)


@pytest.fixture(scope="module")
def hub():
    with FakeHub() as server:
        add_lineage(server, "fake-org/tiny", steps=(1000,))
        yield server


@pytest.fixture(scope="module")
def running(hub, tmp_path_factory, shared_dir):
    """One daemon that polls hourly (so only the start-up poll and the webhook poll run). Its
    gate refuses what it discovers: these tests look at the lock, the API, the webhook and the
    stop, and a score only started a scoring worker that imports torch."""
    tmp = tmp_path_factory.mktemp("daemon")
    daemon = DaemonProcess(write_policy(tmp / "policies", UNSCORED_WATCHER_POLICY), tmp / "state", endpoint=hub.url,
                           args=["--poll-every", "1h", "--score-every", "1h", *score_args(tmp, shared_dir)],
                           env={"LSTAR_HUB_WEBHOOK_SECRET": SECRET})
    with daemon:
        wait_for(lambda: daemon.status()["jobs"]["poll"]["runs"] >= 1, timeout=60, what="the start-up poll")
        yield daemon


def test_second_daemon_on_the_same_state_is_refused_by_the_lock(running):
    second = DaemonProcess(running.policies_dir, running.state_dir, endpoint=running.endpoint)
    second.start(wait=False)
    assert second.wait(timeout=60) != 0
    pid = running.proc.pid
    assert f"another daemon (pid {pid}) holds {running.state_dir / 'lstar.lock'}" in second.log()
    assert running.proc.poll() is None
    assert json.loads((running.state_dir / "daemon.json").read_text())["pid"] == pid


def test_read_commands_are_answered_through_the_api_while_the_daemon_runs(running):
    db = running.state_dir / "lstar.duckdb"
    # The file is held read-write by the daemon: a direct read-only open is refused ...
    with pytest.raises(Exception, match="(?i)lock|held"):
        Store.open(db, read_only=True)
    # ... and the read commands ask the daemon instead.
    listed = lstar("checkpoints", "--db", str(db), "--json")
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)["items"]
    assert [(r["repo"], r["refs"]) for r in rows] == [("fake-org/tiny", ["step1000"])]
    assert rows == json.loads(json.dumps(running.get_json("/checkpoints")["items"], default=str))

    status = lstar("status", "--state", str(running.state_dir), "--json")
    assert status.returncode == 0, status.stderr
    data = json.loads(status.stdout)
    assert data["daemon"]["pid"] == running.proc.pid
    assert sum(data["checkpoints"].values()) == 1
    assert data["policies"][0]["name"] == "watcher"

    info = lstar("db", "info", "--db", str(db), "--json")
    assert info.returncode == 0, info.stderr
    assert json.loads(info.stdout)["tables"]["checkpoints"] == 1


def test_health_and_metrics(running):
    assert running.request("/health") == (200, json.dumps({"ok": True, "reasons": []}, separators=(",", ":")).encode())
    status, body = running.request("/metrics")
    assert status == 200
    text = body.decode()
    assert 'lstar_polls_total{result="ok"}' in text
    assert 'lstar_job_last_success_timestamp_seconds{job="poll"}' in text


def test_hub_webhook_checks_the_secret_and_triggers_a_poll(running, hub):
    runs_before = running.status()["jobs"]["poll"]["runs"]
    assert running.request("/hooks/hub", method="POST", body=b"{}")[0] == 401
    assert running.request("/hooks/hub", method="POST", body=b"{}",
                           headers={"X-Webhook-Secret": SECRET + "x"})[0] == 403
    assert running.status()["jobs"]["poll"]["runs"] == runs_before  # polls hourly: nothing ran

    add_lineage(hub, "fake-org/tiny-two", steps=(5,), seed=77)
    status, _ = running.request("/hooks/hub", method="POST", body=b'{"event": {"action": "update"}}',
                                headers={"X-Webhook-Secret": SECRET})
    assert status == 202
    rows = wait_for(lambda: [r for r in running.get_json("/checkpoints")["items"] if r["repo"] == "fake-org/tiny-two"],
                    timeout=60, what="the webhook's poll to discover the new repo")
    assert rows[0]["refs"] == ["step5"]
    wait_for(lambda: running.status()["jobs"]["poll"]["runs"] == runs_before + 1, timeout=30,
             what="the webhook's poll to finish")


def test_sigterm_exits_zero_with_a_clean_database(running):
    assert running.stop(signal.SIGTERM, timeout=60) == 0
    assert not (running.state_dir / "daemon.json").exists()
    assert not Path(str(running.state_dir / "lstar.duckdb") + ".wal").exists() or \
        Path(str(running.state_dir / "lstar.duckdb") + ".wal").stat().st_size == 0
    with Store.open(running.state_dir / "lstar.duckdb", read_only=True) as store:
        assert {r.repo for r in store.list_checkpoints()} == {"fake-org/tiny", "fake-org/tiny-two"}
        assert store.pending_migrations() == []


@pytest.fixture()
def own_hub():
    """A hub with one single-step lineage (the module's hub gains a repo in the webhook test)."""
    with FakeHub() as server:
        add_lineage(server, "fake-org/tiny", steps=(1000,))
        yield server


def test_kill_9_mid_score_then_the_lease_expires_and_the_job_is_scored_once(own_hub, tmp_path, shared_dir):
    hub = own_hub
    policies = write_policy(tmp_path / "policies")
    args = [*score_args(tmp_path, shared_dir), "--lease", "2s"]
    crashing = DaemonProcess(policies, tmp_path / "state", endpoint=hub.url, args=args,
                             env={"LSTAR_FAILPOINT": "mid_score"})
    crashing.start()
    assert crashing.wait(timeout=120) == -signal.SIGKILL  # killed itself between score and write
    with Store.open(tmp_path / "state" / "lstar.duckdb", read_only=True) as store:
        rows = store.list_checkpoints(repo="fake-org/tiny")
        assert [(r.status, r.attempts, r.lease_owner is not None) for r in rows] == [("fetched", 1, True)]
        assert store.query("SELECT count(*) AS n FROM score_runs")[0]["n"] == 0

    with DaemonProcess(policies, tmp_path / "state", endpoint=hub.url, args=args) as daemon:
        wait_for(lambda: daemon.status()["checkpoints"].get("scored") == 1, timeout=120,
                 what=f"the retried score\n{daemon.log()}")
        assert daemon.stop() == 0
    with Store.open(tmp_path / "state" / "lstar.duckdb", read_only=True) as store:
        row = store.list_checkpoints(repo="fake-org/tiny")[0]
        assert (row.status, row.attempts, row.lease_owner) == ("scored", 2, None)
        runs = store.query("SELECT checkpoint_id, model_repo, model_sha FROM score_runs")
        assert runs == [{"checkpoint_id": row.id, "model_repo": "fake-org/tiny", "model_sha": row.sha}]


def test_a_job_killed_at_every_attempt_is_failed_after_three_with_the_reason(own_hub, tmp_path):
    hub = own_hub
    policies = write_policy(tmp_path / "policies")
    args = ["--cache-dir", str(tmp_path / "cache"), "--lease", "1s"]
    for attempt in (1, 2, 3):
        daemon = DaemonProcess(policies, tmp_path / "state", endpoint=hub.url, args=args,
                               env={"LSTAR_FAILPOINT": "mid_download"})
        daemon.start()
        assert daemon.wait(timeout=120) == -signal.SIGKILL, daemon.log()
    with DaemonProcess(policies, tmp_path / "state", endpoint=hub.url, args=args) as daemon:
        wait_for(lambda: daemon.status()["checkpoints"].get("failed") == 1, timeout=60, what="the give-up")
        daemon.stop()
    with Store.open(tmp_path / "state" / "lstar.duckdb", read_only=True) as store:
        row = store.list_checkpoints(repo="fake-org/tiny")[0]
    assert row.status == "failed" and row.attempts == 3
    # each restart reclaimed the dead daemon's lease at start, naming the attempt it died in
    assert row.reason.startswith("gave up after 3 attempts: ")
    assert "died during attempt 3 (started " in row.reason
    assert [i["attempt"] for i in row.meta["interrupted"]] == [1, 2, 3]
