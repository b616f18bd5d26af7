"""The evaluation tick is set-based (issue 39): a tick over N new runs issues the same number of
statements whatever N and whatever the number of lineages they fall into, and what it writes
(predictions, alerts, deliveries) equals, row for row, what the row-by-row path writes on the
same state: each run planned alone against `Store.lineage_history` and written alone with
`Store.write_outbox`, in one transaction, as the tick did before it read histories per batch.

The states are written with the project's own functions (`record_discoveries` with step refs,
`record_score_run`); the stand-in curve gives at_risk below L* 2 and clear above, and refuses
L* 9.9 (a `not_evaluated` record), so alerts fire, repeat and resolve, and earlier checkpoints
are scored late.
"""

from __future__ import annotations

import shutil
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from monitor.alerts.alert_planning import task_prediction_row
from monitor.alerts.evaluation_tick import evaluate_pending
from monitor.alerts.predict import TaskPrediction
from monitor.alerts.prediction_eval import prediction_row, score_view
from monitor.errors import CurveError
from monitor.hub.poll import Candidate
from monitor.policy.load import load_policy
from monitor.store import Store
from monitor.store.evaluation_gaps import NOT_EVALUATED
from support.scores import CALIB_V0_SHA256, fake_sha, record_fake_score

T0 = datetime(2025, 5, 1, 12, tzinfo=timezone.utc)


class Counting:
    """The store's connection, noting each statement it is given."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn
        self.statements: list[str] = []

    def execute(self, sql: str, *args: Any, **kwargs: Any) -> Any:
        self.statements.append(" ".join(sql.split()))
        return self._conn.execute(sql, *args, **kwargs)

    def executemany(self, sql: str, *args: Any, **kwargs: Any) -> Any:
        self.statements.append(" ".join(sql.split()))
        return self._conn.executemany(sql, *args, **kwargs)

    def sql(self, sql: str, *args: Any, **kwargs: Any) -> Any:
        self.statements.append(" ".join(sql.split()))
        return self._conn.sql(sql, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


def write_policy(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "gov.yaml"
    path.write_text(
        f"name: gov\ncorpora: {{public: '{CALIB_V0_SHA256}'}}\n"
        "tasks:\n  - name: cloze\n    curve: cloze.json\n"
        "route:\n  receiver: log\n  group_wait: 0s\n  group_interval: 0s\n  repeat_interval: 1m\n"
        "  routes:\n    - receiver: log\n      continue: true\n    - receiver: pager\n"
        "receivers:\n"
        f"  - name: log\n    file: {{path: {folder / 'alerts.jsonl'}}}\n"
        f"  - name: pager\n    file: {{path: {folder / 'pager.jsonl'}}}\n")
    return path


def predictor(policy: Any, task: Any, score: Any) -> TaskPrediction:
    """A stand-in curve: at_risk below L* 2, clear above; L* 9.9 is refused."""
    if abs(score.lstar - 9.9) < 1e-9:
        raise CurveError("the stand-in curve refuses L* 9.9")
    p = 0.5 - 0.1 * score.lstar
    return TaskPrediction(task=task.name, lstar=score.lstar, se=score.se, p_hat=p, lo=p - 0.01, hi=p + 0.01,
                          floor=0.25, margin=0.05, confidence=0.95,
                          state="at_risk" if score.lstar < 2.0 else "clear", curve_id="c1",
                          corpus_sha256=score.corpus_sha256)


def repo_of(j: int) -> str:
    return f"org/m{j}"


def discover(store: Store, lineages: int, steps: int, *, step_refs: bool = True) -> dict[tuple[int, int], int]:
    """Checkpoints step 1..steps of each lineage, with step refs (and a commit date each):
    {(lineage, step): checkpoint id}."""
    cands = [Candidate(repo_of(j), fake_sha(f"{j}/{s}"), (f"step{s * 1000}",) if step_refs else ("main",), meta={
        "gate": {"verdict": "passed", "commit_date": (T0 + timedelta(hours=s)).isoformat()}})
        for j in range(lineages) for s in range(1, steps + 1)]
    store.record_discoveries("rule-key", "watch", "http://hub.invalid", cands, watermark=None, boundary=[],
                             now=T0, requests=1, listed=len(cands))
    by_sha = {c.sha: c.id for c in store.list_checkpoints(limit=len(cands) + 10)}
    return {(j, s): by_sha[fake_sha(f"{j}/{s}")] for j in range(lineages) for s in range(1, steps + 1)}


def score(store: Store, ids: dict[tuple[int, int], int], j: int, s: int, lstar: float, hours: float) -> str:
    return record_fake_score(store, repo=repo_of(j), sha=fake_sha(f"{j}/{s}"), lstar=lstar, se=0.02,
                             finished_at=T0 + timedelta(hours=hours), checkpoint_id=ids[(j, s)])


def lstar_of(j: int, s: int, k: int = 0, *, refuse: bool = False) -> float:
    """At_risk and clear in turn along a lineage, some lineages flapping; one refused score."""
    if refuse and (j, s, k) == (1, 5, 0):
        return 9.9
    return 1.5 if (j + s + k) % 3 == 0 else 2.5


def history(store: Store, ids: dict[tuple[int, int], int], lineages: int) -> None:
    """Steps 1-3 of each lineage scored and evaluated (the lineages' history)."""
    for j in range(lineages):
        for s in (1, 2, 3):
            score(store, ids, j, s, lstar_of(j, s), hours=10 + s)


def new_scores(store: Store, ids: dict[tuple[int, int], int], lineages: int, n: int, *, refuse: bool) -> None:
    """`n` new runs over the lineages: the next steps in order, a later step scored before an
    earlier one, and a re-score of a checkpoint already judged."""
    for k in range(n):
        j, s = k % lineages, 4 + (k // lineages) % 5
        order = {4: 5, 5: 4}.get(s, s)   # step 5 before step 4: step 4 is scored late
        score(store, ids, j, order, lstar_of(j, order, k // (5 * lineages), refuse=refuse), hours=100 + k)
    for j in range(min(lineages, 3)):   # re-scored with another number
        score(store, ids, j, 3, 1.0 if lstar_of(j, 3) > 2 else 3.0, hours=200 + j)


def build(path: Path, tmp: Path, lineages: int, n: int, *, refuse: bool = False) -> tuple[Store, Any]:
    """A state whose lineages have a history, and `n` new runs (one refused by the curve with
    `refuse`: the share of refusals opens an evaluation gap in a small batch, which is data,
    not size)."""
    policy = load_policy(write_policy(tmp / "policies"), check_curves=False)
    store = Store.open(path)
    ids = discover(store, lineages, 10)
    history(store, ids, lineages)
    evaluate_pending(store, [policy], now=T0 + timedelta(hours=50), predictor=predictor)
    new_scores(store, ids, lineages, n, refuse=refuse)
    return store, policy


def tick_statements(tmp_path: Path, lineages: int, n: int) -> list[str]:
    store, policy = build(tmp_path / f"l{lineages}-n{n}.duckdb", tmp_path, lineages, n)
    try:
        counter = Counting(store._conn)
        store._conn = counter  # type: ignore[assignment]
        report = evaluate_pending(store, [policy], now=T0 + timedelta(hours=300), predictor=predictor)
        store._conn = counter._conn
        assert report.predictions >= n   # every new run judged (the refused one recorded too)
        assert report.alerts > 0 and report.deliveries > 0
    finally:
        store.close()
    return counter.statements


def test_a_ticks_statements_do_not_grow_with_the_number_of_new_runs(tmp_path: Path) -> None:
    few, many = tick_statements(tmp_path, 5, 5), tick_statements(tmp_path, 5, 50)
    assert len(few) == len(many)
    # the same statements, bar the length of the queue's run-id lists
    assert [s.split(" IN (")[0] for s in few] == [s.split(" IN (")[0] for s in many]
    assert not [s for s in many if s.startswith("INSERT INTO predictions") and "VALUES" in s]


def test_a_ticks_statements_do_not_grow_with_the_number_of_lineages(tmp_path: Path) -> None:
    two, twenty = tick_statements(tmp_path, 2, 20), tick_statements(tmp_path, 20, 20)
    assert len(two) == len(twenty)
    assert [s.split(" IN (")[0] for s in two] == [s.split(" IN (")[0] for s in twenty]


def row_by_row_tick(store: Store, policy: Any, now: datetime) -> None:
    """The tick as it ran before it was set-based: each candidate planned against
    `Store.lineage_history` (read inside the transaction, so it sees the runs before it) and
    written alone with `Store.write_outbox`."""
    task = policy.tasks[0]
    rows = store.evaluation_candidates(policy.name, task.name, CALIB_V0_SHA256, None)
    with store.transaction():
        for row in rows:
            view = score_view(row)
            try:
                prediction = predictor(policy, task, view)
            except CurveError as exc:
                planned = prediction_row(policy, task.name, view, state=NOT_EVALUATED, now=now, curve_id=None,
                                         detail={"reason": exc.one_line()})
            else:
                planned = task_prediction_row(store, policy, task, view, prediction, now=now)
            store.write_outbox([planned], now=now)
    store.drain_evaluation_queue(list(store.evaluation_queue()))


def outbox_tables(store: Store) -> dict[str, list[dict[str, Any]]]:
    """Predictions, task alerts and their deliveries in the order written; ids replaced by what
    they point at (the two stores number rows alike only when they write alike)."""
    predictions = store.query("SELECT * EXCLUDE (id) FROM predictions ORDER BY id")
    alerts = store.query("SELECT a.* EXCLUDE (id, prediction_id), p.run_id FROM alerts a "
                         "LEFT JOIN predictions p ON p.id = a.prediction_id WHERE a.kind != 'meta' ORDER BY a.id")
    deliveries = store.query("SELECT d.* EXCLUDE (id, alert_id), a.alert_key FROM deliveries d "
                             "JOIN alerts a ON a.id = d.alert_id WHERE a.kind != 'meta' ORDER BY d.id")
    return {"predictions": predictions, "alerts": alerts, "deliveries": deliveries}


def test_the_set_based_tick_writes_what_the_row_by_row_tick_writes(tmp_path: Path) -> None:
    now = T0 + timedelta(hours=300)
    set_based, policy = build(tmp_path / "set.duckdb", tmp_path, 6, 40, refuse=True)
    # The row-by-row side ticks on a copy of that file: the same state, without writing its
    # 61 scores and first tick a second time (about 1.9 CPU-seconds; the test went from 7.1 to 4.2).
    set_based.checkpoint()
    shutil.copyfile(tmp_path / "set.duckdb", tmp_path / "row.duckdb")
    row_by_row = Store.open(tmp_path / "row.duckdb")
    try:
        evaluate_pending(set_based, [policy], now=now, predictor=predictor)
        row_by_row_tick(row_by_row, policy, now)
        got, expected = outbox_tables(set_based), outbox_tables(row_by_row)
        # the scenario exercises what the batch has to carry from one run to the next
        assert len(expected["predictions"]) == 18 + 40 + 3
        assert {a["kind"] for a in expected["alerts"]} >= {"fire", "resolve"}
        assert any(p["state"] == NOT_EVALUATED for p in expected["predictions"])
        assert len(expected["deliveries"]) == 2 * len(expected["alerts"])
        for table in ("predictions", "alerts", "deliveries"):
            assert len(got[table]) == len(expected[table]), table
            for i, (a, b) in enumerate(zip(got[table], expected[table])):
                assert a == b, (table, i)
    finally:
        set_based.close()
        row_by_row.close()
