"""The isotonic fits' direct call of scipy's PAVA gives the same numbers, to the bit, as
scikit-learn's `isotonic_regression` it stands for (which, after checking its arguments, makes
the same call)."""

from __future__ import annotations

import numpy as np
from sklearn.isotonic import isotonic_regression as sklearn_isotonic

from monitor.curves.stats import _pava


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
