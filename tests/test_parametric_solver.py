"""The fast paths of the curve fits give the same numbers, to the bit, as the public calls
they stand for: the sigmoid's direct trust-region-reflective solve against scipy's
`least_squares`, and the isotonic fit's direct PAVA against scikit-learn's
`isotonic_regression`."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.isotonic import isotonic_regression as sklearn_isotonic

from monitor.curves import parametric
from monitor.curves.axes import AXES
from monitor.curves.stats import _pava


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
    if parametric._trf_core is None:
        pytest.skip("this scipy does not expose its trust-region-reflective core")
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
            assert got.status == ref.status and got.message == ref.message and got.nfev == ref.nfev
            assert np.array_equal(got.x, ref.x) and got.cost == ref.cost
            assert np.array_equal(got.fun, ref.fun) and np.array_equal(got.jac, ref.jac)
    assert len(statuses) >= 2   # converged by more than one criterion (or not at all)


def test_the_direct_pava_matches_scikit_learn_to_the_bit() -> None:
    rng = np.random.default_rng(8)
    for m in (1, 2, 5, 40, 300):
        y = rng.normal(0.0, 1.0, m)
        y[m // 2:] = np.round(y[m // 2:], 1)          # ties among the values
        w = rng.uniform(0.1, 10.0, m)
        got = _pava(y, w)
        ref = sklearn_isotonic(y, sample_weight=w, increasing=True)
        assert np.array_equal(got, ref)
        assert np.all(np.diff(got) >= 0)
    # The hand-worked case: (3, 1) pools to their weighted mean, 2.5 with weights 3 and 1.
    assert _pava(np.array([0.0, 3.0, 1.0, 4.0]), np.array([1.0, 3.0, 1.0, 1.0])).tolist() == [0.0, 2.5, 2.5, 4.0]
