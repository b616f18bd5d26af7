"""A parametric task curve: the four-parameter sigmoid in the progress axis, with a bootstrap band
that reaches beyond the data (docs/measurement.md §2b).

    y = floor + (ceiling − floor) / (1 + exp(−k·s·(x − x0)))

with s = −1 on an axis where lower is progress (L*, losses) and +1 otherwise, so the curve is
non-decreasing toward progress; k > 0 and floor ≤ ceiling (fitted as ceiling = floor + h·(top −
floor), h in [0, 1]); for proportions floor and ceiling lie in [0, 1]. Weighted least squares
(scipy's `least_squares`, analytic Jacobian) with the label weights of
`monitor.curves.stats.label_weights`, from several starting points (the midpoint inside and
beyond the data, three steepnesses); the best converged start wins, and a fit that no start
brings to convergence is a CurveError naming the solver's message. The solves of one fit (its
starts, then its band's resamples) run together in lock step (`monitor.curves.batch_trf`):
the steps of scipy's solver, taken for every problem of the batch at once; many fits
(`fit_sigmoid_bands`: a validation's folds) share their batches, each on its own rows.

Why a parametric family: an isotonic curve is flat beyond its data, so a release better than
every reference is predicted at the best reference's level, confidently and too low. A sigmoid
keeps rising where the references were still rising.

The band: the fit is repeated on bootstrap resamples of the checkpoints (the resampling unit
of the isotonic band, `monitor.curves.stats._bootstrap`: each distinct axis value with its
pooled rows is one unit), each refit warm-started at the full fit, and the pointwise
percentiles of the refitted curves on a grid are the band. The grid runs from the least
advanced checkpoint to `EXTRAPOLATION_SPAN` times the data's span beyond the most advanced one,
so a prediction beyond the references reads the band there (and is still marked extrapolated,
and widened, by `monitor.curves.artifact.predict`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
from scipy.optimize import least_squares
from scipy.special import expit

try:   # scipy's trust-region-reflective core: the solver `least_squares(method="trf")` runs
    from scipy.optimize._lsq.common import make_strictly_feasible
    from scipy.optimize._lsq.least_squares import TERMINATION_MESSAGES
    from scipy.optimize._lsq.trf import trf as _trf_core

    from monitor.curves.batch_trf import trf_bounds_batch
    from monitor.curves.small_trf import trf_bounds as _small_trf
except ImportError:   # a scipy that moved it: the public wrapper, same numbers, slower
    _trf_core = _small_trf = trf_bounds_batch = None

from monitor.bands import first_reach, threshold_crossing
from monitor.curves.axes import Axis
from monitor.curves.stats import _merge_ties, check_resamples
from monitor.errors import CurveError, LabelError

# How far beyond the most advanced checkpoint the band's grid reaches, in units of the data's
# span on the axis (1.0: as far again as the data spans).
EXTRAPOLATION_SPAN = 1.0
# Bounds of the steepness in units of 1/span of the data: from nearly linear to a step.
_K_MIN, _K_MAX = 1e-3, 1e3
# A bootstrap refit that fails to converge is dropped; more failures than this share is an error.
_MAX_FAILED_SHARE = 0.1
# The solver's settings: least_squares' default ftol = xtol = gtol, and its evaluation cap.
_TOLERANCE, _MAX_EVALUATIONS = 1e-8, 400
# Start costs this close (relative) to the least are a tie, won by the earliest start (`_best_start`).
_TIED_COST = 1e-10
# Fewer solves than this run one at a time (`_Problem.solve`): below it the batch's per-round
# bookkeeping costs more than the solves it shares (measured on the axis-choice workload).
_SMALLEST_BATCH = 4
# At most about this many solves × rows share one batch (`fit_sigmoid_bands`): each solve holds
# its residuals, Jacobians and SVD at the batch's longest row count, about 250 bytes a row, so
# this bounds a batch near 65 MB (4,096 solves of 64 rows).
_MOST_SOLVE_ROWS_AT_ONCE = 1 << 18


@dataclass(frozen=True)
class SigmoidParams:
    """The fitted sigmoid in the axis's own units: floor, ceiling, steepness k (> 0, per axis
    unit) and midpoint x0; `sign` −1 where lower is progress."""

    floor: float
    ceiling: float
    k: float
    x0: float
    sign: float

    def __call__(self, x: Any) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        return self.floor + (self.ceiling - self.floor) * expit(self.k * self.sign * (x - self.x0))

    def as_dict(self) -> dict[str, float]:
        return {"floor": self.floor, "ceiling": self.ceiling, "k": self.k, "x0": self.x0}


def _value_bounds(y: np.ndarray, proportion: bool) -> tuple[float, float]:
    if proportion:
        return 0.0, 1.0
    spread = float(np.ptp(y)) or 1.0
    return float(np.min(y)) - spread, float(np.max(y)) + spread


def _columns(theta: np.ndarray) -> tuple[Any, Any, Any, Any]:
    """floor, h, k, u0 of one point θ (4,) as numbers, or of a batch (B, 4) as (B, 1) columns."""
    theta = np.asarray(theta)
    if theta.ndim == 1:
        return tuple(theta)   # type: ignore[return-value]
    return tuple(theta[:, i:i + 1] for i in range(4))   # type: ignore[return-value]


def _sigmoid(theta: np.ndarray, u: np.ndarray, top: Any) -> np.ndarray:
    """The sigmoid in normalised coordinates: one point θ (4,) at u, or a batch (B, 4) at u
    (its own row of u (B, m) per problem, or one u for all: (B, len(u)))."""
    floor, h, k, u0 = _columns(theta)
    return floor + h * (top - floor) * expit(k * (u - u0))


def _jacobian_of(e: np.ndarray, u: np.ndarray, top: Any, floor: Any, h: Any, k: Any, u0: Any) -> np.ndarray:
    """The unweighted Jacobian (…, m, 4) given the logistic e at the rows u: parameters scalars
    for one point, (B, 1) columns for a batch."""
    de = e * (1.0 - e)
    room = top - floor
    jac = np.empty((*e.shape, 4))
    jac[..., 0] = 1.0 - h * e
    jac[..., 1] = room * e
    jac[..., 2] = h * room * de * (u - u0)
    jac[..., 3] = -h * room * de * k
    return jac


@dataclass
class _Solves:
    """Per solve of a batch: the point reached, its cost, scipy's status (> 0 converged, 0 the
    evaluation cap, −1 could not start or stopped by the single solve's error) and, where it
    did not converge, why."""

    x: np.ndarray
    cost: np.ndarray
    status: np.ndarray
    reasons: list[str | None]


class _Problem:
    """The least-squares problem in normalised coordinates u = (t − centre)/span, so the solver
    sees parameters of order one whatever the axis's units. θ = (floor, h, k_u, u0)."""

    def __init__(self, t: np.ndarray, y: np.ndarray, w: np.ndarray, bottom: float, top: float):
        self.centre = float(np.mean(t))
        self.span = float(np.ptp(t)) or 1.0
        self.u = (t - self.centre) / self.span
        self.y, self.bottom, self.top = y, bottom, top
        self.set_weights(w)
        self._last_theta = b""          # the bytes of the point whose logistic `_last_e` holds
        self._last_e = np.empty(0)
        self.lower = np.array([bottom, 0.0, _K_MIN, float(self.u.min()) - 10.0])
        self.upper = np.array([top, 1.0, _K_MAX, float(self.u.max()) + 10.0])

    def set_weights(self, w: np.ndarray) -> None:
        self.w, self.sw = w, np.sqrt(w)

    def curve(self, theta: np.ndarray, u: np.ndarray) -> np.ndarray:
        """The sigmoid at u for one point θ (4,), or for a batch of points (B, 4): (B, len(u))."""
        return _sigmoid(theta, u, self.top)

    def residuals(self, theta: np.ndarray) -> np.ndarray:
        floor, h, k, u0 = theta
        e = expit(k * (self.u - u0))
        # The solver asks for the Jacobian at the point whose residuals it accepted: keep the
        # logistic there (the same array `curve` computes) rather than evaluate it again. Keyed
        # by the point's value, not its identity: an array changed in place is a new point.
        self._last_theta, self._last_e = np.asarray(theta, dtype=float).tobytes(), e
        return self.sw * (floor + h * (self.top - floor) * e - self.y)

    def jacobian(self, theta: np.ndarray) -> np.ndarray:
        floor, h, k, u0 = theta
        same = np.asarray(theta, dtype=float).tobytes() == self._last_theta
        e = self._last_e if same else expit(k * (self.u - u0))
        return self._jacobian_at(e, floor, h, k, u0) * self.sw[:, None]

    def _jacobian_at(self, e: np.ndarray, floor: Any, h: Any, k: Any, u0: Any) -> np.ndarray:
        """The unweighted Jacobian (m, 4) at one point, given the logistic e at the rows."""
        return _jacobian_of(e, self.u, self.top, floor, h, k, u0)

    def solve_batch(self, starts: np.ndarray, weights: np.ndarray) -> _Solves:
        """One solve from each row of `starts` (B, 4) with the row weights of `weights` (B, m),
        all at once (`solve_stacked` with this one problem)."""
        return solve_stacked([self], np.zeros(len(np.atleast_2d(starts)), dtype=np.int64), starts, weights)

    def starts(self) -> list[np.ndarray]:
        lo, hi = float(np.min(self.y)), float(np.max(self.y))
        floor0 = min(max(lo, self.bottom), self.top)
        room = self.top - floor0
        h0 = min(max((hi - floor0) / room, 0.05), 1.0) if room > 0 else 0.5
        out = []
        # Midpoints inside the data and beyond its advanced end (a curve still rising at the
        # best reference), each at three steepnesses.
        for u0 in (float(np.quantile(self.u, 0.5)), float(self.u.max()), float(self.u.max()) + 0.5,
                   float(np.quantile(self.u, 0.2))):
            for k in (2.0, 6.0, 20.0):
                out.append(np.clip(np.array([floor0, h0, k, u0]), self.lower, self.upper))
        return out

    def solve(self, start: np.ndarray) -> Any:
        """One bounded trust-region-reflective solve from `start`: scipy's `least_squares`
        (method "trf", x_scale "jac", at most 400 evaluations), its loop run by
        `monitor.curves.small_trf.trf_bounds`. A fit uses it for batches too small to share
        (`solve_batch`); the batch follows it step for step.

        Why not the public call: a solve is a few dozen iterations on 4 parameters, where the wrapper's
        per-evaluation bookkeeping (argument checks, copies, evaluation counters) and the
        generic loop's helpers (norms, the SVD's wrapper) cost most of the solve. The loop gets
        what the wrapper would give it for these arguments (the start moved strictly inside the
        bounds, the residuals and Jacobian there, the default tolerances, no loss), and does
        the same arithmetic, so the result is the same to the bit (tests/test_parametric_solver.py
        checks it against `least_squares` and against scipy's own core, `solve_with_scipy_core`)."""
        if _small_trf is None:
            return solve_with_least_squares(self, start)
        x0, f0 = self._feasible_start(start)
        result = _small_trf(self.residuals, self.jacobian, x0, f0, self.jacobian(x0), self.lower, self.upper,
                            _TOLERANCE, _TOLERANCE, _TOLERANCE, _MAX_EVALUATIONS)
        result.message = TERMINATION_MESSAGES[result.status]
        result.success = result.status > 0
        return result

    def _feasible_start(self, start: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The start moved strictly inside the bounds and the residuals there, with
        least_squares' own check and message where they are not finite."""
        x0 = make_strictly_feasible(np.atleast_1d(start).astype(float), self.lower, self.upper)
        f0 = self.residuals(x0)
        if not np.all(np.isfinite(f0)):
            raise ValueError("Residuals are not finite in the initial point.")
        return x0, f0

    def params(self, theta: np.ndarray, sign: float) -> SigmoidParams:
        floor, h, k_u, u0 = (float(v) for v in theta)
        ceiling = floor + h * (self.top - floor)
        t0 = self.centre + u0 * self.span
        return SigmoidParams(floor=floor, ceiling=ceiling, k=k_u / self.span, x0=sign * t0, sign=sign)


def solve_with_scipy_core(problem: _Problem, start: np.ndarray) -> Any:
    """`_Problem.solve` through scipy's own trust-region-reflective core (`trf`), called as
    `least_squares` calls it: the reference `small_trf` must match step for step."""
    if _trf_core is None:
        return solve_with_least_squares(problem, start)
    x0, f0 = problem._feasible_start(start)
    result = _trf_core(problem.residuals, lambda theta, _f=None: problem.jacobian(theta), x0, f0,
                       problem.jacobian(x0), problem.lower, problem.upper, _TOLERANCE, _TOLERANCE, _TOLERANCE,
                       _MAX_EVALUATIONS, "jac", None, "exact", {}, 0)
    result.message = TERMINATION_MESSAGES[result.status]
    result.success = result.status > 0
    return result


def solve_with_least_squares(problem: _Problem, start: np.ndarray) -> Any:
    """`_Problem.solve` through scipy's public `least_squares` (the reference the direct call
    must match, and the fallback where scipy's core cannot be imported)."""
    return least_squares(problem.residuals, start, jac=problem.jacobian, bounds=(problem.lower, problem.upper),
                         method="trf", x_scale="jac", max_nfev=_MAX_EVALUATIONS)


class _Stacked:
    """The solves of a batch, each on its problem's rows (`solve_stacked`): per solve its
    problem's u, y and top, padded to the longest problem with rows of weight 0."""

    def __init__(self, problems: Sequence[_Problem], owners: np.ndarray, weights: Sequence[np.ndarray]):
        sizes = np.array([len(p.u) for p in problems], dtype=np.int64)
        width = int(sizes.max())
        if len(problems) == 1:       # one problem: its own arrays, broadcast, nothing padded
            only = problems[0]
            self.u, self.y = only.u[None, :], only.y[None, :]
            self.top = np.array([[only.top]])
        else:
            self.u, self.y = np.zeros((len(problems), width)), np.zeros((len(problems), width))
            for i, p in enumerate(problems):
                self.u[i, :len(p.u)], self.y[i, :len(p.y)] = p.u, p.y
            self.top = np.array([[p.top] for p in problems])
        self.u, self.y, self.top = self.u[owners], self.y[owners], self.top[owners]
        self.sizes = sizes[owners]
        self.sw = np.zeros((len(owners), width))
        for i, w in enumerate(weights):
            self.sw[i, :len(w)] = np.sqrt(np.asarray(w, dtype=float))

    def keep(self, rows: np.ndarray) -> None:
        self.u, self.y, self.top, self.sw, self.sizes = (self.u[rows], self.y[rows], self.top[rows],
                                                         self.sw[rows], self.sizes[rows])

    def residuals(self, thetas: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """The residuals of solves `rows` at their points `thetas` (k, 4)."""
        return self.sw[rows] * (_sigmoid(thetas, self.u[rows], self.top[rows]) - self.y[rows])

    def jacobian(self, thetas: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """Their Jacobians (k, m, 4), as `_Problem.jacobian` computes one."""
        floor, h, k, u0 = _columns(thetas)
        u = self.u[rows]
        return _jacobian_of(expit(k * (u - u0)), u, self.top[rows], floor, h, k, u0) * self.sw[rows][:, :, None]


def solve_stacked(problems: Sequence[_Problem], owners: np.ndarray, starts: np.ndarray,
                  weights: Sequence[np.ndarray]) -> _Solves:
    """One solve from each row of `starts` (B, 4), on problem `problems[owners[i]]` with the row
    weights `weights[i]` (its problem's length), all at once (`monitor.curves.batch_trf`; where
    scipy's core cannot be imported, one `least_squares` call each). The problems may differ in
    data, length and bounds (the folds of a validation, each with its band). A solve that cannot
    start (residuals not finite at its start: least_squares' own message), or that stops on an
    error the single solve raises, has status −1 and its reason."""
    starts = np.atleast_2d(np.asarray(starts, dtype=float))
    owners = np.asarray(owners, dtype=np.int64)
    out = _Solves(x=starts.copy(), cost=np.full(len(starts), np.inf),
                  status=np.full(len(starts), -1, dtype=np.int64), reasons=[None] * len(starts))
    if trf_bounds_batch is None or len(starts) < _SMALLEST_BATCH:
        # one at a time: scipy's public call where its core moved; a batch too small to
        # repay the lock step's bookkeeping
        for i, (start, owner, w) in enumerate(zip(starts, owners, weights)):
            problem = problems[owner]
            solve = problem.solve if trf_bounds_batch is not None else partial(solve_with_least_squares, problem)
            kept = problem.w
            problem.set_weights(np.asarray(w, dtype=float))
            try:
                result = solve(start)
            except (ValueError, FloatingPointError) as exc:
                out.reasons[i] = str(exc).splitlines()[0]
                continue
            finally:
                problem.set_weights(kept)
            out.x[i], out.cost[i], out.status[i] = result.x, result.cost, result.status
            out.reasons[i] = None if result.status > 0 else str(result.message)
        return out
    lower = np.array([problems[o].lower for o in owners])
    upper = np.array([problems[o].upper for o in owners])
    x0 = np.array([make_strictly_feasible(s, lo, hi) for s, lo, hi in zip(starts, lower, upper)])
    stack = _Stacked(problems, owners, weights)
    f0 = stack.residuals(x0, np.arange(len(x0)))
    ok = np.isfinite(f0).all(axis=1)
    for i in np.flatnonzero(~ok):
        out.reasons[i] = "Residuals are not finite in the initial point."
    if ok.any():
        rows = np.flatnonzero(ok)
        stack.keep(rows)
        solved = trf_bounds_batch(stack.residuals, stack.jacobian, x0[rows], f0[rows], lower[rows], upper[rows],
                                  _TOLERANCE, _MAX_EVALUATIONS, sizes=stack.sizes)
        out.x[rows], out.cost[rows], out.status[rows] = solved.x, solved.cost, solved.status
        for i, status, error in zip(rows, solved.status, solved.errors):
            if error is not None:           # the solve's own error, as the single solve raises it
                out.status[i], out.reasons[i] = -1, error
            elif status <= 0:
                out.reasons[i] = TERMINATION_MESSAGES[int(status)]
    return out


def fit_sigmoid(x: Sequence[float], y: Sequence[float], weights: Sequence[float], *, predictor: Axis,
                proportion: bool) -> SigmoidParams:
    """Weighted least-squares sigmoid of y on x, monotone toward progress (see the module
    docstring); CurveError when no starting point converges."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    sign = -1.0 if predictor.lower_is_progress else 1.0
    problem, _ = _problem(sign * x, y, w, proportion, predictor)
    theta = _best_start(problem, problem.starts())
    return problem.params(theta, sign)


def _problem(t: np.ndarray, y: np.ndarray, w: np.ndarray, proportion: bool,
             predictor: Axis) -> tuple[_Problem, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    tu, yu, wu = _merge_ties(t, y, w)
    if len(tu) < 4:
        raise LabelError(f"a sigmoid has 4 parameters; it needs at least 4 distinct {predictor.label} "
                         f"values (got {len(tu)})", hint="fit the isotonic family, or add checkpoints")
    if not (np.all(np.isfinite(tu)) and np.all(np.isfinite(yu)) and np.all(np.isfinite(wu))):
        raise LabelError(f"the {predictor.label} values, performance values or weights are not all finite")
    bottom, top = _value_bounds(yu, proportion)
    return _Problem(tu, yu, wu, bottom, top), (tu, yu, wu)


def _best_start(problem: _Problem, starts: list[np.ndarray]) -> np.ndarray:
    """The converged solve of least cost among those from `starts`. Costs within
    `_TIED_COST` (relative) of the least are a tie, won by the earliest start: starts that reach
    the same optimum, or optima the data cannot tell apart (alike at every checkpoint, apart
    beyond them), differ in cost only by rounding, which must not choose the curve."""
    solves = problem.solve_batch(np.array(starts), np.broadcast_to(problem.w, (len(starts), len(problem.u))))
    return _pick_start(solves.x, solves.cost, solves.status, solves.reasons)


def _pick_start(x: np.ndarray, cost: np.ndarray, status: np.ndarray, reasons: Sequence[str | None]) -> np.ndarray:
    """`_best_start`'s choice among one fit's solves (one per start, in the starts' order)."""
    converged = np.flatnonzero(status > 0)
    if not len(converged):
        reason = next((r for r in reasons if r), "no starting point")
        raise CurveError(f"the sigmoid fit did not converge from any of {len(status)} starting points ({reason})",
                         hint="fit the isotonic family (--fit-family isotonic), or check the labels")
    costs = cost[converged]
    least = float(np.min(costs))
    tied = converged[costs <= least + _TIED_COST * abs(least)]
    return x[tied[0]].copy()


@dataclass(frozen=True)
class SigmoidFit:
    """The sigmoid with its band and threshold, laid out like `monitor.curves.stats.MonotoneFit`
    (arrays ascending in x): knots are the fitted curve sampled on the grid."""

    params: SigmoidParams
    predictor: Axis
    level: float
    confidence: float
    knots_x: np.ndarray
    knots_y: np.ndarray
    grid_x: np.ndarray
    grid_fit: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    threshold: dict[str, Any]
    dispersion: float
    failed_resamples: int

    def predict(self, x: Any) -> np.ndarray:
        return np.interp(np.asarray(x, dtype=np.float64), self.knots_x, self.knots_y)

    def band(self, x: Any) -> tuple[np.ndarray, np.ndarray]:
        x = np.asarray(x, dtype=np.float64)
        return np.interp(x, self.grid_x, self.lower), np.interp(x, self.grid_x, self.upper)


@dataclass(frozen=True)
class BandRequest:
    """One sigmoid-with-band fit (`fit_sigmoid_band`'s arguments), for `fit_sigmoid_bands`."""

    x: Sequence[float]
    y: Sequence[float]
    weights: Sequence[float]
    predictor: Axis
    level: float
    confidence: float = 0.9
    resamples: int = 1000
    seed: int = 0
    grid_size: int = 101
    proportion: bool = True
    extend: float = EXTRAPOLATION_SPAN

    def __post_init__(self) -> None:
        check_resamples(self.resamples)


def fit_sigmoid_band(x: Sequence[float], y: Sequence[float], weights: Sequence[float], *, predictor: Axis,
                     level: float, confidence: float = 0.9, resamples: int = 1000, seed: int = 0,
                     grid_size: int = 101, proportion: bool = True,
                     extend: float = EXTRAPOLATION_SPAN) -> SigmoidFit:
    """The sigmoid, its bootstrap percentile band on a grid reaching `extend` × the data span
    beyond the most advanced checkpoint, and the threshold for `level` from the shared rule
    (`monitor.bands.threshold_crossing`)."""
    (fit,) = fit_sigmoid_bands([BandRequest(x, y, weights, predictor, level, confidence, resamples, seed,
                                            grid_size, proportion, extend)])
    if isinstance(fit, Exception):
        raise fit
    return fit


@dataclass
class _Pending:
    """A request on its way through `fit_sigmoid_bands`."""

    request: BandRequest
    sign: float
    problem: _Problem
    t: np.ndarray
    yu: np.ndarray
    wu: np.ndarray
    theta: np.ndarray | None = None


def fit_sigmoid_bands(requests: Sequence[BandRequest]) -> list[SigmoidFit | LabelError | CurveError]:
    """`fit_sigmoid_band` for each request, its result or the error it raises (LabelError,
    CurveError), in order. The fits' solves share batches: every fit's starts in one, then every
    band's resamples in one, so the many small fits of a validation (axes × folds, and a family
    bootstrap's refits of it) pay the lock step's per-round cost once instead of once per fit.
    Each fit's arithmetic is its own; only the order of sums over padded rows, and so the last
    bits, can differ from fitting it alone (and, rarely, a solve that sits on a rounding
    boundary ends with another status, as in one fit's batch). Requests are taken in groups of
    about `_MOST_SOLVE_ROWS_AT_ONCE` solves × rows, which bounds the batch's memory. An error
    other than those two (inputs of mismatched lengths) is raised, as fitting alone raises it."""
    out: list[Any] = []
    group: list[BandRequest] = []
    solves = 0
    for request in requests:
        cost = (12 + request.resamples) * max(len(request.x), 1)
        if group and solves + cost > _MOST_SOLVE_ROWS_AT_ONCE:
            out.extend(_fit_group(group))
            group, solves = [], 0
        group.append(request)
        solves += cost
    if group:
        out.extend(_fit_group(group))
    return out


def _fit_group(requests: Sequence[BandRequest]) -> list[SigmoidFit | LabelError | CurveError]:
    out: list[Any] = [None] * len(requests)
    pending: dict[int, _Pending] = {}
    for i, r in enumerate(requests):
        sign = -1.0 if r.predictor.lower_is_progress else 1.0
        try:
            problem, (t, yu, wu) = _problem(sign * np.asarray(r.x, dtype=np.float64), np.asarray(r.y, dtype=np.float64),
                                            np.asarray(r.weights, dtype=np.float64), r.proportion, r.predictor)
        except LabelError as exc:
            out[i] = exc
            continue
        pending[i] = _Pending(r, sign, problem, t, yu, wu)
    order = list(pending)
    problems = [pending[i].problem for i in order]
    # every fit's starts, in one batch
    starts = [problem.starts() for problem in problems]
    owners = np.repeat(np.arange(len(problems)), [len(s) for s in starts])
    solves = solve_stacked(problems, owners, np.array([s for group in starts for s in group]).reshape(-1, 4),
                           [problems[o].w for o in owners]) if len(order) else None
    at = 0
    for j, i in enumerate(order):
        n = len(starts[j])
        part = slice(at, at + n)
        at += n
        try:
            pending[i].theta = _pick_start(solves.x[part], solves.cost[part], solves.status[part], solves.reasons[part])
        except CurveError as exc:
            out[i] = exc
    fitted = [i for i in order if pending[i].theta is not None]
    # every band's resamples, in one batch, each warm-started at its fit
    counts = {}
    for i in fitted:
        r, m = pending[i].request, len(pending[i].t)
        counts[i] = np.random.default_rng(r.seed).multinomial(m, np.full(m, 1.0 / m), size=r.resamples)
    index = {i: k for k, i in enumerate(order)}
    owners = np.repeat([index[i] for i in fitted], [len(counts[i]) for i in fitted]).astype(np.int64)
    band_starts = np.concatenate([np.broadcast_to(pending[i].theta, (len(counts[i]), 4)) for i in fitted]) \
        if fitted else np.empty((0, 4))
    band_weights = [row for i in fitted for row in counts[i] * pending[i].wu]
    band = solve_stacked(problems, owners, band_starts, band_weights) if len(band_starts) else None
    at = 0
    for i in fitted:
        n = len(counts[i])
        part = slice(at, at + n)
        at += n
        try:
            out[i] = _finish_band(pending[i], band.x[part], band.status[part])
        except CurveError as exc:
            out[i] = exc
    return out


def _finish_band(fit: _Pending, refits: np.ndarray, status: np.ndarray) -> SigmoidFit:
    """The band, threshold and dispersion of one fit from its resamples' refits."""
    r, problem, t, theta, sign = fit.request, fit.problem, fit.t, fit.theta, fit.sign
    params = problem.params(theta, sign)
    span = float(t[-1] - t[0])
    grid_t = np.linspace(t[0], t[-1] + r.extend * span, r.grid_size)
    grid_u = (grid_t - problem.centre) / problem.span
    est = problem.curve(theta, grid_u)
    failed = status <= 0
    curves = problem.curve(refits, grid_u)
    if failed.mean() > _MAX_FAILED_SHARE:
        raise CurveError(f"{int(failed.sum())} of {r.resamples} bootstrap refits of the sigmoid did not converge",
                         hint="the data do not pin a sigmoid down; fit the isotonic family")
    curves = curves[~failed]
    alpha = 1.0 - r.confidence
    lo, hi = np.quantile(curves, [alpha / 2.0, 1.0 - alpha / 2.0], axis=0)
    lo, hi = np.minimum(lo, est), np.maximum(hi, est)
    if r.proportion:
        lo, hi = np.clip(lo, 0.0, 1.0), np.clip(hi, 0.0, 1.0)
    lo = np.minimum.accumulate(lo[::-1])[::-1]
    hi = np.maximum.accumulate(hi)

    level = r.level
    crossing = threshold_crossing(level, sign=sign, t_first=float(t[0]), knots_t=grid_t, knots_y=est,
                                  grid_t=grid_t, lower=lo, upper=hi)
    crossings = np.array([grid_t[0] if c[0] >= level else first_reach(grid_t, c, level) for c in curves])
    ranked = np.where(np.isnan(crossings), np.inf, crossings)
    q = np.quantile(ranked, [alpha / 2.0, 0.5, 1.0 - alpha / 2.0], method="inverted_cdf")
    boot = {name: (None if not math.isfinite(v) else float(sign * v))
            for name, v in zip(("early", "median", "late"), q)}
    threshold = {"estimate": crossing["estimate"], "lower": crossing["lower"], "upper": crossing["upper"],
                 "never_share": float(np.mean(np.isnan(crossings))), "confidence": r.confidence,
                 "status": crossing["status"], "level": level, "bootstrap": boot}
    m = len(t)
    resid = fit.yu - problem.curve(theta, problem.u)
    dof = m - 4
    dispersion = float(np.sum(fit.wu * resid ** 2) / dof) if dof > 0 else 0.0
    order = np.argsort(sign * grid_t)
    gx = (sign * grid_t)[order]
    return SigmoidFit(params=params, predictor=r.predictor, level=level, confidence=r.confidence,
                      knots_x=gx, knots_y=est[order], grid_x=gx, grid_fit=est[order], lower=lo[order],
                      upper=hi[order], threshold=threshold, dispersion=dispersion,
                      failed_resamples=int(failed.sum()))
