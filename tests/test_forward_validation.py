"""Forward validation (monitor.curves.forward): each larger model, or later stretch of training,
predicted from the smaller (earlier) ones only; the family it chooses is recorded in the artifact."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
from scipy.special import expit

from monitor.curves.artifact import load_curve, save_curve
from monitor.curves.fit import fit_curve
from monitor.curves.forward import TIE_TOLERANCE, _needed_widening, choose_family, splits
from monitor.curves.labels import Label
from monitor.errors import LabelError

SIZES = (1e8, 2e8, 4e8, 8e8, 1.6e9)


def lineages(truth, *, per_size=2, checkpoints=20, n=2000, seed=0):
    """Runs of growing size: each run's loss falls from 4.0 toward a floor that drops with size,
    so every larger model reaches a loss no smaller model reached."""
    rng = np.random.default_rng(seed)
    out = []
    for s, size in enumerate(SIZES):
        for r in range(per_size):
            end = 3.2 - 0.18 * s - 0.03 * r
            loss = np.linspace(4.0, end, checkpoints)
            for step, x in enumerate(loss):
                p = truth(x)
                out.append(Label(checkpoint=f"m{s}r{r}@{step}", value=float(rng.binomial(n, p) / n), n=n,
                                 task="t", metric="acc", raw_ce=float(x), params=size, lineage=f"m{s}r{r}",
                                 step=float(step), family=f"m{s}"))
    return out


def sigmoid_truth(x):
    return 0.25 + 0.6 * expit(-4.0 * (x - 2.8))


def step_truth(x):
    """Flat at chance, a jump at loss 3.3, then a straight rise: a shape no sigmoid has. (A pure
    step is not such a case: a steep sigmoid is a step, and it fits one better than the centred
    isotonic curve, which draws a straight line between the block centroids either side.)"""
    return np.where(x > 3.3, 0.25, 0.55 + 0.25 * (3.3 - x))


def test_splits_by_size_and_by_training_order():
    labels = lineages(sigmoid_truth, checkpoints=5)
    used, parts = splits(labels)
    assert used == "params" and len(parts) == len(SIZES) - 1
    name, mask = parts[0]
    assert all((lab.params <= SIZES[0]) == m for lab, m in zip(labels, mask))
    used, parts = splits(labels, "training")
    assert used == "training" and len(parts) == 5
    _, first_half = parts[0]
    # step 0..4 of each lineage: positions 0, .25, .5 in the first half
    assert sum(first_half) == 3 * len(SIZES) * 2
    with pytest.raises(LabelError, match="lineage and step"):
        splits([lab.with_(lineage=None) for lab in labels], "training")


def test_needed_widening_is_hand_worked():
    # error 0.05, band half-width 0.02, noise 0.03: sqrt(0.05² − 0.03²) = 0.04, so 0.02 more over distance 0.5
    assert _needed_widening(0.05, 0.02, 0.03, 0.5) == pytest.approx(0.04)
    assert _needed_widening(0.01, 0.02, 0.03, 0.5) == 0.0


def test_a_sigmoid_truth_is_forecast_best_by_the_sigmoid():
    labels = lineages(sigmoid_truth)
    record = choose_family(labels, fit=fit_curve, task="t", metric="acc", baseline=0.25, margin=0.1,
                           axis="raw_ce",
                           resamples=60)
    iso, sig = record["families"]["isotonic"], record["families"]["sigmoid"]
    assert record["chosen"] == "sigmoid"
    # the smallest split sees only the foot of the curve, so even the right family errs a little
    assert sig["mare"] < 0.05 and sig["mare"] < iso["mare"] / 2 < iso["mare"] * (1 - TIE_TOLERANCE)
    assert sig["n"] == iso["n"] > 0 and sig["n_ahead"] > 0
    # the isotonic error grows with the distance ahead of the training range (it is flat there)
    ahead = [b for b in iso["by_distance"] if b["from"] is not None]
    assert ahead[-1]["mae"] > ahead[0]["mae"]
    # the widening is calibrated so the forward points are covered at about the nominal rate
    assert iso["coverage_widened"] >= 0.85 and iso["widening"] > 0
    json.dumps(record, allow_nan=False)


def test_a_flat_then_step_truth_leaves_isotonic_no_worse_inside_the_data():
    labels = lineages(step_truth)
    record = choose_family(labels, fit=fit_curve, task="t", metric="acc", baseline=0.25, margin=0.1,
                           axis="raw_ce",
                           resamples=60)
    inside = {f: next(b for b in record["families"][f]["by_distance"] if b["from"] is None)
              for f in ("isotonic", "sigmoid")}
    assert inside["isotonic"]["mae"] <= inside["sigmoid"]["mae"]
    assert record["chosen"] == "isotonic"


def test_choose_family_is_recorded_in_the_artifact(tmp_path):
    labels = lineages(sigmoid_truth)
    curve = fit_curve(labels, task="t", metric="acc", baseline=0.25, margin=0.1, axis="raw_ce", resamples=100,
                      lofo=False, family="auto", forward_resamples=60)
    choice = curve.family_choice
    assert choice is not None and choice["chosen"] == curve.fit_family == "sigmoid"
    assert curve.extrapolation_widening == choice["families"]["sigmoid"]["widening"]
    assert curve.lineage_spread == choice["families"]["sigmoid"]["spread"]
    again = load_curve(save_curve(curve, tmp_path / "auto.json"))
    assert again.family_choice == choice and again.curve_id == curve.curve_id


def test_forward_validation_of_2000_points_is_fast():
    """25 lineages × 80 checkpoints, one task: both families on every split."""
    rng = np.random.default_rng(3)
    labels = []
    for li in range(25):
        size = SIZES[li % 5]
        end = 3.2 - 0.18 * (li % 5) - 0.01 * (li // 5)
        for step, x in enumerate(np.linspace(4.5, end, 80)):
            labels.append(Label(checkpoint=f"l{li}@{step}", value=float(rng.binomial(1000, sigmoid_truth(x)) / 1000),
                                n=1000, task="t", metric="acc", raw_ce=float(x), params=size, lineage=f"l{li}",
                                step=float(step)))
    start = time.perf_counter()
    record = choose_family(labels, fit=fit_curve, task="t", metric="acc", baseline=0.25, margin=0.1,
                           axis="raw_ce",
                           resamples=200)
    elapsed = time.perf_counter() - start
    assert record["chosen"] == "sigmoid"
    assert elapsed < 20.0, elapsed


def test_the_widening_is_one_sided_for_isotonic_and_coverage_uses_the_band_used():
    """Hand-worked: p̂ = 0.5, band ±0.02, no noise. Inside: one point on the curve (a = 0).
    Ahead by 1 unit: above by 0.09 (needs c = 0.07), above by 0.05 (needs 0.03), below by 0.10
    (needs 0.08 on the lower side, which only a sigmoid widens; its band's edge at the last
    reference, 0.45, bounds it)."""
    from monitor.curves.forward import _summarise

    def row(d, err, floor=0.45):
        return (d, err, 0.5 + err, 0.02, 0.02, 0.0, 0.0, floor, 1.0, 1.0)

    rows = [row(0.0, 0.0), row(1.0, 0.09), row(1.0, 0.05), row(1.0, -0.10)]
    iso = _summarise(rows, 0.9, two_sided=False)
    # c over the two points above only: quantile_0.9 of (0.07, 0.03) = 0.03 + 0.9·0.04
    assert iso["spread"] == 0.0 and iso["widening"] == pytest.approx(0.066)
    assert iso["beyond_widening"] == 1 and "open side" in iso["widening_sides"]
    # covered: on the curve; 0.55 ≤ 0.5 + 0.02 + 0.066; not 0.59 (> 0.586); not 0.40 (< 0.48)
    assert iso["coverage_widened"] == pytest.approx(2 / 4)
    sig = _summarise(rows, 0.9, two_sided=True)
    # quantile_0.9 of (0.03, 0.07, 0.08) = 0.07 + 0.8·0.01
    assert sig["widening"] == pytest.approx(0.078) and sig["beyond_widening"] == 0
    # 0.59 ≤ 0.598 now covered; 0.40 still not: the lower edge stops at the floor 0.45
    assert sig["coverage_widened"] == pytest.approx(3 / 4)
