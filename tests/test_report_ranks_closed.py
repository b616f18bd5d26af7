"""A report's ranks live on a cursor of the store's connection (`ReportRanks`): when the daemon
closes the store under a report (a shutdown past its drain deadline), every read of the ranks
fails with the store's one error for that, never a bare DuckDB error; and two reports on one
store, in two threads, each read their own ranks."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from monitor.errors import StoreError
from monitor.store import Store

END = datetime(2026, 6, 1, tzinfo=timezone.utc)


def _one_run(store: Store, run: str, repo: str, finished: datetime) -> None:
    store.conn.execute(
        "INSERT INTO score_runs (run_id, checkpoint_id, model_repo, model_sha, model_source, tokenizer_fingerprint, "
        "corpus_sha256, spec_version, window_len, stride, prefix_policy, dtype, device, n_tokens, n_bytes, nll_sum, "
        "ce, ce_unigram, lstar, l_rel, l_gain, bits_per_byte, tokens_per_byte, se_ce, slices, spec, model, "
        "library_versions, wall_s, tokens_per_s, finished_at, partial) VALUES (?, NULL, ?, ?, 'hub', 't', 'c', '1', "
        "8, 8, 'p', 'float32', 'cpu', 10, 40, 10, 1, 1, 2, 0, 0, 1, 0.25, 0.1, '[]', '{}', '{}', '{}', 1, 10, ?, false)",
        [run, repo, "a" * 40, finished])


def _week_ranks(store: Any) -> Any:
    """The ranks a report of the week before END reads (every repo watched)."""
    return store.report_ranks(None, start=END - timedelta(days=7), end=END, watched=None)


def test_the_store_closed_before_a_read_of_the_ranks(tmp_path) -> None:
    store = Store.open(tmp_path / "lstar.duckdb")
    _one_run(store, "run1", "org/m", END - timedelta(days=1))
    ranks = _week_ranks(store)
    assert [row[3] for row in ranks.shown()] == ["run1"]
    store.close()
    with pytest.raises(StoreError, match="was closed while a query on it ran"):
        ranks.shown()


def test_the_store_closed_between_a_statement_and_its_rows(tmp_path) -> None:
    """As `Store.query` (tests/test_incremental_jobs.py): the connection closes after the
    statement ran and before its rows are fetched."""
    store = Store.open(tmp_path / "lstar.duckdb")
    _one_run(store, "run1", "org/m", END - timedelta(days=1))
    ranks = _week_ranks(store)

    class ClosesParent:
        def __init__(self, conn: Any) -> None:
            self._conn = conn

        def execute(self, *args: Any) -> Any:
            result = self._conn.execute(*args)
            store.close()   # the shutdown thread, between the statement and its rows
            return result

        def close(self) -> None:
            self._conn.close()

    ranks._cur = ClosesParent(ranks._cur)  # type: ignore[assignment]
    with pytest.raises(StoreError, match="was closed while a query on it ran"):
        ranks.lineages()


def test_two_reports_in_two_threads_read_their_own_ranks(tmp_path) -> None:
    with Store.open(tmp_path / "lstar.duckdb") as store:
        for i in range(30):
            _one_run(store, f"run{i:02d}", f"org/m{i:02d}", END - timedelta(days=i))
        got: dict[int, list[str]] = {}
        errors: list[BaseException] = []

        def report(days: int) -> None:
            try:
                for _ in range(20):
                    with store.report_ranks(None, start=END - timedelta(days=days), end=END, watched=None) as ranks:
                        seen = sorted(run for *_, run, _, new in ranks.shown() if new)
                        assert got.setdefault(days, seen) == seen
            except BaseException as exc:   # reported below, in the test's thread
                errors.append(exc)

        threads = [threading.Thread(target=report, args=(days,)) for days in (5, 20)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        # runs finished in (END - days, END]: run00 .. run(days-1)
        assert got == {5: [f"run{i:02d}" for i in range(5)], 20: [f"run{i:02d}" for i in range(20)]}


def test_a_read_while_the_store_is_closing(tmp_path) -> None:
    """The store's close has closed DuckDB's connection (so the ranks' cursor) but not yet
    marked itself closed when the report reads: still the store's error, not DuckDB's."""
    store = Store.open(tmp_path / "lstar.duckdb")
    _one_run(store, "run1", "org/m", END - timedelta(days=1))
    ranks = _week_ranks(store)
    closed, finish = threading.Event(), threading.Event()

    class SlowClose:
        def __init__(self, conn: Any) -> None:
            self._conn = conn

        def execute(self, *args: Any) -> Any:
            return self._conn.execute(*args)

        def close(self) -> None:
            self._conn.close()
            closed.set()
            finish.wait(5)   # the closing thread is preempted before it marks the store closed

    store._conn = SlowClose(store._conn)  # type: ignore[assignment]
    closer = threading.Thread(target=store.close)
    closer.start()
    assert closed.wait(5)
    threading.Timer(0.3, finish.set).start()
    try:
        with pytest.raises(StoreError, match="was closed while a query on it ran"):
            ranks.shown()
    finally:
        finish.set()
        closer.join()


def test_a_job_store_on_a_cursor_of_the_daemon_store(tmp_path) -> None:
    """The daemon's jobs and API requests read through a Store on a cursor of its store: when
    the daemon closes its store, a report running in a job fails with the store's error too,
    though the job's Store was never closed itself."""
    path = tmp_path / "lstar.duckdb"
    main = Store.open(path)
    _one_run(main, "run1", "org/m", END - timedelta(days=1))
    job = Store(main.cursor(), path, read_only=False)
    ranks = _week_ranks(job)
    assert [row[3] for row in ranks.shown()] == ["run1"]
    main.close()
    with pytest.raises(StoreError, match="was closed while a query on it ran"):
        ranks.shown()


def test_the_ranks_cursor_is_handed_to_the_daemon_while_the_report_reads_it(tmp_path) -> None:
    """A job's or request's store (`DaemonStore`) hands the ranks' own cursor to the daemon, so
    its drain deadline interrupts the ranks' statements as it does the job's; the report
    forgets it when done, and interrupting it stops a statement running on it."""
    from monitor.service.daemon_store import DaemonStore

    with Store.open(tmp_path / "lstar.duckdb") as store:
        _one_run(store, "run-1", "org/a", END - timedelta(days=1))
        job = DaemonStore(store.cursor(), store.path, read_only=True)
        handed: list[Any] = []
        forgotten: list[Any] = []

        def tracker(cursor: Any) -> Any:
            handed.append(cursor)
            return lambda: forgotten.append(cursor)

        job.cursor_tracker = tracker
        with _week_ranks(job) as ranks:
            assert len(handed) == 1 and forgotten == []
            assert [row[0] for row in ranks.lineages()] == ["org/a"]
            # what the daemon's drain does with a cursor it was handed
            stopped: list[BaseException] = []

            def long_statement() -> None:
                try:
                    handed[0].execute("SELECT count(*) FROM range(10000000000) a, range(10) b").fetchall()
                except BaseException as exc:   # noqa: BLE001 - the interruption is what is checked
                    stopped.append(exc)

            worker = threading.Thread(target=long_statement)
            worker.start()
            import time
            time.sleep(0.5)
            handed[0].interrupt()
            worker.join(timeout=30)
            assert not worker.is_alive() and stopped and "interrupt" in str(stopped[0]).lower()
        assert forgotten == handed
        job.conn.close()


def test_the_daemon_drain_interrupts_a_statement_on_a_report_s_ranks(tmp_path) -> None:
    """A report job whose ranks' statement outlives the drain deadline is interrupted like any
    job's query: the job fails with DuckDB's interrupt and no cursor is left registered."""
    from support.daemon_drain import assert_the_drain_interrupts

    def endless_report(daemon: Any, started: threading.Event) -> None:
        with daemon.job_store() as store:
            with _week_ranks(store) as ranks:
                assert len(daemon.live_cursors) == 2   # the job's cursor and the ranks'
                started.set()
                ranks._rows("SELECT sum(a.i * b.j) FROM range(100000000) a(i), range(100000000) b(j)")

    assert_the_drain_interrupts(tmp_path, "report", endless_report)
