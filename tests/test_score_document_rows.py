"""A score's document rows are written a few hundred to a statement (`insert_document_rows`),
not one statement per row: the rows, their values and their order are what the row-at-a-time
insert it replaced writes (kept here as the reference)."""

from __future__ import annotations

import sys
from datetime import datetime, timezone
from pathlib import Path

import duckdb
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import scale_state as ss

from monitor.errors import StoreError
from monitor.store import Store
from monitor.store.scores import DOCUMENT_ROWS_PER_INSERT

WHEN = datetime(2026, 6, 1, 12, tzinfo=timezone.utc)


def documents(n: int) -> list[tuple]:
    """`n` document rows of the kinds a score writes: names in any script, a slice, token and
    byte counts, NLLs as floats, integers and numpy float64s (a float)."""
    rows = []
    for k in range(n):
        nll = (float(k) * 1.25 + 0.1, k, np.float64(k / 7), 1e-300)[k % 4]
        rows.append((f"doc-{k:05d}-{'éλ文'[k % 3]}", ("web", "code", "wiki")[k % 3], k + 1, nll, 4 * k + 3))
    return rows[::-1] if n % 2 else rows   # not in name order either way


def stored(store: Store, run_id: str) -> list[tuple]:
    return store.conn.execute("SELECT * FROM score_documents WHERE run_id = ? ORDER BY rowid", [run_id]).fetchall()


@pytest.mark.parametrize("n", [1, 50, 2 * DOCUMENT_ROWS_PER_INSERT + 201])
def test_document_rows_are_those_of_a_row_at_a_time_insert(tmp_path: Path, n: int) -> None:
    docs = documents(n)
    run, _ = ss.score_run("org/model", "a" * 40, None, 1.5, WHEN)
    with Store.open(tmp_path / "batched.duckdb") as batched, Store.open(tmp_path / "reference.duckdb") as reference:
        batched.record_score_run(run, docs, ss.CORPUS_ROW, ss.TOKENIZER)
        with reference.transaction() as conn:   # the insert this replaced, row by row
            conn.executemany("INSERT INTO score_documents VALUES (?, ?, ?, ?, ?, ?)", [[run["run_id"], *d] for d in docs])
        rows = stored(batched, run["run_id"])
        assert rows == stored(reference, run["run_id"])
        assert [r[1] for r in rows] == [d[0] for d in docs] and len(rows) == n
        assert [type(v) for r in rows[:4] for v in r] == [type(v) for r in stored(reference, run["run_id"])[:4]
                                                           for v in r]


@pytest.mark.parametrize("value", [np.int64(7), np.float32(0.5)])
def test_a_numpy_scalar_that_is_no_python_number_is_refused_as_before(tmp_path: Path, value) -> None:
    docs = documents(3)
    docs[1] = (*docs[1][:3], value, docs[1][4])
    run, _ = ss.score_run("org/model", "d" * 40, None, 1.5, WHEN)
    with Store.open(tmp_path / "batched.duckdb") as batched, Store.open(tmp_path / "reference.duckdb") as reference:
        with pytest.raises(duckdb.NotImplementedException):
            batched.record_score_run(run, docs, ss.CORPUS_ROW, ss.TOKENIZER)
        with pytest.raises(duckdb.NotImplementedException), reference.transaction() as conn:
            conn.executemany("INSERT INTO score_documents VALUES (?, ?, ?, ?, ?, ?)", [[run["run_id"], *d] for d in docs])
        assert stored(batched, run["run_id"]) == []


def test_a_score_of_no_documents_is_refused_as_before(tmp_path: Path) -> None:
    run, _ = ss.score_run("org/model", "c" * 40, None, 1.5, WHEN)
    with Store.open(tmp_path / "state.duckdb") as store:
        with pytest.raises(duckdb.InvalidInputException, match="non-empty list"):
            store.record_score_run(run, [], ss.CORPUS_ROW, ss.TOKENIZER)
        assert store.query("SELECT count(*) AS n FROM score_runs")[0]["n"] == 0


def test_a_duplicate_document_writes_nothing_of_the_score(tmp_path: Path) -> None:
    """A failing row (here a duplicate key in the second statement) rolls the whole score back."""
    docs = documents(DOCUMENT_ROWS_PER_INSERT + 2)
    docs[-1] = (docs[0][0], *docs[-1][1:])
    run, _ = ss.score_run("org/model", "b" * 40, None, 1.5, WHEN)
    with Store.open(tmp_path / "state.duckdb") as store:
        with pytest.raises(duckdb.ConstraintException):
            store.record_score_run(run, docs, ss.CORPUS_ROW, ss.TOKENIZER)
        assert stored(store, run["run_id"]) == []
        assert store.query("SELECT count(*) AS n FROM score_runs")[0]["n"] == 0


def test_document_rows_of_the_wrong_length_are_refused_before_anything_is_written(tmp_path: Path) -> None:
    """Flattened into one statement, a row of 7 values beside a row of 5 would shift values
    across columns; each row's length is checked first, as executemany checked it."""
    docs = documents(3)
    docs[1] = (*docs[1], "one too many")
    docs[2] = docs[2][:-1]
    run, _ = ss.score_run("org/model", "d" * 40, None, 1.5, WHEN)
    with Store.open(tmp_path / "state.duckdb") as store:
        with pytest.raises(StoreError, match="document row 1 of the score has 7 values, not 6"):
            store.record_score_run(run, docs, ss.CORPUS_ROW, ss.TOKENIZER)
        assert stored(store, run["run_id"]) == []
        assert store.query("SELECT count(*) AS n FROM score_runs")[0]["n"] == 0
