"""What the evaluation tick and the dispatch pass after it read (issue 39, 100 new scores at 10^5
checkpoints): the rows they read for a batch are checked against naive computations from the
tables themselves, so that reading less (only the batch's checkpoints, only the lineages with a
`not_evaluated` record, one query for every group) does not change what is read.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from scipy.stats import norm

from monitor.bands import two_sided_z
from monitor.store import Store
from monitor.store.alerts import current_rows, placed_predictions
from monitor.store.evaluation_gaps import NOT_EVALUATED
from monitor.training_order import commit_date
from test_tick_query_count import T0, build
from support.notifications import notify_one


def naive_placed(store: Store, policy: str, task: str) -> list[dict[str, Any]]:
    """`placed_predictions` computed in Python from whole rows: each (lineage, repo, commit)'s
    newest prediction (evaluated_at, then id) not `not_evaluated`, with its run's finish time and
    its checkpoint (by id, else by repo and commit) refs, discovery time and commit date."""
    predictions = store.query("SELECT * FROM predictions WHERE policy = ? AND task = ? AND state != ?",
                              [policy, task, NOT_EVALUATED])
    runs = {r["run_id"]: r for r in store.query("SELECT * FROM score_runs")}
    checkpoints = store.query("SELECT * FROM checkpoints ORDER BY id")
    by_id = {c["id"]: c for c in checkpoints}
    by_key = {(c["repo"], c["sha"]): c for c in checkpoints}
    newest: dict[tuple[str, str, str], dict[str, Any]] = {}
    for p in predictions:
        key = (p["lineage"], p["repo"], p["commit_sha"])
        if key not in newest or (p["evaluated_at"], p["id"]) > (newest[key]["evaluated_at"], newest[key]["id"]):
            newest[key] = p
    out = []
    for key, p in sorted(newest.items()):
        run = runs[p["run_id"]]
        c = by_id.get(run["checkpoint_id"]) if run["checkpoint_id"] is not None else by_key.get(
            (run["model_repo"], run["model_sha"]))
        refs = json.loads(c["refs"]) if c else []
        meta = json.loads(c["meta"]) if c else {}
        out.append({"id": p["id"], "run_id": p["run_id"], "state": p["state"], "finished_at": run["finished_at"],
                    "refs": refs, "commit_date": commit_date(refs, meta),
                    "discovered_at": c["discovered_at"] if c else None})
    return out


def test_placed_predictions_read_what_whole_rows_say(tmp_path: Path) -> None:
    store, policy = build(tmp_path / "s.duckdb", tmp_path, 4, 12)
    try:
        from monitor.alerts.evaluation_tick import evaluate_pending
        from test_tick_query_count import predictor
        evaluate_pending(store, [policy], now=T0 + timedelta(hours=300), predictor=predictor)
        # a run recorded before runs named their checkpoint by id: placed through (repo, commit)
        store.conn.execute("UPDATE score_runs SET checkpoint_id = NULL WHERE run_id IN "
                           "(SELECT run_id FROM score_runs ORDER BY run_id LIMIT 3)")
        task = policy.tasks[0].name
        expected = naive_placed(store, policy.name, task)
        got = placed_predictions(store, policy.name, task)
        assert len(got) == len(expected) > 20
        in_order = sorted(got, key=lambda r: (r["lineage"], r["repo"], r["commit_sha"]))
        assert [{"id": r["id"], "run_id": r["run_id"], "state": r["state"], "finished_at": r["finished_at"],
                 "refs": r["refs"], "commit_date": commit_date(r["refs"], r["meta"]),
                 "discovered_at": r["discovered_at"]} for r in in_order] == expected
        assert all(r["commit_date"] is not None for r in expected)   # the meta's date came through
        # of the ~2 KB meta, only the keys that place a checkpoint are read
        assert all(set(r["meta"]) == {"gate", "listing"} for r in got)
        lineages = sorted({r["lineage"] for r in got})[:2]
        some = placed_predictions(store, policy.name, task, lineages=lineages)
        assert some == [r for r in got if r["lineage"] in lineages]
    finally:
        store.close()


def test_open_not_evaluated_equals_every_lineages_current_record(tmp_path: Path) -> None:
    store, policy = build(tmp_path / "s.duckdb", tmp_path, 4, 4, refuse=True)
    try:
        from monitor.alerts.evaluation_tick import evaluate_pending
        from test_tick_query_count import predictor
        evaluate_pending(store, [policy], now=T0 + timedelta(hours=300), predictor=predictor)
        tasks = [t.name for t in policy.tasks]
        # the refused run is the newest of its lineage's current checkpoint: an open record
        every = current_rows(placed_predictions(store, policy.name, tasks, judged_only=False))
        expected = sorted((r["run_id"] for r in every if r["state"] == NOT_EVALUATED))
        got = [r.run_id for r in store.open_not_evaluated(policy.name, tasks)]
        assert sorted(got) == expected and len(expected) == 1
        # judged again, the record is no longer open
        store.conn.execute("DELETE FROM predictions WHERE state = ?", [NOT_EVALUATED])
        assert store.open_not_evaluated(policy.name, tasks) == []
        assert store.open_not_evaluated(policy.name, []) == []
    finally:
        store.close()


@pytest.mark.parametrize("confidence", [0.5, 0.8, 0.9, 0.95, 0.975, 0.99, 0.999, 0.123456789])
def test_two_sided_z_is_what_norm_ppf_gives(confidence: float) -> None:
    assert two_sided_z(confidence) == float(norm.ppf(0.5 + confidence / 2.0))
    assert two_sided_z(0.95) == pytest.approx(1.959963984540054, abs=1e-15)


def test_last_notification_times_equal_one_lookup_per_group(tmp_path: Path) -> None:
    with Store.open(tmp_path / "lstar.duckdb") as store:
        made: dict[tuple[str, str, str], Any] = {}
        for i in range(24):
            receiver, key = f"r{i % 3}", f"g{i % 4}"
            now = T0 + timedelta(minutes=7 * i)
            notify_one(store, i, receiver, key, now)
            made[("p", receiver, key)] = max(made.get(("p", receiver, key), now), now)
        asked = [*made, ("p", "r0", "never"), ("q", "r1", "g1")]
        got = store.last_notification_times(asked)
        assert got == {k: store.last_notification_at(*k) for k in made} == made
        assert store.last_notification_times([]) == {}
