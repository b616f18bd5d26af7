"""η̂, its interval and the curve's warnings at the level b + ε a policy puts in force.

A policy task may set its own margin ε; the report prints "level b + ε" with that ε, so η̂
beside it must be the crossing of that level, not of the curve's own margin. Checked against
a refit of the same labels at the policy's margin (the fit's own rule, same seed) and a naive
walk along the curve's knots.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pytest

from monitor.alerts.evaluation_tick import evaluate_pending
from monitor.alerts.predict import predict_task
from monitor.curves.artifact import ScoringRef, curve_warnings, save_curve, threshold_at
from monitor.curves.fit import fit_curve
from monitor.curves.labels import Label
from monitor.policy.load import load_policy
from monitor.reports.present import fmt
from monitor.reports.report import build_report, to_markdown
from monitor.store import Store
from support.report_state import write_report_policy

CORPUS = "c" * 64
SPEC = ScoringRef(spec_version="lstar-score/1", window=64, stride=32, prefix_policy="bos")
CURVE_MARGIN, POLICY_MARGIN = 0.2, 0.4
T0 = datetime(2025, 3, 1, 12, tzinfo=timezone.utc)


def _labels(n_items: int = 200) -> list[Label]:
    rng = np.random.default_rng(0)
    xs = np.linspace(0.0, 3.2, 16)
    return [Label(checkpoint=f"h{i}", value=float(np.clip(0.25 + 0.6 / (1 + np.exp(4 * (x - 1.2)))
                                                          + rng.normal(0, 0.02), 0, 1)),
                  family="f1" if i % 2 else "f2", task="cloze", metric="acc", n=n_items, lstar=float(x))
            for i, x in enumerate(xs)]


def _fit(margin: float, n_items: int = 200):
    return fit_curve(_labels(n_items), task="cloze", metric="acc", baseline=0.25, margin=margin, resamples=100,
                     lofo=False, corpus_sha256=CORPUS, scoring_spec=SPEC, seed=0)


def _naive_crossing(knots_x: list[float], knots_y: list[float], level: float) -> float | None:
    """Walk from the least advanced knot (highest L*) toward lower L*; interpolate the first
    segment that reaches the level."""
    pts = sorted(zip(knots_x, knots_y), reverse=True)
    if pts[0][1] >= level:
        return pts[0][0]
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if y1 >= level:
            return x0 + (level - y0) * (x1 - x0) / (y1 - y0)
    return None


def test_threshold_at_another_level_is_the_refit_threshold():
    curve, refit = _fit(CURVE_MARGIN), _fit(POLICY_MARGIN)
    at = threshold_at(curve, POLICY_MARGIN)
    assert at.level == pytest.approx(0.25 + POLICY_MARGIN) and not at.own_level
    # the band does not depend on the level: the refit's knots and band are the curve's
    assert refit.knots == curve.knots and refit.band == curve.band
    assert at.estimate == pytest.approx(refit.threshold.estimate, abs=1e-12)
    assert at.lower == pytest.approx(refit.threshold.lower, abs=1e-12)
    assert at.upper == pytest.approx(refit.threshold.upper, abs=1e-12)
    assert at.status == refit.threshold.status == "crosses"
    assert at.estimate == pytest.approx(_naive_crossing(curve.knots.x, curve.knots.y, at.level), abs=1e-12)
    # a different level than the curve's own: a different η̂ (else the test proves nothing)
    assert abs(at.estimate - curve.threshold.estimate) > 0.05
    # the logistic check inverted at the policy's level equals the refit's logistic threshold
    assert at.logistic_threshold == pytest.approx(refit.logistic.threshold, rel=1e-6)
    # at the curve's own margin, the stored threshold as it is
    own = threshold_at(curve)
    assert own.own_level and own.threshold == curve.threshold and own.estimate == curve.threshold.estimate


def test_warnings_are_those_of_the_level_in_force():
    # n = 4 items: resolution 1/n = 0.25 is finer than ε = 0.4 but coarser than ε = 0.2
    coarse = _fit(CURVE_MARGIN, n_items=4)
    own = [w.message for w in curve_warnings(coarse) if w.code == "resolution"]
    assert any("resolution 1/n = 0.25" in m for m in own)
    at_policy = [w.message for w in curve_warnings(coarse, POLICY_MARGIN) if w.code == "resolution"]
    refit = [m for m in _fit(POLICY_MARGIN, n_items=4).warnings if "resolution" in m or "binomial" in m]
    assert at_policy == refit
    assert not any("resolution 1/n" in m for m in at_policy)
    # every level mentioned in a warning is the level in force
    for w in curve_warnings(coarse, POLICY_MARGIN):
        assert "b + ε = 0.45" not in w.message


def test_report_and_alert_print_eta_of_the_policy_level(tmp_path: Path):
    curve = _fit(CURVE_MARGIN)
    save_curve(curve, tmp_path / "curves" / "cloze.json")
    audit = tmp_path / "audit.jsonl"
    path = write_report_policy(tmp_path, audit)
    path.write_text(path.read_text().replace("    curve: curves/cloze.json\n",
                                             f"    curve: curves/cloze.json\n    margin: {POLICY_MARGIN}\n"))
    policy = load_policy(path)
    refit = _fit(POLICY_MARGIN)
    with Store.open(tmp_path / "lstar.duckdb") as store:
        evaluate_pending(store, [policy], now=T0)
        data = build_report(store, policy, now=T0 + timedelta(hours=1), period_start=T0)
    (task,) = data["tasks"]
    assert task["margin"] == POLICY_MARGIN and task["level"] == pytest.approx(0.25 + POLICY_MARGIN)
    assert task["eta"] == pytest.approx(refit.threshold.estimate, abs=1e-12)
    assert (task["eta_lower"], task["eta_upper"]) == pytest.approx(
        (refit.threshold.lower, refit.threshold.upper), abs=1e-12)
    assert task["eta"] != pytest.approx(curve.threshold.estimate, abs=0.05)
    # the printed line: the policy's level beside the η̂ of that level
    line = next(x for x in to_markdown(data).splitlines() if x.startswith("Level b + ε"))
    assert f"= {fmt(0.25 + POLICY_MARGIN)}; threshold η̂ = {fmt(refit.threshold.estimate)} [" in line, line
    # the alert's prediction carries the same warnings as the report's task
    pred = predict_task(curve, policy.tasks[0], value=1.0, se=0.0, corpus_sha256=CORPUS)
    assert pred.threshold == pytest.approx(task["level"])
    assert [w["message"] for w in pred.curve_warnings] == [w["message"] for w in task["curve_warnings"]]
