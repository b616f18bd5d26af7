"""Task curves monotone in a progress axis and an inference budget (`lstar curves fit
--budget-column`).

Inference-time compute (samples per question, majority of k, chain of thought) moves task
thresholds, so a curve for a deployment that spends it is g(x, c): monotone in progress x and
in the budget c. Labels carry the budget as an ordered number per row; every checkpoint must
be labelled at every budget level (a complete grid), because the fit compares levels checkpoint
by checkpoint and says nothing about a level a checkpoint lacks.

The fit is the weighted least-squares fit on the grid (distinct progress values × budget
levels) under both orders: non-decreasing along progress at each level and along the budget at
each progress value — bivariate isotonic regression (Dykstra & Robertson 1982, "An algorithm
for isotonic regression for two or more independent variables", Ann. Statist. 10(3)). It is
computed by Dykstra's cyclic projection (1983) between the two orders, each projection a
weighted pool-adjacent-violators pass, which converges to the exact least-squares solution.
Each budget level then gets what a one-axis curve has (`monitor.curves.stats.monotone_fit_from`):
centred knots, a bootstrap band (checkpoints resampled with all their levels, the whole
bivariate fit refitted on each resample), the threshold and its interval, the logistic check.
Prediction is only at a fitted level (`monitor.curves.artifact.at_budget`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import numpy as np
from scipy.optimize import isotonic_regression as scipy_isotonic
from sklearn.isotonic import isotonic_regression

from monitor.curves.artifact import (SCHEMA, Band, BootstrapInfo, BudgetInfo, BudgetLevelCurve, BudgetLofoRow,
                                     CurveArtifact, CurvePoint, Knots, LogisticCheck, ScoringRef, Threshold)
from monitor.curves.axes import AXES, Axis
from monitor.curves.labels import Label, select_labels
from monitor.bands import first_reach, threshold_crossing
from monitor.curves.stats import fit_logistic, label_weights, monotone_fit_from
from monitor.curves.validation import emergence_score
from monitor.errors import CurveError, LabelError

METHOD = ("bivariate isotonic (Dykstra's cyclic projection); checkpoint bootstrap percentile with all "
          "budget levels of a checkpoint resampled together, widened to the block interval per level")
# Dykstra's projections converge linearly; this bounds the work on a hostile grid.
MAX_ITERATIONS = 20_000
TOLERANCE = 1e-12


# -- the fit ------------------------------------------------------------------------------------
def _rowwise_isotonic(v: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Each row of v made non-decreasing (weighted PAVA per row), in one call: row r is
    shifted by r·C with C above the spread of v, so no block pools across two rows.

    scipy's PAVA, called directly: scikit-learn's `isotonic_regression` is this same call behind
    argument validation that cost about ten times the fit itself here (a bootstrap of the
    bivariate fit calls this tens of thousands of times on small, already checked arrays)."""
    rows = v.shape[0]
    shift = float(np.ptp(v)) + 1.0
    offsets = (np.arange(rows, dtype=np.float64) * shift)[:, None]
    flat = scipy_isotonic((v + offsets).ravel(), weights=w.ravel(), increasing=True).x
    return flat.reshape(v.shape) - offsets


def bivariate_isotonic(y: np.ndarray, w: np.ndarray, *, tol: float = TOLERANCE,
                       max_iter: int = MAX_ITERATIONS) -> np.ndarray:
    """The weighted least-squares fit to y[i, j] that is non-decreasing in i (progress) and in
    j (budget), with positive weights w: Dykstra's cyclic projection between the two orders.

    Stops when an iteration moves no value by more than `tol` (relative to the spread of y) and
    the result violates neither order by more than that; CurveError if it does not converge.
    """
    y = np.asarray(y, dtype=np.float64)
    w = np.asarray(w, dtype=np.float64)
    if y.ndim != 2 or y.shape != w.shape or y.size == 0:
        raise CurveError(f"a bivariate fit needs equal, non-empty 2-D values and weights (got {y.shape}, {w.shape})")
    if not (np.all(np.isfinite(y)) and np.all(np.isfinite(w)) and np.all(w > 0)):
        raise CurveError("a bivariate fit needs finite values and positive finite weights")
    scale = max(1.0, float(np.ptp(y)))
    eps = tol * scale
    x = y.copy()
    p = np.zeros_like(y)
    q = np.zeros_like(y)
    for _ in range(max_iter):
        # Progress order: each budget level (a column) non-decreasing down the rows.
        a = _rowwise_isotonic((x + p).T, w.T).T
        p = x + p - a
        # Budget order: each progress value (a row) non-decreasing along the levels.
        b = _rowwise_isotonic(a + q, w)
        q = a + q - b
        moved = float(np.max(np.abs(b - x)))
        x = b
        if moved <= eps and float(np.min(np.diff(x, axis=0), initial=0.0)) >= -eps:
            return x
    raise CurveError(f"the bivariate isotonic fit did not converge in {max_iter} iterations")


# -- the grid of checkpoints × budget levels -----------------------------------------------------
@dataclass(frozen=True)
class BudgetGrid:
    """Labels arranged as checkpoints × budget levels (rows in the order given)."""

    checkpoints: list[str]
    families: list[str | None]
    x: np.ndarray            # [m] the checkpoint's value on the axis
    levels: np.ndarray       # [L] ascending
    y: np.ndarray            # [m, L]
    w: np.ndarray            # [m, L]
    labels: list[list[Label]]  # [m][L]

    def subset(self, rows: Sequence[int] | np.ndarray) -> "BudgetGrid":
        idx = np.asarray(rows, dtype=np.intp)
        return BudgetGrid([self.checkpoints[i] for i in idx], [self.families[i] for i in idx],
                          self.x[idx], self.levels, self.y[idx], self.w[idx], [self.labels[i] for i in idx])


def budget_grid(labels: Sequence[Label], predictor: Axis) -> BudgetGrid:
    """Arrange labels (one task and metric) into the complete checkpoint × budget grid; a
    missing or repeated (checkpoint, budget) pair, or a checkpoint whose axis value differs
    between its rows, is refused naming it."""
    if any(label.budget is None for label in labels):
        raise LabelError("every row of a budget curve needs a budget value")
    levels = np.array(sorted({float(label.budget) for label in labels}), dtype=np.float64)  # type: ignore[arg-type]
    if len(levels) < 2:
        raise LabelError(f"the budget column has one level ({levels[0]:g}); a budget curve needs at least two",
                         hint="fit without --budget-column")
    row_weights, _ = label_weights([label.value for label in labels], [label.n for label in labels],
                                   [label.stderr for label in labels])
    weights = dict(zip((id(label) for label in labels), row_weights))
    order: list[str] = []
    cells: dict[str, dict[float, Label]] = {}
    for label in labels:
        row = cells.setdefault(label.checkpoint, {})
        if label.checkpoint not in order:
            order.append(label.checkpoint)
        if float(label.budget) in row:  # type: ignore[arg-type]
            raise LabelError(f"checkpoint {label.checkpoint!r} is listed twice at budget {label.budget:g}",
                             hint="keep one row per checkpoint and budget")
        row[float(label.budget)] = label  # type: ignore[arg-type]
    missing = [f"{c}@{b:g}" for c in order for b in levels if b not in cells[c]]
    if missing:
        raise LabelError(f"the budget grid is incomplete: no row for {', '.join(missing[:5])}"
                         + (f" and {len(missing) - 5} more" if len(missing) > 5 else ""),
                         hint="label every checkpoint at every budget level, or drop the checkpoint")
    xs, fams, grid_labels = [], [], []
    for c in order:
        row_labels = [cells[c][b] for b in levels]
        vals = {getattr(label, predictor.column) for label in row_labels}
        if len(vals) != 1:
            raise LabelError(f"checkpoint {c!r} has different {predictor.label} values across its budget rows",
                             hint="a checkpoint has one position on the axis; fix the rows")
        x = predictor.values(row_labels[:1])
        if x is None:
            raise LabelError(f"checkpoint {c!r}: no finite {predictor.label}",
                             hint=f"every row needs a {predictor.name} value")
        xs.append(float(x[0]))
        fams.append(row_labels[0].family)
        grid_labels.append(row_labels)
    y = np.array([[label.value for label in row] for row in grid_labels], dtype=np.float64)
    w = np.array([[weights[id(label)] for label in row] for row in grid_labels], dtype=np.float64)
    return BudgetGrid(order, fams, np.asarray(xs, dtype=np.float64), levels, y, w, grid_labels)


def _merged(t: np.ndarray, y: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows sorted by t, rows of equal t pooled into their weighted mean at each level (equal
    progress must get equal fitted values)."""
    order = np.argsort(t, kind="stable")
    t, y, w = t[order], y[order], w[order]
    starts = np.flatnonzero(np.r_[True, np.diff(t) != 0])
    wsum = np.add.reduceat(w, starts, axis=0)
    return t[starts], np.add.reduceat(w * y, starts, axis=0) / wsum, wsum


def fit_grid(t: np.ndarray, y: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(distinct t, pooled values, pooled weights, fitted) of the bivariate fit, t ascending."""
    tu, yu, wu = _merged(t, y, w)
    return tu, yu, wu, bivariate_isotonic(yu, wu)


def _slice_predict(tu: np.ndarray, fitted: np.ndarray, t_new: np.ndarray) -> np.ndarray:
    """One level's curve at t_new: its fitted values at the distinct progress values, linearly
    interpolated (flat beyond). Every level is drawn through the same points, so a curve
    ordered at the points (the budget order) stays ordered between them."""
    return np.interp(t_new, tu, fitted)


def _bootstrap(tu: np.ndarray, yu: np.ndarray, wu: np.ndarray, grid_t: np.ndarray, level: float,
               resamples: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Refit the bivariate curve on bootstrap resamples of the checkpoints (all budget levels
    of a checkpoint together). Returns curves [L, resamples, grid] and crossings [L, resamples]
    in t (NaN: never reaches the level)."""
    m, n_levels = yu.shape
    curves = np.empty((n_levels, resamples, len(grid_t)))
    crossings = np.empty((n_levels, resamples))
    draws = rng.multinomial(m, np.full(m, 1.0 / m), size=resamples)
    for b in range(resamples):
        keep = np.flatnonzero(draws[b])
        wb = wu[keep] * draws[b][keep][:, None]
        fitted = bivariate_isotonic(yu[keep], wb)
        for j in range(n_levels):
            kt, ky = tu[keep], fitted[:, j]
            curves[j, b] = np.interp(grid_t, kt, ky)
            crossings[j, b] = grid_t[0] if ky[0] >= level else first_reach(kt, ky, level)
    return curves, crossings


# -- leave one family out -------------------------------------------------------------------------
def budget_lofo(grid: BudgetGrid, predictor: Axis, *, level: float) -> list[BudgetLofoRow] | None:
    """Held-out error of three uses of the budget, each family predicted by a fit on the others:
    `bivariate` (monotone in axis and budget), `per_level` (a one-axis isotonic curve per budget
    level) and `pooled` (one curve, the budget ignored). RMSE over held-out (checkpoint, budget)
    cells; crossing error: the share of them put on the wrong side of b + ε. None with fewer
    than two families or a row without one."""
    families = sorted({f for f in grid.families if f is not None})
    if len(families) < 2 or any(f is None for f in grid.families):
        return None
    sign = -1.0 if predictor.lower_is_progress else 1.0
    t_all = sign * grid.x
    errors: dict[str, list[np.ndarray]] = {"bivariate": [], "per_level": [], "pooled": []}
    observed: list[np.ndarray] = []
    folds = 0
    for family in families:
        held = np.array([f == family for f in grid.families])
        train = ~held
        if len(np.unique(t_all[train])) < 2:
            continue
        folds += 1
        th, yh = t_all[held], grid.y[held]
        tu, yu, wu, fitted = fit_grid(t_all[train], grid.y[train], grid.w[train])
        preds = {"bivariate": np.stack([_slice_predict(tu, fitted[:, j], th)
                                        for j in range(len(grid.levels))], axis=1)}
        per_level = []
        for j in range(len(grid.levels)):
            one = isotonic_regression(yu[:, j], sample_weight=wu[:, j], increasing=True)
            per_level.append(_slice_predict(tu, one, th))
        preds["per_level"] = np.stack(per_level, axis=1)
        tp = np.repeat(tu, len(grid.levels))
        order = np.argsort(tp, kind="stable")
        tpu, ypu, wpu = _merged(tp[order], yu.ravel()[order][:, None], wu.ravel()[order][:, None])
        pooled = isotonic_regression(ypu[:, 0], sample_weight=wpu[:, 0], increasing=True)
        preds["pooled"] = np.repeat(_slice_predict(tpu, pooled, th)[:, None], len(grid.levels), axis=1)
        for name, pred in preds.items():
            errors[name].append(pred.ravel())
        observed.append(yh.ravel())
    if folds < 2:
        return None
    obs = np.concatenate(observed)
    rows = []
    for name in ("bivariate", "per_level", "pooled"):
        pred = np.concatenate(errors[name])
        rows.append(BudgetLofoRow(model=name, rmse=float(np.sqrt(np.mean((pred - obs) ** 2))),  # type: ignore[arg-type]
                                  crossing_error=float(np.mean((pred >= level) != (obs >= level))),
                                  n_heldout=int(obs.size), n_folds=folds))
    return rows


# -- the artifact -------------------------------------------------------------------------------
def _grid_to_fit(labels: Sequence[Label], *, task: str, metric: str | None,
                 predictor: Axis) -> tuple[list[Label], str, BudgetGrid]:
    """The labels of `task` and `metric` on the budget grid a curve can be fitted to (higher is
    better, every row finite at every level, at least 3 checkpoints, not all at one value)."""
    from monitor.curves.fit import LOWER_IS_BETTER, _check_rows

    chosen, metric = select_labels(labels, task=task, metric=metric)
    if metric in LOWER_IS_BETTER:
        raise CurveError(f"metric {metric!r} is lower-is-better; curves model a rise above the baseline")
    grid = budget_grid(chosen, predictor)
    for j in range(len(grid.levels)):
        _check_rows([row[j] for row in grid.labels], predictor)
    if len(grid.checkpoints) < 3:
        raise LabelError(f"task {task!r}, metric {metric!r}: {len(grid.checkpoints)} checkpoint(s); "
                         "a curve needs at least 3")
    if float(np.ptp(grid.y)) == 0.0:
        raise CurveError(f"task {task!r}, metric {metric!r}: performance is constant; there is no curve to fit")
    return chosen, metric, grid


def _level_curve(grid: BudgetGrid, j: int, fit: Any, crossing: dict[str, Any], lower: np.ndarray,
                 upper: np.ndarray, *, progress: np.ndarray, baseline: float, margin: float, predictor: Axis,
                 proportion: bool) -> BudgetLevelCurve:
    """The curve of budget level `j`: its fit with the band ordered in the budget (`lower`,
    `upper`) and the threshold interval read from that band (`crossing`), its logistic
    cross-check and its emergence score."""
    threshold = {**fit.threshold, "lower": crossing["lower"], "upper": crossing["upper"]}
    logistic = fit_logistic(grid.x, grid.y[:, j], grid.w[:, j], floor=baseline, margin=margin,
                            predictor=predictor, proportion=proportion)
    score = emergence_score(grid.y[progress, j])
    return BudgetLevelCurve(
        budget=float(grid.levels[j]), n_checkpoints=len(grid.checkpoints),
        x_range=(float(grid.x.min()), float(grid.x.max())),
        knots=Knots(x=fit.knots_x.tolist(), y=fit.knots_y.tolist()),
        band=Band(x=fit.grid_x.tolist(), fit=fit.grid_fit.tolist(), lower=lower.tolist(), upper=upper.tolist()),
        threshold=Threshold(**threshold), logistic=LogisticCheck(**logistic),
        emergence_score=score if math.isfinite(score) else None)


def fit_budget_curve(labels: Sequence[Label], *, task: str, metric: str | None = None, baseline: float,
                     margin: float, budget_column: str, confidence: float = 0.9, resamples: int = 1000,
                     seed: int = 0, corpus_sha256: str | None = None, scoring_spec: ScoringRef | None = None,
                     axis: str = "lstar", lofo: bool = True, grid_size: int = 101,
                     now: datetime | None = None) -> CurveArtifact:
    """Fit a curve monotone in `axis` and the labels' budget, and return its artifact.

    The artifact's top-level knots, band and threshold are those of the lowest budget level;
    it predicts only through `at_budget` at one of its levels.
    """
    from monitor.curves.fit import check_band_settings, training_data_sha256

    check_band_settings(confidence=confidence, margin=margin, resamples=resamples)
    if axis not in AXES:
        raise CurveError(f"unknown axis {axis!r}", hint=f"choose from {', '.join(AXES)}")
    pred = AXES[axis]
    chosen, metric, grid = _grid_to_fit(labels, task=task, metric=metric, predictor=pred)
    sign = -1.0 if pred.lower_is_progress else 1.0
    tu, yu, wu, fitted = fit_grid(sign * grid.x, grid.y, grid.w)
    if len(tu) < 3:
        raise LabelError(f"a curve needs at least 3 distinct {pred.label} values (got {len(tu)})")
    _, known = label_weights([label.value for label in chosen], [label.n for label in chosen],
                             [label.stderr for label in chosen])
    proportion = bool(np.all((grid.y >= 0) & (grid.y <= 1)))
    level = baseline + margin
    grid_t = np.linspace(tu[0], tu[-1], grid_size)
    curves, crossings = _bootstrap(tu, yu, wu, grid_t, level, resamples, np.random.default_rng(seed))
    progress = np.argsort(sign * grid.x, kind="stable")
    fits = [monotone_fit_from(tu, yu[:, j], wu[:, j], fitted[:, j], curves[j], crossings[j], grid_t,
                              x=grid.x, sign=sign, predictor=pred, level=level, confidence=confidence,
                              known_variance=known, bounds=(0.0, 1.0) if proportion else None, centred=False)
            for j in range(len(grid.levels))]
    # Each level's band is widened to be ordered in the budget too, as it is along the axis: a
    # level's lower edge is the smallest of its own and every higher level's, its upper edge the
    # largest of its own and every lower level's; then each threshold interval is read again
    # from the widened band (the estimate stays: the fitted curves are already ordered).
    lowers = np.minimum.accumulate(np.array([f.lower for f in fits])[::-1], axis=0)[::-1]
    uppers = np.maximum.accumulate(np.array([f.upper for f in fits]), axis=0)
    order = np.argsort(sign * fits[0].grid_x)   # the band in progress order
    level_curves = []
    for j, budget in enumerate(grid.levels):
        crossing = threshold_crossing(level, sign=sign, t_first=float(tu[0]), knots_t=tu, knots_y=fitted[:, j],
                                      grid_t=(sign * fits[j].grid_x)[order], lower=lowers[j][order],
                                      upper=uppers[j][order])
        level_curves.append(_level_curve(grid, j, fits[j], crossing, lowers[j], uppers[j], progress=progress,
                                         baseline=baseline, margin=margin, predictor=pred, proportion=proportion))
    dispersions = [fit.dispersion for fit in fits]
    info = BudgetInfo(column=budget_column, levels=[float(v) for v in grid.levels], curves=level_curves,
                      method=METHOD, lofo=budget_lofo(grid, pred, level=level) if lofo else None)
    first = level_curves[0]
    warnings = []
    if corpus_sha256 is None or scoring_spec is None:
        warnings.append("the curve is not pinned to a corpus and scoring spec; predictions for "
                        "stored score runs will be refused (fit with --corpus-sha and --spec)")
    weights = {id(label): float(w) for row, wrow in zip(grid.labels, grid.w) for label, w in zip(row, wrow)}
    now = now or datetime.now(timezone.utc)
    body = dict(
        schema=SCHEMA, curve_id="", created_at=now, task=task, metric=metric, axis=axis,
        direction=pred.direction, baseline=baseline, margin=margin, confidence=confidence,
        corpus_sha256=corpus_sha256, scoring_spec=scoring_spec,
        training_data_sha256=training_data_sha256(chosen), n_checkpoints=len(grid.checkpoints),
        families=sorted({f for f in grid.families if f is not None}), x_range=first.x_range,
        knots=first.knots, band=first.band, threshold=first.threshold,
        bootstrap=BootstrapInfo(resamples=resamples, seed=seed, method=METHOD,
                                dispersion=max(dispersions), n_blocks=len(first.knots.x)),
        logistic=first.logistic, emergence_score=first.emergence_score, emergence_by_family={},
        lofo=None,
        points=[CurvePoint(checkpoint=label.checkpoint, family=label.family, x=float(x), value=label.value,
                           weight=weights[id(label)], imported=axis in label.imported, budget=label.budget)
                for row, x in zip(grid.labels, grid.x) for label in row],
        warnings=warnings, budget=info)
    draft = CurveArtifact.model_validate(body)
    return draft.model_copy(update={"curve_id": draft.content_id()})
