"""A report reads each section with a bounded number of queries, whatever the number of
lineages and derivatives, and says what it said before those reads were made set-based.

Two small realistic states (`benchmarks/scale_state.py`, written through the store's own
functions): 3 lineages (one fine-tune) and 30 lineages (two fine-tunes), three checkpoints
each. The queries are counted by a wrapper on the store's DuckDB connection. The report of the
30-lineage state is compared, section by section and row by row, with the JSON the code before
this change wrote for the same state (`tests/fixtures/report_golden_30_lineages.json`).
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import scale_state as ss

from monitor.reports.delivery import report_body_text
from monitor.reports.report import build_report, iter_json, to_json
from monitor.reports.summary import PLOT_LINEAGES, plotted_lineages
from monitor.store import Store

T_END = datetime(2026, 6, 1, 12, tzinfo=timezone.utc)
WINDOW = timedelta(days=60)   # about a sixth of each lineage's history: new rows and carried states
PER_LINEAGE = 3
GOLDEN = Path(__file__).parent / "fixtures" / "report_golden_30_lineages.json"
# what names this machine's copy of the policy (its path, hash and load time), not the report
MACHINE_KEYS = ("policy_version",)

# building the two states writes 99 checkpoints through the store (~30 CPU-s)
slow_state = pytest.mark.slow


def statement(sql: str) -> str:
    """A statement's first 80 characters, its report's temporary table named alike in every report."""
    return re.sub(r"report_ranks_\d+", "report_ranks_N", " ".join(sql.split()))[:80]


class CountingConnection:
    """A DuckDB connection that counts the statements run through it."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn
        self.statements: list[str] = []

    def execute(self, sql: str, *args: Any) -> Any:
        self.statements.append(statement(sql))
        return self._conn.execute(sql, *args)

    def cursor(self) -> Any:
        """A cursor whose statements are counted too (a report's ranks live in one)."""
        return CountingCursor(self, self._conn.cursor())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


class CountingCursor:
    def __init__(self, owner: CountingConnection, cur: Any) -> None:
        self._owner, self._cur = owner, cur

    def execute(self, sql: str, *args: Any) -> Any:
        self._owner.statements.append(statement(sql))
        return self._cur.execute(sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cur, name)


@pytest.fixture(scope="module")
def states(tmp_path_factory):
    out = {}
    for n_lineages in (3, 30):
        folder = tmp_path_factory.mktemp(f"lineages{n_lineages}")
        ss.write_policy(folder)
        policy = ss.load_bench_policy(folder / "policies")
        store = Store.open(folder / "lstar.duckdb")
        # Written without a CHECKPOINT after each write (the WAL is folded into the file once,
        # after): a CHECKPOINT changes no row the report reads, and one after every store call
        # was a sixth of the CPU of writing these states.
        store.checkpoint = lambda: None
        ss.build_api_state(store, policy, range(n_lineages), n_lineages=n_lineages, t_end=T_END,
                           per_lineage=PER_LINEAGE, retention=None)
        del store.checkpoint
        store.checkpoint()
        out[n_lineages] = (store, policy)
    yield out
    for store, _ in out.values():
        store.close()


def counted_report(store: Store, policy: Any) -> tuple[dict[str, Any], list[str]]:
    counting = CountingConnection(store._conn)
    store._conn = counting
    try:
        data = build_report(store, policy, now=T_END, period_start=T_END - WINDOW)
    finally:
        store._conn = counting._conn
    return data, counting.statements


@slow_state
def test_report_queries_do_not_grow_with_lineages_or_derivatives(states) -> None:
    small, small_queries = counted_report(*states[3])
    large, large_queries = counted_report(*states[30])
    # the two states differ where the cost would: ten times the lineages, twice the derivatives
    assert small["summary"]["lineages"] == 3 and large["summary"]["lineages"] == 30
    derivatives = [sum(len(g["derivatives"]) for g in data["derivatives"]) for data in (small, large)]
    assert derivatives[0] >= 1 and derivatives[1] >= 2 * derivatives[0]
    # the history holds the lineages the L*-over-time figure draws: all 3, then 14 of 30
    assert len(small["lineage_history"]) == 3 * PER_LINEAGE
    assert len(large["lineage_history"]) == PLOT_LINEAGES * PER_LINEAGE
    # the same statements, as many of each, and few
    assert Counter(small_queries) == Counter(large_queries)
    assert len(large_queries) <= 24   # 22: the ranks (7, on their cursor), the rows, the sections
    # every scored checkpoint is ranked by one statement, on the report's own cursor
    assert sum(q.startswith("CREATE TEMP TABLE report_ranks_N AS") for q in large_queries) == 1, large_queries


def _public(data: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in json.loads(to_json(data)).items() if k not in MACHINE_KEYS}


@slow_state
def test_report_of_a_realistic_state_equals_the_previous_codes_row_for_row(states) -> None:
    store, policy = states[30]
    now = _public(build_report(store, policy, now=T_END, period_start=T_END - WINDOW))
    before = {k: v for k, v in json.loads(GOLDEN.read_text()).items() if k not in MACHINE_KEYS}
    # A curve's id is the sha256 of everything in its file, the bootstrap bands' last bits
    # included, and those follow the machine's floating-point paths (numpy's vector width): the
    # golden's ids were written on another machine. Here each id must be the id of the curve file
    # the report names; every field the report shows of the curve is compared below.
    from monitor.curves import load_curve

    for task in now["tasks"]:
        assert task["curve_id"] == load_curve(task["curve_file"]).content_id()
    for task in [*now["tasks"], *before["tasks"]]:
        task.pop("curve_file")   # the policy's folder on this machine
        task.pop("curve_id")
    assert sorted(now) == sorted(before)
    # The history now holds only the lineages the L*-over-time figure draws (schema 2): those
    # rows are the previous code's, and every other section is as it was.
    assert (before.pop("schema"), now.pop("schema")) == ("lstar-report/1", "lstar-report/2")
    drawn = set(plotted_lineages(now))
    assert len(drawn) == PLOT_LINEAGES and {r["lineage"] for r in now["lineage_history"]} == drawn
    before["lineage_history"] = [r for r in before["lineage_history"] if r["lineage"] in drawn]
    for section, rows in before.items():
        if isinstance(rows, list):
            assert len(now[section]) == len(rows), section
            for i, (got, want) in enumerate(zip(now[section], rows)):
                assert got == want, f"{section}[{i}]"
        else:
            assert now[section] == rows, section
    assert len(before["lineage_history"]) == PLOT_LINEAGES * PER_LINEAGE and before["crossings"] and before["derivatives"]


@slow_state
def test_the_webhook_body_is_the_report_json_encoded_once(states) -> None:
    """`deliver_report` encodes the report once; its body says what decoding the report's JSON
    and encoding it again in the canonical spelling said."""
    from monitor.alerts.channels.base import canonical_json

    store, policy = states[30]
    data = build_report(store, policy, now=T_END, period_start=T_END - WINDOW)
    paths = {"json": Path("/r/report.json"), "markdown": Path("/r/report.md")}
    twice = json.loads(to_json(data))
    twice["files"] = {k: str(v) for k, v in paths.items()}
    assert report_body_text(data, paths) == canonical_json(twice)
    assert "".join(iter_json(data)) == to_json(data)


@pytest.mark.parametrize("n_pairs", [3, 1200])   # past the 500 a query the batch reads once took
def test_batch_lookups_are_one_query_whatever_their_number(tmp_path, n_pairs) -> None:
    """The report's and the listings' lookups by many checkpoints read them in one query (the
    pairs travel as two list parameters), and find what a lookup of each one finds."""
    with Store.open(tmp_path / "lstar.duckdb") as store:
        with store.transaction() as conn:
            for i in range(3):
                conn.execute("INSERT INTO checkpoints (repo, sha, source, refs, lineage, rule, discovered_at, "
                             "updated_at, status, attempts) VALUES (?, ?, 'hub', ?, ?, 'r', ?, ?, 'scored', 0)",
                             [f"org/m{i}", f"{i:040x}", json.dumps([f"step{i}"]), f"org/m{i}", T_END, T_END])
        pairs = [(f"org/m{i}", f"{i:040x}") for i in range(n_pairs)]
        counting = CountingConnection(store._conn)
        store._conn = counting
        try:
            refs = store.checkpoint_refs(pairs)
            observed = store.observed_states(pairs, until=T_END)
            notes = store.with_not_evaluated([{"repo": r, "sha": s} for r, s in pairs])
            details = store.prediction_details(list(range(n_pairs)))
        finally:
            store._conn = counting._conn
        assert len(counting.statements) == 4, counting.statements
        assert refs == {(f"org/m{i}", f"{i:040x}"): [f"step{i}"] for i in range(3)}
        assert observed == {} and details == {} and all(n["not_evaluated"] == [] for n in notes)
