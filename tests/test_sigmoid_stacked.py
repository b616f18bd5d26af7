"""Sigmoid fits of different data in one batch (`parametric.solve_stacked`,
`parametric.fit_sigmoid_bands`): each solve and each fit is the one its problem gets alone, and
a validation's folds (`validation.lofo_axes`) and a family bootstrap's refits
(`axis_choice.refit_bootstrap`) fitted together give what fitting them one by one gives."""

from __future__ import annotations

import numpy as np
import pytest

from monitor.curves import axis_choice, parametric, validation
from monitor.curves.axes import AXES
from monitor.curves.stats import PREDICTORS
from monitor.errors import CurveError, LabelError
from test_parametric_solver import solve_agrees


def _data(rng: np.random.Generator, m: int, noise: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    x = np.sort(rng.uniform(1.5, 4.0, m))
    y = np.clip(0.1 + 0.8 / (1.0 + np.exp(4.0 * (x - rng.uniform(2.3, 3.2)))) + rng.normal(0.0, noise, m), 0.0, 1.0)
    return x, y, rng.uniform(50.0, 500.0, m)


def _requests(seed: int) -> list[parametric.BandRequest]:
    """Fits of 4 to 19 checkpoints (so the batch pads them to different lengths), on an axis
    where lower is progress and on one where higher is, clean and noisy."""
    rng = np.random.default_rng(seed)
    out = []
    for case in range(10):
        x, y, w = _data(rng, 4 + (case * 7) % 16, 0.01 + 0.04 * (case % 3))
        axis = AXES["lstar"] if case % 2 else AXES["bits_per_byte"]
        out.append(parametric.BandRequest(x, y, w, predictor=axis, level=0.5, resamples=30, seed=case))
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_solves_of_problems_of_different_lengths_in_one_batch_are_their_own_solves(seed: int) -> None:
    """Every start of ten problems of 4 to 19 rows, their own bounds, in one stacked batch,
    against each problem's starts solved one at a time. Padding adds rows of weight 0, which
    change no sum but its order, so (as for one problem's batch) a decision on a rounding
    boundary may end a solve elsewhere: at most 1 % here; every other solve ends with the single
    solve's status and, converged, at its cost and fitted values."""
    problems = []
    for r in _requests(seed):
        problem, _ = parametric._problem(-np.asarray(r.x) if r.predictor.lower_is_progress else np.asarray(r.x),
                                         np.asarray(r.y), np.asarray(r.weights), True, r.predictor)
        problems.append(problem)
    assert len({len(p.u) for p in problems}) >= 5 and len({tuple(p.upper) for p in problems}) == len(problems)
    starts = [s for p in problems for s in p.starts()]
    owners = np.repeat(np.arange(len(problems)), [len(p.starts()) for p in problems])
    got = parametric.solve_stacked(problems, owners, np.array(starts), [problems[o].w for o in owners])
    other = sum(not solve_agrees(problems[owner], got, i, problems[owner].solve(start))
                for i, (start, owner) in enumerate(zip(starts, owners)))
    assert len(starts) == 120 and other <= 1


def test_fits_made_together_are_the_fits_made_alone_and_an_error_stays_with_its_fit(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Ten fits with their bands, and two that cannot be fitted (three distinct points: a
    LabelError; a batch whose every solve fails: a CurveError), in one call: each result is the
    one `fit_sigmoid_band` gives that request alone, each error the one it raises alone."""
    requests = _requests(7)
    x, y, w = _data(np.random.default_rng(1), 3, 0.02)
    requests.insert(3, parametric.BandRequest(x, y, w, predictor=AXES["lstar"], level=0.5, resamples=30))
    together = parametric.fit_sigmoid_bands(requests)
    assert isinstance(together[3], LabelError) and "at least 4 distinct" in together[3].message
    for request, fit in zip(requests, together):
        alone = None
        try:
            alone = parametric.fit_sigmoid_band(request.x, request.y, request.weights, predictor=request.predictor,
                                                level=request.level, resamples=request.resamples, seed=request.seed)
        except LabelError as exc:
            assert isinstance(fit, LabelError) and fit.message == exc.message
            continue
        assert isinstance(fit, parametric.SigmoidFit)
        for name, value in fit.params.as_dict().items():
            assert value == pytest.approx(alone.params.as_dict()[name], rel=1e-6, abs=1e-9), name
        np.testing.assert_allclose(fit.grid_fit, alone.grid_fit, rtol=0, atol=1e-8)
        np.testing.assert_allclose(fit.lower, alone.lower, rtol=0, atol=1e-6)
        np.testing.assert_allclose(fit.upper, alone.upper, rtol=0, atol=1e-6)
        assert fit.threshold["status"] == alone.threshold["status"]
        assert fit.failed_resamples == alone.failed_resamples

    # A fit none of whose starts converges is that fit's CurveError; the others are fitted.
    real = parametric.solve_stacked

    def failing_first(problems, owners, starts, weights):   # type: ignore[no-untyped-def]
        out = real(problems, owners, starts, weights)
        first = np.asarray(owners) == 0
        out.status[first] = 0
        for i in np.flatnonzero(first):
            out.reasons[i] = "The maximum number of function evaluations is exceeded."
        return out

    monkeypatch.setattr(parametric, "solve_stacked", failing_first)
    fits = parametric.fit_sigmoid_bands(requests[:3])
    assert isinstance(fits[0], CurveError) and "did not converge from any of 12" in fits[0].message
    assert all(isinstance(f, parametric.SigmoidFit) for f in fits[1:])


def test_a_large_set_of_fits_is_taken_in_groups_with_the_same_results(monkeypatch: pytest.MonkeyPatch) -> None:
    requests = _requests(4)
    whole = parametric.fit_sigmoid_bands(requests)
    monkeypatch.setattr(parametric, "_MOST_SOLVE_ROWS_AT_ONCE", 100)   # under one fit's (12 + 30) × rows: one a group
    groups = []
    real = parametric._fit_group
    monkeypatch.setattr(parametric, "_fit_group", lambda g: groups.append(len(g)) or real(g))
    split = parametric.fit_sigmoid_bands(requests)
    assert groups == [1] * len(requests)
    for a, b in zip(whole, split):
        np.testing.assert_allclose(a.grid_fit, b.grid_fit, rtol=0, atol=1e-8)


def _families(seed: int) -> tuple[np.ndarray, list[str], np.ndarray, np.ndarray]:
    """Five families of 6 checkpoints on one rise, each family shifted on the axis."""
    rng = np.random.default_rng(seed)
    xs, fams, ys = [], [], []
    for f in range(5):
        x = np.sort(rng.uniform(1.5, 4.0, 6)) + rng.normal(0, 0.05)
        xs.append(x)
        ys.append(np.clip(0.1 + 0.8 / (1 + np.exp(4 * (x - 2.7))) + rng.normal(0, 0.03, 6), 0, 1))
        fams += [f"fam{f}"] * 6
    x = np.concatenate(xs)
    return np.concatenate(ys), fams, x, x + rng.normal(0, 0.1, len(x))


def test_a_validations_folds_fitted_together_are_the_folds_fitted_one_by_one(monkeypatch: pytest.MonkeyPatch) -> None:
    values, fams, x1, x2 = _families(3)
    axes = {"lstar": (PREDICTORS["lstar"], x1), "raw_ce": (PREDICTORS["raw_ce"], x2)}
    kwargs = {"baseline": 0.1, "margin": 0.3, "n": [200] * len(values), "resamples": 20, "seed": 4,
              "fit_family": "sigmoid"}
    made = []
    real = parametric.fit_sigmoid_bands

    monkeypatch.setattr(parametric, "fit_sigmoid_bands", lambda requests: made.append(len(requests)) or real(requests))
    together = validation.lofo_axes(values, fams, axes, **kwargs)
    assert made == [10]                                 # two axes × five families, in one call
    # `fits={}`: no fold fitted ahead, so each is fitted in turn by `_fit_fold`, the path of
    # the isotonic family and of every validation before the folds were batched.
    alone = validation.lofo_axes(values, fams, axes, **kwargs, fits={})
    assert made == [10, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]
    assert [r.predictor for r in together.rows] == ["lstar", "raw_ce"] and together.skipped == alone.skipped
    for a, b in zip(together.rows, alone.rows):
        assert (a.n_heldout, a.n_folds) == (b.n_heldout, b.n_folds) == (30, 5)
        assert a.rmse == pytest.approx(b.rmse, rel=1e-7) and a.crossing_error == b.crossing_error
        assert a.brier == pytest.approx(b.brier, abs=1e-6)
    for axis in axes:
        np.testing.assert_array_equal(together.points[axis]["index"], alone.points[axis]["index"])
        np.testing.assert_allclose(together.points[axis]["p_hat"], alone.points[axis]["p_hat"], rtol=0, atol=1e-7)

    # The family bootstrap: every draw's folds in one call, each draw's validation given its own.
    calls = []
    monkeypatch.setattr(parametric, "fit_sigmoid_bands", lambda requests: calls.append(len(requests))
                        or real(requests))
    fam = np.asarray(fams, dtype=object)
    weights = np.full(len(values), 200.0)
    preds = {"lstar": PREDICTORS["lstar"], "raw_ce": PREDICTORS["raw_ce"]}
    args = {"baseline": 0.1, "margin": 0.3, "reference": "lstar", "resamples": 6, "seed": [1], "fold_seed": 0,
            "fit_family": "sigmoid"}
    pooled, degenerate = axis_choice.refit_bootstrap(values, fam, weights, {"lstar": x1, "raw_ce": x2}, preds, **args)
    assert len(calls) == 1 and calls[0] >= 2 * 2 * (6 - degenerate) and degenerate < 6   # 2 axes × the families drawn
    monkeypatch.setattr(axis_choice, "_sigmoid_refits", lambda draws: [{}] * len(draws))   # fold by fold
    separate, degenerate_again = axis_choice.refit_bootstrap(values, fam, weights, {"lstar": x1, "raw_ce": x2},
                                                             preds, **args)
    assert degenerate == degenerate_again
    for axis in pooled:
        for key, series in pooled[axis].items():
            np.testing.assert_allclose(series, separate[axis][key], rtol=1e-6, atol=1e-7, err_msg=f"{axis} {key}")
