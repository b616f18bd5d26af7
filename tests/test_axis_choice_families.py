"""The axis choice compares (axis, fit family) pairs (monitor.curves.axis_choice): each family's
axis by the LOFO axis rule, the family between the winners by forward validation, and the
choice recorded in the curve artifact."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from monitor.curves.artifact import load_curve, save_curve
from monitor.curves.axis_choice import ChoiceConfig, choice_markdown, choose_axis, parse_fit_families
from monitor.curves.fit import fit_curve
from monitor.curves.forward import TIE_TOLERANCE
from monitor.errors import CurveError
from test_forward_validation import lineages, sigmoid_truth

FAST = ChoiceConfig(family_resamples=20, resamples=50)


def kink_truth(x):
    """A straight rise from loss 3.9 to 3.4, flat after: every larger model sits on the plateau
    the smaller ones reached, where a flat isotonic curve is right and a sigmoid fitted to the
    rise overshoots or bends early."""
    return 0.25 + 0.5 * np.clip((3.9 - x) / 0.5, 0.0, 1.0)


def choose(truth, axes):
    labels = lineages(truth, checkpoints=8, per_size=1)
    return labels, choose_axis(labels, baseline=0.25, margin=0.1, axes=axes, config=FAST, task="t",
                               metric="acc", fit_families=("isotonic", "sigmoid"))


def pair(choice, axis, family):
    return next(c for c in choice["choice"]["candidates"] if c["axis"] == axis and c["family"] == family)


@pytest.fixture(scope="module")
def sigmoid_choice():
    return choose(sigmoid_truth, ["raw_ce", "log_params"])


@pytest.mark.slow
def test_data_drawn_from_a_sigmoid_on_raw_ce_choose_the_sigmoid_on_raw_ce(sigmoid_choice):
    _, choice = sigmoid_choice
    pick = choice["choice"]
    assert (pick["axis"], pick["family"]) == ("raw_ce", "sigmoid")
    assert (choice["recommended"], choice["recommended_family"]) == ("raw_ce", "sigmoid")
    assert pick["decided_by"] == "forward validation by params"
    # every (axis, family) pair is a candidate, with its LOFO and forward errors
    assert {(c["axis"], c["family"]) for c in pick["candidates"]} == {
        (a, f) for a in ("raw_ce", "log_params") for f in ("isotonic", "sigmoid")}
    sig, iso = pair(choice, "raw_ce", "sigmoid"), pair(choice, "raw_ce", "isotonic")
    assert sig["forward_mae"] < iso["forward_mae"] * (1.0 - TIE_TOLERANCE)
    # the sigmoid's LOFO error on the true axis is lower too, and log params (no family offsets
    # to absorb, but a step per size) is worse than raw CE in both families
    assert sig["rmse"] < iso["rmse"]
    assert pair(choice, "log_params", "sigmoid")["rmse"] > sig["rmse"]
    assert pick["forward"]["axis"] == "raw_ce" and "sigmoid" in pick["forward"]["families"]
    text = choice_markdown(choice)
    assert "| family |" in text and "Chosen: **raw_ce with the sigmoid fit**" in text
    json.dumps(choice, allow_nan=False)


def test_a_rise_that_stops_leaves_isotonic_chosen():
    _, choice = choose(kink_truth, ["raw_ce"])
    pick = choice["choice"]
    assert (pick["axis"], pick["family"]) == ("raw_ce", "isotonic")
    sig, iso = pair(choice, "raw_ce", "sigmoid"), pair(choice, "raw_ce", "isotonic")
    assert not sig["forward_mae"] < iso["forward_mae"] * (1.0 - TIE_TOLERANCE)
    assert "so isotonic stays" in pick["reason"]


def test_without_a_model_order_the_family_is_decided_by_lofo():
    labels = [dataclasses.replace(lab, params=None, step=None, lineage=None)
              for lab in lineages(sigmoid_truth, checkpoints=8, per_size=1)]
    choice = choose_axis(labels, baseline=0.25, margin=0.1, axes=["raw_ce"], config=FAST, task="t",
                         metric="acc", fit_families=("isotonic", "sigmoid"))
    pick = choice["choice"]
    assert pick["decided_by"] == "leave-one-family-out" and pick["ordering"] is None
    assert all(c["forward_mae"] is None for c in pick["candidates"])
    # 5 families: the sign-flip test cannot go below 2/32 = 0.0625 ≥ 0.05, so isotonic stays
    assert pick["family"] == "isotonic"
    vs = pair(choice, "raw_ce", "sigmoid")["vs_default"]
    assert vs["p_value"] >= 2 / 32 and vs["n_families"] == 5


def test_one_family_keeps_the_old_output():
    labels = lineages(sigmoid_truth, checkpoints=8, per_size=1)
    choice = choose_axis(labels, baseline=0.25, margin=0.1, axes=["raw_ce", "log_params"], config=FAST)
    assert choice["fit_families"] == ["isotonic"] and choice["recommended_family"] == "isotonic"
    assert choice["choice"]["family"] == "isotonic" and choice["choice"]["forward"] is None
    assert all(r["fit_family"] == "isotonic" for r in choice["axes"])


def test_fit_families_are_checked():
    assert parse_fit_families("all") == ["isotonic", "sigmoid"]
    assert parse_fit_families("sigmoid, isotonic") == ["sigmoid", "isotonic"]
    with pytest.raises(CurveError, match="spline"):
        parse_fit_families("isotonic,spline")
    with pytest.raises(CurveError, match="unknown fit family"):
        choose_axis(lineages(sigmoid_truth, checkpoints=4, per_size=1), baseline=0.25, margin=0.1,
                    fit_families=("spline",))


@pytest.mark.slow
def test_the_choice_is_recorded_in_the_artifact_and_old_artifacts_load(sigmoid_choice, tmp_path):
    labels, choice = sigmoid_choice
    pick = choice["choice"]
    forward = pick["forward"]["families"]["sigmoid"]
    curve = fit_curve(labels, task="t", metric="acc", baseline=0.25, margin=0.1, resamples=50, lofo=False,
                      axis="raw_ce", family="sigmoid", widening=forward["widening"], spread=forward["spread"],
                      choice=pick)
    path = save_curve(curve, tmp_path / "c.json")
    back = load_curve(path)
    assert back.choice == json.loads(json.dumps(pick)) and back.curve_id == curve.curve_id
    assert back.extrapolation_widening == pytest.approx(forward["widening"])
    with pytest.raises(CurveError, match="recorded choice"):
        fit_curve(labels, task="t", metric="acc", baseline=0.25, margin=0.1, resamples=50, lofo=False,
                  axis="raw_ce", family="isotonic", choice=pick)
    # a curve without a choice writes no `choice` key: files written before it existed load,
    # with the default, and keep their id
    plain = fit_curve(labels, task="t", metric="acc", baseline=0.25, margin=0.1, resamples=50, lofo=False,
                      axis="raw_ce")
    data = json.loads(plain.to_json())
    assert "choice" not in data
    old = tmp_path / "old.json"
    old.write_text(json.dumps(data), encoding="utf-8")
    loaded = load_curve(old)
    assert loaded.choice is None and loaded.curve_id == plain.curve_id == loaded.content_id()
