"""The arithmetic from (L*, SE) and a task curve's band to an interval and a state, shared by
`monitor.curves.artifact.predict` (alerts) and `monitor.scoring.sequential` (when to stop):
numpy only, so that both stages use one definition without importing each other.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def predicted_interval(lstar: float, se: float, z: float, band_x: Sequence[float], band_lower: Sequence[float],
                       band_upper: Sequence[float], knots_x: Sequence[float],
                       knots_y: Sequence[float]) -> tuple[float, float, float]:
    """(P̂, lower, upper): P̂ = g(L*) from the knots; the interval is the lowest lower edge and
    the highest upper edge of the band over [L* − z·se, L* + z·se] (and holds P̂)."""
    gx = np.asarray(band_x)
    lo_x, hi_x = lstar - z * se, lstar + z * se
    inside = gx[(gx > lo_x) & (gx < hi_x)]
    xs = np.concatenate([[lo_x, lstar, hi_x], inside])
    lower = float(np.min(np.interp(xs, gx, band_lower)))
    upper = float(np.max(np.interp(xs, gx, band_upper)))
    p_hat = float(np.interp(lstar, knots_x, knots_y))
    return p_hat, min(lower, p_hat), max(upper, p_hat)


def classify_state(lo: float, hi: float, threshold: float) -> str:
    """clear / at_risk / emerged from the interval [lo, hi] and the threshold b_t + ε."""
    if lo > hi:
        raise ValueError(f"interval is reversed: lo={lo} > hi={hi}")
    if lo >= threshold:
        return "emerged"
    if hi >= threshold:
        return "at_risk"
    return "clear"
