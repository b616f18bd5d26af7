"""The committed full run of lab v2 (`benchmarks/results/lab-v2/`): its lab.json is a complete,
valid record of the design in docs/lab.md, and the committed report's headline numbers are
what the committed code computes from it. The primary comparison's difference, permutation p
and per-family errors do not depend on the bootstrap or on the other axes, so a race of L*
against bits/byte alone, with few resamples, must reproduce them exactly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from monitor.lab.analysis import PRIMARY, RaceConfig, race
from monitor.lab.record_file import load_lab_with_sha256
from monitor.lab.records import race_rows

RUN = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "lab-v2"
FAMILIES = {"gpt2", "llama-2", "llama-3", "smollm2", "qwen2", "gpt-neox"}


@pytest.fixture(scope="module")
def committed():
    lab, sha = load_lab_with_sha256(RUN / "lab.json")
    report = json.loads((RUN / "report" / "lab-report.json").read_text(encoding="utf-8"))
    return lab, sha, report


def test_the_committed_lab_json_is_the_whole_design(committed):
    lab, _, _ = committed
    lineages = {(c.family, c.size, c.seed) for c in lab.checkpoints}
    assert {f for f, _, _ in lineages} == FAMILIES
    assert len(lineages) == 6 * 2 * 3
    assert all(sum(1 for c in lab.checkpoints if (c.family, c.size, c.seed) == lin) == 6 for lin in lineages)
    assert all(f.role == "primary" for f in lab.families)
    # Every checkpoint was scored on the whole of calib-v0 (216 documents, 606,511 bytes), not a subset.
    assert {c.texts["calib"].n_bytes for c in lab.checkpoints} == {606_511}
    # The pool the run read is the one whose pins are committed.
    pins = json.loads((RUN.parents[2] / "data" / "lab-pool-v1.manifest.json").read_text(encoding="utf-8"))
    recorded = json.dumps(lab.config)
    assert all(split["sha256"] in recorded for split in pins["splits"].values())


def test_the_committed_report_comes_from_the_committed_lab_json(committed):
    lab, sha, report = committed
    assert report["source"]["sha256"] == sha
    assert report["design"]["n_lineages"] == 36 and report["design"]["n_families"] == 6
    quick = race(race_rows(lab), RaceConfig(axes=(PRIMARY["axis"],), resamples=20, threshold_resamples=20))
    got, want = quick["primary"], report["primary"]
    assert got["difference"] == pytest.approx(want["difference"], abs=1e-12)
    assert got["p_value"] == pytest.approx(want["p_value"], abs=1e-12)
    assert got["signs_by_text"] == want["signs_by_text"] and got["signs_by_size"] == want["signs_by_size"]

    def families(data):
        entry = next(m for m in data["metrics"] if (m["task"], m["metric"]) == (PRIMARY["task"], PRIMARY["metric"]))
        return entry["texts"][PRIMARY["text"]]["axes"][PRIMARY["axis"]]

    assert json.dumps(families(quick)["per_family"], sort_keys=True) == json.dumps(families(report)["per_family"],
                                                                                   sort_keys=True)
