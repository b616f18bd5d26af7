"""The report's score-run query joins the checkpoints' key columns and the meta's two placing
values extracted before the join (not whole metas, issue 39): its rows equal those of the query
it replaced, which joined whole checkpoints and extracted after the join (kept here as the
reference), for a run that names its checkpoint by id, one recorded before ids (by repo and
commit), one whose checkpoint's meta is empty and one with no checkpoint row."""

from __future__ import annotations

import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import scale_state as ss

from monitor.store import Store
from monitor.store.placing import META_SET, PLACEMENT_EXTRACT, PLACEMENT_OBJECT
from monitor.store.reports import ReportRows

T_END = datetime(2026, 6, 1, 12, tzinfo=timezone.utc)

# the query before the change: whole checkpoints joined, the placing values extracted from the
# whole meta after the join (not read from `placing_values`)
REFERENCE_SELECT = ReportRows._RUN_SELECT.split("json_array(")[0] + (
    "json_array(r.tcb, coalesce(c1.refs, c2.refs), "
    f"{PLACEMENT_OBJECT.format(placed=PLACEMENT_EXTRACT.format(meta='coalesce(c1.meta, c2.meta)'))}) AS json_columns "
    "FROM score_runs r LEFT JOIN checkpoints c1 ON c1.id = r.checkpoint_id "
    "LEFT JOIN checkpoints c2 ON r.checkpoint_id IS NULL AND c2.repo = r.model_repo AND c2.sha = r.model_sha ")


def test_the_run_query_reads_what_the_whole_meta_join_read(tmp_path):
    policy = ss.load_bench_policy(ss.write_policy(tmp_path))
    store = Store.open(tmp_path / "lstar.duckdb")
    try:
        for j in range(3):
            for i in range(2):
                ss.record_checkpoint(store, policy, ss.repo_name(j), i, ss.lstar_of(j, i, 2),
                                     T_END - timedelta(days=2) + timedelta(hours=j + 24 * i))
        conn = store._conn
        assert conn.execute("SELECT count(*) FROM score_runs WHERE checkpoint_id IS NOT NULL").fetchone()[0] == 6
        # lineage 1's runs recorded before ids; lineage 2's first checkpoint with an empty meta; its
        # second checkpoint's row gone (the run keeps its repo as its lineage)
        conn.execute("UPDATE score_runs SET checkpoint_id = NULL WHERE model_repo = ?", [ss.repo_name(1)])
        conn.execute(f"UPDATE checkpoints SET {META_SET} WHERE repo = ? AND sha = ?",
                     ["{}", "{}", ss.repo_name(2), ss.commit_sha(ss.repo_name(2), 0)])
        conn.execute("DELETE FROM checkpoints WHERE repo = ? AND sha = ?",
                     [ss.repo_name(2), ss.commit_sha(ss.repo_name(2), 1)])
        order = " ORDER BY r.finished_at, r.run_id"
        new = conn.execute(ReportRows._RUN_SELECT + order).fetchall()
        old = conn.execute(REFERENCE_SELECT + order).fetchall()
        assert len(new) == 6
        assert new == old
        placing = [row[-1] for row in new]
        # the cases differ: a gate date where the meta has one, nulls where it has none, and a
        # run with no checkpoint reads null placing values (its checkpoint's meta is unknown)
        assert any('"commit_date":"' in p for p in placing)
        assert any('"commit_date":null' in p for p in placing)
    finally:
        store.close()
