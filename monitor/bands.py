"""The arithmetic from (L*, SE) and a task curve's band to an interval and a state, shared by
`monitor.curves.artifact.predict` (alerts) and `monitor.scoring.sequential` (when to stop):
numpy only, so that both stages use one definition without importing each other.

`threshold_crossing` is the threshold η̂ and its interval at a level b_t + ε: the fit
(`monitor.curves.stats`) computes it at the curve's own margin when the curve is made, and
`monitor.curves.artifact.threshold_at` at the level a policy puts in force, from the same
knots and band, so a report's η̂ is always that of the level it prints.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np


@functools.lru_cache(maxsize=64)
def two_sided_z(confidence: float) -> float:
    """z with P(|Z| ≤ z) = `confidence` for a standard normal Z: the value
    `scipy.stats.norm.ppf(0.5 + confidence / 2)` returns, from `scipy.special.ndtri`, which is
    what that calls. Importing scipy.stats (about 0.7 CPU-s) was most of a fresh daemon's first
    evaluation tick, and its per-call argument checks most of each prediction's arithmetic; the
    answer is kept per confidence (a policy has one or two)."""
    from scipy.special import ndtri  # imported here: this module stays numpy only at import time

    return float(ndtri(0.5 + confidence / 2.0))


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


def first_reach(t: np.ndarray, values: np.ndarray, level: float) -> float:
    """Smallest t at which the piecewise-linear curve through (t, values) reaches `level`
    (values non-decreasing); t[0] if it starts there, NaN if it never does."""
    above = np.flatnonzero(values >= level)
    if len(above) == 0:
        return math.nan
    i = int(above[0])
    if i == 0:
        return float(t[0])
    t0, t1, v0, v1 = t[i - 1], t[i], values[i - 1], values[i]
    return float(t0 + (level - v0) * (t1 - t0) / (v1 - v0))


def threshold_crossing(level: float, *, sign: float, t_first: float, knots_t: np.ndarray, knots_y: np.ndarray,
                       grid_t: np.ndarray, lower: np.ndarray, upper: np.ndarray) -> dict[str, object]:
    """η̂, its interval and its status at `level`, from a curve in progress order.

    t = sign · x runs toward progress (sign −1 for an axis where lower is progress, e.g. L*);
    `knots_t`/`knots_y` are the curve's knots and `grid_t` with `lower`/`upper` its band, all
    ascending in t and non-decreasing in value; `t_first` is the least advanced data point.
    η̂ is where the curve first reaches the level; the interval is the band inverted: the
    optimistic edge reaches it early, the pessimistic edge late (None: never inside the data).
    Returns estimate, lower, upper (in x) and status: crosses, never or before_range.
    """
    if knots_y[0] >= level:
        t_est, status = float(t_first), "before_range"
    else:
        t_est = first_reach(knots_t, knots_y, level)
        status = "never" if math.isnan(t_est) else "crosses"
    early, late = first_reach(grid_t, upper, level), first_reach(grid_t, lower, level)
    in_x = (lambda v: None if math.isnan(v) else float(sign * v))
    # For L* (sign −1) the early crossing is the larger L*, so it is the upper end of the interval.
    low, high = (in_x(late), in_x(early)) if sign < 0 else (in_x(early), in_x(late))
    return {"estimate": in_x(t_est), "lower": low, "upper": high, "status": status}


def extrapolation_distance(x: float, x_range: tuple[float, float], sign: float) -> float:
    """How far x lies beyond a curve's reference range, in the axis's units, signed by
    progress: positive beyond the most advanced reference (toward progress), negative before
    the least advanced one, 0 inside. `sign` −1 where lower is progress."""
    t = sign * x
    first, last = sorted((sign * x_range[0], sign * x_range[1]))
    if t > last:
        return float(t - last)
    if t < first:
        return float(t - first)
    return 0.0


def widen_beyond(lower: float, upper: float, *, ahead: float, behind: float, c: float, two_sided: bool,
                 floor_ahead: float, ceiling_behind: float,
                 bounds: tuple[float, float] | None) -> tuple[float, float]:
    """An interval widened for extrapolation: the half-width grows by c per axis unit beyond
    the reference range (`ahead`: distance beyond the most advanced reference, `behind`: before
    the least advanced, both ≥ 0).

    Beyond the data a monotone curve still bounds one side: past the most advanced reference the
    truth is at least the band's lower edge there (`floor_ahead`), before the least advanced at
    most its upper edge (`ceiling_behind`). A flat curve (isotonic, `two_sided` False) widens
    only the open side (upper ahead, lower behind); a parametric curve, whose shape can be wrong
    either way, widens both, never past those monotone bounds. `bounds` clips to the metric's range.
    """
    upper += c * ahead
    lower -= c * behind
    if two_sided:
        lower = min(lower, max(lower - c * ahead, floor_ahead)) if ahead > 0 else lower
        upper = max(upper, min(upper + c * behind, ceiling_behind)) if behind > 0 else upper
    if bounds is not None:
        lower, upper = min(max(lower, bounds[0]), bounds[1]), min(max(upper, bounds[0]), bounds[1])
    return lower, upper


def extrapolation_words(distance: float, unit: str = "") -> str:
    """`extrapolated by 0.147 nats/token beyond the most advanced reference` for a signed
    distance (`extrapolation_distance`); empty inside the range or for a non-number."""
    if not isinstance(distance, (int, float)) or isinstance(distance, bool) or not math.isfinite(distance) \
            or distance == 0:
        return ""
    where = "beyond the most advanced reference" if distance > 0 else "before the least advanced reference"
    return f"extrapolated by {abs(distance):.4g}{(' ' + unit) if unit else ''} {where}"
