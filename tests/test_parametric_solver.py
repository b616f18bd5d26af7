"""The sigmoid's trust-region-reflective solve (`monitor.curves.small_trf`) gives the same
numbers, to the bit, as scipy's `least_squares` it stands for and as scipy's own core it
follows step for step, solve by solve and through a whole band fit (the isotonic fit's direct
PAVA is checked the same way in tests/test_isotonic_pava.py)."""

from __future__ import annotations

import numpy as np
import pytest

from monitor.curves import parametric
from monitor.curves.axes import AXES


def _problems() -> list[parametric._Problem]:
    """Sigmoid problems of the kinds the fits meet: clean rises, noisy and flat data, few
    points, and the zero weights of bootstrap resamples (a checkpoint not drawn)."""
    rng = np.random.default_rng(3)
    out = []
    for case in range(12):
        m = 4 + case % 9
        x = np.sort(rng.uniform(1.5, 4.0, m))
        rise = 0.1 + 0.8 / (1.0 + np.exp(4.0 * (x - 2.7)))
        y = np.clip(rise + rng.normal(0.0, 0.02 + 0.05 * (case % 3), m), 0.0, 1.0)
        if case == 5:
            y = np.full(m, 0.3) + rng.normal(0.0, 1e-3, m)   # flat: steepness runs to a bound
        w = rng.uniform(50.0, 500.0, m)
        problem, _ = parametric._problem(-x, y, w, True, AXES["lstar"])
        if case % 4 == 3:   # as a band resample sets them: a checkpoint not drawn weighs 0
            problem.set_weights(w[::-1] * rng.multinomial(m, np.full(m, 1.0 / m)))
        out.append(problem)
    return out


def test_the_direct_solve_matches_least_squares_to_the_bit() -> None:
    # Where a scipy no longer exposes its core, `solve` is `least_squares` itself and this
    # compares the fallback; where the core's call changed, it fails here, not in a fit.
    statuses = set()
    for problem in _problems():
        for start in problem.starts():
            try:
                ref = parametric.solve_with_least_squares(problem, start)
            except ValueError as exc:
                with pytest.raises(ValueError, match=str(exc).splitlines()[0][:30]):
                    problem.solve(start)
                continue
            got = problem.solve(start)
            statuses.add(int(ref.status))
            for other in (ref, parametric.solve_with_scipy_core(problem, start)):
                assert got.status == other.status and got.message == other.message and got.nfev == other.nfev
                assert got.njev == other.njev and np.array_equal(got.active_mask, other.active_mask)
                assert np.array_equal(got.x, other.x) and got.cost == other.cost
                assert np.array_equal(got.fun, other.fun) and np.array_equal(got.jac, other.jac)
                assert np.array_equal(got.grad, other.grad) and got.optimality == other.optimality
    # These problems take every branch of the loop (counted once with a tracing copy: 3,829
    # interior steps and 94 reflected, 15 steps nudged off a bound, Gauss-Newton steps and
    # Moré's iteration) and end by the gradient, ftol, xtol and the evaluation cap.
    assert len(statuses) >= 2   # converged by more than one criterion (or not at all)


def test_a_band_fit_is_the_same_with_scipys_core(monkeypatch: pytest.MonkeyPatch) -> None:
    """A whole sigmoid band (12 starts, then 50 warm-started resamples) through the lean loop and
    through scipy's core: every array of the fit equal to the bit."""
    rng = np.random.default_rng(5)
    x = np.sort(rng.uniform(1.5, 4.0, 14))
    y = np.clip(0.1 + 0.8 / (1.0 + np.exp(4.0 * (x - 2.7))) + rng.normal(0.0, 0.04, 14), 0.0, 1.0)
    w = rng.uniform(50.0, 500.0, 14)

    def fit() -> parametric.SigmoidFit:
        return parametric.fit_sigmoid_band(x, y, w, predictor=AXES["lstar"], level=0.5, resamples=50, seed=1)

    got = fit()
    monkeypatch.setattr(parametric._Problem, "solve", parametric.solve_with_scipy_core)
    ref = fit()
    assert got.params == ref.params and got.threshold == ref.threshold
    assert got.dispersion == ref.dispersion and got.failed_resamples == ref.failed_resamples
    for name in ("knots_x", "knots_y", "grid_fit", "lower", "upper"):
        assert np.array_equal(getattr(got, name), getattr(ref, name)), name


def test_the_jacobian_is_the_one_at_the_point_it_is_given() -> None:
    """The Jacobian reuses the logistic of the last residuals only at that same point: a point
    changed in place after its residuals (same array, new values) gets its own."""
    problem = _problems()[0]
    theta = np.array([problem.bottom, 0.5, 2.0, float(np.median(problem.u))])
    at_theta = problem.jacobian(theta.copy())            # computed fresh, nothing cached for it
    moved = theta.copy()
    moved[2] = 3.0
    problem.residuals(moved)
    moved[:] = theta                                     # the same array, back at theta
    np.testing.assert_array_equal(problem.jacobian(moved), at_theta)
    problem.residuals(theta)
    np.testing.assert_array_equal(problem.jacobian(theta), at_theta)
