"""The committed lab v3 pilot (benchmarks/results/lab-v3/pilot/) against the pre-registered gate:
`lstar lab report --pilot` on the committed lab.json gives the committed gate, the record carries
the hash of the pre-registration as committed, and the numbers docs/lab.md quotes are the gate's."""

from __future__ import annotations

import json
import re
from pathlib import Path

from typer.testing import CliRunner

from monitor.cli import app
from monitor.lab.preregistration import preregistration_sha256

ROOT = Path(__file__).resolve().parents[1]
PILOT = ROOT / "benchmarks" / "results" / "lab-v3" / "pilot"


def _gate_now() -> dict:
    result = CliRunner().invoke(app, ["lab", "report", "--pilot", str(PILOT / "lab.json"), "--json"])
    assert result.exit_code == 0, result.output  # exit 0: the gate passed
    return json.loads(result.output)


def test_the_committed_pilot_gives_the_committed_gate():
    now = _gate_now()
    committed = json.loads((PILOT / "pilot-gate.json").read_text())
    now.pop("source")
    committed.pop("source")
    assert now == committed


def test_the_pilot_was_run_under_the_committed_preregistration():
    record = json.loads((PILOT / "lab.json").read_text())
    assert record["preregistration_sha256"] == preregistration_sha256()


def test_the_gate_is_recomputed_from_the_rows_by_hand():
    """Crossing errors of each axis against the always-above baseline, from the committed numbers:
    an axis passes when it is at least the margin below both baselines (pre-registration)."""
    gate = json.loads((PILOT / "pilot-gate.json").read_text())["pilot_gate"]
    margin = gate["margin"]
    for name, axis in gate["axes"].items():
        shuffled = sum(axis["shuffled_errors"]) / len(axis["shuffled_errors"])
        assert abs(shuffled - axis["shuffled_mean_error"]) < 1e-12
        beats = (axis["crossing_error"] <= axis["always_above_error"] - margin
                 and axis["crossing_error"] <= shuffled - margin)
        assert beats == axis["passed"], name
    assert gate["passed"] == any(a["passed"] for a in gate["axes"].values())
    # 36 rows (6 families x 6 checkpoints): every error is a multiple of 1/36
    for axis in gate["axes"].values():
        assert abs(axis["crossing_error"] * 36 - round(axis["crossing_error"] * 36)) < 1e-9


def test_the_docs_quote_the_gate():
    gate = json.loads((PILOT / "pilot-gate.json").read_text())["pilot_gate"]
    text = (ROOT / "docs" / "lab.md").read_text()
    section = text[text.index("### The pilot's result"):]
    for name in ("lstar", "lstar_oos", "bits_per_byte", "raw_ce"):
        axis = gate["axes"][name]
        row = re.search(rf"^\| `{name}` \| ([0-9.]+) \| ([0-9.]+) \| ([0-9.]+) \| (yes|no) \|$", section, re.M)
        assert row, name
        assert float(row[1]) == round(axis["crossing_error"], 3)
        assert float(row[2]) == round(axis["always_above_error"], 3)
        assert float(row[3]) == round(axis["shuffled_mean_error"], 3)
        assert (row[4] == "yes") == axis["passed"]


def test_the_rerun_on_another_machine_is_what_the_docs_say():
    """gpt2 seed 0 trained again on another machine (benchmarks/results/lab-v3/race/rerun/): the
    same data, the held-out L* apart by the amounts docs/lab.md quotes, checkpoint by checkpoint,
    and the same checkpoints above the gate's level."""
    record = json.loads((PILOT / "lab.json").read_text())
    rerun = json.loads((ROOT / "benchmarks/results/lab-v3/race/rerun/gpt2-large-s0.json").read_text())
    pilot = [c for c in record["checkpoints"] if (c["family"], c["seed"]) == ("gpt2", 0)]
    data = [d for d in record["data"] if (d["family"], d["seed"]) == ("gpt2", 0)]
    assert rerun["data"] == data[0]
    assert [c["bytes_seen"] for c in pilot] == [c["bytes_seen"] for c in rerun["checkpoints"]]
    gaps = [abs(b["texts"]["heldout"]["lstar"] - a["texts"]["heldout"]["lstar"])
            for a, b in zip(pilot, rerun["checkpoints"], strict=True)]
    assert [f"{g:.1e}" for g in gaps] == ["1.6e-06", "1.3e-05", "1.0e-04", "2.2e-04", "4.0e-04", "2.7e-03"]
    last = (pilot[-1]["tasks"]["add-words"], rerun["checkpoints"][-1]["tasks"]["add-words"])
    assert [f"{t['logp_correct']:.3f}" for t in last] == ["-1.671", "-1.511"]
    assert [f"{t['acc']:.3f}" for t in last] == ["0.368", "0.390"]
    level = json.loads((PILOT / "pilot-gate.json").read_text())["pilot_gate"]["level"]
    assert f"{level:.3f}" == "-2.639"
    above = [[c["tasks"]["add-words"]["logp_correct"] > level for c in run] for run in (pilot, rerun["checkpoints"])]
    assert above[0] == above[1] == [False, False, True, True, True, True]
    text = (ROOT / "docs" / "lab.md").read_text()
    for quoted in ("1.6e-6", "2.7e-3", "−1.511 against −1.671", "0.390 against 0.368", "(−2.639)"):
        assert quoted in text
