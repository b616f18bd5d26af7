"""A report reads a checkpoint's stored refs as the alert engine and the status page do: a JSON
array's strings, nothing from any other JSON value (`lineage_batch.decoded`, then
`training_order.place`'s filter). Refs that are an object must not name a step through its keys,
and an array mixing numbers and strings must not stop the report."""

from __future__ import annotations

import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

END = datetime(2026, 6, 1, 12, tzinfo=timezone.utc)


def _report(tmp_path: Path, first_refs: str, *, days: int = 7) -> tuple[dict, list[str]]:
    """The report of a two-checkpoint lineage (step0 gated 2026-05-02, step1 gated 2026-05-03,
    both scored a month before END) whose first checkpoint's refs are `first_refs` (JSON text)."""
    import scale_state as ss

    from monitor.reports.report import build_report
    from monitor.store import Store

    policy = ss.load_bench_policy(ss.write_policy(tmp_path))
    with Store.open(tmp_path / "lstar.duckdb") as store:
        repo = ss.repo_name(0)
        shas = [ss.commit_sha(repo, i) for i in range(2)]
        for i in range(2):
            ss.record_checkpoint(store, policy, repo, i, ss.lstar_of(0, i, 2), END - timedelta(days=30 - i))
        with store.transaction() as conn:
            conn.execute("UPDATE checkpoints SET refs = ? WHERE sha = ?", [first_refs, shas[0]])
        data = build_report(store, policy, now=END, period_start=END - timedelta(days=days))
    return data, shas


def test_refs_that_are_an_object_name_no_step(tmp_path) -> None:
    # The alert engine reads `{"step900": 1}` as no refs (`decoded(text, [])`): the lineage then has
    # a checkpoint without a step, so it is ordered by the gate's commit date, and step1 (gated a
    # day later) is current. Reading the object's keys would make step 900 current instead.
    from monitor.store.lineage_batch import decoded
    from monitor.training_order import place

    assert place(decoded('{"step900": 1}', []), {}, None, END).step is None   # the reference reading
    data, shas = _report(tmp_path, '{"step900": 1}')
    family = data["families"][0]
    assert family["order"] == "release time"
    assert shas[1][:7] in family["current"] and shas[0][:7] not in family["current"]
    rows = {row["commit"]: row for row in data["lineage_history"]}
    assert rows[shas[0]]["step"] is None and rows[shas[0]]["refs"] == []
    assert [row["commit"] for row in data["lineage_history"]] == shas


@pytest.mark.parametrize("days", [7, 60])   # carried in, and scored and discovered in the window
def test_refs_mixing_numbers_and_strings_are_read_as_their_strings(tmp_path, days) -> None:
    # `[1, "step900"]` is the ref `step900` (place drops the number): by step, 900 > 1, so the
    # first checkpoint is current, and its name shows that ref.
    data, shas = _report(tmp_path, '[1, "step900"]', days=days)
    family = data["families"][0]
    assert family["order"] == "training step"
    assert family["current"].endswith(f"@step900 ({shas[0][:7]})")
    assert [row["commit"] for row in data["lineage_history"]] == [shas[1], shas[0]]
    assert {row["commit"]: row["refs"] for row in data["lineage_history"]}[shas[0]] == ["step900"]
    if days == 60:
        assert {c["checkpoint"] for c in data["new_checkpoints"]} >= {family["current"]}
