"""A label file's standard error or count so extreme that its inverse-variance weight is not a
finite number (1/se² underflows to a division by zero, or overflows to inf, whose PAVA fit is
NaN) is refused with a LabelError naming the value, not a crash or a NaN curve."""

from __future__ import annotations

import math

import pytest

from monitor.curves.fit import fit_curve
from monitor.curves.labels import Label
from monitor.curves.stats import label_weights
from monitor.errors import LabelError

POINTS = [(5.0, 0.1), (4.0, 0.2), (3.0, 0.5), (2.0, 0.7), (1.0, 0.9)]


def _labels(**extreme) -> list[Label]:
    return [Label(checkpoint=f"c{i}", value=v, family="f", task="t", metric="acc", lstar=x,
                  **(extreme if i == 2 else {"stderr": 0.05})) for i, (x, v) in enumerate(POINTS)]


@pytest.mark.parametrize("extreme", [{"stderr": 1e-200},   # se² underflows to 0: ZeroDivisionError
                                     {"stderr": 1e-160},   # 1/se² = 1e320 overflows to inf: a NaN fit
                                     {"n": 10 ** 400}])    # the binomial weight overflows the float
def test_a_weight_that_is_not_a_finite_number_is_refused(extreme):
    with pytest.raises(LabelError) as info:
        fit_curve(_labels(**extreme), task="t", metric="acc", baseline=0.25, margin=0.05, resamples=50,
                  seed=0, lofo=False)
    assert "label 3 of those fitted" in str(info.value) and "weight beyond" in str(info.value)
    assert info.value.hint


def test_ordinary_weights_are_unchanged():
    # hand-worked: 1/0.1² = 100; n = 10 at 0.5: p̃ = 6/12 = 0.5, 10 / 0.25 = 40; nothing: 1
    weights, known = label_weights([0.3, 0.5, 0.7], [None, 10, None], [0.1, None, None])
    assert weights.tolist() == pytest.approx([100.0, 40.0, 1.0])
    assert not known and all(math.isfinite(w) for w in weights)
