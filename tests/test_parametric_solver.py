"""The sigmoid's trust-region-reflective solve (`monitor.curves.small_trf`) gives the same
numbers, to the bit, as scipy's `least_squares` it stands for and as scipy's own core it
follows step for step; the batched solve (`monitor.curves.batch_trf`) takes the same steps as
the single one, to rounding, solve by solve and through a whole band fit (the isotonic fit's
direct PAVA is checked the same way in tests/test_isotonic_pava.py)."""

from __future__ import annotations

import numpy as np
import pytest

from monitor.curves import parametric
from monitor.curves.axes import AXES


def _problems(seed: int = 3) -> list[parametric._Problem]:
    """Sigmoid problems of the kinds the fits meet: clean rises, noisy and flat data, few
    points, and the zero weights of bootstrap resamples (a checkpoint not drawn)."""
    rng = np.random.default_rng(seed)
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


def _same_bits(got: tuple, want: tuple) -> bool:
    return all(type(a) is type(b) and np.asarray(a).tobytes() == np.asarray(b).tobytes() for a, b in zip(got, want))


def test_the_reflected_step_in_floats_is_the_arrays_step_to_the_bit(monkeypatch: pytest.MonkeyPatch) -> None:
    """`small_trf._reflected_step_floats` (the step of `_select_step` that leaves the bounds,
    its elementwise arithmetic on Python floats) against `_reflected_step` (scipy's arrays and
    helpers): the same step, scaled step and predicted reduction, bit for bit and of the same
    types, on every reflected step of `_problems()`' solves and on variants of them; and the
    arrays' step wherever the floats could differ (an input not finite, a step of 0)."""
    from monitor.curves import small_trf

    seen = []
    real = small_trf._select_step

    def recording(*args):
        seen.append(tuple(a.copy() if isinstance(a, np.ndarray) else a for a in args))
        return real(*args)

    monkeypatch.setattr(small_trf, "_select_step", recording)
    for problem in _problems():
        for start in problem.starts():
            try:
                problem.solve(start)
            except ValueError:
                pass
    monkeypatch.undo()
    reflected = [c for c in seen if not ((c[0] + c[4] >= c[8]) & (c[0] + c[4] <= c[9])).all()]
    variants = []
    for x, J_h, diag_h, g_h, p, p_h, d, Delta, lb, ub, theta in reflected:
        zero = p.copy(), p_h.copy()
        zero[0][1] = zero[1][1] = 0.0                     # a coordinate the step does not move
        variants += [(x, J_h, diag_h, g_h, *zero, d, Delta, lb, ub, theta),
                     (x, J_h, diag_h, g_h, 8.0 * p, 8.0 * p_h, d, Delta, lb, ub, theta),   # past two bounds
                     (x, J_h, diag_h, g_h, p, p_h, d, 0.5 * Delta, lb, ub, 0.999)]
    cases = reflected + variants

    def outcome(step, case):
        try:
            return step(*(a.copy() if isinstance(a, np.ndarray) else a for a in case))
        except ValueError as exc:   # a step outside the halved region: both raise it
            return str(exc)

    floats = 0
    for case in cases:
        got, want = outcome(small_trf._reflected_step_floats, case), outcome(small_trf._reflected_step, case)
        if got is not None:
            floats += 1
            assert got == want if isinstance(want, str) else _same_bits(got, want), case
    # 94 reflected steps (one solve's count, see above) and their variants, nearly all in floats
    assert len(reflected) >= 90 and floats >= 0.95 * len(cases)
    x, J_h, diag_h, g_h, p, p_h, d, Delta, lb, ub, theta = reflected[0]
    unbounded, nan = lb.copy(), p.copy()
    unbounded[0], nan[2] = -np.inf, np.nan
    assert small_trf._reflected_step_floats(x, J_h, diag_h, g_h, p, p_h, d, Delta, unbounded, ub, theta) is None
    assert small_trf._reflected_step_floats(x, J_h, diag_h, g_h, nan, p_h, d, Delta, lb, ub, theta) is None
    on_bound = x.copy()
    on_bound[np.argmax(np.abs(p))] = (ub if p[np.argmax(np.abs(p))] > 0 else lb)[np.argmax(np.abs(p))]
    assert small_trf._reflected_step_floats(on_bound, J_h, diag_h, g_h, p, p_h, d, Delta, lb, ub, theta) is None


def test_the_least_of_a_quadratic_on_a_segment_is_scipys_and_takes_the_first_of_a_tie() -> None:
    from scipy.optimize._lsq.common import minimize_quadratic_1d

    from monitor.curves.small_trf import _least_on_segment

    f = np.float64
    cases = [(f(0.0), f(0.0), 0, 2.5, f(1.0)),          # flat: all three values tie, the first end wins
             (f(-1.0), f(0.0), -1.0, 1.0, 0),            # both ends tie below the extremum's 0
             (f(1.0), f(0.0), -1.0, 1.0, 0),             # the extremum, inside
             (f(2.0), f(-3.0), 0, 0.25, 0), (f(0.3), f(7.0), -2.0, -1.0, f(-0.5)), (f(1e-300), f(1.0), 0, 1.0, 0)]
    for a, b, lo, hi, c in cases:
        assert _same_bits(_least_on_segment(a, b, lo, hi, c), minimize_quadratic_1d(a, b, lo, hi, c=c))
    assert _least_on_segment(f(np.nan), f(1.0), 0, 1.0) is None


def test_a_band_fit_batched_is_the_band_solved_one_at_a_time_by_scipys_core(monkeypatch: pytest.MonkeyPatch) -> None:
    """A whole sigmoid band (12 starts, then 200 warm-started resamples) solved in batches, and
    solved one problem at a time through scipy's own core: the same fit to rounding (the batch
    sums over rows in another order than BLAS), the same resamples failing."""
    rng = np.random.default_rng(5)
    x = np.sort(rng.uniform(1.5, 4.0, 14))
    y = np.clip(0.1 + 0.8 / (1.0 + np.exp(4.0 * (x - 2.7))) + rng.normal(0.0, 0.04, 14), 0.0, 1.0)
    w = rng.uniform(50.0, 500.0, 14)

    def fit() -> parametric.SigmoidFit:
        return parametric.fit_sigmoid_band(x, y, w, predictor=AXES["lstar"], level=0.5, resamples=200, seed=1)

    got = fit()
    monkeypatch.setattr(parametric, "_SMALLEST_BATCH", 10 ** 9)
    monkeypatch.setattr(parametric._Problem, "solve", parametric.solve_with_scipy_core)
    ref = fit()
    for name, value in got.params.as_dict().items():
        assert value == pytest.approx(ref.params.as_dict()[name], rel=1e-9, abs=1e-12), name
    for key in ("estimate", "lower", "upper"):
        assert got.threshold[key] == pytest.approx(ref.threshold[key], rel=1e-9), key
    assert got.threshold["status"] == ref.threshold["status"]
    assert got.threshold["never_share"] == ref.threshold["never_share"]
    assert got.failed_resamples == ref.failed_resamples
    assert got.dispersion == pytest.approx(ref.dispersion, rel=1e-9)
    for name in ("knots_x", "knots_y", "grid_fit", "lower", "upper"):
        np.testing.assert_allclose(getattr(got, name), getattr(ref, name), rtol=1e-9, atol=1e-12, err_msg=name)


def solve_agrees(problem: parametric._Problem, got: parametric._Solves, i: int, ref) -> bool:  # type: ignore[no-untyped-def]
    """Whether batched solve `i` ended with the single solve `ref`'s status (False: a decision on
    a rounding boundary went the other way); where it did, that it ended at the single solve's
    cost and fitted values, or with its message."""
    if got.status[i] != ref.status:
        return False
    if ref.status > 0:
        # the fitted values, not the parameters: a steep fit's k and h are pinned only loosely
        # (relative differences of 1e-6 there move the curve by 1e-11). A bootstrap weighting that
        # weighs fewer points than the curve has parameters leaves it free at the others: two
        # solves that stop at a near-zero cost by `xtol` on paths a rounding apart have been seen
        # 1.8e-4 apart at such a point (an AVX-512 machine, seed 1: 3 of 6 points weighed), so
        # there only the weighed points are compared; otherwise every point is.
        weighed = problem.w > 0
        if np.count_nonzero(weighed) >= len(ref.x):
            weighed[:] = True
        np.testing.assert_allclose(problem.curve(got.x[i], problem.u)[weighed],
                                   problem.curve(ref.x, problem.u)[weighed], rtol=0, atol=1e-6)
        assert got.cost[i] == pytest.approx(ref.cost, rel=1e-6, abs=1e-9)
    else:
        assert got.reasons[i] == ref.message
    return True


@pytest.mark.parametrize("seed", [3, 0, 1])
def test_a_batch_of_sigmoid_solves_takes_the_steps_of_each_solve(seed: int) -> None:
    """Every problem of `_problems(seed)` from all 12 starts at once, and from a warm start under
    40 bootstrap weightings at once, against the same solves one at a time. The batch sums in
    another order and uses numpy's SVD, so a decision that sits on a rounding boundary can go
    the other way (here 0 to 3 solves in 624 end with another status); every other solve ends
    with the single solve's status, and a converged one at its cost and fitted values."""
    compared, other_status = 0, 0
    for problem in _problems(seed):
        starts = np.array(problem.starts())
        rng = np.random.default_rng(len(problem.u))
        m = len(problem.u)
        batches = [(starts, np.broadcast_to(problem.w, (len(starts), m))),
                   (np.broadcast_to(starts[0], (40, 4)),
                    problem.w * rng.multinomial(m, np.full(m, 1.0 / m), size=40))]
        for batch_starts, weights in batches:
            kept = problem.w
            got = problem.solve_batch(batch_starts, weights)
            assert np.array_equal(problem.w, kept)            # the problem's own weights untouched
            for i, (start, w) in enumerate(zip(batch_starts, weights)):
                problem.set_weights(w)
                compared += 1
                other_status += not solve_agrees(problem, got, i, problem.solve(start))
            problem.set_weights(kept)
    assert compared == 12 * (12 + 40) and other_status <= compared // 100


@pytest.mark.parametrize("seed", [5, 1])
def test_the_batch_takes_scipys_steps_on_problems_the_sigmoid_never_poses(seed: int) -> None:
    """`batch_trf.trf_bounds_batch` against the single solve on generic bounded problems, six
    starts each at once: residuals that turn infinite past a point, more parameters than
    residuals, a zero Jacobian column, unbounded sides, evaluation caps of 2 to 60. At most 1 %
    of solves end with another status or evaluation count (a decision on a rounding boundary:
    a reduction of one ulp, a singular value 0 in one LAPACK and 1e-17 in the other); every other
    one at the single solve's point to rounding."""
    from scipy.optimize._lsq.common import make_strictly_feasible

    from monitor.curves.batch_trf import trf_bounds_batch
    from monitor.curves.small_trf import trf_bounds

    rng = np.random.default_rng(seed)
    compared, other_path, cut_short, hit_wall = 0, 0, 0, 0
    for case in range(150):
        m, n = int(rng.integers(1, 8)), int(rng.integers(1, 5))
        a = rng.normal(size=(m, n)) * (rng.uniform(size=(m, n)) < 0.7)
        if case % 5 == 0:
            a[:, 0] = 0.0
        b, wall, infinite = rng.normal(size=m), rng.uniform(0.1, 2.0), case % 3 == 0
        calls = {"infinite": 0}

        def fun(x, a=a, b=b, wall=wall, infinite=infinite):
            r = a @ x - b + 0.3 * np.sin(3.0 * x).sum()
            return r * np.inf if infinite and x[0] > wall else r

        def jac(x, _f=None, a=a):
            return a + 0.9 * np.cos(3.0 * x)[None, :]

        def batch_fun(xs, rows, a=a, b=b, wall=wall, infinite=infinite, calls=calls):
            r = xs @ a.T - b + 0.3 * np.sin(3.0 * xs).sum(axis=1)[:, None]
            past = infinite & (xs[:, :1] > wall)
            calls["infinite"] += int(past.sum())
            with np.errstate(invalid="ignore"):
                return np.where(past, r * np.inf, r)

        def batch_jac(xs, rows, a=a):
            return a[None] + 0.9 * np.cos(3.0 * xs)[:, None, :]

        lb, ub = _generic_bounds(rng, n, case)
        cap = int(rng.integers(2, 60))
        x0 = np.array([make_strictly_feasible(rng.uniform(lb.clip(-5.0), ub.clip(None, 5.0)), lb, ub)
                       for _ in range(6)])
        f0 = batch_fun(x0, None)
        calls["infinite"] = 0
        x0, f0 = x0[np.isfinite(f0).all(axis=1)], f0[np.isfinite(f0).all(axis=1)]
        if not len(x0):
            continue
        got = trf_bounds_batch(batch_fun, batch_jac, x0, f0, lb, ub, 1e-8, cap)
        hit_wall += calls["infinite"]
        for i in range(len(x0)):
            ref = trf_bounds(fun, jac, x0[i], fun(x0[i]), jac(x0[i]), lb, ub, 1e-8, 1e-8, 1e-8, cap)
            compared += 1
            cut_short += ref.status == 0
            if (got.status[i], got.nfev[i]) != (ref.status, ref.nfev):
                other_path += 1
                continue
            np.testing.assert_allclose(got.x[i], ref.x, rtol=1e-7, atol=1e-9)
            assert got.cost[i] == pytest.approx(ref.cost, rel=1e-7, abs=1e-12)
    assert compared > 600 and cut_short > 50 and hit_wall > 30
    assert other_path <= compared // 100


def test_a_problem_whose_solve_fails_ends_alone_with_the_single_solves_error() -> None:
    """A Jacobian that is NaN past a point: the single solve from there raises; in a batch that
    problem ends with status −1 and that error, and the other problems end as they would alone."""
    from monitor.curves.batch_trf import trf_bounds_batch
    from monitor.curves.small_trf import trf_bounds

    a, b = np.array([[1.0, 0.5], [0.2, 1.0], [1.0, -1.0]]), np.array([2.0, 1.5, 0.3])
    lb, ub = np.array([-3.0, -3.0]), np.array([3.0, 3.0])

    def fun(x):
        return a @ x - b + 0.1 * np.sin(x).sum()

    def jac(x, _f=None):
        out = a + 0.1 * np.cos(x)[None, :]
        return out * np.nan if x[0] > 2.9 else out

    starts = np.array([[-2.0, -2.0], [0.5, 0.2], [-1.0, 2.0], [2.95, 0.0]])   # the last starts past it
    got = trf_bounds_batch(lambda xs, rows: np.array([fun(x) for x in xs]),
                           lambda xs, rows: np.array([jac(x) for x in xs]), starts,
                           np.array([fun(x) for x in starts]), lb, ub, 1e-8, 100)
    failures = 0
    for i, start in enumerate(starts):
        try:
            ref = trf_bounds(fun, jac, start, fun(start), jac(start), lb, ub, 1e-8, 1e-8, 1e-8, 100)
        except ValueError as exc:
            failures += 1
            assert got.status[i] == -1 and got.errors[i] == str(exc)
            continue
        assert got.errors[i] is None and (got.status[i], got.nfev[i]) == (ref.status, ref.nfev)
        np.testing.assert_allclose(got.x[i], ref.x, rtol=1e-9)
    assert failures == 1


def _generic_bounds(rng: np.random.Generator, n: int, case: int) -> tuple[np.ndarray, np.ndarray]:
    """Bounds of a generic test problem: finite boxes, with an unbounded side in some cases."""
    lb = rng.uniform(-3.0, 0.0, n)
    ub = lb + rng.uniform(0.0, 4.0, n)
    if case % 7 == 0:
        lb[0] = -np.inf
    if case % 11 == 0:
        ub[-1] = np.inf
    return lb, ub


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

        lb, ub = _generic_bounds(rng, n, case)
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


def test_starts_whose_costs_tie_to_rounding_go_to_the_earliest(monkeypatch: pytest.MonkeyPatch) -> None:
    """The best start: least cost, and costs within 1e-10 (relative) of it a tie won by the
    earliest start, so rounding (which differs between the batched and the single solve) never
    picks the curve. By hand: least 1.0; 1.0 + 5e-11 ties with it, 1.0 + 2e-10 does not."""
    problem = _problems()[0]

    def solves(costs: list[float], status: list[int]) -> None:
        monkeypatch.setattr(problem, "solve_batch", lambda starts, weights: parametric._Solves(
            x=np.arange(len(costs), dtype=float)[:, None] * np.ones(4), cost=np.array(costs),
            status=np.array(status), reasons=[None] * len(costs)))

    solves([2.0, 1.0 + 5e-11, 1.0, 3.0], [1, 2, 4, 1])
    assert parametric._best_start(problem, [np.zeros(4)] * 4)[0] == 1.0
    solves([2.0, 1.0 + 2e-10, 1.0, 3.0], [1, 2, 4, 1])
    assert parametric._best_start(problem, [np.zeros(4)] * 4)[0] == 2.0
    solves([0.5, 1.0 + 5e-11, 1.0, 3.0], [0, 2, 4, 1])       # a start that did not converge is no candidate
    assert parametric._best_start(problem, [np.zeros(4)] * 4)[0] == 1.0


def test_optima_the_data_cannot_tell_apart_give_one_curve_batched_or_not(monkeypatch: pytest.MonkeyPatch) -> None:
    """Noisy data on which two starts reach optima equal in cost to the last bits but far apart
    beyond the data (one steep near the data, one whose midpoint lies far beyond it): the batched
    and the one-at-a-time fits choose the same start and give the same band."""
    x = np.array([1.8704467192761294, 2.2985836278113068, 2.483718830249831, 2.5175558205189454, 2.899625673653428,
                  3.104050231388798, 3.198370958303834, 3.385167940592144, 3.5532539113634343, 3.5688932877387494,
                  3.655446794838438, 3.835261020252268, 3.9016194000447855, 3.9388187260398935])
    y = np.array([0.01098085101386004, 0.6391893320658769, 0.23163168896492548, 0.9560655599081945,
                  0.19500445741210803, 0.3161794080516598, 0.9841316837334273, 0.5198546202904285,
                  0.9220245989560005, 0.781437673828669, 0.11896569346946495, 0.2159834369804282,
                  0.3871775574072005, 0.8809562507227594])
    w = np.array([200.29472705535423, 258.38691734944587, 266.3444669086959, 196.13986119613392, 403.91837801744646,
                  74.67202740478156, 151.65957256119313, 421.2883431916648, 327.3537665318893, 280.3211734027235,
                  216.27858369329235, 108.56280955678696, 255.55293914151406, 494.1925141155666])

    def fit() -> parametric.SigmoidFit:
        return parametric.fit_sigmoid_band(x, y, w, predictor=AXES["lstar"], level=0.5, resamples=200, seed=27)

    batched = fit()
    monkeypatch.setattr(parametric, "_SMALLEST_BATCH", 10 ** 9)
    single = fit()
    for name, value in batched.params.as_dict().items():
        assert value == pytest.approx(single.params.as_dict()[name], rel=1e-8), name
    np.testing.assert_allclose(batched.grid_fit, single.grid_fit, rtol=0, atol=1e-9)
    np.testing.assert_allclose(batched.lower, single.lower, rtol=0, atol=1e-6)
    np.testing.assert_allclose(batched.upper, single.upper, rtol=0, atol=1e-6)
