"""Leases over checkpoint rows: compare-and-set claims, retries, and kill -9 recovery.

The crash tests run a real worker process (fetch from the fake Hub into the cache, then a
marker row written atomically with completion) and SIGKILL it at named fail points; a
restarted worker must finish the job exactly once and leave the database consistent.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from monitor.errors import HubError, IntegrityError
from monitor.hub.client import HubClient
from monitor.hub.gate import gate_pending
from monitor.hub.poll import Candidate, poll_rule
from monitor.hub.queue import Outcome, claim_next, complete, process_pending, release
from monitor.hub.rules import WatchRule
from monitor.store import Store

REPO_ROOT = Path(__file__).resolve().parent.parent
T0 = datetime(2024, 5, 1, tzinfo=timezone.utc)
LEASE_S = 600


@pytest.fixture
def store(tmp_path):
    with Store.open(tmp_path / "state.duckdb") as s:
        s.conn.execute("CREATE TABLE job_markers (checkpoint_id BIGINT, owner VARCHAR, digest VARCHAR)")
        yield s


def add_gated(store: Store, *names: str) -> list[int]:
    """Rows in status `gated`, discovered in the order given."""
    for i, name in enumerate(names):
        store.record_discoveries("k", "rule", "http://hub", [Candidate(name, f"{i:040x}", ("main",))],
                                 watermark=None, boundary=[], now=T0 + timedelta(seconds=i), requests=0,
                                 listed=1)
    ids = [r.id for r in store.list_checkpoints()]
    for checkpoint_id in ids:
        assert store.set_checkpoint_verdict(checkpoint_id, expect_status="discovered", status="gated",
                                            reason=None, meta=None, now=T0)
    return ids


def markers(store: Store) -> list[tuple]:
    return store.conn.execute("SELECT checkpoint_id, owner FROM job_markers ORDER BY owner").fetchall()


def marker_writer(checkpoint_id: int, owner: str):
    return lambda conn: conn.execute("INSERT INTO job_markers VALUES (?, ?, 'x')", [checkpoint_id, owner])


# -- claims and completion ----------------------------------------------------------------------
def test_claims_are_exclusive_until_the_lease_expires(store):
    first, second = add_gated(store, "org/a", "org/b")
    a = claim_next(store, "A", T0, LEASE_S)
    b = claim_next(store, "B", T0, LEASE_S)
    assert (a.id, b.id) == (first, second)
    assert a.attempts == 1 and a.lease_owner == "A"
    assert a.lease_expires_at == T0 + timedelta(seconds=LEASE_S)
    assert claim_next(store, "B", T0 + timedelta(seconds=LEASE_S - 1), LEASE_S) is None

    later = T0 + timedelta(seconds=LEASE_S)
    again = claim_next(store, "B", later, LEASE_S)
    assert again.id == first and again.attempts == 2
    assert again.reason == "lease of A expired during attempt 1"

    # A comes back after its lease was taken over: nothing it writes lands.
    assert not complete(store, first, "A", "scored", {"by": "A"}, write=marker_writer(first, "A"))
    assert complete(store, first, "B", "scored", {"by": "B"}, write=marker_writer(first, "B"), now=later)
    row = store.get_checkpoint(first)
    assert (row.status, row.lease_owner, row.lease_expires_at, row.reason) == \
        ("scored", None, None, None)
    assert row.meta["by"] == "B"
    assert markers(store) == [(first, "B")]
    assert not complete(store, first, "B", "scored")             # no lease any more


def test_a_failing_write_rolls_back_the_completion(store):
    (only,) = add_gated(store, "org/a")
    claim_next(store, "A", T0, LEASE_S)

    def broken(conn):
        marker_writer(only, "A")(conn)
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        complete(store, only, "A", "scored", write=broken)
    row = store.get_checkpoint(only)
    assert row.status == "gated" and row.lease_owner == "A" and markers(store) == []


def test_three_attempts_then_failed_with_the_last_reason(store):
    (only,) = add_gated(store, "org/a")
    now = T0
    for attempt, owner in enumerate(("w1", "w2", "w3"), start=1):
        job = claim_next(store, owner, now, LEASE_S)
        assert job.attempts == attempt
        now += timedelta(seconds=LEASE_S)                          # each worker dies silently
    assert claim_next(store, "w4", now, LEASE_S) is None
    row = store.get_checkpoint(only)
    assert row.status == "failed" and row.lease_owner is None
    assert row.reason == "gave up after 3 attempts: lease of w3 expired during attempt 3"


def test_release_counts_attempts_unless_refunded(store):
    (only,) = add_gated(store, "org/a")
    claim_next(store, "A", T0, LEASE_S)
    assert release(store, only, "A", "hub down", refund=True) == "gated"
    assert store.get_checkpoint(only).attempts == 0
    for n in range(1, 4):
        claim_next(store, "A", T0, LEASE_S)
        status = release(store, only, "A", f"boom {n}")
        assert status == ("failed" if n == 3 else "gated")
    assert store.get_checkpoint(only).reason == "gave up after 3 attempts: boom 3"
    assert release(store, only, "A", "late") is None              # no lease held


def test_process_pending_sorts_failures(store):
    bad, flaky, fine = add_gated(store, "org/bad", "org/flaky", "org/fine")
    seen: list[str] = []

    def worker(job):
        seen.append(job.repo)
        if job.repo == "org/bad":
            raise IntegrityError("org/bad: model.safetensors sha256 differs")
        if job.repo == "org/flaky":
            raise RuntimeError("out of memory")
        return Outcome("scored", meta={"ok": True}, write=marker_writer(job.id, "P"))

    results = process_pending(store, worker, owner="P", now_fn=lambda: T0)
    assert seen == ["org/bad", "org/flaky", "org/fine"]             # each tried once per run
    by_repo = {r.repo: r for r in results}
    assert by_repo["org/bad"].status == "failed" and "sha256 differs" in by_repo["org/bad"].reason
    assert by_repo["org/flaky"].status == "gated" and by_repo["org/flaky"].reason == \
        "RuntimeError: out of memory"
    assert by_repo["org/fine"].status == "scored" and markers(store) == [(fine, "P")]

    for _ in range(2):
        process_pending(store, worker, owner="P", now_fn=lambda: T0)
    row = store.get_checkpoint(flaky)
    assert row.status == "failed" and row.attempts == 3
    assert row.reason == "gave up after 3 attempts: RuntimeError: out of memory"
    assert process_pending(store, worker, owner="P", now_fn=lambda: T0) == []
    assert store.get_checkpoint(bad).attempts == 1


def test_a_hub_outage_stops_the_run_without_using_attempts(store):
    first, second = add_gated(store, "org/a", "org/b")

    def worker(job):
        raise HubError("the Hub failed model_info: 503")

    results = process_pending(store, worker, owner="P", now_fn=lambda: T0)
    assert [r.id for r in results] == [first]
    row = store.get_checkpoint(first)
    assert row.attempts == 0 and row.lease_owner is None
    assert row.reason.startswith("waiting for the Hub:")
    assert store.get_checkpoint(second).attempts == 0


# -- kill -9 ----------------------------------------------------------------------------------------
WORKER = r"""
import hashlib, json, sys
from datetime import datetime
from pathlib import Path
from monitor.hub.fetch import fetch_job
from monitor.hub.client import HubClient
from monitor.failpoints import failpoint
from monitor.hub.queue import Outcome, process_pending
from monitor.store import Store

db, endpoint, cache, owner = sys.argv[1], sys.argv[2], Path(sys.argv[3]), sys.argv[4]
now = datetime.fromisoformat(sys.argv[5])
with Store.open(db) as store:
    client = HubClient(endpoint, token=False, store=store)

    def worker(job):
        snapshot = fetch_job(store, job, owner=owner, client=client, cache_dir=cache, now_fn=lambda: now)
        failpoint("mid_job")
        digest = hashlib.sha256((snapshot / "model.safetensors").read_bytes()).hexdigest()

        def write(conn):
            conn.execute("INSERT INTO job_markers VALUES (?, ?, ?)", [job.id, owner, digest])

        return Outcome("scored", meta={"weights_sha256": digest}, write=write)

    results = process_pending(store, worker, owner=owner, now_fn=lambda: now, lease_s=%d)
print(json.dumps([r.as_dict() for r in results]))
""" % LEASE_S


@pytest.fixture(scope="module")
def crash_hub(tmp_path_factory):
    from monitor.demo.fakehub import FakeHub
    from monitor.demo.hub_repos import tiny_model_files

    files = tiny_model_files("llama-2", arch="llama", seed=1,
                             build_dir=tmp_path_factory.getbasetemp() / "hub-build")
    with FakeHub() as hub:
        sha = hub.add_repo("crash-org/tiny", files, last_modified=T0, pipeline_tag="text-generation")
        yield hub, sha, files


@pytest.fixture
def crash_env(crash_hub, tmp_path):
    """A database holding one gated row for crash-org/tiny, and how to run a worker on it."""
    hub, sha, files = crash_hub
    db, cache = tmp_path / "state.duckdb", tmp_path / "hf" / "hub"
    with Store.open(db) as store:
        client = HubClient(hub.url, token=False, store=store)
        rule = WatchRule(name="crash", author="crash-org")
        assert poll_rule(store, client, rule).new == 1
        assert [o.status for o in gate_pending(store, client, [rule], cache_dir=cache)] == ["gated"]
        store.conn.execute("CREATE TABLE job_markers (checkpoint_id BIGINT, owner VARCHAR, digest VARCHAR)")

    def run(owner: str, now: datetime, failpoint: str | None = None) -> subprocess.CompletedProcess:
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "HF_HOME": str(tmp_path / "hf"),
               "HF_HUB_DISABLE_TELEMETRY": "1", "DISABLE_SAFETENSORS_CONVERSION": "1",
               "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
        env.pop("LSTAR_FAILPOINT", None)
        env.pop("HF_TOKEN", None)
        if failpoint:
            env["LSTAR_FAILPOINT"] = failpoint
        return subprocess.run([sys.executable, "-c", WORKER, str(db), hub.url, str(cache), owner,
                               now.isoformat()], env=env, capture_output=True, text=True, timeout=120)

    def state() -> tuple[dict, list[tuple]]:
        with Store.open(db, read_only=True) as s:
            (row,) = s.list_checkpoints()
            marks = s.conn.execute("SELECT owner, digest FROM job_markers").fetchall()
            assert s.info()["tables"]["checkpoints"] == 1
        return row, marks

    return run, state, sha, files, cache


@pytest.mark.slow
@pytest.mark.parametrize("point", ["mid_download", "mid_job", "before_complete"])
def test_worker_killed_at_a_fail_point_completes_exactly_once_after_restart(crash_env, point):
    run, state, sha, files, cache = crash_env
    killed = run("w1", T0, failpoint=point)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    row, marks = state()
    assert row.lease_owner == "w1" and row.attempts == 1 and marks == []
    assert row.status == ("fetched" if point in ("mid_job", "before_complete") else "gated")

    done = run("w2", T0 + timedelta(seconds=LEASE_S + 1))
    assert done.returncode == 0, done.stderr[-2000:]
    assert [r["status"] for r in json.loads(done.stdout)] == ["scored"]
    row, marks = state()
    digest = hashlib.sha256(files["model.safetensors"]).hexdigest()
    assert marks == [("w2", digest)]
    assert (row.status, row.attempts, row.lease_owner, row.reason) == ("scored", 2, None, None)
    assert row.meta["weights_sha256"] == digest
    assert Path(row.meta["snapshot_dir"]).resolve().is_relative_to(cache.resolve())

    if point == "mid_job":                                   # a further run finds nothing to do
        idle = run("w3", T0 + timedelta(seconds=3 * LEASE_S))
        assert idle.returncode == 0 and json.loads(idle.stdout) == []
        assert state()[1] == [("w2", digest)]


@pytest.mark.slow
def test_killed_three_times_then_failed_with_reason(crash_env):
    run, state, sha, files, cache = crash_env
    now = T0
    for owner in ("w1", "w2", "w3"):
        assert run(owner, now, failpoint="mid_job").returncode == -signal.SIGKILL
        now += timedelta(seconds=LEASE_S + 1)
    last = run("w4", now)
    assert last.returncode == 0 and json.loads(last.stdout) == []
    row, marks = state()
    assert marks == [] and row.status == "failed" and row.attempts == 3
    assert row.reason == "gave up after 3 attempts: lease of w3 expired during attempt 3"


@pytest.mark.slow
def test_a_tampered_download_fails_the_job_and_nothing_is_scored(crash_hub, crash_env):
    from monitor.hub.fetch import fetch_job

    hub, sha, files = crash_hub
    run, state, _, _, cache = crash_env
    original = files["model.safetensors"]
    hub.tamper("crash-org/tiny", "model.safetensors", original[:-1] + bytes([original[-1] ^ 1]), sha)
    db = cache.parent.parent / "state.duckdb"
    try:
        with Store.open(db) as store:
            client = HubClient(hub.url, token=False, store=store)

            def worker(job):
                fetch_job(store, job, owner="P", client=client, cache_dir=cache, now_fn=lambda: T0)
                return Outcome("scored", write=marker_writer(job.id, "P"))

            (result,) = process_pending(store, worker, owner="P", now_fn=lambda: T0)
    finally:
        hub.tamper("crash-org/tiny", "model.safetensors", original, sha)
    row, marks = state()
    assert marks == [] and row.status == "failed" and row.attempts == 1
    assert result.status == "failed" and "model.safetensors sha256 is" in row.reason
    assert row.meta["error"] == "IntegrityError"
