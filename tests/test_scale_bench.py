"""The scale benchmark's bulk loader is faithful: lineages copied set-based from an API-built
template equal the same lineages written through the store's API one checkpoint at a time
(`benchmarks/scale_state.py`)."""

from __future__ import annotations

import shutil
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import scale_state as ss

from monitor.store import Store

T_END = datetime(2026, 6, 1, 12, tzinfo=timezone.utc)
# Each shape once (len(ss.SHAPES) == 4), and lineage 1 a fine-tune of lineage 0 (with 6
# lineages the fixture cost 15.7 CPU-seconds, with 4 it costs 9.8). Fewer lineages than the
# template's 20, as before: the bulk copy's renaming of lineages past the template (repo,
# run ids, time shift) is not exercised here.
N_LINEAGES, PER_LINEAGE = 4, 5
RETENTION = timedelta(days=2)    # the idle polls kept: 192 (a year's worth would take minutes)


@pytest.fixture(scope="module")
def states(tmp_path_factory):
    folder = tmp_path_factory.mktemp("scale")
    template = ss.build_template(folder, n_lineages=N_LINEAGES, t_end=T_END, per_lineage=PER_LINEAGE)
    policy = ss.load_bench_policy(folder / "policies")
    # With N_LINEAGES <= TEMPLATE_LINEAGES the template is lineages 0..N-1 written by
    # build_api_state through the store's API, the same calls in the same order the API state
    # makes, so the API state starts as a copy of that file and only its retention (idle polls,
    # weekly reports, the prune) is written here through the API: writing the checkpoints a
    # second time cost 9.8 of the fixture's 25.5 CPU-seconds (at 6 lineages).
    assert len(ss.SHAPES) <= N_LINEAGES <= ss.TEMPLATE_LINEAGES and not Path(f"{template}.wal").exists()
    shutil.copyfile(template, folder / "api.duckdb")
    api = Store.open(folder / "api.duckdb")
    bulk = Store.open(folder / "bulk.duckdb")
    ss.build_api_state(api, policy, [], n_lineages=N_LINEAGES, t_end=T_END,
                       per_lineage=PER_LINEAGE, retention=RETENTION)
    ss.bulk_state(bulk, template, n_lineages=N_LINEAGES, t_end=T_END, per_lineage=PER_LINEAGE,
                  retention=RETENTION)
    yield api, bulk
    api.close()
    bulk.close()


@pytest.mark.slow
def test_bulk_copy_equals_the_api_built_state(states):
    api, bulk = states
    assert ss.compare_states(api, bulk) == {}
    # and the comparison is not vacuous: every kind of row is there, in the expected numbers
    counts = {t: api.query(f"SELECT count(*) AS n FROM {t}")[0]["n"] for t in
              ("checkpoints", "score_runs", "score_documents", "predictions", "alerts", "deliveries",
               "notifications", "hub_polls")}
    n = N_LINEAGES * PER_LINEAGE
    assert counts["checkpoints"] == counts["score_runs"] == n
    assert counts["score_documents"] == n * ss.DOCS_PER_SCORE
    assert counts["predictions"] == n * len(ss.TASKS)
    assert counts["alerts"] > 0 and counts["deliveries"] == counts["alerts"] and counts["notifications"] > 0
    assert counts["hub_polls"] >= RETENTION / ss.POLL_EVERY
    # the realistic parts: fine-tunes with their base, drained queue with scopes, weekly reports, ~2 KB meta
    bases = api.query("SELECT b.base_repo, c.repo FROM checkpoint_bases b JOIN checkpoints c ON c.id = b.checkpoint_id")
    assert len(bases) == PER_LINEAGE and {(r["base_repo"], r["repo"]) for r in bases} == {
        (ss.repo_name(0), ss.repo_name(1))}
    assert api.query("SELECT count(*) AS n FROM evaluation_queue")[0]["n"] == 0
    assert api.query("SELECT count(*) AS n FROM evaluation_scopes")[0]["n"] == len(ss.TASKS)
    assert api.query("SELECT count(*) AS n FROM reports")[0]["n"] == ss.REPORTS
    sizes = [r["n"] for r in api.query("SELECT length(meta::VARCHAR) AS n FROM checkpoints")]
    assert 1800 <= min(sizes) and max(sizes) <= 2600


@pytest.mark.slow
def test_the_comparison_sees_a_changed_row(states):
    api, bulk = states
    with bulk.transaction() as conn:
        conn.execute("UPDATE predictions SET p_hat = p_hat + 1e-9 WHERE id = (SELECT max(id) FROM predictions)")
    try:
        assert set(ss.compare_states(api, bulk)) == {"predictions"}
    finally:
        with bulk.transaction() as conn:
            conn.execute("UPDATE predictions SET p_hat = p_hat - 1e-9 WHERE id = (SELECT max(id) FROM predictions)")


def test_lineage_starts_spread_over_the_span_and_end_before_t_end():
    """The loader's SQL copies these starts; here they are checked by hand."""
    n = 10
    starts = [ss.lineage_start(j, n, T_END, per_lineage=20) for j in range(n)]
    assert starts == sorted(starts)
    last_checkpoint = starts[-1] + ss.STEP * 19
    assert last_checkpoint == T_END - timedelta(hours=1)
    spacing = (ss.SPAN - ss.STEP * 19) / n
    assert abs((starts[1] - starts[0]) - spacing).total_seconds() < 1
