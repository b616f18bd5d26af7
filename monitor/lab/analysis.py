"""Which progress axis transfers a task threshold to a family it has not seen?

From a lab record (`monitor.lab.records`): for every task metric, fit the task curve on each
x-axis (L*, raw CE, bits/byte, L_rel, L_gain, bits/byte minus the unigram's, and bytes seen
as a reference that ignores the model's loss), validate each leave-one-family-out with the
same code as `lstar curves validate` (`monitor.curves.validation.lofo_axes`), and put a
bootstrap interval on the difference of each axis's held-out error against L*.

The interval resamples held-out checkpoints within each family (stratified, paired across
axes: every axis is scored on the same resampled checkpoints). It says how much the
comparison depends on which checkpoints were measured; it does not refit the curves and does
not resample families, so it does not cover family-to-family variation. A positive
difference means the axis erred more than L*.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from monitor.curves.axis_choice import finite_json as _finite
from monitor.curves.stats import Predictor, fit_monotone, label_weights
from monitor.curves.validation import lofo_axes
from monitor.errors import CurveError, LabelError, LabError
from monitor.lab.records import CheckpointRecord, LabRecord

# The axes raced against each other, in table order: (column, label, lower is progress).
AXES: dict[str, Predictor] = {
    "lstar": Predictor("lstar", "L*", "lstar", lower_is_progress=True),
    "ce": Predictor("ce", "raw CE", "ce", lower_is_progress=True),
    "bits_per_byte": Predictor("bits_per_byte", "bits/byte", "bits_per_byte", lower_is_progress=True),
    "l_rel": Predictor("l_rel", "L_rel", "l_rel", lower_is_progress=True),
    "l_gain": Predictor("l_gain", "L_gain", "l_gain", lower_is_progress=False),
    "bpb_minus_unigram": Predictor("bpb_minus_unigram", "bits/byte − unigram bits/byte", "bpb_minus_unigram",
                                   lower_is_progress=True),
    # Not a loss: how far training got. Same byte stream and budget for every family.
    "bytes_seen": Predictor("bytes_seen", "bytes seen", "bytes_seen", lower_is_progress=False),
}
REFERENCE = "lstar"
# Task metrics a curve can be fitted on (higher is better); Brier is kept as a number only.
CURVE_METRICS = ("acc", "prob_correct", "exact_match")
ERRORS = ("rmse", "crossing_error", "brier")
MAX_CHECKPOINTS = 100_000
_BOOT_CHUNK = 200   # resamples per batch: bounds the [resamples, checkpoints] weight matrix


@dataclass(frozen=True)
class AnalysisConfig:
    """Knobs of the analysis (all recorded in the report)."""

    margin: float = 0.1            # ε above the task's baseline
    confidence: float = 0.9        # curve bands
    lofo_resamples: int = 200      # bootstrap resamples per LOFO fit
    curve_resamples: int = 1000    # bootstrap resamples of the full-data curves
    diff_resamples: int = 2000     # bootstrap resamples of the LOFO differences
    interval: float = 0.95         # level of the difference intervals
    seed: int = 0

    def check(self) -> None:
        if not 0.0 < self.margin < 1.0:
            raise CurveError(f"the margin ε must lie in (0, 1), got {self.margin}")
        if not 0.0 < self.confidence < 1.0 or not 0.0 < self.interval < 1.0:
            raise CurveError("confidence and interval must lie in (0, 1)")
        if self.lofo_resamples < 50 or self.curve_resamples < 50:
            raise CurveError("use at least 50 bootstrap resamples for the curves")
        if self.diff_resamples < 1000:
            raise CurveError(f"use at least 1000 resamples for the difference intervals (got {self.diff_resamples})")


def axis_values(checkpoints: Sequence[CheckpointRecord], axis: str) -> np.ndarray:
    """The x-axis value of each checkpoint."""
    if axis == "bytes_seen":
        return np.array([c.bytes_seen for c in checkpoints], dtype=np.float64)
    return np.array([getattr(c.metrics, axis) for c in checkpoints], dtype=np.float64)


def metric_baseline(metric: str, task_baseline: float) -> float:
    """Chance level of a metric: the multiple-choice baseline, or 0 for exact match."""
    return 0.0 if metric == "exact_match" else task_baseline


def _strata(families: Sequence[str], index: np.ndarray) -> list[np.ndarray]:
    fam = np.asarray(families, dtype=object)[index]
    return [np.flatnonzero(fam == f) for f in sorted(set(fam.tolist()))]


def _boot_weights(strata: list[np.ndarray], n: int, resamples: int, rng: np.random.Generator) -> np.ndarray:
    """[resamples, n] counts: each stratum resampled with replacement to its own size."""
    w = np.zeros((resamples, n))
    for rows in strata:
        draws = rng.multinomial(len(rows), np.full(len(rows), 1.0 / len(rows)), size=resamples)
        w[:, rows] = draws
    return w


def _errors(w: np.ndarray, pts: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    total = w.sum(axis=1)
    return {"rmse": np.sqrt(w @ pts["sq_error"] / total), "crossing_error": w @ pts["wrong"] / total,
            "brier": w @ pts["brier"] / total}


def difference_intervals(points: dict[str, dict[str, np.ndarray]], families: Sequence[str], *,
                         reference: str = REFERENCE, resamples: int = 2000, level: float = 0.95,
                         seed: int = 0) -> dict[str, dict[str, dict[str, Any]]]:
    """Paired, stratified bootstrap of (axis error − reference error) for every axis and error.

    Only checkpoints held out on both axes enter a comparison. Returns, per axis and error:
    the observed difference, the bootstrap mean, the percentile interval and a verdict
    (`reference_better`, `axis_better` or `no_clear_difference`: the interval covers 0).
    """
    if reference not in points:
        return {}
    out: dict[str, dict[str, dict[str, Any]]] = {}
    alpha = (1.0 - level) / 2.0
    for k, (axis, pts) in enumerate(points.items()):
        if axis == reference:
            continue
        common = np.intersect1d(points[reference]["index"], pts["index"])
        if len(common) == 0:
            continue
        ref = {key: v[np.searchsorted(points[reference]["index"], common)] if key != "index" else common
               for key, v in points[reference].items()}
        ax = {key: v[np.searchsorted(pts["index"], common)] if key != "index" else common
              for key, v in pts.items()}
        strata = _strata(families, common)
        rng = np.random.default_rng([seed, k])
        diffs: dict[str, list[np.ndarray]] = {e: [] for e in ERRORS}
        done = 0
        while done < resamples:
            batch = min(_BOOT_CHUNK, resamples - done)
            w = _boot_weights(strata, len(common), batch, rng)
            er, ea = _errors(w, ref), _errors(w, ax)
            for e in ERRORS:
                diffs[e].append(ea[e] - er[e])
            done += batch
        ones = np.ones((1, len(common)))
        observed = {e: float(_errors(ones, ax)[e][0] - _errors(ones, ref)[e][0]) for e in ERRORS}
        out[axis] = {}
        for e in ERRORS:
            d = np.concatenate(diffs[e])
            lo, hi = (float(v) for v in np.quantile(d, [alpha, 1.0 - alpha]))
            verdict = ("reference_better" if lo > 0 else "axis_better" if hi < 0 else "no_clear_difference")
            out[axis][e] = {"difference": observed[e], "bootstrap_mean": float(np.mean(d)),
                            "lower": lo, "upper": hi, "level": level, "n": int(len(common)),
                            "resamples": resamples, "verdict": verdict}
    return out


def _full_fit(x: np.ndarray, y: np.ndarray, w: np.ndarray, axis: str, *, level: float, known: bool,
              cfg: AnalysisConfig) -> dict[str, Any]:
    """The curve on all checkpoints: knots, band and threshold (or why it could not be fitted)."""
    try:
        fit = fit_monotone(x, y, w, predictor=AXES[axis], level=level, confidence=cfg.confidence,
                           resamples=cfg.curve_resamples, seed=cfg.seed, known_variance=known,
                           bounds=(0.0, 1.0))
    except (LabelError, CurveError) as exc:
        return {"fitted": False, "reason": exc.message}
    return {"fitted": True, "threshold": fit.threshold, "n_blocks": fit.n_blocks, "dispersion": fit.dispersion,
            "knots": {"x": fit.knots_x.tolist(), "y": fit.knots_y.tolist()},
            "band": {"x": fit.grid_x.tolist(), "fit": fit.grid_fit.tolist(), "lower": fit.lower.tolist(),
                     "upper": fit.upper.tolist()}}


def best_axis(rows: Sequence[dict[str, Any]], error: str = "rmse") -> str | None:
    """The axis with the smallest held-out error (ties: table order)."""
    ranked = [r for r in rows if r.get(error) is not None and math.isfinite(r[error])]
    return min(ranked, key=lambda r: r[error])["predictor"] if ranked else None


def analyse_metric(lab: LabRecord, task: str, metric: str, cfg: AnalysisConfig) -> dict[str, Any]:
    """Curves, LOFO table and difference intervals of one task metric."""
    chosen = [c for c in lab.checkpoints if task in c.tasks
              and getattr(c.tasks[task], metric) is not None]
    results = [c.tasks[task] for c in chosen]
    baselines = {metric_baseline(metric, r.baseline) for r in results}
    if len(baselines) != 1:
        raise LabError(f"task {task!r}: checkpoints disagree on the baseline ({sorted(baselines)})",
                         hint="every checkpoint of a task must be labelled on the same items")
    baseline = baselines.pop()
    level = baseline + cfg.margin
    values = np.array([getattr(r, metric) for r in results], dtype=np.float64)
    n = [r.n for r in results]
    families = [c.family for c in chosen]
    base = {"task": task, "metric": metric, "baseline": baseline, "margin": cfg.margin, "level": level,
            "n_checkpoints": len(chosen), "families": sorted(set(families))}
    if len(chosen) < 3 or float(np.ptp(values)) == 0.0:
        return {**base, "skipped": f"{len(chosen)} checkpoint(s), values {'constant' if len(chosen) else 'none'}"}
    weights, known = label_weights(values, n)
    curves = {axis: _full_fit(axis_values(chosen, axis), values, weights, axis, level=level, known=known, cfg=cfg)
              for axis in AXES}
    if len(set(families)) < 2:
        return {**base, "curves": curves, "lofo": None, "skipped": "LOFO needs at least 2 families"}
    lofo = lofo_axes(values, families, {a: (p, axis_values(chosen, a)) for a, p in AXES.items()},
                     baseline=baseline, margin=cfg.margin, n=n, confidence=cfg.confidence,
                     resamples=cfg.lofo_resamples, seed=cfg.seed)
    rows = [r.model_dump() for r in lofo.rows]
    diffs = difference_intervals(lofo.points, families, resamples=cfg.diff_resamples, level=cfg.interval,
                                 seed=cfg.seed)
    return {**base, "curves": curves,
            "lofo": {"rows": rows, "per_family": lofo.per_family, "skipped": lofo.skipped,
                     "best": {e: best_axis(rows, e) for e in ERRORS}},
            "differences": diffs}


def family_summary(lab: LabRecord) -> list[dict[str, Any]]:
    """Per family: tokenizer, vocabulary, checkpoints and seeds, and the metrics of the most
    trained checkpoints (mean over seeds at the largest bytes seen that every seed reached)."""
    out = []
    for fam in lab.families:
        cps = [c for c in lab.checkpoints if c.family == fam.family]
        seeds = sorted({c.seed for c in cps})
        last = min((max(c.bytes_seen for c in cps if c.seed == s) for s in seeds), default=None)
        final = [c for c in cps if c.bytes_seen == last]
        mean = (lambda key: float(np.mean([getattr(c.metrics, key) for c in final])) if final else None)
        out.append({"family": fam.family, "tokenizer": fam.tokenizer, "vocab_used": fam.vocab_used,
                    "checkpoints": len(cps), "seeds": seeds, "final_bytes_seen": last,
                    **{f"final_{k}": mean(k) for k in ("lstar", "ce", "ce_uni", "bits_per_byte",
                                                      "unigram_bits_per_byte", "bpb_minus_unigram")}})
    return out


def analyse(lab: LabRecord, cfg: AnalysisConfig | None = None) -> dict[str, Any]:
    """Every number of the lab analysis, JSON-ready (no NaN: missing numbers are None)."""
    cfg = cfg or AnalysisConfig()
    cfg.check()
    if not lab.checkpoints:
        raise LabError("the lab record has no checkpoints", hint="run the lab (lstar lab train) first")
    if len(lab.checkpoints) > MAX_CHECKPOINTS:
        raise LabError(f"the lab record has {len(lab.checkpoints)} checkpoints; the analysis takes at most "
                         f"{MAX_CHECKPOINTS}", hint="analyse a subset of the run")
    tasks = sorted({t for c in lab.checkpoints for t in c.tasks})
    metrics = []
    for task in tasks:
        for metric in CURVE_METRICS:
            if any(task in c.tasks and getattr(c.tasks[task], metric) is not None for c in lab.checkpoints):
                metrics.append(analyse_metric(lab, task, metric, cfg))
    return _finite({"schema": "lstar-lab-report/1", "lab_schema": lab.schema_,
                    "analysis_config": cfg.__dict__, "reference_axis": REFERENCE,
                    "axes": {a: {"label": p.label, "lower_is_progress": p.lower_is_progress} for a, p in AXES.items()},
                    "families": family_summary(lab), "n_checkpoints": len(lab.checkpoints),
                    "tasks": tasks, "analyses": metrics,
                    "checkpoints": [c.model_dump(mode="json") for c in lab.checkpoints]})
