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


def test_the_loop_matches_scipys_core_on_problems_the_sigmoid_never_poses() -> None:
    """`small_trf.trf_bounds` against scipy's `trf` on generic bounded problems: residuals that
    turn infinite past a point (the radius cut to a quarter), more parameters than residuals (no
    Gauss-Newton step), a zero Jacobian column, an unbounded side, and evaluation caps of 2 to
    60. The same result to the bit, or the same error."""
    from scipy.optimize._lsq.common import make_strictly_feasible
    from scipy.optimize._lsq.trf import trf as scipy_trf

    from monitor.curves.small_trf import trf_bounds

    rng = np.random.default_rng(5)
    compared, cut_short = 0, 0
    for case in range(150):
        m, n = int(rng.integers(1, 8)), int(rng.integers(1, 5))
        a = rng.normal(size=(m, n)) * (rng.uniform(size=(m, n)) < 0.7)
        if case % 5 == 0:
            a[:, 0] = 0.0
        b, wall = rng.normal(size=m), rng.uniform(0.1, 2.0)

        def fun(x, a=a, b=b, wall=wall, infinite=case % 3 == 0):
            r = a @ x - b + 0.3 * np.sin(3.0 * x).sum()
            return r * np.inf if infinite and x[0] > wall else r

        def jac(x, _f=None, a=a):
            return a + 0.9 * np.cos(3.0 * x)[None, :]

        lb = rng.uniform(-3.0, 0.0, n)
        ub = lb + rng.uniform(0.0, 4.0, n)
        if case % 7 == 0:
            lb[0] = -np.inf
        if case % 11 == 0:
            ub[-1] = np.inf
        x0 = make_strictly_feasible(rng.uniform(lb.clip(-5.0), ub.clip(None, 5.0)), lb, ub)
        f0 = fun(x0)
        if not np.isfinite(f0).all():
            continue
        cap = int(rng.integers(2, 60))
        outcomes = []
        for solve in (lambda: scipy_trf(fun, jac, x0, f0, jac(x0), lb, ub, 1e-8, 1e-8, 1e-8, cap, "jac", None,
                                        "exact", {}, 0),
                      lambda: trf_bounds(fun, jac, x0, f0, jac(x0), lb, ub, 1e-8, 1e-8, 1e-8, cap)):
            try:
                outcomes.append(solve())
            except (ValueError, np.linalg.LinAlgError) as exc:
                outcomes.append(f"{type(exc).__name__}: {exc}")
        ref, got = outcomes
        if isinstance(ref, str) or isinstance(got, str):
            assert got == ref
            continue
        compared += 1
        cut_short += ref.status == 0
        assert got.status == ref.status and got.nfev == ref.nfev and got.njev == ref.njev, case
        for name in ("x", "fun", "jac", "grad", "active_mask"):
            assert np.array_equal(getattr(got, name), getattr(ref, name)), (case, name)
        assert got.cost == ref.cost and got.optimality == ref.optimality, case
    assert compared > 100 and cut_short > 10      # most compared, many stopped by the cap
