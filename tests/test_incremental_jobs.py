"""Periodic jobs cost what is new, not what exists: an evaluation tick reads the queued runs
(none when idle) instead of every score run and prediction; grouping reads one row per due
group; discovery looks a poll's candidates up in one query; and a query whose connection is
closed under it at shutdown fails with a clear error, not a TypeError."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from monitor.alerts import evaluate_pending
from monitor.alerts.predict import TaskPrediction
from monitor.errors import StoreError
from monitor.policy.load import load_policy
from monitor.store import Store
from support.notifications import notify_one
from support.scores import (
    CALIB_V0_SHA256,
    TEST_SPEC,
    fake_sha,
    record_fake_score,
)

T0 = datetime(2025, 5, 1, 12, tzinfo=timezone.utc)


class Counting:
    """The store's connection, noting each statement and the rows fetched from it."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn
        self.statements: list[str] = []
        self.rows = 0

    def execute(self, sql: str, *args: Any, **kwargs: Any) -> Any:
        self.statements.append(" ".join(sql.split()))
        return _Result(self, self._conn.execute(sql, *args, **kwargs))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


class _Result:
    def __init__(self, owner: Counting, result: Any) -> None:
        self._owner, self._result = owner, result

    def fetchall(self) -> list[Any]:
        rows = self._result.fetchall()
        self._owner.rows += len(rows)
        return rows

    def fetchone(self) -> Any:
        row = self._result.fetchone()
        self._owner.rows += row is not None
        return row

    def __getattr__(self, name: str) -> Any:
        return getattr(self._result, name)


def counted(store: Store) -> Counting:
    counter = Counting(store._conn)
    store._conn = counter  # type: ignore[assignment]
    return counter


def uncounted(store: Store, counter: Counting) -> None:
    store._conn = counter._conn


def write_policy(folder: Path, *, author: str | None = None, name: str = "gov") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    watch = f"watch:\n  - name: org\n    author: {author}\n" if author else ""
    path = folder / f"{name}.yaml"
    path.write_text(
        f"name: {name}\n{watch}corpora: {{public: '{CALIB_V0_SHA256}'}}\n"
        "tasks:\n  - name: cloze\n    curve: cloze.json\n"
        f"route: {{receiver: log, group_wait: 0s, group_interval: 0s}}\n"
        f"receivers:\n  - name: log\n    file: {{path: {folder / 'alerts.jsonl'}}}\n")
    return path


def predictor(policy: Any, task: Any, score: Any) -> TaskPrediction:
    """A stand-in curve: P̂ falls with L*; always clear (no alerts to route)."""
    p = 0.1 + 0.01 * score.lstar
    return TaskPrediction(task=task.name, lstar=score.lstar, se=score.se, p_hat=p, lo=p - 0.01, hi=p + 0.01,
                          floor=0.25, margin=0.05, confidence=0.95, state="clear", curve_id="c1",
                          corpus_sha256=score.corpus_sha256)


def bulk_old_runs(store: Store, n: int, *, policy: str = "gov", task: str = "cloze") -> list[str]:
    """`n` score runs with their predictions, written by SQL as a long history would be (no
    queue rows: they were evaluated long ago)."""
    run_ids = [f"old{i:06d}" for i in range(n)]
    store.conn.execute(
        "INSERT INTO score_runs (run_id, model_repo, model_sha, model_source, tokenizer_fingerprint, "
        "corpus_sha256, spec_version, window_len, stride, prefix_policy, dtype, device, n_tokens, n_bytes, "
        "nll_sum, ce, ce_unigram, lstar, l_rel, l_gain, bits_per_byte, tokens_per_byte, se_ce, slices, spec, "
        "model, library_versions, wall_s, tokens_per_s, finished_at) "
        "SELECT 'old' || lpad(i::VARCHAR, 6, '0'), 'org/old', md5(i::VARCHAR) || 'abcdefgh', 'hub', 'f', ?, "
        "?, ?, ?, ?, 'float32', 'cpu', 1000, 4000, 9000, 9, 7, 2, 1.2, -0.2, 1, 0.25, 0.02, '{}', '{}', '{}', "
        "'{}', 1, 1000, ?::TIMESTAMPTZ - INTERVAL 1 DAY * (? - i) FROM range(?) t(i)",
        [CALIB_V0_SHA256, TEST_SPEC["spec_version"], TEST_SPEC["window_len"], TEST_SPEC["stride"],
         TEST_SPEC["prefix_policy"], T0, n, n])
    store.conn.execute(
        "INSERT INTO predictions (policy, task, run_id, repo, commit_sha, lineage, corpus_sha256, lstar, se, "
        "p_hat, lo, hi, threshold, state, curve_id, detail, evaluated_at) SELECT ?, ?, run_id, model_repo, "
        "model_sha, model_repo, corpus_sha256, 2, 0.02, 0.12, 0.11, 0.13, 0.3, 'clear', 'c1', '{}', finished_at "
        "FROM score_runs WHERE run_id LIKE 'old%'", [policy, task])
    return run_ids


def idle_tick_cost(tmp_path: Path, n_old: int) -> tuple[Counting, list[str]]:
    policy = load_policy(write_policy(tmp_path / "policies"), check_curves=False)
    with Store.open(tmp_path / f"state{n_old}" / "lstar.duckdb") as store:
        bulk_old_runs(store, n_old)
        evaluate_pending(store, [policy], now=T0, predictor=predictor)   # first tick: the one full scan
        new = [record_fake_score(store, repo="org/new", sha=fake_sha(f"n{i}"), lstar=1.5, se=0.02,
                                 finished_at=T0 + timedelta(hours=i)) for i in range(2)]
        counter = counted(store)
        report = evaluate_pending(store, [policy], now=T0 + timedelta(hours=3), predictor=predictor)
        assert report.predictions == 2
        with_new = list(counter.statements)
        counter.statements.clear()
        counter.rows = 0
        again = evaluate_pending(store, [policy], now=T0 + timedelta(hours=4), predictor=predictor)
        assert again.predictions == 0
        uncounted(store, counter)
        evaluated = {r["run_id"] for r in store.query("SELECT run_id FROM predictions WHERE run_id NOT LIKE 'old%'")}
        assert evaluated == set(new)
    return counter, with_new


def test_an_idle_evaluation_tick_reads_no_score_run_and_its_cost_does_not_grow_with_history(tmp_path):
    small, small_new = idle_tick_cost(tmp_path, 50)
    large, large_new = idle_tick_cost(tmp_path, 2000)
    # Nothing new: no statement reads score_runs or predictions, and the tick does the same
    # statements, fetching the same rows, over 50 or 2,000 evaluated runs.
    assert not [s for s in large.statements if "score_runs" in s or "predictions" in s]
    assert large.statements == small.statements
    assert large.rows == small.rows
    # Two new runs: score_runs is read only by run id, for the two queued runs (the candidates,
    # and where the batch's runs sit in their lineages).
    reads = [s for s in large_new if "FROM score_runs" in s]
    assert reads and all("WHERE run_id IN (?, ?)" in s or "WHERE r.run_id IN (SELECT unnest(?::VARCHAR[]))" in s
                         for s in reads)
    assert len(large_new) == len(small_new)


def test_the_queued_candidates_are_the_new_runs_only(tmp_path):
    policy = load_policy(write_policy(tmp_path / "policies"), check_curves=False)
    with Store.open(tmp_path / "lstar.duckdb") as store:
        bulk_old_runs(store, 300)
        evaluate_pending(store, [policy], now=T0, predictor=predictor)
        assert store.evaluation_queue() == {}
        new = [record_fake_score(store, repo="org/new", sha=fake_sha(f"n{i}"), lstar=1.0 + i, se=0.02,
                                 finished_at=T0 + timedelta(hours=i)) for i in range(3)]
        assert store.evaluation_queue() == {r: CALIB_V0_SHA256 for r in new}
        rows = store.queued_candidates("gov", "cloze", CALIB_V0_SHA256, None, list(store.evaluation_queue()))
        assert [r.run_id for r in rows] == new   # oldest first, none of the 300 old ones
        evaluate_pending(store, [policy], now=T0 + timedelta(hours=5), predictor=predictor)
        assert store.evaluation_queue() == {}


def test_a_changed_scope_scans_every_run_once(tmp_path):
    """Watch rules that now cover a repo evaluate its old scores: a new scope is one full scan."""
    narrow = load_policy(write_policy(tmp_path / "a", author="someone-else"), check_curves=False)
    wide = load_policy(write_policy(tmp_path / "b", author="org"), check_curves=False)
    with Store.open(tmp_path / "lstar.duckdb") as store:
        runs = [record_fake_score(store, repo="org/m", sha=fake_sha(f"s{i}"), lstar=1.0, se=0.02,
                                  finished_at=T0 + timedelta(hours=i)) for i in range(3)]
        assert evaluate_pending(store, [narrow], now=T0, predictor=predictor).predictions == 0
        assert store.evaluation_queue() == {}   # looked at, not watched: drained
        assert evaluate_pending(store, [narrow], now=T0, predictor=predictor).predictions == 0
        report = evaluate_pending(store, [wide], now=T0 + timedelta(hours=5), predictor=predictor)
        assert report.predictions == 3
        assert {r["run_id"] for r in store.query("SELECT run_id FROM predictions")} == set(runs)


def test_a_policy_left_out_of_a_call_keeps_the_runs_it_has_not_seen(tmp_path):
    gov = load_policy(write_policy(tmp_path / "p", name="gov"), check_curves=False)
    other = load_policy(write_policy(tmp_path / "p", name="other"), check_curves=False)
    with Store.open(tmp_path / "lstar.duckdb") as store:
        evaluate_pending(store, [gov, other], now=T0, predictor=predictor)   # both scopes recorded
        run = record_fake_score(store, repo="org/m", sha=fake_sha("x"), lstar=1.0, se=0.02, finished_at=T0)
        evaluate_pending(store, [gov], now=T0, predictor=predictor)           # e.g. `lstar alerts evaluate gov.yaml`
        assert store.evaluation_queue() == {run: CALIB_V0_SHA256}
        assert evaluate_pending(store, [gov, other], now=T0, predictor=predictor).predictions == 1
        assert store.evaluation_queue() == {}
        # The daemon's call names every policy: one that is gone is forgotten, not waited for.
        run2 = record_fake_score(store, repo="org/m", sha=fake_sha("y"), lstar=1.0, se=0.02, finished_at=T0)
        evaluate_pending(store, [gov], now=T0, predictor=predictor, complete=True)
        assert store.evaluation_queue() == {}
        assert store.evaluation_consumers() == [("gov", "cloze", CALIB_V0_SHA256)]
        # `other` comes back: it scans every run once and evaluates the one it missed.
        assert evaluate_pending(store, [gov, other], now=T0, predictor=predictor).predictions == 1
        rows = store.query("SELECT policy FROM predictions WHERE run_id = ? ORDER BY policy", [run2])
        assert [r["policy"] for r in rows] == ["gov", "other"]


def test_a_tick_stopped_or_crashed_half_way_evaluates_each_run_exactly_once_later(tmp_path, monkeypatch):
    policy = load_policy(write_policy(tmp_path / "policies"), check_curves=False)
    with Store.open(tmp_path / "lstar.duckdb") as store:
        evaluate_pending(store, [policy], now=T0, predictor=predictor)
        runs = [record_fake_score(store, repo="org/m", sha=fake_sha(f"s{i}"), lstar=1.0, se=0.02,
                                  finished_at=T0 + timedelta(hours=i)) for i in range(4)]
        calls = iter([False, False, True])   # shutdown asked while the third run is due
        report = evaluate_pending(store, [policy], now=T0, predictor=predictor, stop=lambda: next(calls, True))
        assert (report.predictions, report.stopped) == (2, True)
        assert set(store.evaluation_queue()) == set(runs)     # nothing drained: the next tick goes on

        from monitor.alerts import outbox
        real, seen = outbox.write_planned, []

        def crash_with_fourth(store_: Store, rows: Any, now: datetime, *batch: Any) -> Any:
            seen.extend(r["run_id"] for r in rows)
            if any(r["run_id"] == runs[3] for r in rows):
                raise RuntimeError("killed")
            return real(store_, rows, now, *batch)
        monkeypatch.setattr(outbox, "write_planned", crash_with_fourth)
        with pytest.raises(RuntimeError):
            evaluate_pending(store, [policy], now=T0, predictor=predictor)
        assert seen == runs[2:]   # the two evaluated before the stop are not looked at again
        # The third run's write shared the crashed run's transaction: both are evaluated again.
        assert store.query("SELECT count(*) AS n FROM predictions WHERE run_id = ?", [runs[2]]) == [{"n": 0}]
        monkeypatch.setattr(outbox, "write_planned", real)
        assert evaluate_pending(store, [policy], now=T0, predictor=predictor).predictions == 2
        counts = store.query("SELECT run_id, count(*) AS n FROM predictions GROUP BY run_id ORDER BY run_id")
        assert counts == [{"run_id": r, "n": 1} for r in sorted(runs)]
        assert store.evaluation_queue() == {}


def test_grouping_reads_the_groups_own_row(tmp_path):
    with Store.open(tmp_path / "lstar.duckdb") as store:
        made: dict[tuple[str, str], list[datetime]] = {}
        for i in range(30):
            receiver, key = f"r{i % 3}", f"g{i % 5}"
            now = T0 + timedelta(minutes=7 * i)
            notify_one(store, i, receiver, key, now)
            made.setdefault((receiver, key), []).append(now)
        counter = counted(store)
        for (receiver, key), times in made.items():
            assert store.last_notification_at("p", receiver, key) == max(times)
        assert store.last_notification_at("p", "r0", "nope") is None
        uncounted(store, counter)
        assert all("FROM notification_groups" in s for s in counter.statements)
        assert counter.rows == len(made)   # one row per group that has sent


def test_discovery_looks_up_a_poll_batch_in_one_query(tmp_path):
    def candidate(i: int, refs: list[str]) -> SimpleNamespace:
        return SimpleNamespace(repo=f"org/m{i % 7}", sha=fake_sha(f"c{i}"), refs=refs, status="discovered",
                               reason=None, meta={})

    with Store.open(tmp_path / "lstar.duckdb") as store:
        first = [candidate(i, ["main"]) for i in range(0, 40, 2)]
        assert store.record_discoveries("k", "rule", "http://hub", first, watermark=None, boundary=[],
                                        now=T0, requests=1, listed=len(first)) == 20
        batch = [candidate(i, ["step"]) for i in range(60)] + [candidate(1, ["again"])]
        counter = counted(store)
        inserted = store.record_discoveries("k", "rule", "http://hub", batch, watermark=None, boundary=[],
                                            now=T0, requests=1, listed=len(batch))
        uncounted(store, counter)
        # new: the 30 odd ones and even 40..58; a candidate repeated in the batch is one row
        assert inserted == len({(c.repo, c.sha) for c in batch} - {(c.repo, c.sha) for c in first}) == 40
        lookups = [s for s in counter.statements if s.startswith("SELECT") and "checkpoints" in s]
        assert len(lookups) == 1
        refs = {(r["repo"], r["sha"]): json.loads(r["refs"]) for r in store.query("SELECT repo, sha, refs FROM checkpoints")}
        expected: dict[tuple[str, str], set[str]] = {}
        for c in first + batch:   # naive: the union of every ref seen for a (repo, sha)
            expected.setdefault((c.repo, c.sha), set()).update(c.refs)
        assert refs == {k: sorted(v) for k, v in expected.items()}


def test_a_query_whose_connection_is_closed_under_it_fails_clearly(tmp_path):
    """At shutdown past the drain deadline the daemon closed its connection while a job's
    cursor had just run a statement: DuckDB then has no result set (description None)."""
    path = tmp_path / "lstar.duckdb"
    main = Store.open(path)
    job = Store(main.cursor(), path, read_only=False)

    class ClosesParent:
        def __init__(self, conn: Any) -> None:
            self._conn = conn

        def execute(self, *args: Any) -> Any:
            result = self._conn.execute(*args)
            main.close()   # the shutdown thread, between the statement and its rows
            return result

    job._conn = ClosesParent(job.conn)  # type: ignore[assignment]
    with pytest.raises(StoreError, match="was closed while a query on it ran"):
        job.query("SELECT 1 AS x")


def test_cache_pruning_reads_the_rows_of_the_cached_commits_only(tmp_path):
    from monitor.hub.cache_prune import prune_cache

    cache = tmp_path / "cache"
    with Store.open(tmp_path / "lstar.duckdb") as store:
        store.conn.execute(
            "INSERT INTO checkpoints (repo, sha, source, lineage, discovered_at, updated_at, status) "
            "SELECT 'org/m' || (i % 5)::VARCHAR, sha1(i::VARCHAR), 'hub', 'org/m', ?, "
            "?::TIMESTAMPTZ + INTERVAL 1 MINUTE * i, 'scored' FROM range(300) t(i)", [T0, T0])
        cached = store.query("SELECT repo, sha, updated_at FROM checkpoints WHERE id % 100 = 7 ORDER BY id")
        for r in cached:   # three finished checkpoints still in the cache
            snap = cache / ("models--" + r["repo"].replace("/", "--")) / "snapshots" / r["sha"]
            snap.mkdir(parents=True)
            (snap / "config.json").write_text("{}")
        counter = counted(store)
        report = prune_cache(store, cache, keep_last=1, max_bytes=None)
        uncounted(store, counter)
        newest_first = sorted(cached, key=lambda r: r["updated_at"], reverse=True)
        assert report.kept == [f"{r['repo']}@{r['sha']}" for r in newest_first[:1]]
        assert sorted(report.removed) == sorted(f"{r['repo']}@{r['sha']}" for r in newest_first[1:])
        assert counter.rows == len(cached)   # not the 300 rows of the table


def test_shutdown_past_the_drain_interrupts_a_running_query_and_exits_cleanly(tmp_path):
    """A job whose query outlives the drain deadline (a tick over a huge backlog) is
    interrupted: the job fails with DuckDB's interrupt, the database is checkpointed and
    closed, and nothing is left running."""
    from support.daemon_drain import assert_the_drain_interrupts

    def endless(daemon, started) -> None:
        with daemon.job_store() as store:
            started.set()
            store.query("SELECT sum(a.i * b.j) FROM range(100000000) a(i), range(100000000) b(j)")

    assert_the_drain_interrupts(tmp_path, "evaluate", endless)


def test_a_task_dropped_from_the_configuration_does_not_hold_the_queue(tmp_path):
    folder = tmp_path / "p"
    two = write_policy(folder)
    two.write_text(two.read_text().replace("tasks:\n", "tasks:\n  - name: arith\n    curve: arith.json\n"))
    policy = load_policy(two, check_curves=False)
    one = load_policy(write_policy(tmp_path / "q"), check_curves=False)   # the same policy without arith
    with Store.open(tmp_path / "lstar.duckdb") as store:
        evaluate_pending(store, [policy], now=T0, predictor=predictor)
        assert sorted(store.evaluation_consumers()) == [("gov", "arith", CALIB_V0_SHA256),
                                                        ("gov", "cloze", CALIB_V0_SHA256)]
        record_fake_score(store, repo="org/m", sha=fake_sha("x"), lstar=1.0, se=0.02, finished_at=T0)
        evaluate_pending(store, [one], now=T0, predictor=predictor)
        assert len(store.evaluation_queue()) == 1                 # arith might still come: it waits
        evaluate_pending(store, [one], now=T0, predictor=predictor, complete=True)
        assert store.evaluation_queue() == {}                     # the daemon's whole set: arith is gone
        assert store.evaluation_consumers() == [("gov", "cloze", CALIB_V0_SHA256)]


def test_the_migration_carries_each_groups_newest_notification_over(tmp_path):
    from monitor.store import MIGRATIONS

    made = {("r1", "g1"): [5, 1, 9], ("r1", "g2"): [3], ("r2", "g1"): [7, 2]}   # minutes after T0
    with Store.open(tmp_path / "lstar.duckdb", migrate=False) as store:
        store.migrate([m for m in MIGRATIONS if m.name < "0010"])
        for (receiver, key), minutes in made.items():
            for m in minutes:
                store.conn.execute(
                    "INSERT INTO notifications (id, policy, receiver, group_key, status, body, n_alerts, is_meta, "
                    "next_attempt_at, created_at, updated_at) VALUES (?, 'p', ?, ?, 'delivered', '{}', 1, false, ?, ?, ?)",
                    [f"{receiver}-{key}-{m}", receiver, key, T0, T0 + timedelta(minutes=m), T0])
        store.migrate()
        groups = store.query("SELECT receiver, group_key, last_created_at FROM notification_groups")
        assert {(g["receiver"], g["group_key"]): g["last_created_at"] for g in groups} == \
            {k: T0 + timedelta(minutes=max(v)) for k, v in made.items()}
        for (receiver, key), minutes in made.items():
            assert store.last_notification_at("p", receiver, key) == T0 + timedelta(minutes=max(minutes))


def _tick_statements(tmp_path: Path, n: int) -> tuple[dict[str, int], list[dict[str, Any]]]:
    """BEGIN/COMMIT/CHECKPOINT statements of the tick that evaluates `n` new runs (over three
    lineages), and the predictions it wrote."""
    policy = load_policy(write_policy(tmp_path / f"policies{n}"), check_curves=False)
    with Store.open(tmp_path / f"lstar{n}.duckdb") as store:
        evaluate_pending(store, [policy], now=T0, predictor=predictor)
        for i in range(n):
            record_fake_score(store, repo=f"org/m{i % 3}", sha=fake_sha(f"n{i}"), lstar=1.0 + i / 10, se=0.02,
                              finished_at=T0 + timedelta(minutes=i))
        counter = counted(store)
        report = evaluate_pending(store, [policy], now=T0 + timedelta(days=1), predictor=predictor)
        uncounted(store, counter)
        assert report.predictions == n
        kinds = {k: sum(s.upper().startswith(k) for s in counter.statements)
                 for k in ("BEGIN", "COMMIT", "CHECKPOINT")}
        rows = store.query("SELECT r.lstar, p.p_hat, p.state FROM predictions p JOIN score_runs r USING (run_id) "
                           "ORDER BY r.lstar")
    return kinds, rows


def test_a_tick_writes_its_new_runs_in_a_bounded_number_of_commits_and_one_checkpoint(tmp_path):
    few, few_rows = _tick_statements(tmp_path, 3)
    many, many_rows = _tick_statements(tmp_path, 24)
    # One write transaction per (policy, task) batch, whatever the number of new runs
    # (each run committed, and checkpointed, on its own before).
    assert few == many
    assert many["CHECKPOINT"] == 1
    assert many["COMMIT"] == many["BEGIN"] <= 4
    # The numbers are the stand-in curve's, run by run (p = 0.1 + 0.01 L*).
    expected = [{"lstar": 1.0 + i / 10, "p_hat": 0.1 + 0.01 * (1.0 + i / 10), "state": "clear"} for i in range(24)]
    assert [{k: pytest.approx(v) if k != "state" else v for k, v in r.items()} for r in expected] == many_rows
    assert many_rows[:3] == few_rows


def test_shutdown_gives_up_on_a_job_blocked_outside_any_query_and_says_so(tmp_path, caplog):
    """A job blocked in Python (no query to interrupt) past the drain and its grace: the
    shutdown names it, does not touch the busy connection, and reports exit 1, never
    "stopped cleanly"."""
    import logging
    import threading

    from monitor.service.daemon import Daemon, DaemonConfig

    (tmp_path / "policies").mkdir()
    daemon = Daemon(DaemonConfig(policies_dir=tmp_path / "policies", state_dir=tmp_path / "state",
                                 drain=0.2, drain_grace=0.2))
    daemon.store = Store.open(tmp_path / "state" / "lstar.duckdb")
    started, release = threading.Event(), threading.Event()

    def blocked() -> dict:
        with daemon.job_store():
            started.set()
            release.wait()
        return {}

    daemon.job_report = blocked  # type: ignore[method-assign]
    job = threading.Thread(target=daemon._run_job, args=("report",), daemon=True)
    job.start()
    assert started.wait(30)
    try:
        daemon.stopping.set()
        with caplog.at_level(logging.INFO, logger="monitor.service.daemon"):
            assert daemon._shutdown() == 1
        assert job.is_alive()
        assert daemon.unfinished == ["report"]
        messages = [r.getMessage() for r in caplog.records]
        assert any(m.startswith("not stopped cleanly: job(s) report did not end") for m in messages)
        assert "stopped cleanly" not in messages
    finally:
        release.set()
        job.join(5)
        daemon.store.close()


_BLOCKED_DAEMON = """
import sys, threading
from pathlib import Path
from monitor.service.daemon import Daemon, DaemonConfig, run_daemon

def blocked(self):
    print("blocked", flush=True)
    threading.Event().wait()   # in Python, outside any query: no interrupt reaches it

Daemon.job_prune = blocked
folder = Path(sys.argv[1])
sys.exit(run_daemon(DaemonConfig(policies_dir=folder / "policies", state_dir=folder / "state",
                                 api_port=0, drain=0.5, drain_grace=0.5, poll_interval=3600)))
"""


@pytest.mark.slow
def test_sigterm_with_a_job_blocked_outside_any_query_ends_the_process_with_exit_1(tmp_path):
    """The real process: the scheduler's job threads are not daemon threads, so a job that
    never ends kept the interpreter alive after "stopped cleanly". It now exits 1, naming it."""
    import signal
    import subprocess
    import sys

    (tmp_path / "policies").mkdir()
    proc = subprocess.Popen([sys.executable, "-c", _BLOCKED_DAEMON, str(tmp_path)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "blocked"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)   # a bound against hanging, not a timing check
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 1, err
    assert "not stopped cleanly: job(s) prune did not end" in err
    assert "stopped cleanly\n" not in err.replace("not stopped cleanly", "")
