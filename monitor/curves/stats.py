"""Task curves, the statistical core: from (L*, performance) pairs to a monotone curve, its
band and a threshold.

docs/measurement.md §2. Performance is non-increasing in L* (lower L* is more progress). The pieces:

- weights (`label_weights`): 1/stderr² where a standard error is reported, else the binomial
  n / (p̃(1-p̃)) with the add-one estimate p̃ = (k+1)/(n+2), so a 0 % or 100 % row does not get
  an infinite weight;
- the fit (`isotonic_fit`): weighted isotonic regression (scipy's PAVA), non-increasing in L*;
- the curve g: *centred* isotonic regression (Oron & Flournoy 2017): each block of the
  isotonic fit becomes one knot at its weighted centroid, with straight lines between knots
  and flat ends. It has the isotonic block values but not the staircase, so the threshold
  moves continuously with the data;
- the band: a seeded bootstrap over checkpoints gives pointwise percentile bands; these are
  widened to at least the block interval g ± z·sqrt(φ / W_block), where W_block is the
  summed inverse-variance weight behind the knot(s) and φ = max(1, Pearson χ² / (m - blocks))
  the over-dispersion. Why: the percentile bootstrap of isotonic regression is inconsistent
  and in simulation covers a 90 % band at only ~75 % of points (30 checkpoints, 300 items);
  the widened band covers ~94 %. The band is then made monotone by widening only;
- the threshold η̂: the L* at which g first reaches b_t + ε moving toward lower L*. Its
  interval is the band inverted: `upper` is where the optimistic edge reaches b_t + ε,
  `lower` where the pessimistic edge does, i.e. exactly the L* range that measurement.md §3 calls
  at_risk-but-not-emerged. The bootstrap distribution of η̂ gives the share of resamples
  that never cross;
- a logistic with floor b_t, p(x) = b_t + (c - b_t)·sigmoid(-(x - x0)/s), as a robustness check.

The rest of the curve machinery builds on this module: `monitor.curves.validation`
(leave-one-family-out validation against raw CE, log parameters and log FLOPs; the emergence
score; resolution warnings), `monitor.curves.artifact` (the versioned `lstar-curve/1` JSON
artifact and prediction from it without refitting), `monitor.curves.fit` (labels → artifact)
and `monitor.curves.plot`.

Known limit: where the true curve leaves its floor abruptly (a sharp elbow), every smoother
including this one lifts the fit just before the elbow, and the threshold interval covers less
often than its nominal level: for a Gompertz-shaped rise, about 79 % with 30 checkpoints of
300 items and 57 % with 15 (95 % with 60). The misses lie on the early side (the interval sits
at higher L* than the true threshold), so states turn at_risk/emerged early, not late.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.special import expit, logit, ndtri
from scipy.optimize import isotonic_regression as scipy_isotonic

from monitor.bands import first_reach, threshold_crossing
from monitor.curves.axes import AXES, Axis
from monitor.errors import CurveError, LabelError

# -- predictors ------------------------------------------------------------------------------
# The axes are a closed set defined in monitor.curves.axes; `Predictor` is the older name of
# `Axis`. PREDICTORS is the set the leave-one-family-out table compares by default.
Predictor = Axis
PREDICTORS: dict[str, Axis] = {name: AXES[name] for name in ("lstar", "raw_ce", "log_params", "log_flops")}


# -- weights and the isotonic fit ---------------------------------------------------------------
MAX_WEIGHT = 1e100   # a label's inverse-variance weight, at most (label_weights)


def label_weights(values: Sequence[float], n: Sequence[int | None] | None = None,
                  stderr: Sequence[float | None] | None = None) -> tuple[np.ndarray, bool]:
    """Inverse-variance weights per row, and whether they are on an absolute scale.

    A reported standard error wins (1/se²); else a count n gives the binomial weight
    n / (p̃(1-p̃)) with p̃ = (value·n + 1)/(n + 2) for values in [0, 1], or just n for other
    metrics; else weight 1. The second value is True when every row's variance is known
    (standard error or binomial), so the residual spread is only used to widen, never narrow.
    """
    values = np.asarray(values, dtype=np.float64)
    weights = np.ones(len(values))
    known = True
    for i, value in enumerate(values):
        se = None if stderr is None else stderr[i]
        count = None if n is None else n[i]
        try:
            if se is not None and math.isfinite(se) and se > 0:
                weights[i] = 1.0 / se ** 2
            elif count is not None and count > 0 and 0.0 <= value <= 1.0:
                p = (value * count + 1.0) / (count + 2.0)
                weights[i] = count / (p * (1.0 - p))
            elif count is not None and count > 0:
                weights[i] = float(count)
                known = False
            else:
                known = False
        except (ZeroDivisionError, OverflowError):   # se² underflowed, or a count beyond a float
            weights[i] = math.inf
        # A weight the fits cannot sum (inf makes PAVA's pooled means NaN; counts times it in
        # the bootstrap overflow) comes from a standard error or count no measurement has.
        if not weights[i] <= MAX_WEIGHT:
            raise LabelError(f"label {i + 1} of those fitted (value {float(value):g}): standard error {se!r} "
                             f"and count {count!r} give a weight beyond {MAX_WEIGHT:g}",
                             hint="give the metric's real standard error (or its count of items), or neither")
    return weights, known


def _merge_ties(t: np.ndarray, y: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sort by t and pool rows with equal t into their weighted mean (as scikit-learn does)."""
    order = np.argsort(t, kind="stable")
    t, y, w = t[order], y[order], w[order]
    starts = np.flatnonzero(np.r_[True, np.diff(t) != 0])
    wsum = np.add.reduceat(w, starts)
    return t[starts], np.add.reduceat(w * y, starts) / wsum, wsum


def _pava(y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The weighted non-decreasing least-squares fit of y (pool adjacent violators): scipy's
    PAVA called directly. scikit-learn's `isotonic_regression` is this same call behind argument
    validation that costs more than the fit on a curve's few dozen points, and the axis choice
    and the bands call it thousands of times."""
    return scipy_isotonic(y, weights=w, increasing=True).x


@dataclass(frozen=True)
class IsotonicFit:
    """A weighted isotonic fit: fitted values at the distinct predictor values (ascending)."""

    x: np.ndarray
    fitted: np.ndarray
    weights: np.ndarray
    increasing: bool

    def predict(self, x: Any) -> np.ndarray:
        """Linear interpolation between the fitted points, flat outside (scikit-learn's
        `out_of_bounds="clip"`)."""
        return np.interp(np.asarray(x, dtype=np.float64), self.x, self.fitted)


def isotonic_fit(x: Sequence[float], y: Sequence[float], weights: Sequence[float] | None = None,
                 *, increasing: bool = False) -> IsotonicFit:
    """Weighted isotonic regression of y on x (default non-increasing, as performance on L*).

    Equal x values are pooled first; the pool-adjacent-violators step is scipy's (`_pava`).
    """
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    w = np.ones(len(x)) if weights is None else np.asarray(weights, dtype=np.float64)
    if not (len(x) == len(y) == len(w)) or len(x) == 0:
        raise CurveError(f"isotonic fit needs equal, non-empty x, y and weights (got {len(x)}, {len(y)}, {len(w)})")
    # In the progress coordinate t the fit is non-decreasing, whichever way x runs.
    t = x if increasing else -x
    tu, yu, wu = _merge_ties(t, y, w)
    fitted = _pava(yu, wu)
    xu = tu if increasing else -tu
    order = np.argsort(xu)
    return IsotonicFit(xu[order], fitted[order], wu[order], increasing)


def _centred_knots(t: np.ndarray, fitted: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One knot per isotonic block at its weighted centroid: (t, value, block weight)."""
    starts = np.flatnonzero(np.r_[True, np.diff(fitted) != 0])
    wsum = np.add.reduceat(w, starts)
    return np.add.reduceat(w * t, starts) / wsum, fitted[starts], wsum


def _knot_se(grid: np.ndarray, kt: np.ndarray, kw: np.ndarray) -> np.ndarray:
    """Standard error of the centred curve at grid points, per unit dispersion: knots are
    means of disjoint blocks, so var = (1-λ)²/W_j + λ²/W_{j+1} between knots j and j+1."""
    if len(kt) == 1:
        return np.full(len(grid), 1.0 / math.sqrt(kw[0]))
    j = np.clip(np.searchsorted(kt, grid, side="right"), 1, len(kt) - 1)
    lam = np.clip((grid - kt[j - 1]) / (kt[j] - kt[j - 1]), 0.0, 1.0)
    return np.sqrt((1.0 - lam) ** 2 / kw[j - 1] + lam ** 2 / kw[j])


def _bootstrap(t: np.ndarray, y: np.ndarray, w: np.ndarray, grid: np.ndarray, level: float,
               resamples: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Refit the centred curve on `resamples` bootstrap samples of the checkpoints.

    t is sorted with distinct values. A resample is a vector of counts per checkpoint (a
    checkpoint drawn twice counts twice as much weight, the same fit as a duplicated row).
    All resamples go through one isotonic regression call: resample b is shifted by b·C with
    C above the range of y, so no block can pool across two resamples and each part is the
    isotonic fit of its own resample. Returns curves [resamples, grid] and the threshold of
    each resample in t (NaN: never reaches the level).
    """
    m = len(t)
    counts = rng.multinomial(m, np.full(m, 1.0 / m), size=resamples)   # [B, m]
    mask = counts > 0
    rep = np.nonzero(mask)[0]                     # resample index of each kept row
    col = np.nonzero(mask)[1]                     # checkpoint index of each kept row
    shift = float(np.ptp(y)) + 1.0
    ww = (counts * w)[mask]
    fitted = _pava(y[col] + rep * shift, ww) - rep * shift
    tt = t[col]
    starts = np.flatnonzero(np.r_[True, (np.diff(fitted) != 0) | (np.diff(rep) != 0)])
    wsum = np.add.reduceat(ww, starts)
    kt = np.add.reduceat(ww * tt, starts) / wsum
    ky = fitted[starts]
    bounds = np.searchsorted(rep[starts], np.arange(resamples + 1))
    curves = np.empty((resamples, len(grid)))
    crossings = np.empty(resamples)
    for b in range(resamples):
        lo, hi = bounds[b], bounds[b + 1]
        curves[b] = np.interp(grid, kt[lo:hi], ky[lo:hi])
        # Above the level from the first knot on: it crossed at or before the range start.
        crossings[b] = grid[0] if ky[lo] >= level else first_reach(kt[lo:hi], ky[lo:hi], level)
    return curves, crossings


# -- one monotone fit with its band and threshold -----------------------------------------------
@dataclass(frozen=True)
class MonotoneFit:
    """A fitted curve on one predictor, with band and threshold. Arrays run in ascending x."""

    predictor: Predictor
    level: float
    confidence: float
    knots_x: np.ndarray
    knots_y: np.ndarray
    grid_x: np.ndarray
    grid_fit: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    threshold: dict[str, Any]
    boot_thresholds: np.ndarray          # in x; NaN where a resample never crosses
    dispersion: float
    n_blocks: int
    fitted_at_points: np.ndarray         # the isotonic fit at each input row

    def predict(self, x: Any) -> np.ndarray:
        """The curve g at x (flat beyond the outer knots)."""
        return np.interp(np.asarray(x, dtype=np.float64), self.knots_x, self.knots_y)

    def band(self, x: Any) -> tuple[np.ndarray, np.ndarray]:
        """The band (lower, upper) at x, interpolated on the grid."""
        x = np.asarray(x, dtype=np.float64)
        return np.interp(x, self.grid_x, self.lower), np.interp(x, self.grid_x, self.upper)


def fit_monotone(x: Sequence[float], y: Sequence[float], weights: Sequence[float], *,
                 predictor: Predictor = PREDICTORS["lstar"], level: float,
                 confidence: float = 0.9, resamples: int = 1000, seed: int = 0,
                 grid_size: int = 101, known_variance: bool = True,
                 bounds: tuple[float, float] | None = None) -> MonotoneFit:
    """Fit the centred isotonic curve of y on x, its band and the threshold for `level`.

    `bounds` clips the band to the metric's range (e.g. (0, 1) for proportions).
    """
    check_resamples(resamples)
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    sign = -1.0 if predictor.lower_is_progress else 1.0
    t, yu, wu = _merge_ties(sign * x, y, w)
    if len(t) < 3:
        raise LabelError(f"a curve needs at least 3 distinct {predictor.label} values (got {len(t)})")
    with np.errstate(over="ignore"):
        gaps = np.diff(t)
    # Values closer than the smallest normal float (their differences subnormal) or spread past
    # the float range (a difference of inf) cannot be interpolated: the band would be NaN.
    if not (np.all(np.isfinite(gaps)) and float(gaps.min()) >= np.finfo(np.float64).tiny):
        raise LabelError(f"the {predictor.label} values ({float(np.min(x)):.3g} … {float(np.max(x)):.3g}) "
                         "are too close together or too far apart to fit a curve on")
    fitted = _pava(yu, wu)
    grid_t = np.linspace(t[0], t[-1], grid_size)
    rng = np.random.default_rng(seed)
    curves, crossings = _bootstrap(t, yu, wu, grid_t, level, resamples, rng)
    return monotone_fit_from(t, yu, wu, fitted, curves, crossings, grid_t, x=x, sign=sign,
                             predictor=predictor, level=level, confidence=confidence,
                             known_variance=known_variance, bounds=bounds)


def check_resamples(resamples: int) -> None:
    """A band is a percentile of bootstrap refits, so it needs at least one (the CLI and
    `fit_curve` ask for 50 or more; this guards the library's lower-level fits)."""
    if isinstance(resamples, bool) or not (isinstance(resamples, (int, np.integer)) and resamples >= 1):
        raise CurveError(f"a band needs at least 1 bootstrap resample (got {resamples!r})",
                         hint="give a whole number of resamples ≥ 1 (fit_curve and the CLI ask for 50 or more)")


@functools.lru_cache(maxsize=64)
def _band_z(confidence: float) -> float:
    """`norm.ppf(1 - alpha/2)` for alpha = 1 - `confidence`, the band's z: the same `ndtri` of the
    same argument that `norm.ppf` computes, kept per confidence. A lab analysis makes thousands
    of fits, and `norm.ppf`'s argument checks took about 0.1 ms of each (`ndtri` alone: 1 µs).
    The argument is written as the fit always wrote it, 1 - (1 - c)/2, not `two_sided_z`'s
    0.5 + c/2."""
    alpha = 1.0 - confidence
    return float(ndtri(1.0 - alpha / 2.0))


def monotone_fit_from(t: np.ndarray, yu: np.ndarray, wu: np.ndarray, fitted: np.ndarray,
                      curves: np.ndarray, crossings: np.ndarray, grid_t: np.ndarray, *, x: np.ndarray,
                      sign: float, predictor: Predictor, level: float, confidence: float,
                      known_variance: bool, bounds: tuple[float, float] | None,
                      centred: bool = True) -> MonotoneFit:
    """The curve, band and threshold from a non-decreasing fit in the progress coordinate t.

    t: the distinct progress values (ascending), yu and wu the pooled values and weights there,
    `fitted` the monotone fit at t, `curves` [resamples, grid] and `crossings` (in t; NaN: never)
    the bootstrap refits on `grid_t`, x the input rows on the axis (for `fitted_at_points`).
    Shared by the one-axis fit and each budget level of a budget curve
    (`monitor.curves.budget`), so both widen and read thresholds the same way. `centred` False
    draws the curve through the fitted value at every t instead of one knot per block centroid
    (a budget curve's levels share the points, so the curves stay ordered between them too);
    the standard errors come from the blocks either way.
    """
    kt, ky, kw = _centred_knots(t, fitted, wu)
    n_blocks = len(kt)
    chi2 = float(np.sum(wu * (yu - fitted) ** 2))
    dof = len(t) - n_blocks
    if known_variance:
        dispersion = max(1.0, chi2 / dof) if dof > 0 else 1.0
    else:
        dispersion = chi2 / dof if dof > 0 else 0.0

    half_se = _knot_se(grid_t, kt, kw)
    if not centred:
        kt, ky = t, fitted
    est = np.interp(grid_t, kt, ky)
    alpha = 1.0 - confidence
    z = _band_z(confidence)
    b_lo, b_hi = np.quantile(curves, [alpha / 2.0, 1.0 - alpha / 2.0], axis=0)
    half = z * math.sqrt(dispersion) * half_se
    lo = np.minimum(b_lo, est - half)
    hi = np.maximum(b_hi, est + half)
    if bounds is not None:
        lo = np.clip(lo, *bounds)
        hi = np.clip(hi, *bounds)
    # Monotone by widening only: the lower edge takes the smallest value at or beyond each
    # point, the upper edge the largest value at or before it (g is non-decreasing in t).
    lo = np.minimum.accumulate(lo[::-1])[::-1]
    hi = np.maximum.accumulate(hi)

    crossing = threshold_crossing(level, sign=sign, t_first=float(t[0]), knots_t=kt, knots_y=ky,
                                  grid_t=grid_t, lower=lo, upper=hi)
    boot_x = sign * crossings
    never_share = float(np.mean(np.isnan(crossings)))
    # Bootstrap percentile interval of η̂, with "never" beyond the most advanced checkpoint.
    ranked = np.where(np.isnan(crossings), np.inf, crossings)
    q = np.quantile(ranked, [alpha / 2.0, 0.5, 1.0 - alpha / 2.0], method="inverted_cdf")
    boot = {name: (None if not math.isfinite(v) else float(sign * v))
            for name, v in zip(("early", "median", "late"), q)}
    threshold = {
        # lower/upper in the predictor's own units; None: the edge never reaches the level
        "estimate": crossing["estimate"], "lower": crossing["lower"], "upper": crossing["upper"],
        "never_share": never_share, "confidence": confidence, "status": crossing["status"], "level": level,
        "bootstrap": boot,
    }
    order = np.argsort(sign * grid_t)
    korder = np.argsort(sign * kt)
    fitted_rows = np.interp(sign * x, t, fitted)
    return MonotoneFit(
        predictor=predictor, level=level, confidence=confidence,
        knots_x=(sign * kt)[korder], knots_y=ky[korder],
        grid_x=(sign * grid_t)[order], grid_fit=est[order], lower=lo[order], upper=hi[order],
        threshold=threshold, boot_thresholds=boot_x, dispersion=dispersion, n_blocks=n_blocks,
        fitted_at_points=fitted_rows)


# -- logistic check ------------------------------------------------------------------------------
def fit_logistic(x: Sequence[float], y: Sequence[float], weights: Sequence[float], *, floor: float,
                 margin: float, predictor: Predictor = PREDICTORS["lstar"],
                 proportion: bool = True) -> dict[str, Any]:
    """Weighted least squares fit of p(x) = floor + (c - floor)·sigmoid(-(x - x0)/s) (with
    +(x - x0)/s for predictors where higher is progress), and its threshold for floor + margin.

    Returns ceiling c, midpoint x0, scale s, threshold (None if c - floor ≤ margin) and whether
    the threshold lies inside the data; `converged` False with a message when the fit fails.
    """
    from scipy.optimize import least_squares

    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    sw = np.sqrt(np.asarray(weights, dtype=np.float64))
    sign = -1.0 if predictor.lower_is_progress else 1.0
    t = sign * x
    span = float(np.ptp(t)) or 1.0
    top = 1.0 if proportion else float(np.max(y)) + float(np.ptp(y))
    c0 = min(max(float(np.max(y)), floor + 1e-3), top)

    def residuals(theta: np.ndarray) -> np.ndarray:
        c, t0, s = theta
        return sw * (floor + (c - floor) * expit((t - t0) / s) - y)

    start = np.array([c0, float(np.median(t)), span / 10.0])
    lower = np.array([floor, float(t.min()) - span, span / 1000.0])
    upper = np.array([max(top, floor + 2e-3), float(t.max()) + span, 10.0 * span])
    start = np.clip(start, lower + 1e-12, upper - 1e-12)
    try:
        result = least_squares(residuals, start, bounds=(lower, upper), method="trf")
    except (ValueError, FloatingPointError) as exc:
        return {"converged": False, "message": str(exc).splitlines()[0]}
    if not result.success:
        return {"converged": False, "message": result.message}
    c, t0, s = (float(v) for v in result.x)
    threshold: float | None = None
    in_range: bool | None = None
    if c - floor > margin:
        t_thr = t0 + s * float(logit(margin / (c - floor)))
        threshold = sign * t_thr
        in_range = bool(t.min() <= t_thr <= t.max())
    return {"converged": True, "message": None, "ceiling": c, "midpoint": sign * t0, "scale": s,
            "threshold": threshold, "threshold_in_range": in_range}


def logistic_value(params: Mapping[str, Any], x: Any, *, floor: float,
                   predictor: Predictor = PREDICTORS["lstar"]) -> np.ndarray:
    """The fitted logistic check at x."""
    sign = -1.0 if predictor.lower_is_progress else 1.0
    t = sign * np.asarray(x, dtype=np.float64)
    t0 = sign * params["midpoint"]
    return floor + (params["ceiling"] - floor) * expit((t - t0) / params["scale"])
