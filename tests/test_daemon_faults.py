"""Faults against the real daemon in a subprocess (docs/reliability.md rows 6, 17, 19, 21) and the
scheduler's behaviour under clock jumps (row 20, with a fake clock)."""

from __future__ import annotations

import json
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from monitor.demo.fakehub import FakeHub
from monitor.demo.hub_repos import add_lineage
from monitor.store import Store
from support.daemon_harness import UNSCORED_WATCHER_POLICY, DaemonProcess, wait_for
from tests.test_daemon import write_policy


@pytest.fixture
def hub():
    # One per test: fault injection (outages, 429s) must not leak into the next test.
    with FakeHub() as server:
        add_lineage(server, "fake-org/tiny", steps=(1000, 2000))
        yield server


@pytest.fixture
def one_step_hub():
    """A hub with a single checkpoint, for the scoring-child faults: each failed attempt costs
    a fresh scoring worker (a torch import), and a second checkpoint only added attempts the
    test never looks at, and a score still running when the daemon was stopped (20 s drain)."""
    with FakeHub() as server:
        add_lineage(server, "fake-org/tiny", steps=(1000,))
        yield server


# No test here but the scoring-child faults looks at a score, yet the poll asks for one of what
# it gated: those daemons run UNSCORED_WATCHER_POLICY, whose gate refuses every checkpoint
# (nothing fetched, no scoring worker importing torch). What the tests check (polls, disk and
# database faults, pruning) is the same.
def unscored_policy(folder: Path) -> Path:
    return write_policy(folder, UNSCORED_WATCHER_POLICY)


def alerts_file(policies: Path) -> list[dict]:
    path = policies / "alerts.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.slow
def test_rate_limit_and_long_outage(hub, tmp_path):
    """Row 6: no request before Retry-After, watermark kept, one meta-alert per outage."""
    policies = unscored_policy(tmp_path / "policies")
    hub.reset_log()
    # A daemon that ignored Retry-After would ask again at the next poll, a second later (on a
    # loaded machine perhaps two): 3 s keeps a margin over that.
    hub.fail_next(1, 429, retry_after=3, path_prefix="/api/models/fake-org/tiny/refs")
    # huggingface_hub retries a failing listing page itself, five times, so the circuit opens
    # after one failed poll here rather than the default five; the outage's 503s say
    # `Retry-After: 0`, so those retries wait 1 s each instead of 1, 2, 4, 8 and 8 s (23 s of
    # the test's time, in which nothing it checks happens).
    args = ["--cache-dir", str(tmp_path / "cache"), "--hub-max-wait", "0s", "--hub-cooldown", "3s",
            "--hub-circuit-threshold", "1", "--score-every", "1h"]
    with DaemonProcess(policies, tmp_path / "state", endpoint=hub.url, args=args) as daemon:
        rows = wait_for(lambda: daemon.get_json("/checkpoints")["items"], timeout=60, what="discovery after the 429")
        assert sorted(r["refs"][0] for r in rows) == ["step1000", "step2000"]  # watermark was kept
        log = hub.requests
        limited = [r for r in log if r.status == 429]
        assert len(limited) == 1
        after = [r for r in log if r.time > limited[0].time]
        assert after and min(r.time for r in after) - limited[0].time >= 3.0

        hub.set_outage(True, retry_after=0)
        try:
            outage = wait_for(lambda: daemon.status()["hub_outages"], timeout=120, what="the outage row")
            assert len(outage) == 1
            meta = wait_for(lambda: [a for a in alerts_file(policies) if "hub-outage" in json.dumps(a)],
                            timeout=30, what="the outage meta-alert")
            polls_then = daemon.status()["jobs"]["poll"]["runs"]
            wait_for(lambda: daemon.status()["jobs"]["poll"]["runs"] >= polls_then + 3, timeout=120,
                     what="more polls during the outage")
        finally:
            hub.set_outage(False)
        assert daemon.stop() == 0
    with Store.open(tmp_path / "state" / "lstar.duckdb", read_only=True) as store:
        assert len(store.hub_outages()) == 1
        n_meta = store.query("SELECT count(*) AS n FROM alerts WHERE alert_key LIKE 'meta|%|hub-outage|%'")
        assert n_meta[0]["n"] == 1
    assert len([a for a in alerts_file(policies) if "hub-outage" in json.dumps(a)]) == len(meta) == 1


@pytest.mark.parametrize("failpoint, extra, reason", [
    # Each of the 3 attempts waits out the limit (it runs once the worker is ready): the least
    # the setting takes.
    ("hang_score_child", ["--score-timeout", "1s"], "killed after the 1 s time limit"),
    # Out of memory is retried (a larger --score-memory would score it): failed after 3 tries.
    # The fail point allocates until any limit stops it. At start the daemon measures what
    # importing torch needs (a probe child, about 1.1 GiB of address space here) and tries a
    # limit under 1.5 times that in a second probe: 2 GiB is clear of it, so torch is imported
    # by one probe, not two (both probes: 17.6 CPU-seconds, measured under load).
    ("oom_score_child", ["--score-memory", "2G"],
     "gave up after 3 attempts: ScoringMemoryError: scoring ran out of memory under the --score-memory limit "
     "of 2.00 GiB"),
])
@pytest.mark.slow
def test_scoring_child_is_killed_and_the_daemon_goes_on(one_step_hub, tmp_path, failpoint, extra, reason):
    """Row 17: a loader out of time or memory ends in its child; the daemon keeps running."""
    hub = one_step_hub
    policies = write_policy(tmp_path / "policies")
    args = ["--cache-dir", str(tmp_path / "cache"), *extra]
    with DaemonProcess(policies, tmp_path / "state", endpoint=hub.url, args=args, start_timeout=240,
                       env={"LSTAR_FAILPOINT": failpoint}) as daemon:
        # polled each second, not every 0.2 s: the three attempts take tens of seconds, each
        # request builds a new httpx client (about 34 ms of CPU for its SSL context) and the
        # daemon answers it; a failed row stays failed, so a later look sees it as well
        rows = wait_for(lambda: [r for r in daemon.get_json("/checkpoints?status=failed")["items"]],
                        timeout=180, every=1.0, what=f"a failed row\n{daemon.log()}")
        assert reason in rows[0]["reason"]
        assert daemon.proc.poll() is None
        assert daemon.request("/health")[0] == 200
        assert daemon.stop() == 0


@pytest.mark.slow
def test_disk_full_is_retried_reported_and_leaves_the_database_intact(hub, tmp_path):
    """Row 19: writes fail with ENOSPC, the next ticks retry, the operator is told."""
    policies = unscored_policy(tmp_path / "policies")
    with DaemonProcess(policies, tmp_path / "state", endpoint=hub.url,
                       args=["--cache-dir", str(tmp_path / "cache"), "--score-every", "1h"],
                       env={"LSTAR_FAILPOINT": "enospc_writes=5"}) as daemon:
        wait_for(lambda: len(daemon.get_json("/checkpoints")["items"]) == 2, timeout=60, what="discovery after the disk frees")
        status = wait_for(lambda: (s := daemon.status())["disk"]["history"] and s, timeout=30,
                          what="the disk episode in /status")
        episode = status["disk"]["history"][0]
        assert "No space left on device" in episode["error"] and episode["failures"] >= 1
        assert status["disk"]["error"] is None
        assert "DISK FULL" in daemon.log()
        wait_for(lambda: [a for a in alerts_file(policies) if "disk-full" in json.dumps(a)], timeout=30,
                 what="the operator alert")
        assert daemon.stop() == 0
    with Store.open(tmp_path / "state" / "lstar.duckdb", read_only=True) as store:
        rows = store.list_checkpoints()
        assert sorted(r.refs[0] for r in rows) == ["step1000", "step2000"]
        assert len({(r.repo, r.sha) for r in rows}) == 2


def _health(daemon: DaemonProcess) -> tuple[int, dict]:
    status, body = daemon.request("/health")
    return status, json.loads(body)


def _runs(daemon: DaemonProcess) -> dict[str, int]:
    return {name: job["runs"] for name, job in daemon.status()["jobs"].items()}


@pytest.mark.slow
def test_disk_full_keeps_health_false_until_a_real_write_and_tells_the_operator_once(hub, tmp_path):
    """Row 19 without flapping: while the disk stays full, jobs that write nothing go on
    succeeding and /health stays 503 on one episode; freeing the disk ends it after a job's
    write commits, and the operator gets one alert for the whole episode."""
    policies = unscored_policy(tmp_path / "policies")
    full = tmp_path / "the-disk-is-full"
    full.touch()
    with DaemonProcess(policies, tmp_path / "state", endpoint=hub.url,
                       args=["--cache-dir", str(tmp_path / "cache"), "--score-every", "1h"],
                       env={"LSTAR_FAILPOINT": f"enospc_while={full}"}) as daemon:
        code, body = wait_for(lambda: (h := _health(daemon))[0] == 503 and h, timeout=60,
                              what=f"/health to report the full disk\n{daemon.log()}")
        assert body["reasons"][0].startswith("disk full since") and "No space left on device" in body["reasons"][0]
        since = daemon.status()["disk"]["error"]["since"]

        before = _runs(daemon)
        wait_for(lambda: all(_runs(daemon)[job] >= before[job] + 3 for job in ("reload", "evaluate", "poll")),
                 timeout=60, what="more ticks while the disk is full")
        status = daemon.status()
        assert status["jobs"]["reload"]["last_error"] is None and status["jobs"]["evaluate"]["last_error"] is None
        assert "No space left on device" in status["jobs"]["poll"]["last_error"]
        assert _health(daemon)[0] == 503
        assert status["disk"]["error"]["since"] == since and status["disk"]["history"] == []
        assert status["disk"]["error"]["failures"] >= 3
        assert daemon.log().count("DISK FULL") == 1
        assert status["checkpoints"] == {}

        full.unlink()
        status = wait_for(lambda: (s := daemon.status())["disk"]["history"] and s, timeout=60,
                          what="the end of the episode")
        (episode,) = status["disk"]["history"]
        assert episode["since"] == since and episode["recovered_by"] == "poll"
        assert status["disk"]["error"] is None and _health(daemon)[0] == 200
        told = wait_for(lambda: [a for a in alerts_file(policies) if "disk-full" in json.dumps(a)], timeout=30,
                        what="the operator alert")
        wait_for(lambda: len(daemon.get_json("/checkpoints")["items"]) == 2, timeout=60, what="discovery after the disk frees")
        assert daemon.stop() == 0
    assert len(told) == 1 and since in json.dumps(told[0])
    with Store.open(tmp_path / "state" / "lstar.duckdb", read_only=True) as store:
        assert store.query("SELECT count(*) AS n FROM alerts WHERE alert_key LIKE 'meta|%|disk-full|%'")[0]["n"] == 1


@pytest.mark.slow
def test_a_fatal_database_error_is_unhealthy_until_the_database_is_reopened(hub, tmp_path):
    """After a DuckDB FatalException the connection is invalidated: /health says so for as long
    as re-opening fails, jobs pause, and once the file opens again everything committed before
    is there and writes work."""
    policies = unscored_policy(tmp_path / "policies")
    fatal = tmp_path / "the-database-is-invalidated"
    with DaemonProcess(policies, tmp_path / "state", endpoint=hub.url,
                       args=["--cache-dir", str(tmp_path / "cache"), "--score-every", "1h"],
                       env={"LSTAR_FAILPOINT": f"fatal_while={fatal}"}) as daemon:
        wait_for(lambda: len(daemon.get_json("/checkpoints")["items"]) == 2, timeout=60, what="the first discovery")
        fatal.touch()  # the next poll's write hits the fatal error
        code, body = wait_for(lambda: (h := _health(daemon))[0] == 503 and h, timeout=60,
                              what=f"/health to report the invalidated database\n{daemon.log()}")
        assert body["reasons"][0].startswith("database invalidated since")
        assert "FatalException" in body["reasons"][0]

        attempts = wait_for(lambda: (e := daemon.status()["database"]["error"]) and e["reopen_attempts"] >= 3 and e,
                            timeout=60, what="re-open attempts")
        assert "cannot be restarted yet" in attempts["reopen_error"]
        polls = daemon.status()["jobs"]["poll"]["runs"]
        assert _health(daemon)[0] == 503
        assert daemon.status()["jobs"]["poll"]["runs"] == polls  # jobs pause while the database is invalid

        fatal.unlink()
        wait_for(lambda: _health(daemon)[0] == 200, timeout=60, what="/health after the database re-opens")
        (episode,) = daemon.status()["database"]["history"]
        assert episode["reopened_at"] > episode["since"]
        add_lineage(hub, "fake-org/tiny-later", steps=(5,), seed=11, start=datetime.now(timezone.utc))
        rows = wait_for(lambda: (r := daemon.get_json("/checkpoints")["items"]) and len(r) == 3 and r, timeout=60,
                        what="a write after the re-open")
        assert "DATABASE INVALIDATED" in daemon.log()
        assert daemon.stop() == 0
    with Store.open(tmp_path / "state" / "lstar.duckdb", read_only=True) as store:
        assert sorted(r.repo for r in store.list_checkpoints()) == sorted(r["repo"] for r in rows)


@pytest.mark.slow
def test_the_daemon_prunes_old_hub_polls_and_keeps_recent_ones(hub, tmp_path):
    """Disk use stays bounded: the prune job deletes poll-log rows older than --retention and
    keeps the recent ones (and each rule's newest)."""
    state = tmp_path / "state"
    now = datetime.now(timezone.utc)
    with Store.open(state / "lstar.duckdb") as store:
        for age_days in (400, 45, 2):
            store.record_hub_poll("old-rule", "old-rule", now=now - timedelta(days=age_days), ok=True, listed=0,
                                  new=0, requests=1)
    with DaemonProcess(unscored_policy(tmp_path / "policies"), state, endpoint=hub.url,
                       args=["--cache-dir", str(tmp_path / "cache"), "--score-every", "1h", "--retention", "30d"]
                       ) as daemon:
        result = wait_for(lambda: daemon.status()["jobs"]["prune"]["last_result"], timeout=60,
                          what=f"the prune job\n{daemon.log()}")
        assert result == {"hub_polls": 2, "delivery_attempts": 0, "hub_outages": 0}
        wait_for(lambda: len(daemon.get_json("/checkpoints")["items"]) == 2, timeout=60, what="the poll")
        assert daemon.stop() == 0
    with Store.open(state / "lstar.duckdb", read_only=True) as store:
        ages = sorted((now - p.polled_at).days for p in store.hub_polls() if p.rule_key == "old-rule")
        assert ages == [2]
        assert any(p.rule_name == "tiny" for p in store.hub_polls())  # the daemon's own polls stay


@pytest.mark.slow
def test_a_hung_job_is_reported_by_the_watchdog_and_health(hub, tmp_path):
    """Row 21."""
    policies = write_policy(tmp_path / "policies")
    with DaemonProcess(policies, tmp_path / "state", endpoint=hub.url,
                       args=["--stuck-after", "2s", "--score-every", "1h"],
                       env={"LSTAR_FAILPOINT": "hang_poll"}) as daemon:
        body = wait_for(lambda: (r := daemon.request("/health"))[0] == 503 and json.loads(r[1]),
                        timeout=30, what="/health to turn 503")
        assert body["ok"] is False and body["reasons"][0].startswith("job poll has been running for")
        status = daemon.status()
        assert list(status["stuck"]) == ["poll"]
        evaluated = status["jobs"]["evaluate"]["runs"]
        wait_for(lambda: daemon.status()["jobs"]["evaluate"]["runs"] > evaluated, timeout=30,
                 what="other jobs to keep running")
        assert "watchdog: job poll has been running" in daemon.log()
        assert daemon.stop() == 0


def _counting_executor():
    """A DebugExecutor that records run times instead of running jobs (the scheduler's seam)."""
    from apscheduler.executors.debug import DebugExecutor

    class Counting(DebugExecutor):
        runs: list[datetime] = []

        def _do_submit_job(self, job, run_times):
            self.runs.append(run_times[-1])
            self._run_job_success(job.id, [])  # finished at once: one instance at a time holds

    return Counting()


def test_clock_jumps_and_dst_cause_no_double_runs(monkeypatch):
    """Row 20: the daemon's scheduler (UTC interval triggers, coalesce, max one instance)."""
    import apscheduler.schedulers.base as base
    from apscheduler.schedulers.base import STATE_RUNNING

    from monitor.service.scheduler import add_interval_job, build_scheduler

    clock = {"now": datetime(2025, 3, 30, 0, 30, tzinfo=timezone.utc)}  # Europe's DST change at 01:00 UTC

    class FakeDatetime(datetime):
        @classmethod
        def now(cls, tz=None):
            return clock["now"].astimezone(tz) if tz else clock["now"]

    monkeypatch.setattr(base, "datetime", FakeDatetime)
    executor = _counting_executor()
    scheduler = build_scheduler({"poll": 3600}, executor=executor)
    assert str(scheduler.timezone) == "UTC"
    scheduler.start(paused=True)
    add_interval_job(scheduler, "poll", lambda: None, 3600, clock["now"])
    job = scheduler.get_job("poll")
    assert (job.coalesce, job.max_instances, job.misfire_grace_time) == (True, 1, 3600)
    time.sleep(0.2)  # the scheduler thread has seen the job while paused and now waits indefinitely
    scheduler.state = STATE_RUNNING  # ticks are driven by hand below, on the fake clock

    def tick(to: datetime) -> None:
        clock["now"] = to
        scheduler._process_jobs()

    start = clock["now"]
    tick(start)                                   # first run
    tick(start + timedelta(minutes=30))           # across the DST change: nothing due
    tick(start + timedelta(hours=1))              # second run, one hour later in UTC
    tick(start + timedelta(hours=4, minutes=10))  # clock jumps 3 h forward: one coalesced run
    tick(start + timedelta(hours=2))              # and back: nothing runs twice
    tick(start + timedelta(hours=4, minutes=20))
    scheduler.shutdown(wait=False)
    assert executor.runs == [start, start + timedelta(hours=1), start + timedelta(hours=4)]
