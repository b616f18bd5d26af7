"""Values reach the terminal as they are: a curve warning such as `[none, -1.63]` (which rich
would read as a markup tag and drop) is printed whole by `lstar alerts show` and the terminal
report, exactly as the webhook and `--json` carry it."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from monitor.alerts import evaluate_pending
from monitor.cli import main
from monitor.curves.artifact import Threshold, load_curve, save_curve, unresolved_warnings
from monitor.policy.load import load_policy
from monitor.store import Store
from monitor.testing.scores import record_fake_score

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "policies" / "curves" / "arith.json"
T0 = datetime(2025, 6, 1, 12, 0, tzinfo=timezone.utc)


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path, list[str]]:
    """A policy on a curve whose threshold interval is open below (`[none, …]`), an at-risk
    alert on it in a real DuckDB file, and the curve's warning messages."""
    monkeypatch.setenv("COLUMNS", "1000")  # the messages on one line each, to compare them whole
    clean = load_curve(FIXTURE)
    changed = clean.model_copy(update={"threshold": Threshold.model_validate(
        {**clean.threshold.model_dump(), "lower": None})})
    curve = changed.model_copy(update={"curve_id": changed.content_id()})
    save_curve(curve, tmp_path / "curves" / "arith.json")
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text("name: watched\ntasks:\n  - name: arith\n    curve: curves/arith.json\n"
                           "route: {receiver: log, group_wait: 0s}\nreceivers:\n  - name: log\n"
                           "    file: {path: alerts.jsonl}\n")
    db = tmp_path / "state.duckdb"
    with Store.open(db) as store:
        record_fake_score(store, repo="org/[draft]-model", sha="c" * 40, lstar=-2.0, se=0.02, finished_at=T0)
        evaluate_pending(store, [load_policy(policy_file)], now=T0)
    messages = [w.message for w in unresolved_warnings(curve)]
    assert any("[none, " in m for m in messages)
    return db, policy_file, messages


def test_alerts_show_prints_bracketed_values_whole(state, capsys) -> None:
    db, _, messages = state
    assert main(["alerts", "list", "--db", str(db), "--json"]) == 0
    [alert] = json.loads(capsys.readouterr().out)
    assert main(["alerts", "show", str(alert["id"]), "--db", str(db), "--json"]) == 0
    description = json.loads(capsys.readouterr().out)["annotations"]["description"]
    assert all(m in description for m in messages)
    assert main(["alerts", "show", str(alert["id"]), "--db", str(db)]) == 0
    out = capsys.readouterr().out
    assert description in out
    assert "org/[draft]-model" in out and all(m in out for m in messages)


def test_the_terminal_report_prints_bracketed_values_whole(state, capsys) -> None:
    db, policy_file, messages = state
    assert main(["report", "--db", str(db), "--policy", str(policy_file), "--json"]) == 0
    [problem] = json.loads(capsys.readouterr().out)["problems"]
    assert main(["report", "--db", str(db), "--policy", str(policy_file)]) == 0
    out = capsys.readouterr().out
    assert f"problem: {problem}\n" in out
    assert "org/[draft]-model" in out and all(m in out for m in messages)
