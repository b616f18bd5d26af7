"""The sigmoid family (monitor.curves.parametric), its artifact, and predictions beyond the
references: marked with their distance and widened (monitor.curves.artifact.predict)."""

from __future__ import annotations

import glob
import json
import math
from pathlib import Path

import numpy as np
import pytest
from scipy.optimize import curve_fit
from scipy.special import expit

from monitor.alerts.payload import task_annotations
from monitor.curves.artifact import (extrapolation_widening, load_curve, predict, save_curve)
from monitor.curves.axes import AXES
from monitor.curves.fit import fit_curve
from monitor.curves.labels import Label
from monitor.curves.parametric import EXTRAPOLATION_SPAN, fit_sigmoid, fit_sigmoid_band
from monitor.curves.stats import label_weights
from monitor.errors import CurveError

ROOT = Path(__file__).resolve().parents[1]
TRUTH = dict(floor=0.25, ceiling=0.85, k=5.0, x0=3.2)


def sigmoid(x, floor, ceiling, k, x0, sign):
    return floor + (ceiling - floor) * expit(k * sign * (x - x0))


def synthetic(axis: str, *, m=60, n=2000, seed=0, lo=2.4, hi=4.2):
    rng = np.random.default_rng(seed)
    x = np.sort(rng.uniform(lo, hi, m))
    sign = -1.0 if AXES[axis].lower_is_progress else 1.0
    p = sigmoid(x, **TRUTH, sign=sign)
    y = rng.binomial(n, p) / n
    return x, y, sign


@pytest.mark.parametrize("axis", ["raw_ce", "log_params"])
def test_sigmoid_recovers_known_parameters_and_agrees_with_curve_fit(axis):
    x, y, sign = synthetic(axis)
    n = 2000
    w, _ = label_weights(y, [n] * len(y))
    got = fit_sigmoid(x, y, w, predictor=AXES[axis], proportion=True)
    # scipy's curve_fit on the same weighted problem (sigma = 1/sqrt(weight)), from the truth
    ref, _ = curve_fit(lambda v, f, c, k, x0: sigmoid(v, f, c, k, x0, sign), x, y,
                       p0=[0.3, 0.8, 3.0, 3.0], sigma=1.0 / np.sqrt(w), absolute_sigma=True, maxfev=20000)
    ours = np.array([got.floor, got.ceiling, got.k, got.x0])
    assert np.allclose(ours, ref, rtol=2e-3, atol=2e-4), (ours, ref)
    truth = np.array([TRUTH["floor"], TRUTH["ceiling"], TRUTH["k"], TRUTH["x0"]])
    assert np.allclose(ours, truth, rtol=0.08, atol=0.02), (ours, truth)
    assert got.k > 0 and got.sign == sign
    # monotone toward progress: rising with sign·x
    grid = np.linspace(2.0, 5.0, 50)
    assert np.all(np.diff(got(sign * grid * sign)[np.argsort(sign * grid)]) >= -1e-12)


def test_the_band_covers_the_true_curve_at_about_its_nominal_rate():
    """30 data sets of 30 checkpoints × 300 items: the 90 % band at five points inside the data."""
    hits, total = 0, 0
    probe = np.array([2.6, 2.9, 3.2, 3.5, 3.8])
    truth = sigmoid(probe, **TRUTH, sign=-1.0)
    for seed in range(30):
        x, y, _ = synthetic("raw_ce", m=30, n=300, seed=seed)
        w, _ = label_weights(y, [300] * len(y))
        fit = fit_sigmoid_band(x, y, w, predictor=AXES["raw_ce"], level=0.5, resamples=100, seed=seed)
        lo, hi = fit.band(probe)
        hits += int(np.sum((lo <= truth) & (truth <= hi)))
        total += len(probe)
    share = hits / total
    assert 0.80 <= share <= 0.98, share


def test_the_band_reaches_beyond_the_data_by_the_stated_span():
    x, y, _ = synthetic("raw_ce", m=30)
    w, _ = label_weights(y, [2000] * len(y))
    fit = fit_sigmoid_band(x, y, w, predictor=AXES["raw_ce"], level=0.5, resamples=60)
    span = x.max() - x.min()
    # lower is progress: the grid reaches below the smallest x by EXTRAPOLATION_SPAN × span
    assert fit.grid_x[0] == pytest.approx(x.min() - EXTRAPOLATION_SPAN * span)
    assert fit.grid_x[-1] == pytest.approx(x.max())
    assert np.all(np.diff(fit.lower) <= 1e-12) and np.all(np.diff(fit.upper) <= 1e-12)  # non-increasing in L
    assert np.all(fit.lower <= fit.grid_fit + 1e-12) and np.all(fit.grid_fit <= fit.upper + 1e-12)


def labels_from(x, y, n=2000, axis="raw_ce"):
    return [Label(checkpoint=f"c{i}", value=float(v), n=n, task="t", metric="acc", **{AXES[axis].column: float(xi)})
            for i, (xi, v) in enumerate(zip(x, y))]


def test_fit_curve_sigmoid_artifact_round_trips_and_records_its_family(tmp_path):
    x, y, _ = synthetic("raw_ce", m=40)
    curve = fit_curve(labels_from(x, y), task="t", baseline=0.25, margin=0.2, resamples=100, lofo=False,
                      axis="raw_ce", family="sigmoid")
    assert curve.fit_family == "sigmoid" and curve.sigmoid is not None
    assert curve.sigmoid.x0 == pytest.approx(TRUTH["x0"], abs=0.1)
    data = json.loads(curve.to_json())
    assert data["fit_family"] == "sigmoid" and "extrapolation_widening" not in data
    # knots are the fitted sigmoid sampled on the grid, which reaches beyond the data
    s = curve.sigmoid
    assert np.allclose(curve.knots.y, sigmoid(np.array(curve.knots.x), s.floor, s.ceiling, s.k, s.x0, -1.0))
    assert curve.knots.x[0] < curve.x_range[0]
    # the threshold is the band inverted by the shared rule: the fitted curve is at the level there
    level = curve.level
    assert sigmoid(curve.threshold.estimate, s.floor, s.ceiling, s.k, s.x0, -1.0) == pytest.approx(level, abs=2e-3)
    path = save_curve(curve, tmp_path / "c.json")
    again = load_curve(path)
    assert again == curve and again.content_id() == curve.curve_id
    with pytest.raises(CurveError, match="unknown fit family"):
        fit_curve(labels_from(x, y), task="t", baseline=0.25, margin=0.2, resamples=100, axis="raw_ce",
                  family="spline")


def committed_curves():
    paths = [*glob.glob(str(ROOT / "monitor/demo/data/*.json")), *glob.glob(str(ROOT / "examples/**/*.json"),
                                                                          recursive=True)]
    out = []
    for p in paths:
        try:
            data = json.loads(Path(p).read_text())
        except ValueError:
            continue
        if isinstance(data, dict) and str(data.get("schema", "")).startswith("lstar-curve/"):
            out.append(p)
    return out


def test_committed_isotonic_artifacts_keep_their_json_and_id():
    paths = committed_curves()
    assert paths, "no committed curve artifact found"
    for p in paths:
        text = Path(p).read_text()
        curve = load_curve(p)
        assert curve.fit_family == "isotonic" and curve.lineage_spread is None
        assert curve.content_id() == curve.curve_id == json.loads(text)["curve_id"]
        dumped = json.loads(curve.to_json())
        assert dumped == json.loads(text), p
        assert not {"fit_family", "sigmoid", "extrapolation_widening", "lineage_spread", "family_choice"} & set(dumped)


def simple_isotonic():
    # L* axis (lower is progress): accuracy 0.3 at L* 4 rising to 0.7 at L* 2, with 1000 items
    x = np.linspace(2.0, 4.0, 21)
    y = 0.3 + 0.4 * (4.0 - x) / 2.0
    return fit_curve(labels_from(x, y, n=1000, axis="lstar"), task="t", baseline=0.25, margin=0.2,
                     resamples=100, lofo=False)


def test_an_isotonic_prediction_beyond_its_data_is_marked_and_widens_with_distance():
    curve = simple_isotonic()
    # hand-worked c: the mean slope of g over the data, |g(2) - g(4)| / 2
    g_lo, g_hi = np.interp([2.0, 4.0], curve.knots.x, curve.knots.y)
    c = abs(g_lo - g_hi) / 2.0
    assert extrapolation_widening(curve) == pytest.approx(c)
    edge = predict(curve, 2.0)
    assert edge.extrapolation == 0.0 and not edge.extrapolated
    near, far = predict(curve, 1.9), predict(curve, 1.5)
    assert near.extrapolated and near.extrapolation == pytest.approx(0.1)
    assert far.extrapolation == pytest.approx(0.5)
    # flat g, the lower edge held by monotonicity, the upper edge raised by c·distance
    assert near.p_hat == far.p_hat == pytest.approx(edge.p_hat)
    assert near.lower == far.lower == pytest.approx(edge.lower)
    assert near.upper == pytest.approx(edge.upper + c * 0.1)
    assert far.upper == pytest.approx(min(edge.upper + c * 0.5, 1.0))
    # before the least advanced checkpoint: negative distance, the lower edge drops
    behind = predict(curve, 4.3)
    start = predict(curve, 4.0)
    assert behind.extrapolation == pytest.approx(-0.3)
    assert behind.upper == pytest.approx(start.upper)
    assert behind.lower == pytest.approx(max(start.lower - c * 0.3, 0.0))
    assert behind.as_dict()["extrapolation"] == pytest.approx(-0.3)


def test_a_stored_widening_and_a_score_se_are_used():
    curve = simple_isotonic().model_copy(update={"extrapolation_widening": 0.2})
    edge = predict(curve, 2.0)
    got = predict(curve, 1.8, se=0.05)
    z = 1.6448536269514722
    # the most advanced end of the score's own range, 1.8 - z·0.05, is what the widening reads
    assert got.upper == pytest.approx(edge.upper + 0.2 * (0.2 + z * 0.05))
    assert got.extrapolation == pytest.approx(0.2)


def test_a_sigmoid_prediction_beyond_the_data_widens_both_sides_within_the_monotone_bound():
    x, y, _ = synthetic("lstar", m=40)
    curve = fit_curve(labels_from(x, y, axis="lstar"), task="t", baseline=0.25, margin=0.2, resamples=100,
                      lofo=False, family="sigmoid", widening=0.05)
    lo_edge = float(np.interp(curve.x_range[0], curve.band.x, curve.band.lower))
    results = []
    for d in (0.1, 0.4):
        at = curve.x_range[0] - d
        band_lo = float(np.interp(at, curve.band.x, curve.band.lower))
        band_hi = float(np.interp(at, curve.band.x, curve.band.upper))
        got = predict(curve, at)
        assert got.extrapolated and got.extrapolation == pytest.approx(d)
        assert got.p_hat == pytest.approx(float(np.interp(at, curve.knots.x, curve.knots.y)))
        assert got.upper == pytest.approx(min(band_hi + 0.05 * d, 1.0))
        assert got.lower == pytest.approx(max(band_lo - 0.05 * d, lo_edge))
        results.append(got.upper - got.lower)
    assert results[1] > results[0]


def test_a_sigmoid_answers_from_its_parameters_beyond_its_grid():
    # Past the stored grid (one data span beyond the references) P̂ is the fitted sigmoid itself,
    # computed here by hand from the stored parameters, and keeps rising toward the ceiling.
    x, y, _ = synthetic("lstar", m=40)
    curve = fit_curve(labels_from(x, y, axis="lstar"), task="t", baseline=0.25, margin=0.2, resamples=100,
                      lofo=False, family="sigmoid", widening=0.05)
    sig = curve.sigmoid
    grid_end = min(curve.band.x)          # lower is progress on L*
    got = []
    for at in (grid_end - 0.5, grid_end - 2.0):
        by_hand = sig.floor + (sig.ceiling - sig.floor) / (1.0 + math.exp(sig.k * (at - sig.x0)))
        pred = predict(curve, at)
        assert pred.p_hat == pytest.approx(by_hand, abs=1e-12)
        assert pred.lower <= pred.p_hat <= pred.upper and pred.extrapolated
        got.append(pred.p_hat)
    assert got[1] >= got[0] > float(np.interp(grid_end, curve.knots.x, curve.knots.y)) - 1e-12


def test_a_stored_spread_widens_every_prediction():
    curve = simple_isotonic()
    wider = curve.model_copy(update={"lineage_spread": 0.03})
    a, b = predict(curve, 3.0), predict(wider, 3.0)
    assert b.lower == pytest.approx(a.lower - 0.03) and b.upper == pytest.approx(a.upper + 0.03)


def test_the_alert_says_how_far_a_prediction_extrapolates():
    numbers = {"task": "t", "axis": "lstar", "axis_label": "L*", "value": 1.5, "se": 0.01, "p_hat": 0.6,
               "interval": [0.5, 0.8], "confidence": 0.9, "floor": 0.25, "margin": 0.2, "threshold": 0.45,
               "state": "at_risk", "curve_id": "abc" * 10, "extrapolation": 0.5}
    got = task_annotations(numbers, repo="org/m", commit="0" * 40, state="at_risk")
    assert "extrapolated by 0.5 nats/token beyond the most advanced reference" in got["description"]
    assert got["extrapolation"].startswith("extrapolated by 0.5")
    inside = task_annotations({**numbers, "extrapolation": 0.0}, repo="org/m", commit="0" * 40, state="at_risk")
    assert "extrapolat" not in inside["description"] and "extrapolation" not in inside
    hostile = task_annotations({**numbers, "extrapolation": "<b>"}, repo="org/m", commit="0" * 40, state="at_risk")
    assert "extrapolation" not in hostile and "<b>" not in hostile["description"]
    assert math.isfinite(numbers["extrapolation"])


def test_the_daemon_prediction_carries_the_distance_into_the_alert_numbers():
    from monitor.alerts.predict import predict_task
    from monitor.policy.schema import Task

    curve = simple_isotonic()
    task = Task(name="t", curve="c.json")
    beyond = predict_task(curve, task, value=1.75, se=0.0)
    assert beyond.extrapolated and beyond.as_dict()["extrapolation"] == pytest.approx(0.25)
    assert predict_task(curve, task, value=3.0, se=0.0).as_dict()["extrapolation"] == 0.0
    words = task_annotations(beyond.as_dict(), repo="org/m", commit="1" * 40, state=beyond.state)["description"]
    assert "extrapolated by 0.25 nats/token beyond the most advanced reference" in words


@pytest.mark.parametrize("resamples", [0, -3])
def test_a_band_without_resamples_is_refused_by_name(resamples):
    """Both band fits refuse a band with no bootstrap refits in one CurveError that names the
    setting, rather than failing inside numpy; one resample is enough to draw a band."""
    from monitor.curves.stats import fit_monotone

    x, y, _ = synthetic("lstar", m=12)
    w, _ = label_weights(y, [2000] * len(y))
    for fit in (fit_monotone, fit_sigmoid_band):
        with pytest.raises(CurveError, match="at least 1 bootstrap resample"):
            fit(x, y, w, predictor=AXES["lstar"], level=0.5, resamples=resamples)
        band = fit(x, y, w, predictor=AXES["lstar"], level=0.5, resamples=1)
        assert np.all(band.lower <= band.upper)
