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
