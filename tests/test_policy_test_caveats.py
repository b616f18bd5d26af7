"""`lstar policy test` says in its table, not only in `--json`, when a decision rests on an
extrapolated curve or on a threshold the curve's own warnings leave unresolved."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from monitor.cli import main
from monitor.curves.artifact import Threshold, load_curve, save_curve

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "policies"


def _row(out: str, task: str) -> str:
    return next(line for line in out.splitlines() if line.lstrip("│ ").startswith(task + " "))


def _policy(tmp_path: Path, *, unresolved: bool) -> Path:
    curve = load_curve(FIXTURES / "curves" / "arith.json")
    if unresolved:  # the threshold at the edge of the data: a curve warning leaves it unresolved
        threshold = Threshold.model_validate({**curve.threshold.model_dump(), "lower": None})
        changed = curve.model_copy(update={"threshold": threshold})
        curve = changed.model_copy(update={"curve_id": changed.content_id()})
    save_curve(curve, tmp_path / "curves" / "arith.json")
    (tmp_path / "policy.yaml").write_text("name: p\ntasks:\n  - name: arith\n    curve: curves/arith.json\n"
                                          "route: {receiver: log}\nreceivers:\n  - name: log\n"
                                          "    file: {path: alerts.jsonl}\n")
    return tmp_path / "policy.yaml"


@pytest.mark.parametrize("unresolved", [False, True])
def test_the_table_names_an_extrapolated_curve_and_an_unresolved_threshold(tmp_path: Path, monkeypatch,
                                                                           capsys, unresolved: bool) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    policy = _policy(tmp_path, unresolved=unresolved)
    far = "-40"  # the curve's data spans L* -4 … -1
    assert main(["policy", "test", str(policy), "--lstar", far, "--json"]) == 0
    decision = json.loads(capsys.readouterr().out)["tasks"][0]
    assert decision["extrapolated"] is True and decision["threshold_resolved"] is (not unresolved)
    assert main(["policy", "test", str(policy), "--lstar", far]) == 0
    out = capsys.readouterr().out
    assert "caveats" in out
    row = _row(out, "arith")
    assert "extrapolated" in row
    assert ("threshold unresolved" in out) is unresolved


def test_a_score_inside_the_data_has_no_caveats(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    shutil.copytree(FIXTURES / "curves", tmp_path / "curves")
    assert main(["policy", "test", str(_policy(tmp_path, unresolved=False)), "--lstar", "-2.0"]) == 0
    row = _row(capsys.readouterr().out, "arith")
    assert "extrapolated" not in row and "unresolved" not in row and "—" in row
