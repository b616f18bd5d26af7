"""The committed backtests (`examples/backtests/results/`) checked independently of the code that
made them: each result's coverage, observed states and final errors recounted from its own
points with scipy and a loop, the OLMo-2 7B's observed values read back from the source table
with the csv module, and every number the README of that folder states found in the results.
"""

from __future__ import annotations

import csv
import json
import math
import re
from pathlib import Path

import pytest
from scipy.stats import beta, norm

REPO = Path(__file__).resolve().parents[1]
BACKTESTS = REPO / "examples" / "backtests"
RESULTS = sorted((BACKTESTS / "results").glob("*/result.json"))


def _load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def test_every_committed_backtest_is_there() -> None:
    names = {p.parent.name for p in RESULTS}
    assert {"olmo-c4-low", "olmo-c4-frontier", "olmo-task-loss-low", "olmo-task-loss-frontier",
            "pythia-lambada-low", "obsscaling-lofo-bpc"} <= names


@pytest.mark.parametrize("path", RESULTS, ids=lambda p: p.parent.name)
def test_coverage_states_and_errors_recounted_from_the_points(path: Path) -> None:
    data = _load(path)
    pooled_checked = pooled_covered = 0
    by_range = {False: [0, 0], True: [0, 0]}   # extrapolated? -> [checked, covered]
    for item in data["results"]:
        checked = covered = 0
        for point in item["points"]:
            conf = data["curves"][item["task"]]["confidence"] if item["task"] in data["curves"] else 0.9
            z = norm.ppf(0.5 + conf / 2)
            level = item["level"]
            # the observation's interval: Clopper–Pearson on round(value·n) of n
            n, value = point["n"], point["observed"]
            if n:
                k = round(value * n)
                lo = 0.0 if k == 0 else beta.ppf((1 - conf) / 2, k, n - k + 1)
                hi = 1.0 if k == n else beta.ppf(1 - (1 - conf) / 2, k + 1, n - k)
                assert point["observed_interval"] == pytest.approx([lo, hi], abs=1e-9)
                state = ("observed_emerged" if lo >= level else "observed_clear" if hi < level
                         else "observed_unresolved")
                assert point["observed_state"] == state, point["checkpoint"]
            if point.get("p_hat") is None:
                continue
            p_hat, (p_lo, p_hi) = point["p_hat"], point["interval"]
            p = min(max(p_hat, 0.0), 1.0)
            noise = z * math.sqrt(p * (1 - p) / n) if n else z * (point["stderr"] or 0.0)
            wide_lo = p_hat - math.sqrt(max(p_hat - p_lo, 0) ** 2 + noise ** 2)
            wide_hi = p_hat + math.sqrt(max(p_hi - p_hat, 0) ** 2 + noise ** 2)
            checked += 1
            covered += wide_lo <= value <= wide_hi
            assert point["covered"] is (wide_lo <= value <= wide_hi), point["checkpoint"]
            by_range[bool(point["extrapolated"])][0] += 1
            by_range[bool(point["extrapolated"])][1] += wide_lo <= value <= wide_hi
        assert (item["coverage"]["checked"], item["coverage"]["covered"]) == (checked, covered)
        pooled_checked, pooled_covered = pooled_checked + checked, pooled_covered + covered
        last = item["points"][-1]
        if last.get("p_hat") is not None and last["observed"]:
            assert item["final"]["relative_error"] == pytest.approx((last["p_hat"] - last["observed"]) / last["observed"])
    cov = data["summary"]["coverage"]
    assert (cov["checked"], cov["covered"]) == (pooled_checked, pooled_covered)
    for key, extrapolated in (("coverage_inside_references", False), ("coverage_beyond_references", True)):
        got = data["summary"][key]
        assert [got["checked"], got["covered"]] == by_range[extrapolated], key
    assert cov["coverage_lo"] == pytest.approx(beta.ppf(0.05, pooled_covered, pooled_checked - pooled_covered + 1))


# The 7B's accuracy columns as the paper's code reads them (rc format, length-normalised; test
# split where the task has one), and MMLU as the plain mean of its four categories.
OLMO_7B_COLUMNS = {
    "mmlu": [f"eval/downstream/mmlu_{c}_test_rc_5shot_len_norm" for c in ("stem", "humanities", "social_sciences",
                                                                          "other")],
    "hellaswag": ["eval/downstream/hellaswag_val_rc_5shot_len_norm"],
    "arc_challenge": ["eval/downstream/arc_challenge_test_rc_5shot_len_norm"],
    "arc_easy": ["eval/downstream/arc_easy_test_rc_5shot_len_norm"],
    "piqa": ["eval/downstream/piqa_val_rc_5shot_len_norm"],
    "csqa": ["eval/downstream/csqa_val_rc_5shot_len_norm"],
    "socialiqa": ["eval/downstream/socialiqa_val_rc_5shot_len_norm"],
    "openbookqa": ["eval/downstream/openbookqa_test_rc_5shot_len_norm"],
}


@pytest.mark.parametrize("name", ["olmo-c4-low", "olmo-task-loss-low"])
def test_the_7b_observations_are_the_source_tables_cells(shared_dir: Path, name: str) -> None:
    with (shared_dir / "data/public-evals/olmo-ladder/ladder-runs/peteish7_eval_full.csv").open(newline="") as fh:
        rows = {float(r["_step"]): r for r in csv.DictReader(fh)}
    data = _load(BACKTESTS / "results" / name / "result.json")
    for item in data["results"]:
        columns = OLMO_7B_COLUMNS[item["task"]]
        for point in item["points"]:
            row = rows[point["step"]]
            assert point["observed"] == pytest.approx(sum(float(row[c]) for c in columns) / len(columns), abs=1e-12)
            if name == "olmo-c4-low":
                assert point["axis_value"] == float(row["eval/c4_en-validation/CrossEntropyLoss"])
        assert item["points"][-1]["step"] == max(rows)


def test_the_readme_states_the_results_numbers() -> None:
    # The README's table: | backtest | task × lineage | crossings (at start) | warned ahead |
    # misses (late) | false alarms | false emerged | coverage [CI] | mean |rel. error| |
    rows = {}
    for line in (BACKTESTS / "README.md").read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if cells and re.fullmatch(r"`[a-z0-9-]+`", cells[0]):
            rows[cells[0].strip("`")] = cells
    for path in RESULTS:
        s = _load(path)["summary"]
        name = path.parent.name
        assert name in rows, f"the README's table has no row for {name}"
        cov = s["coverage"]
        assert rows[name][1:] == [
            str(s["task_lineages"]), f"{s['crossings']} ({s['crossed_at_start']})", str(s["warned_ahead"]),
            f"{s['misses']} ({s['late_warnings']})", str(s["false_alarms"]), str(s["false_emerged"]),
            f"{cov['covered']}/{cov['checked']} = {cov['coverage']:.2f} [{cov['coverage_lo']:.2f}, "
            f"{cov['coverage_hi']:.2f}]", f"{s['mean_abs_relative_error'] * 100:.1f} %"], name


def test_the_readme_states_each_olmo_tasks_final_forecast() -> None:
    text = (BACKTESTS / "README.md").read_text(encoding="utf-8")
    c4 = _load(BACKTESTS / "results" / "olmo-c4-low" / "result.json")
    loss = {r["task"]: r for r in _load(BACKTESTS / "results" / "olmo-task-loss-low" / "result.json")["results"]}
    frontier = {r["task"]: r for r in _load(BACKTESTS / "results" / "olmo-c4-frontier" / "result.json")["results"]}
    for item in c4["results"]:
        task, final = item["task"], item["final"]
        row = (f"| {task} | {final['observed']:.3f} | {final['p_hat']:.3f} | {final['relative_error'] * 100:+.1f} % | "
               f"{loss[task]['final']['relative_error'] * 100:+.1f} % | {final['paper_relative_error'] * 100:+.1f} % | "
               f"{item['coverage']['coverage']:.2f} | {loss[task]['coverage']['coverage']:.2f} | "
               f"{frontier[task]['first_warning']['step']:,.0f} → {frontier[task]['crossing']['step']:,.0f} |")
        assert row in text, row
