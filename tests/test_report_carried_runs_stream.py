"""The carried-in score runs a report streams (`ReportRows.report_carried_runs`): while a
report walks them, the store stays usable, by other threads and by the walker itself."""

from __future__ import annotations

import sys
import threading
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from test_report_queries import T_END, write_state  # noqa: E402


def _carried(store, start):
    return [(c.run.run_id, c.checkpoints_before, c.best_lstar_before)
            for c in store.report_carried_runs(None, start=start)]


def test_a_walk_of_the_carried_runs_does_not_hold_the_store_from_other_threads(tmp_path) -> None:
    store, _ = write_state(tmp_path, 2)
    try:
        start = T_END   # every run finished before: all carried in
        walk = store.report_carried_runs(None, start=start)
        next(walk)                                  # a report part way through its rows
        answered = []
        reader = threading.Thread(target=lambda: answered.append(
            store.query("SELECT count(*) AS n FROM score_runs")[0]["n"]), daemon=True)
        reader.start()
        reader.join(timeout=10)
        assert answered == [6], "another thread's read waited for the report's walk to finish"
        walk.close()
    finally:
        store.close()


def test_a_query_between_two_carried_runs_does_not_change_the_rest_of_the_walk(tmp_path, monkeypatch) -> None:
    from monitor.store import reports

    monkeypatch.setattr(reports, "_BATCH_ROWS", 2)   # the walk fetches again after the query
    store, _ = write_state(tmp_path, 2)
    try:
        start = T_END - timedelta(hours=1)
        expected = _carried(store, start)
        assert len(expected) == 6
        walked = []
        for c in store.report_carried_runs(None, start=start):
            walked.append((c.run.run_id, c.checkpoints_before, c.best_lstar_before))
            store.query("SELECT run_id FROM score_runs ORDER BY run_id DESC")   # e.g. a name looked up
        assert walked == expected
    finally:
        store.close()


def test_a_store_closed_during_the_walk_ends_it_with_an_error_naming_the_file(tmp_path, monkeypatch) -> None:
    import pytest

    from monitor.errors import StoreError
    from monitor.store import reports

    monkeypatch.setattr(reports, "_BATCH_ROWS", 1)
    store, _ = write_state(tmp_path, 2)
    walk = store.report_carried_runs(None, start=T_END)
    next(walk)
    store.close()                                   # a daemon stopping past its drain deadline
    with pytest.raises(StoreError, match="lstar.duckdb was closed while a query on it ran"):
        next(walk)
