"""Stress limits → flags on a curve: the limits themselves, the store table, and where a flag
shows (`lstar policy check`, a prediction's caveat and alert text, the report's problems)."""

from __future__ import annotations

import math
from datetime import timedelta

import pytest

from monitor.errors import StoreError
from monitor.store import Store
from monitor.stress.limits import (FORMAT_INSTABILITY_MAX, LIMITS, TOKENIZATION_RESIDUAL_VARIANCE_MAX,
                                   curves_of, flags_for)
from monitor.stress.storage import save_stress_report, stress_caveats, stress_flags_for_curve
from monitor.stress.subject import SCHEMA

CURVE = "c" * 64
OTHER = "d" * 64


def document(*, instability=0.25, shift=0.40, width=0.30, alpha=1.02, residual=1e-4, curve=CURVE,
             register_curve=OTHER, sections=("task_format", "registers", "tokenization")) -> dict:
    every = {
        "task_format": {"test": "task_format", "tasks": [
            {"task": "cloze-v0", "formats": [], "instability": instability,
             "accuracy_upper_bound": 1 - instability if isinstance(instability, float) else instability,
             "n_items": 40}]},
        "registers": {"test": "registers", "registers": [], "lstar": {}, "kendall_tau": [], "curves": [
            {"curve_id": register_curve, "register": "code", "threshold_lstar": 1.2,
             "threshold_shift_lstar": shift, "threshold_interval_width": width, "crossing_error_change": 0.1}]},
        "tokenization": {"test": "tokenization", "checkpoints": [], "notes": [], "fits": [
            {"variant": "dropout-0.1", "alpha": alpha, "beta": 0.0, "residual_variance": residual, "n": 5}]},
    }
    return {"schema": SCHEMA, "subject": {"kind": "model", "name": "m", "curve_id": curve},
            "sections": {name: every[name] for name in sections}}


def test_each_limit_fires_just_past_its_bound_and_not_at_it():
    # format instability: 0.25 > 0.10 flags, exactly 0.10 does not
    [flag] = flags_for(document(shift=0.0), CURVE)
    assert (flag.limit, flag.value, flag.bound) == ("format_instability", 0.25, FORMAT_INSTABILITY_MAX)
    assert "0.75" in flag.message   # the accuracy bound 1 - 0.25 is named
    assert flags_for(document(instability=FORMAT_INSTABILITY_MAX, shift=0.0), CURVE) == []
    # register shift: |-0.40| > 0.30 flags the register section's own curve, not the subject's
    [flag] = flags_for(document(instability=0.0, shift=-0.40), OTHER)
    assert (flag.limit, flag.value, flag.bound) == ("register_threshold_shift", 0.40, 0.30)
    assert flags_for(document(instability=0.0, shift=0.30), OTHER) == []
    # tokenization: alpha 1.2 and residual variance above 0.03²
    flags = flags_for(document(instability=0.0, alpha=1.2, residual=0.0301 ** 2), CURVE)
    assert [f.limit for f in flags] == ["tokenization_alpha", "tokenization_residual"]
    assert flags_for(document(instability=0.0, alpha=0.91, residual=TOKENIZATION_RESIDUAL_VARIANCE_MAX), CURVE) == []
    # every limit is documented with a reason
    assert {limit.name for limit in LIMITS} == {"register_threshold_shift", "format_instability",
                                                "tokenization_alpha", "tokenization_residual"}
    assert all(limit.reason for limit in LIMITS)


def test_hostile_numbers_flag_nothing_and_never_raise():
    for bad in (None, "0.9", math.nan, math.inf, True, [1]):
        assert flags_for(document(instability=bad, shift=bad, alpha=bad, residual=bad), CURVE) == []
        assert flags_for(document(instability=bad, shift=bad, alpha=bad, residual=bad), OTHER) == []
    assert flags_for({"sections": "x", "subject": 3}, CURVE) == []
    assert curves_of(document()) == {CURVE, OTHER}


def test_store_keeps_documents_and_the_newest_result_of_each_test_decides(tmp_path):
    with Store.open(tmp_path / "s.duckdb") as store:
        assert stress_flags_for_curve(store, CURVE) == []
        first = save_stress_report(store, document())
        assert save_stress_report(store, document()) == first            # same document: same id, one row
        assert store.query("SELECT count(*) AS n FROM stress_reports")[0]["n"] == 1
        assert [f.limit for f in stress_flags_for_curve(store, CURVE)] == ["format_instability"]
        assert [f.limit for f in stress_flags_for_curve(store, OTHER)] == ["register_threshold_shift"]
        assert stress_flags_for_curve(store, CURVE)[0].report_id == first
        # a newer task-format result within the limit clears that flag; registers stay as stored
        save_stress_report(store, document(instability=0.05, sections=("task_format",)))
        assert stress_flags_for_curve(store, CURVE) == []
        assert [f.limit for f in stress_flags_for_curve(store, OTHER)] == ["register_threshold_shift"]
        [line] = stress_caveats(store, OTHER)
        assert "0.400 L*" in line and "limit register_threshold_shift" in line


def test_store_refuses_what_is_not_a_stress_document(tmp_path):
    with Store.open(tmp_path / "s.duckdb") as store:
        with pytest.raises(StoreError, match="schema"):
            save_stress_report(store, {"schema": "other/1"})
        with pytest.raises(StoreError, match="unknown sections"):
            save_stress_report(store, {**document(), "sections": {"vibes": {}}})
        with pytest.raises(StoreError, match="plain JSON"):
            save_stress_report(store, {**document(), "subject": {"curve_id": CURVE, "x": math.nan}})


def test_report_problems_and_prediction_caveats_name_a_flagged_curve(tmp_path):
    from monitor.reports.report import build_report, to_markdown
    from support.report_state import T0, build_report_state

    made = build_report_state(tmp_path)
    store, policy, curve = made.store, made.policy, made.curve
    try:
        data = build_report(store, policy, now=made.now, period_start=T0)
        assert not any("stress" in p for p in data["problems"])
        save_stress_report(store, document(curve=curve.curve_id))
        data = build_report(store, policy, now=made.now, period_start=T0)
        [problem] = [p for p in data["problems"] if "stress" in p]
        assert problem.startswith(f"task cloze: curve {curve.curve_id[:12]} is flagged by a stress limit")
        assert "format instability 0.250" in problem
        assert "format instability 0.250" in to_markdown(data)
    finally:
        store.close()


def test_a_prediction_on_a_flagged_curve_carries_the_caveat_into_its_alert_text(tmp_path):
    from monitor.alerts.evaluation_tick import evaluate_pending
    from monitor.policy.load import load_policy
    from support.report_state import CORPUS, T0, _fit_curve, write_report_policy
    from support.scores import record_fake_score

    curve = _fit_curve(tmp_path)
    policy = load_policy(write_report_policy(tmp_path, tmp_path / "audit.jsonl"))
    with Store.open(tmp_path / "lstar.duckdb") as store:
        save_stress_report(store, document(curve=curve.curve_id))
        record_fake_score(store, repo="org/m", sha="a" * 40, lstar=0.5, se=0.01, finished_at=T0,
                          corpus_sha256=CORPUS, spec={"window_len": 64, "stride": 32, "prefix_policy": "bos"})
        evaluate_pending(store, [policy], now=T0 + timedelta(minutes=1))
        rows = store.query_json("SELECT detail FROM predictions", [], ("detail",))
        alerts = store.query_json("SELECT annotations FROM alerts", [], ("annotations",))
    assert rows, "the score was not evaluated"
    [caveat] = rows[0]["detail"]["caveats"]
    assert caveat.startswith("stress: task cloze-v0 has format instability 0.250 > 0.10")
    for alert in alerts:   # the alert's text (webhook payload and email body) says it too
        assert caveat in alert["annotations"]["description"]


def test_policy_check_warns_of_a_flagged_curve(tmp_path, capsys):
    from monitor.cli import main
    from support.report_state import _fit_curve, write_report_policy

    curve = _fit_curve(tmp_path)
    path = write_report_policy(tmp_path, tmp_path / "audit.jsonl")
    state = tmp_path / "state"
    with Store.open(state / "lstar.duckdb") as store:
        save_stress_report(store, document(curve=OTHER))   # another curve's result: no warning
    assert main(["policy", "check", str(path), "--state", str(state)]) == 0
    assert "WARNING" not in capsys.readouterr().out
    with Store.open(state / "lstar.duckdb") as store:
        save_stress_report(store, document(curve=curve.curve_id))
    assert main(["policy", "check", str(path), "--state", str(state)]) == 0   # a warning, not a failure
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"SUCCESS {path}"
    [warning] = [line for line in lines if line.startswith("WARNING")]
    assert warning.startswith(f"WARNING {path}: tasks[0] cloze: curve {curve.curve_id[:12]} is flagged by stress "
                              "limit format_instability: stress: task cloze-v0 has format instability 0.250")
