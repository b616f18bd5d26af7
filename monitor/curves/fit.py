"""Fit a task curve from labelled checkpoints and package it as a `lstar-curve/2` artifact, on
any progress axis (monitor.curves.axes).

`fit_curve` checks the rows (enough distinct checkpoints, finite values, no duplicates, a
metric where higher is better), fits the curve of the chosen family with its band and threshold
(the centred isotonic curve, `monitor.curves.stats`; the sigmoid, `monitor.curves.parametric`;
or the one forward validation picks, `monitor.curves.forward`), adds the logistic check, the
emergence score, resolution warnings (the warnings that need the labels;
`monitor.curves.artifact.curve_warnings` derives the others from the artifact) and, with two
or more families, the leave-one-family-out table (`monitor.curves.validation`), and
returns the validated artifact (`monitor.curves.artifact`) named by its content hash.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

import numpy as np

from monitor.curves.artifact import (SCHEMA, Band, BootstrapInfo, CurveArtifact, CurvePoint, Knots,
                                     LofoSummary, LogisticCheck, ScoringRef, SigmoidInfo, Threshold)
from monitor.curves.labels import Label, select_labels
from monitor.curves.axes import AXES, Axis
from monitor.curves.stats import fit_logistic, fit_monotone, label_weights, logistic_value
from monitor.curves.validation import emergence_score, lofo_validate, resolution_warnings
from monitor.errors import CurveError, LabelError

# Metrics where a lower value is better cannot be fitted as "rising above the baseline".
LOWER_IS_BETTER = frozenset({"brier", "perplexity", "word_perplexity", "byte_perplexity",
                             "bits_per_byte", "ter", "loss", "nll"})


def training_data_sha256(labels: Sequence[Label]) -> str:
    """sha256 of the canonical label rows a curve was fitted on (order-independent)."""
    keys = ("checkpoint", "family", "task", "metric", "value", "n", "stderr", "lstar",
            "lstar_se", "raw_ce", "params", "flops", "repo", "sha")
    # The fields added with the other axes enter only where set, so a curve fitted on the same
    # rows as before keeps its training-data hash.
    extra = ("bits_per_byte", "lstar_per_byte", "l_rel", "l_gain", "axis_se", "imported", "budget")

    def row(label: Label) -> str:
        data = {k: getattr(label, k) for k in keys}
        data.update({k: getattr(label, k) for k in extra if getattr(label, k)})
        if label.budget is not None:  # budget 0 (e.g. chain of thought off) is a level too
            data["budget"] = label.budget
        return json.dumps(data, sort_keys=True, separators=(",", ":"))

    rows = sorted(row(label) for label in labels)
    return hashlib.sha256("\n".join(rows).encode("utf-8")).hexdigest()


def _check_rows(labels: Sequence[Label], predictor: Axis) -> None:
    seen: dict[str, int] = {}
    for label in labels:
        if not math.isfinite(label.value):
            raise LabelError(f"checkpoint {label.checkpoint!r}: value is {label.value} (not a number)",
                             hint="drop or fix the row")
        x = getattr(label, predictor.column)
        if x is None or not math.isfinite(x):
            raise LabelError(f"checkpoint {label.checkpoint!r}: {predictor.name} is {x} (not a number)",
                             hint=f"every row needs a finite {predictor.label}: give a {predictor.name} "
                                  "column in the labels file, or join score runs that measure it")
        if predictor.log10 and x <= 0:
            raise LabelError(f"checkpoint {label.checkpoint!r}: {predictor.column} is {x}; "
                             f"{predictor.label} needs a positive count")
        key = label.checkpoint
        seen[key] = seen.get(key, 0) + 1
    dupes = sorted(k for k, v in seen.items() if v > 1)
    if dupes:
        raise LabelError(f"checkpoint(s) listed more than once for this task and metric: {', '.join(dupes[:5])}",
                         hint="keep one row per checkpoint")


def check_band_settings(*, confidence: float, margin: float, resamples: int) -> None:
    """What every curve fit (by axis, or by axis and budget) needs of its band settings."""
    if not 0.0 < confidence < 1.0:
        raise CurveError(f"confidence must lie in (0, 1), got {confidence}")
    if not margin > 0.0:
        raise CurveError(f"the margin ε must be positive, got {margin}")
    if resamples < 50:
        raise CurveError(f"use at least 50 bootstrap resamples (got {resamples})")


def _checked_settings(*, confidence: float, margin: float, resamples: int, axis: str | None,
                      predictor: str | None, family: str, widening: float | None, spread: float | None,
                      choice: dict | None) -> str:
    """The axis `fit_curve` fits on, once every setting it was given is checked (one CurveError
    naming the first bad one)."""
    check_band_settings(confidence=confidence, margin=margin, resamples=resamples)
    if axis is not None and predictor is not None and axis != predictor:
        raise CurveError(f"axis {axis!r} and predictor {predictor!r} differ; give one")
    predictor = axis or predictor or "lstar"
    if family not in ("isotonic", "sigmoid", "auto"):
        raise CurveError(f"unknown fit family {family!r}", hint="choose isotonic, sigmoid or auto")
    for name, v in (("extrapolation widening", widening), ("lineage spread", spread)):
        if v is not None and not (math.isfinite(v) and v >= 0.0):
            raise CurveError(f"the {name} must be a finite number ≥ 0, got {v}")
    if predictor not in AXES:
        raise CurveError(f"unknown axis {predictor!r}", hint=f"choose from {', '.join(AXES)}")
    if choice is not None and (choice.get("axis") != predictor or choice.get("family") != family):
        raise CurveError(f"the recorded choice is {choice.get('family')} on {choice.get('axis')}, "
                         f"but the fit is {family} on {predictor}", hint="fit the chosen pair")
    return predictor


def _fit_band(fit_family: str, x: np.ndarray, values: np.ndarray, weights: np.ndarray, *, known_variance: Any,
              predictor: Axis, level: float, confidence: float, resamples: int, seed: int, grid_size: int,
              proportion: bool) -> tuple[Any, BootstrapInfo, SigmoidInfo | None]:
    """The fitted curve and its band for one fit family (the sigmoid refitted per bootstrap
    resample, else the monotone fit widened to its block interval), with how the band was made."""
    if fit_family == "sigmoid":
        from monitor.curves.parametric import EXTRAPOLATION_SPAN, fit_sigmoid_band

        fit = fit_sigmoid_band(x, values, weights, predictor=predictor, level=level, confidence=confidence,
                               resamples=resamples, seed=seed, grid_size=grid_size, proportion=proportion)
        sigmoid = SigmoidInfo(**fit.params.as_dict(), dispersion=fit.dispersion, extend=EXTRAPOLATION_SPAN,
                              failed_resamples=fit.failed_resamples)
        bootstrap = BootstrapInfo(resamples=resamples, seed=seed,
                                  method="checkpoint bootstrap percentile of sigmoid refits",
                                  dispersion=fit.dispersion, n_blocks=0)
        return fit, bootstrap, sigmoid
    fit = fit_monotone(x, values, weights, predictor=predictor, level=level, confidence=confidence,
                       resamples=resamples, seed=seed, grid_size=grid_size, known_variance=known_variance,
                       bounds=(0.0, 1.0) if proportion else None)
    bootstrap = BootstrapInfo(resamples=resamples, seed=seed,
                              method="checkpoint bootstrap percentile, widened to the block interval",
                              dispersion=fit.dispersion, n_blocks=fit.n_blocks)
    return fit, bootstrap, None


def _emergence(chosen: Sequence[Label], values: np.ndarray, x: np.ndarray, predictor: Axis,
               families: list[str]) -> tuple[float, dict[str, float | None]]:
    """The emergence score of all checkpoints in progress order along the axis, and each
    family's along its own checkpoints (families with fewer than 3 left out; a non-finite score
    is None)."""
    progress = np.argsort(-x if predictor.lower_is_progress else x, kind="stable")
    by_family: dict[str, float | None] = {}
    for family in families:
        idx = [i for i in progress if chosen[i].family == family]
        if len(idx) >= 3:
            v = emergence_score(values[idx])
            by_family[family] = v if math.isfinite(v) else None
    return emergence_score(values[progress]), by_family


def _rows_to_fit(labels: Sequence[Label], *, task: str, metric: str | None,
                 predictor: Axis) -> tuple[list[Label], str, np.ndarray]:
    """The labels of `task` and `metric` a curve can be fitted to (higher is better, every row
    finite, at least 3 checkpoints, not all at one value), the metric chosen, and their values."""
    chosen, metric = select_labels(labels, task=task, metric=metric)
    if metric in LOWER_IS_BETTER:
        raise CurveError(f"metric {metric!r} is lower-is-better; curves model a rise above the baseline",
                         hint="fit accuracy or the probability of the correct option instead")
    _check_rows(chosen, predictor)
    if len(chosen) < 3:
        raise LabelError(f"task {task!r}, metric {metric!r}: {len(chosen)} checkpoint(s); a curve needs at least 3")
    values = np.array([label.value for label in chosen], dtype=np.float64)
    if float(np.ptp(values)) == 0.0:
        raise CurveError(f"task {task!r}, metric {metric!r}: performance is constant ({values[0]:g}) "
                         f"over all {len(values)} checkpoints; there is no curve to fit",
                         hint="add checkpoints that span the transition, or choose another metric")
    return chosen, metric, values


def _logistic_check(x: np.ndarray, values: np.ndarray, weights: np.ndarray, fit: Any, *, baseline: float,
                    margin: float, predictor: Axis, proportion: bool) -> dict:
    """The logistic fitted beside the curve as a cross-check, with (when it converged) its
    largest distance from the fitted curve on the band's grid."""
    logistic = fit_logistic(x, values, weights, floor=baseline, margin=margin, predictor=predictor,
                            proportion=proportion)
    if logistic.get("converged"):
        diff = np.abs(logistic_value(logistic, fit.grid_x, floor=baseline, predictor=predictor) - fit.grid_fit)
        logistic["max_abs_difference"] = float(np.max(diff))
    return logistic


def _points(chosen: Sequence[Label], x: np.ndarray, weights: np.ndarray, *, axis: str) -> list[CurvePoint]:
    """The labelled checkpoints as the artifact lists them (x on the fitted axis, its weight, and
    whether the axis value was imported rather than measured)."""
    return [CurvePoint(checkpoint=label.checkpoint, family=label.family, x=float(xi), value=label.value,
                       weight=float(wi), imported=axis in label.imported)
            for label, xi, wi in zip(chosen, x, weights)]


def _choose_family(chosen: Sequence[Label], **settings: Any) -> dict:
    """`family="auto"`: forward validation on these labels picks the fit family
    (`monitor.curves.forward.choose_family`), whose record the artifact keeps."""
    from monitor.curves.forward import choose_family

    return choose_family(chosen, fit=fit_curve, **settings)


def _chosen_family_settings(record: dict, *, widening: float | None,
                            spread: float | None) -> tuple[str, float | None, float | None]:
    """The family forward validation chose, and the widening and spread it measured for it
    (where the caller did not set them)."""
    fit_family = record["chosen"]
    measured = record["families"][fit_family]
    return (fit_family, measured["widening"] if widening is None else widening,
            measured["spread"] if spread is None else spread)


def _lofo_summary(chosen: Sequence[Label], **settings: Any) -> LofoSummary:
    """Leave-one-family-out validation of these labels, as the artifact stores it."""
    result = lofo_validate(chosen, **settings)
    return LofoSummary(level=result.level, confidence=result.confidence, families=result.families,
                       rows=list(result.rows), skipped=result.skipped)


def fit_curve(labels: Sequence[Label], *, task: str, metric: str | None = None, baseline: float,
              margin: float, confidence: float = 0.9, resamples: int = 1000, seed: int = 0,
              corpus_sha256: str | None = None, scoring_spec: ScoringRef | None = None,
              predictor: str | None = None, lofo: bool = True, lofo_resamples: int = 200,
              grid_size: int = 101, now: datetime | None = None, axis: str | None = None,
              family: str = "isotonic", widening: float | None = None, spread: float | None = None,
              forward_resamples: int = 200, choice: dict | None = None) -> CurveArtifact:
    """Fit a task curve from labelled checkpoints on `axis` (default L*; `predictor` is the
    older name of the same argument) and return its artifact.

    `family`: isotonic (the centred isotonic curve, flat beyond its data), sigmoid (the
    four-parameter sigmoid of `monitor.curves.parametric`, whose band reaches beyond the data)
    or auto (forward validation, `monitor.curves.forward.choose_family`, picks one on these
    labels, stores its record as `family_choice` and the widening it measured). `widening`
    sets the extrapolation widening c explicitly (stored as `extrapolation_widening`), `spread`
    the spread a added to the interval everywhere (`lineage_spread`; docs/measurement.md §3a).
    `choice`: the (axis, family) choice this fit follows (`monitor.curves.axis_choice.choose_axis`'s
    `choice`), stored as it is; its axis and family must be the ones fitted.

    Rows are selected by task and metric (rows without a task/metric match any). Errors name
    what is wrong: fewer than 3 checkpoints, constant performance, a NaN, an unknown task or
    metric, a lower-is-better metric.
    """
    predictor = _checked_settings(confidence=confidence, margin=margin, resamples=resamples, axis=axis,
                                  predictor=predictor, family=family, widening=widening, spread=spread,
                                  choice=choice)
    fit_family = family
    pred = AXES[predictor]
    chosen, metric, values = _rows_to_fit(labels, task=task, metric=metric, predictor=pred)
    x = pred.values(chosen)
    assert x is not None  # _check_rows made sure
    weights, known = label_weights(values, [label.n for label in chosen], [label.stderr for label in chosen])
    proportion = bool(np.all((values >= 0) & (values <= 1)))
    level = baseline + margin
    family_choice = None
    if family == "auto":
        family_choice = _choose_family(chosen, task=task, metric=metric, baseline=baseline, margin=margin,
                                       confidence=confidence, axis=predictor, seed=seed,
                                       resamples=forward_resamples)
        fit_family, widening, spread = _chosen_family_settings(family_choice, widening=widening, spread=spread)
    fit, bootstrap, sigmoid = _fit_band(fit_family, x, values, weights, known_variance=known, predictor=pred,
                                        level=level, confidence=confidence, resamples=resamples, seed=seed,
                                        grid_size=grid_size, proportion=proportion)
    logistic = _logistic_check(x, values, weights, fit, baseline=baseline, margin=margin, predictor=pred,
                               proportion=proportion)

    families = sorted({label.family for label in chosen if label.family is not None})
    score, by_family = _emergence(chosen, values, x, pred, families)
    warnings = resolution_warnings([label.n for label in chosen], baseline=baseline, margin=margin,
                                   metric=metric)
    if corpus_sha256 is None or scoring_spec is None:
        warnings.append("the curve is not pinned to a corpus and scoring spec; predictions for "
                        "stored score runs will be refused (fit with --corpus-sha and --spec)")
    lofo_summary = None
    if lofo and len(families) >= 2 and all(label.family is not None for label in chosen):
        lofo_summary = _lofo_summary(chosen, baseline=baseline, margin=margin, confidence=confidence,
                                     resamples=lofo_resamples, seed=seed)

    now = now or datetime.now(timezone.utc)
    body = dict(
        schema=SCHEMA, curve_id="", created_at=now, task=task, metric=metric, axis=predictor,
        direction=pred.direction,
        baseline=baseline, margin=margin, confidence=confidence,
        corpus_sha256=corpus_sha256, scoring_spec=scoring_spec,
        training_data_sha256=training_data_sha256(chosen), n_checkpoints=len(chosen),
        families=families, x_range=(float(x.min()), float(x.max())),
        knots=Knots(x=fit.knots_x.tolist(), y=fit.knots_y.tolist()),
        band=Band(x=fit.grid_x.tolist(), fit=fit.grid_fit.tolist(), lower=fit.lower.tolist(),
                  upper=fit.upper.tolist()),
        threshold=Threshold(**fit.threshold),
        bootstrap=bootstrap,
        logistic=LogisticCheck(**logistic),
        emergence_score=score if math.isfinite(score) else None,
        emergence_by_family=by_family, lofo=lofo_summary,
        points=_points(chosen, x, weights, axis=predictor),
        warnings=warnings, fit_family=fit_family, sigmoid=sigmoid, extrapolation_widening=widening,
        lineage_spread=spread,
        family_choice=family_choice, choice=choice)
    draft = CurveArtifact.model_validate(body)
    return draft.model_copy(update={"curve_id": draft.content_id()})

