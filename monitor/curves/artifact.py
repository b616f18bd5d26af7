"""The task-curve artifact `lstar-curve/2`, and prediction from it (docs/measurement.md §2-§3).

A fitted curve is stored as versioned JSON holding everything needed to predict without
refitting: the knots of g, the band on a grid, the threshold with its interval, the corpus
and scoring spec the L* values were measured on, and the validation results. The schema is a
strict pydantic model; loading rejects unknown keys, another schema version, and contents
that no longer match the curve id (a content hash).

The artifact records the progress axis it is fitted on (`axis`, monitor.curves.axes);
`lstar-curve/1` files (no `axis`: their `predictor`, L* in practice) load unchanged.

`predict` turns a value on that axis (with its standard error) into P̂ = g(x), an interval and a state
(clear / at_risk / emerged), refusing a score from another corpus or scoring spec. This
module stays free of scipy and scikit-learn at import time so that policies can load and
apply curves cheaply; the fitting lives in `monitor.curves.stats` and `monitor.curves.fit`.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from monitor.bands import (extrapolation_distance, extrapolation_words, predicted_interval, threshold_crossing,
                           two_sided_z, widen_beyond)
from monitor.curves.axes import AXES, axis_value
from monitor.errors import CurveError, PolicyError
from monitor.files import FileKind, NotJsonError, read_bounded_json
from monitor.store.rows import ScoreRunRow

AXIS_LABELS = {name: axis.label for name, axis in AXES.items()}
SCHEMA = "lstar-curve/2"
# Read as L* curves: the same artifact with `predictor` for `axis` and no imported flags.
SCHEMA_V1 = "lstar-curve/1"
AxisName = Literal["lstar", "bits_per_byte", "lstar_per_byte", "l_rel", "l_gain", "raw_ce", "log_params",
                   "log_flops", "task_loss"]
# Artifacts are tens of KiB (a band on a grid, the LOFO summary); far larger is not one.
CURVE_MAX_BYTES = 16 << 20
CURVE_FILE = FileKind("curve artifact", "curve artifacts", "JSON")
_SCHEMA_FAMILY = "lstar-curve/"


# -- the artifact -------------------------------------------------------------------------------
class _Strict(BaseModel):
    # allow_inf_nan=False: every float field, nested ones included, refuses NaN and ±inf (which
    # Python's JSON reader accepts as literals), so a hostile file is refused naming the field.
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, allow_inf_nan=False)


class ScoringRef(_Strict):
    """The parts of a scoring spec that change L*: spec version, window, stride, prefix."""

    spec_version: str
    window: int = Field(gt=0)
    stride: int = Field(gt=0)
    prefix_policy: Literal["bos", "eos", "none"]

    @classmethod
    def parse(cls, text: str) -> "ScoringRef":
        """From `lstar-score/1:window=2048,stride=1024,prefix=bos` (or a JSON object)."""
        text = text.strip()
        try:
            if text.startswith("{"):
                return cls.model_validate(json.loads(text))
            version, _, rest = text.partition(":")
            fields: dict[str, Any] = {"spec_version": version.strip()}
            for part in filter(None, (p.strip() for p in rest.split(","))):
                key, eq, value = part.partition("=")
                if not eq:
                    raise ValueError(f"{part!r} is not key=value")
                key = {"prefix": "prefix_policy", "window_len": "window"}.get(key.strip(), key.strip())
                fields[key] = value.strip()
            return cls.model_validate(fields)
        except (ValueError, ValidationError) as exc:
            raise CurveError(f"cannot read the scoring spec {text!r}: {_first_error(exc)}",
                             hint="write it as lstar-score/1:window=2048,stride=1024,prefix=bos") from exc

    @classmethod
    def from_score_run(cls, run: Mapping[str, Any]) -> "ScoringRef":
        """From a `score_runs` row."""
        return cls(spec_version=str(run["spec_version"]), window=int(run["window_len"]),
                   stride=int(run["stride"]), prefix_policy=run["prefix_policy"])

    def describe(self) -> str:
        return f"{self.spec_version}:window={self.window},stride={self.stride},prefix={self.prefix_policy}"


class Knots(_Strict):
    x: list[float]
    y: list[float]

    @model_validator(mode="after")
    def _check(self) -> "Knots":
        if not self.x or len(self.x) != len(self.y):
            raise ValueError("knots need equal, non-empty x and y")
        if any(b <= a for a, b in zip(self.x, self.x[1:])):
            raise ValueError("knot x values must be strictly increasing")
        return self


class Band(_Strict):
    x: list[float]
    fit: list[float]
    lower: list[float]
    upper: list[float]

    @model_validator(mode="after")
    def _check(self) -> "Band":
        n = len(self.x)
        if n < 2 or not (len(self.fit) == len(self.lower) == len(self.upper) == n):
            raise ValueError("band arrays need equal lengths of at least 2")
        if any(b < a for a, b in zip(self.x, self.x[1:])):
            raise ValueError("band x values must be increasing")
        if any(lo > hi for lo, hi in zip(self.lower, self.upper)):
            raise ValueError("band lower edge exceeds its upper edge")
        return self


class BootstrapThreshold(_Strict):
    """Percentiles of the bootstrap resamples' own crossings of the level (a diagnostic):
    `early` the earliest in progress, `late` the latest (None: beyond the data, "never")."""

    early: float | None
    median: float | None
    late: float | None


class Threshold(_Strict):
    """η̂ and its interval. `lower`/`upper` are the band inverted (the interval reported,
    consistent with the states; docs/measurement.md §2); `bootstrap` is the percentile
    interval of the resamples' crossings, kept as a diagnostic (`threshold_intervals`)."""

    estimate: float | None
    lower: float | None
    upper: float | None
    never_share: float = Field(ge=0.0, le=1.0)
    confidence: float = Field(gt=0.0, lt=1.0)
    status: Literal["crosses", "never", "before_range"]
    level: float
    bootstrap: BootstrapThreshold


class BootstrapInfo(_Strict):
    resamples: int
    seed: int
    method: str
    dispersion: float
    n_blocks: int


class LogisticCheck(_Strict):
    converged: bool
    message: str | None = None
    ceiling: float | None = None
    midpoint: float | None = None
    scale: float | None = None
    threshold: float | None = None
    threshold_in_range: bool | None = None
    max_abs_difference: float | None = None


class SigmoidInfo(_Strict):
    """The fitted sigmoid of a `fit_family: sigmoid` curve (monitor.curves.parametric), in the
    axis's units: y = floor + (ceiling − floor)/(1 + exp(−k·s·(x − x0))), s = −1 where lower is
    progress. `extend` is how far the band's grid reaches beyond the most advanced checkpoint,
    in units of the data's span; `failed_resamples` the bootstrap refits dropped."""

    floor: float
    ceiling: float
    k: float = Field(gt=0.0)
    x0: float
    dispersion: float
    extend: float = Field(ge=0.0)
    failed_resamples: int = Field(ge=0)


class LofoRow(_Strict):
    """Held-out performance of the curve on one predictor, pooled over folds."""

    predictor: str
    label: str
    rmse: float
    crossing_error: float
    brier: float
    n_heldout: int
    n_folds: int
    extrapolated: float


class LofoSummary(_Strict):
    level: float
    confidence: float
    families: list[str]
    rows: list[LofoRow]
    skipped: dict[str, str] = Field(default_factory=dict)


class CurvePoint(_Strict):
    checkpoint: str
    family: str | None
    x: float
    value: float
    weight: float
    # True: x was given by the labels file (a published value), not measured by a score run
    imported: bool = False
    # The point's inference budget (a curve fitted with a budget column; None otherwise)
    budget: float | None = None


class BudgetLevelCurve(_Strict):
    """The curve of a budget curve at one of its fitted budget levels: the slice of the fit
    monotone in both the axis and the budget, with its own band and threshold."""

    budget: float
    n_checkpoints: int
    x_range: tuple[float, float]
    knots: Knots
    band: Band
    threshold: Threshold
    logistic: LogisticCheck
    emergence_score: float | None


class BudgetLofoRow(_Strict):
    """Leave-one-family-out error of one way of using the budget (bivariate: monotone in axis
    and budget; per_level: a separate one-axis curve per level; pooled: the budget ignored)."""

    model: Literal["bivariate", "per_level", "pooled"]
    rmse: float
    crossing_error: float
    n_heldout: int
    n_folds: int


class BudgetInfo(_Strict):
    """The inference-budget dimension of a curve (`lstar curves fit --budget-column`)."""

    column: str
    levels: list[float] = Field(min_length=2)
    curves: list[BudgetLevelCurve]
    method: str
    lofo: list[BudgetLofoRow] | None = None

    @model_validator(mode="after")
    def _check(self) -> "BudgetInfo":
        if any(b <= a for a, b in zip(self.levels, self.levels[1:])):
            raise ValueError("budget levels must be strictly increasing")
        if [c.budget for c in self.curves] != self.levels:
            raise ValueError("one level curve per budget level, in the same order")
        return self

    def describe_levels(self) -> str:
        return ", ".join(f"{v:g}" for v in self.levels)


class CurveArtifact(_Strict):
    """A fitted task curve (`lstar-curve/2`): everything needed to predict without refitting.

    `axis` names the progress axis the curve is fitted on (monitor.curves.axes); x values,
    the band, the threshold and its interval are in that axis's units. An `lstar-curve/1`
    file loads as the same object (its `predictor` is the axis) and keeps its schema, id and
    JSON when written again.
    """

    schema_: Literal["lstar-curve/1", "lstar-curve/2"] = Field(alias="schema")
    curve_id: str
    created_at: datetime
    task: str
    metric: str
    axis: AxisName
    direction: Literal["non-increasing", "non-decreasing"]
    baseline: float
    margin: float = Field(gt=0.0)
    confidence: float = Field(gt=0.0, lt=1.0)
    corpus_sha256: str | None
    scoring_spec: ScoringRef | None
    training_data_sha256: str
    n_checkpoints: int
    families: list[str]
    x_range: tuple[float, float]
    knots: Knots
    band: Band
    threshold: Threshold
    bootstrap: BootstrapInfo
    logistic: LogisticCheck
    emergence_score: float | None
    emergence_by_family: dict[str, float | None]
    lofo: LofoSummary | None
    points: list[CurvePoint]
    warnings: list[str]
    # A budget curve (fitted with a budget column): the per-level slices. Such a curve predicts
    # only through `at_budget` at one of its levels.
    budget: BudgetInfo | None = None
    # Set on the view `at_budget` returns: the budget level this one-axis curve is the slice at.
    at_budget_level: float | None = None
    # Set on a refit (`lstar curves refit`): the parent curve's id and file, and the observed
    # checkpoints (repo@sha) whose evaluations were added. Absent from files that never had it.
    provenance: dict[str, Any] | None = None
    # The fit family (monitor.curves.parametric): isotonic, the default, is absent from the JSON,
    # so every artifact written before families existed keeps its JSON and its id.
    fit_family: Literal["isotonic", "sigmoid"] = "isotonic"
    sigmoid: SigmoidInfo | None = None
    # c of the widening beyond the reference range (metric units per axis unit; docs/measurement.md
    # §3a): the band's half-width grows by c·distance. Absent: the curve's own mean slope is used.
    extrapolation_widening: float | None = Field(default=None, ge=0.0)
    # a of the same rule: added to the half-width everywhere, inside the data too (how far a new
    # model sits off the references' curve at equal axis value, from forward validation).
    # Absent: 0.
    lineage_spread: float | None = Field(default=None, ge=0.0)
    # The forward-validation record that chose the family (monitor.curves.forward.choose_family).
    family_choice: dict[str, Any] | None = None
    # The (axis, fit family) choice this curve was fitted by (`monitor.curves.axis_choice`:
    # {axis, family, rule, decided_by, reason, candidates}). Absent from curves fitted on a
    # named axis, and from every file written before the choice was recorded.
    choice: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _check_family(self) -> "CurveArtifact":
        if (self.fit_family == "sigmoid") != (self.sigmoid is not None):
            raise ValueError("a sigmoid curve carries its `sigmoid` parameters, and only a sigmoid curve does")
        return self

    @property
    def level(self) -> float:
        """b_t + ε."""
        return self.baseline + self.margin

    @property
    def predictor(self) -> str:
        """The axis, by its `lstar-curve/1` name."""
        return self.axis

    @property
    def axis_label(self) -> str:
        """The axis as text names it (L*, bits/byte, ...)."""
        return AXIS_LABELS.get(self.axis, self.axis)

    def _dump(self) -> dict[str, Any]:
        """The JSON object, in the layout of its own schema version."""
        data = self.model_dump(mode="json", by_alias=True)
        # The budget fields appear only on budget curves, so every other artifact keeps its
        # JSON and its content id.
        for key in ("budget", "at_budget_level"):
            if data.get(key) is None:
                data.pop(key, None)
        for point in data["points"]:
            if point.get("budget") is None:
                point.pop("budget", None)
        if data.get("provenance") is None:
            data.pop("provenance", None)
        # The family fields appear only where they differ from an isotonic curve's defaults.
        if data.get("fit_family") == "isotonic":
            data.pop("fit_family", None)
        for key in ("sigmoid", "extrapolation_widening", "lineage_spread", "family_choice", "choice"):
            if data.get(key) is None:
                data.pop(key, None)
        if self.schema_ == SCHEMA_V1:
            data = {("predictor" if k == "axis" else k): v for k, v in data.items()}
            for point in data["points"]:
                point.pop("imported", None)
        return data

    def content_id(self) -> str:
        """sha256 of the canonical JSON of everything but `curve_id` and `created_at`."""
        data = {k: v for k, v in self._dump().items() if k not in ("curve_id", "created_at")}
        blob = json.dumps(data, sort_keys=True, separators=(",", ":"), allow_nan=False)
        return hashlib.sha256(blob.encode("utf-8")).hexdigest()

    def to_json(self) -> str:
        return json.dumps(self._dump(), indent=2, allow_nan=False) + "\n"


def _first_error(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        parts = []
        for err in exc.errors()[:3]:
            loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
            if err["type"] == "extra_forbidden":
                parts.append(f"unknown key {loc!r}")
            else:
                parts.append(f"{loc}: {err['msg']}")
        more = len(exc.errors()) - 3
        return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")
    return " ".join(str(exc).split())


def save_curve(curve: CurveArtifact, path: str | Path) -> Path:
    """Write the artifact as JSON (atomically: a temporary file renamed into place)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(curve.to_json(), encoding="utf-8")
    os.replace(tmp, path)
    return path


def _upgrade_v1(data: dict[str, Any], path: Path) -> dict[str, Any]:
    """An `lstar-curve/1` object in the model's field names: `predictor` is the axis (one of
    lstar, raw_ce, log_params, log_flops); it has no `axis` key and no imported flags."""
    for key in ("axis",):
        if key in data:
            raise CurveError(f"{path} is not a valid {SCHEMA_V1} artifact: unknown key {key!r}")
    points = data.get("points")
    if isinstance(points, list) and any(isinstance(p, dict) and "imported" in p for p in points):
        raise CurveError(f"{path} is not a valid {SCHEMA_V1} artifact: unknown key 'points.imported'")
    predictor = data.get("predictor")
    if predictor not in ("lstar", "raw_ce", "log_params", "log_flops"):
        raise CurveError(f"{path} is not a valid {SCHEMA_V1} artifact: predictor {predictor!r} is not one of "
                         "lstar, raw_ce, log_params, log_flops")
    return {("axis" if k == "predictor" else k): v for k, v in data.items()}


def load_curve(path: str | Path) -> CurveArtifact:
    """Read and validate a curve artifact; unknown keys, another schema version, or contents
    that do not match the curve id are errors."""
    path = Path(path)
    if not path.exists():
        raise CurveError(f"no curve file at {path}")
    try:  # a regular file of bounded size: a policy may point anywhere, a FIFO or /dev/zero too
        data, _ = read_bounded_json(path, str(path), what=CURVE_FILE, limit=CURVE_MAX_BYTES)
    except PolicyError as exc:
        raise CurveError(exc.message, hint="a curve artifact is a JSON file written by `lstar curves fit`") from None
    except NotJsonError as exc:
        raise CurveError(f"{path} is not a JSON curve artifact: {exc}") from exc
    if not isinstance(data, dict) or "schema" not in data:
        raise CurveError(f"{path} is not a curve artifact (no 'schema' key)",
                         hint=f"fit one with `lstar curves fit`; expected schema {SCHEMA}")
    schema = data["schema"]
    if schema not in (SCHEMA, SCHEMA_V1):
        if isinstance(schema, str) and schema.startswith(_SCHEMA_FAMILY):
            raise CurveError(f"{path} has schema {schema!r}; this version reads {SCHEMA!r} and {SCHEMA_V1!r}",
                             hint="refit the curve with this version, or upgrade lstar-monitor")
        raise CurveError(f"{path} has schema {schema!r}, not a curve artifact ({SCHEMA!r})")
    if schema == SCHEMA_V1:
        data = _upgrade_v1(data, path)
    try:
        curve = CurveArtifact.model_validate(data)
    except ValidationError as exc:
        raise CurveError(f"{path} is not a valid {schema} artifact: {_first_error(exc)}") from exc
    if curve.content_id() != curve.curve_id:
        raise CurveError(f"{path}: contents do not match curve id {curve.curve_id[:16]}",
                         hint="the file was edited after fitting; refit it")
    return curve


# -- prediction ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class CurvePrediction:
    """P̂ = g(x) with its interval and state (docs/measurement.md §3), x the score's value on
    the curve's axis and se its standard error."""

    value: float
    se: float
    p_hat: float
    lower: float
    upper: float
    state: Literal["clear", "at_risk", "emerged"]
    level: float
    confidence: float
    extrapolated: bool
    curve_id: str
    task: str
    metric: str
    axis: str = "lstar"
    budget: float | None = None
    # Signed distance beyond the reference range in the axis's units (`extrapolation_distance`):
    # > 0 beyond the most advanced reference, < 0 before the least advanced, 0 inside.
    extrapolation: float = 0.0

    @property
    def lstar(self) -> float:
        """The value on the curve's axis (the `lstar-curve/1` name: L* was the only axis)."""
        return self.value

    def as_dict(self) -> dict[str, Any]:
        out = {"task": self.task, "metric": self.metric, "axis": self.axis,
               "axis_label": AXIS_LABELS.get(self.axis, self.axis), "value": self.value, "se": self.se,
               "p_hat": self.p_hat, "lower": self.lower, "upper": self.upper, "state": self.state,
               "level": self.level, "confidence": self.confidence,
               "extrapolated": self.extrapolated, "extrapolation": self.extrapolation,
               "curve_id": self.curve_id}
        if self.axis == "lstar":
            out["lstar"] = self.value
        if self.budget is not None:
            out["budget"] = self.budget
        return out


def _check_pin(curve: CurveArtifact, kind: str, score_value: object, score_text: str,
               curve_value: object, curve_text: str, fix: str) -> None:
    """One pin of `check_compatible`: the score's value (None: not checked) against the curve's."""
    if score_value is None:
        return
    name = f"curve {curve.curve_id[:12]} ({curve.task})"
    if curve_value is None:
        raise CurveError(f"{name} is not pinned to a {kind}; cannot apply it to a score with {kind} {score_text}",
                         hint="refit the curve with --corpus-sha and --spec")
    if score_value != curve_value:
        raise CurveError(f"{name} was fitted with {kind} {curve_text}, but the score used {kind} {score_text}",
                         hint=fix)


def check_compatible(curve: CurveArtifact, *, corpus_sha256: str | None,
                     scoring_spec: ScoringRef | None) -> None:
    """Refuse to apply a curve to a score measured on another corpus or scoring spec."""
    _check_pin(curve, "corpus", corpus_sha256, str(corpus_sha256), curve.corpus_sha256, str(curve.corpus_sha256),
               "score on the curve's corpus, or fit a curve on this one")
    _check_pin(curve, "scoring spec", scoring_spec, scoring_spec.describe() if scoring_spec else "",
               curve.scoring_spec, curve.scoring_spec.describe() if curve.scoring_spec else "",
               "rescore with the curve's spec, or fit a curve for this one")


def predict(curve: CurveArtifact, x: float, se: float = 0.0, *,
            corpus_sha256: str | None = None, scoring_spec: ScoringRef | None = None) -> CurvePrediction:
    """P̂ = g(x) and its interval at the curve's confidence, widened for the SE of x.

    x is the score's value on the curve's axis (`curve.axis`: L*, bits/byte, ...) and se its
    standard error on that axis.

    Widening rule: the interval is the lowest lower edge and the highest upper edge of the
    band over [x - z·se, x + z·se], z the two-sided normal quantile of the curve's confidence
    (the band is monotone, so this is the band at the two ends of that range). State:
    emerged if lower ≥ b_t + ε, at_risk if upper ≥ b_t + ε, else clear.
    """
    if curve.budget is not None:
        raise CurveError(f"curve {curve.curve_id[:12]} ({curve.task}) is fitted at budgets "
                         f"{curve.budget.describe_levels()} ({curve.budget.column}); give the budget to predict at",
                         hint="lstar curves predict --budget K, or `budget:` on the policy task")
    lstar = x  # the value on the curve's axis
    if not math.isfinite(lstar):
        raise CurveError(f"cannot predict at {curve.axis_label} = {lstar}")
    if not math.isfinite(se) or se < 0:
        raise CurveError(f"the standard error must be a finite number ≥ 0, got {se}")
    check_compatible(curve, corpus_sha256=corpus_sha256, scoring_spec=scoring_spec)
    z = two_sided_z(curve.confidence)
    p_hat, lower, upper = predicted_interval(lstar, se, z, curve.band.x, curve.band.lower, curve.band.upper,
                                             curve.knots.x, curve.knots.y)
    p_hat, upper = _sigmoid_beyond_grid(curve, lstar, z * se, p_hat, upper)
    lower, upper = _widen_for_extrapolation(curve, lstar, z * se, lower, upper)
    level = curve.level
    state: Literal["clear", "at_risk", "emerged"] = (
        "emerged" if lower >= level else "at_risk" if upper >= level else "clear")
    lo_r, hi_r = curve.x_range
    return CurvePrediction(value=lstar, se=se, p_hat=p_hat, lower=lower, upper=upper, state=state,
                           level=level, confidence=curve.confidence,
                           extrapolated=not (lo_r <= lstar <= hi_r), curve_id=curve.curve_id,
                           task=curve.task, metric=curve.metric, axis=curve.axis,
                           budget=curve.at_budget_level,
                           extrapolation=extrapolation_distance(lstar, curve.x_range, _progress_sign(curve)))


def sigmoid_value(curve: CurveArtifact, x: float) -> float:
    """The fitted sigmoid of a sigmoid curve at x, from its parameters (any x)."""
    sig = curve.sigmoid
    assert sig is not None
    arg = -sig.k * _progress_sign(curve) * (x - sig.x0)
    return float(sig.floor + (sig.ceiling - sig.floor) / (1.0 + math.exp(min(arg, 700.0))))


def _sigmoid_beyond_grid(curve: CurveArtifact, x: float, reach: float, p_hat: float,
                         upper: float) -> tuple[float, float]:
    """A sigmoid curve's band is stored on a grid reaching `sigmoid.extend` data spans beyond the
    references; further out the knots would hold their last value. There P̂ comes from the
    fitted parameters, and the upper edge rises by what the curve still rises between the grid's
    end and the score's most advanced end (x + z·se toward progress); the lower edge keeps the
    band's value at the grid's end, a bound a monotone curve cannot fall below. The extrapolation
    widening (`_widen_for_extrapolation`) then applies as everywhere beyond the references."""
    if curve.sigmoid is None:
        return p_hat, upper
    sign = _progress_sign(curve)
    grid_end = max(curve.band.x, key=lambda v: sign * v)
    far = x + sign * reach
    if sign * far <= sign * grid_end:
        return p_hat, upper
    if sign * x > sign * grid_end:
        p_hat = sigmoid_value(curve, x)
    rise = max(sigmoid_value(curve, far) - sigmoid_value(curve, grid_end), 0.0)
    return p_hat, max(upper + rise, p_hat)


def extrapolation_widening(curve: CurveArtifact) -> float:
    """c of the widening beyond the reference range, per axis unit: the stored value (fitted on
    the references by forward validation, `monitor.curves.forward`), else the curve's mean slope
    over its data, |g(end) − g(start)| / span (the curve may go on changing at least as fast
    beyond the data as it did across it on average)."""
    if curve.extrapolation_widening is not None:
        return curve.extrapolation_widening
    lo_r, hi_r = curve.x_range
    if not hi_r > lo_r:
        return 0.0
    ends = np.interp([lo_r, hi_r], curve.knots.x, curve.knots.y)
    return float(abs(ends[1] - ends[0]) / (hi_r - lo_r))


def _widen_for_extrapolation(curve: CurveArtifact, x: float, reach: float, lower: float,
                             upper: float) -> tuple[float, float]:
    """The interval widened by c·distance beyond the reference range (`monitor.bands.widen_beyond`);
    `reach` = z·se, so the most advanced end of the score's own range counts."""
    sign = _progress_sign(curve)
    ahead = max(extrapolation_distance(x + sign * reach, curve.x_range, sign), 0.0)
    behind = max(-extrapolation_distance(x - sign * reach, curve.x_range, sign), 0.0)
    proportion = all(0.0 <= p.value <= 1.0 for p in curve.points)
    if curve.lineage_spread:
        lower, upper = lower - curve.lineage_spread, upper + curve.lineage_spread
        if proportion:
            lower, upper = max(lower, 0.0), min(upper, 1.0)
    if ahead == 0.0 and behind == 0.0:
        return lower, upper
    first, last = sorted(curve.x_range, key=lambda v: sign * v)
    band_x = np.asarray(curve.band.x)
    floor_ahead = float(np.interp(last, band_x, curve.band.lower))
    ceiling_behind = float(np.interp(first, band_x, curve.band.upper))
    return widen_beyond(lower, upper, ahead=ahead, behind=behind, c=extrapolation_widening(curve),
                        two_sided=curve.fit_family != "isotonic", floor_ahead=floor_ahead,
                        ceiling_behind=ceiling_behind, bounds=(0.0, 1.0) if proportion else None)


def extrapolation_text(distance: float, axis: str) -> str:
    """`extrapolated by 0.147 nats/token beyond the most advanced reference` (empty inside)."""
    return extrapolation_words(distance, AXES[axis].unit if axis in AXES else "")


def at_budget(curve: CurveArtifact, budget: float | None) -> CurveArtifact:
    """The one-axis curve to predict with at inference budget `budget`.

    A curve without a budget dimension is returned as it is (a budget given for it is refused);
    a budget curve needs one of the levels it was fitted at and returns that level's slice,
    with the parent's id. A budget between or beyond the fitted levels is refused: the fit says
    nothing about budgets it did not see.
    """
    info = curve.budget
    name = f"curve {curve.curve_id[:12]} ({curve.task})"
    if info is None and curve.at_budget_level is not None:  # already the slice at one level
        if budget != curve.at_budget_level:
            raise CurveError(f"{name} is the slice at budget {curve.at_budget_level:g}, not at {budget}")
        return curve
    if info is None:
        if budget is not None:
            raise CurveError(f"{name} has no budget dimension; budget {budget:g} cannot be applied",
                             hint="drop the budget, or fit the curve with --budget-column")
        return curve
    if budget is None:
        raise CurveError(f"{name} is fitted at budgets {info.describe_levels()} ({info.column}); "
                         "give the deployment budget",
                         hint="lstar curves predict --budget K, or `budget:` on the policy task")
    if not math.isfinite(budget) or budget not in info.levels:
        raise CurveError(f"budget {budget:g} is outside the fitted levels {info.describe_levels()} of {name}; "
                         "a budget curve does not extrapolate or interpolate between levels")
    part = info.curves[info.levels.index(budget)]
    points = [p for p in curve.points if p.budget == budget]
    return curve.model_copy(update=dict(
        knots=part.knots, band=part.band, threshold=part.threshold, logistic=part.logistic,
        x_range=part.x_range, emergence_score=part.emergence_score, n_checkpoints=part.n_checkpoints,
        points=points, budget=None, at_budget_level=budget))


def score_axis_value(curve: CurveArtifact, run: Any) -> tuple[float, float]:
    """(value, SE) of a score run on the curve's axis; CurveError with the reason when the run
    has none (e.g. a log_flops curve and a checkpoint without declared FLOPs)."""
    got = axis_value(run, curve.axis)
    if isinstance(got, str):
        raise CurveError(f"curve {curve.curve_id[:12]} ({curve.task}) is on {curve.axis_label}: {got}",
                         hint="fit the task's curve on an axis every score has, e.g. lstar")
    return got


def predict_score_run(curve: CurveArtifact, run: ScoreRunRow) -> CurvePrediction:
    """Predict for a stored score run (a `score_runs` row) on the curve's axis, widened by that
    axis's standard error, checking corpus and spec."""
    value, se = score_axis_value(curve, run)
    return predict(curve, value, se,
                   corpus_sha256=str(run.corpus_sha256), scoring_spec=ScoringRef.from_score_run(run.as_dict()))


# -- the level in force -------------------------------------------------------------------------
# A policy task may set its own margin ε; the level b_t + ε it puts in force is then not the
# curve's. η̂, its interval and every warning about them are computed here, at the level in
# force, for the alerts and the reports alike.
_SAME_LEVEL = 1e-12


@dataclass(frozen=True)
class LevelThreshold:
    """η̂ at one level b_t + ε: `threshold` as the artifact stores it (at the curve's own
    level it is the stored object; at another its bootstrap share `never_share` and
    percentile interval are unknown, None), and the logistic check's threshold there."""

    margin: float
    level: float
    threshold: Threshold | None
    estimate: float | None
    lower: float | None
    upper: float | None
    status: str
    confidence: float
    never_share: float | None
    logistic_threshold: float | None
    own_level: bool


def _progress_sign(curve: CurveArtifact) -> float:
    return -1.0 if AXES[curve.axis].lower_is_progress else 1.0


def _logistic_threshold(curve: CurveArtifact, margin: float) -> float | None:
    """Where the logistic check reaches b_t + `margin` (the inverse of its fitted curve)."""
    log = curve.logistic
    if not log.converged or log.ceiling is None or log.midpoint is None or log.scale is None:
        return None
    room = log.ceiling - curve.baseline
    if not room > margin:
        return None
    sign = _progress_sign(curve)
    share = margin / room
    return sign * (sign * log.midpoint + log.scale * math.log(share / (1.0 - share)))


def threshold_at(curve: CurveArtifact, margin: float | None = None) -> LevelThreshold:
    """η̂, its interval and status at b_t + `margin` (default: the curve's own margin),
    from the curve's knots and band by the rule the fit used (`monitor.bands.threshold_crossing`)."""
    margin = curve.margin if margin is None else float(margin)
    level = curve.baseline + margin
    if abs(margin - curve.margin) <= _SAME_LEVEL * max(1.0, abs(curve.margin)):
        thr = curve.threshold
        return LevelThreshold(margin=curve.margin, level=curve.level, threshold=thr, estimate=thr.estimate,
                              lower=thr.lower, upper=thr.upper, status=thr.status, confidence=thr.confidence,
                              never_share=thr.never_share, logistic_threshold=curve.logistic.threshold,
                              own_level=True)
    sign = _progress_sign(curve)
    kt, ky = sign * np.asarray(curve.knots.x), np.asarray(curve.knots.y)
    gt = sign * np.asarray(curve.band.x)
    lo, hi = np.asarray(curve.band.lower), np.asarray(curve.band.upper)
    k_order, g_order = np.argsort(kt, kind="stable"), np.argsort(gt, kind="stable")
    t_first = min(sign * curve.x_range[0], sign * curve.x_range[1])
    got = threshold_crossing(level, sign=sign, t_first=t_first, knots_t=kt[k_order], knots_y=ky[k_order],
                             grid_t=gt[g_order], lower=lo[g_order], upper=hi[g_order])
    return LevelThreshold(margin=margin, level=level, threshold=None, estimate=got["estimate"],  # type: ignore[arg-type]
                          lower=got["lower"], upper=got["upper"], status=str(got["status"]),  # type: ignore[arg-type]
                          confidence=curve.threshold.confidence, never_share=None,
                          logistic_threshold=_logistic_threshold(curve, margin), own_level=False)


# -- the curve's own warnings -----------------------------------------------------------------
# Warnings that make the threshold η̂ unresolved: a prediction resting on such a curve says so
# in the governance report's problems and in its alert.
UNRESOLVED_CODES = frozenset({"threshold_edge", "resolution", "logistic", "never_crosses"})


@dataclass(frozen=True)
class CurveWarning:
    """One thing a curve artifact says about its own reliability.

    code: threshold_edge (η̂ or its interval at or beyond the edge of the data), resolution
    (ε below what the test set can resolve), logistic (the logistic check disagrees),
    never_crosses (too many bootstrap resamples never reach b_t + ε), logistic_failed,
    unpinned (no corpus/spec pin) or other (a stored fit-time warning of another kind).
    """

    code: str
    message: str

    @property
    def unresolved(self) -> bool:
        """Whether this warning means the threshold is not resolved by the data."""
        return self.code in UNRESOLVED_CODES

    def as_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "unresolved": self.unresolved}


def _stored_code(text: str) -> str | None:
    """The code of a warning stored at fit time (None: derived again from the artifact)."""
    if "resolution 1/n" in text or "binomial standard error" in text:
        return "resolution"
    if "not pinned" in text:
        return "unpinned"
    if text.startswith("the logistic check"):
        return None  # older artifacts stored this one; it is derived below for every artifact
    return "other"


# The axes' display names (monitor.curves.axes).
_AXIS_LABELS = AXIS_LABELS


def _g(v: float | None) -> str:
    return "none" if v is None else f"{v:.4g}"


def curve_warnings(curve: CurveArtifact, margin: float | None = None) -> list[CurveWarning]:
    """Every warning a curve artifact carries about itself at the level b_t + `margin` in
    force (default: the curve's own margin), in one list.

    Stored fit-time warnings that need the labels (resolution of the test set, missing
    corpus/spec pins) are read from `curve.warnings`; the rest is derived from the artifact,
    so an artifact written before a check existed is judged by it too:
    - threshold_edge: the curve never reaches b_t + ε in the data, is above it from the least
      advanced checkpoint, has η̂ on an end of the data, or an end of η̂'s interval open or on
      an end of the data;
    - never_crosses: more bootstrap resamples never reach b_t + ε than the interval's tail
      allows ((1 - confidence)/2), so the percentile interval of η̂ is open;
    - logistic: the logistic check's threshold lies outside η̂'s interval or the data, or only
      one of the two fits reaches b_t + ε (logistic_failed: the check did not converge).

    At another level than the curve's, the stored resolution warnings are judged again at the
    margin in force (their n is in the text), and never_crosses is not derived: the bootstrap
    resamples behind it are not stored (an open end of η̂'s interval still is threshold_edge).
    """
    at = threshold_at(curve, margin)
    out: list[CurveWarning] = []
    for text in curve.warnings:
        code = _stored_code(text)
        if code == "resolution" and not at.own_level:
            out.extend(CurveWarning("resolution", again) for again in _resolution_again(curve, text, at.margin))
        elif code is not None:
            out.append(CurveWarning(code, text))
    label = _AXIS_LABELS.get(curve.predictor, curve.predictor)
    thr = at
    lo_r, hi_r = curve.x_range
    span = f"{label} {lo_r:.4g} … {hi_r:.4g}"
    tol = 1e-9 * max(1.0, abs(hi_r - lo_r))
    at_end = (lambda v: v is not None and (abs(v - lo_r) <= tol or abs(v - hi_r) <= tol))
    level = f"b + ε = {at.level:g}"
    if thr.status == "never":
        out.append(CurveWarning("threshold_edge", f"the curve never reaches {level} inside the data "
                                f"({span}); the threshold lies beyond the most advanced checkpoint"))
    elif thr.status == "before_range":
        out.append(CurveWarning("threshold_edge", f"the curve is at or above {level} from the least advanced "
                                f"checkpoint on ({span}); the threshold lies before the data"))
    elif at_end(thr.estimate):
        out.append(CurveWarning("threshold_edge", f"the threshold η̂ = {_g(thr.estimate)} sits at the edge of "
                                f"the data ({span})"))
    if thr.status == "crosses":
        open_ends = [name for name, v in (("lower", thr.lower), ("upper", thr.upper)) if v is None]
        edge_ends = [name for name, v in (("lower", thr.lower), ("upper", thr.upper)) if at_end(v)]
        if open_ends or edge_ends:
            what = ", ".join([f"{n} end open" for n in open_ends] + [f"{n} end at the edge" for n in edge_ends])
            out.append(CurveWarning("threshold_edge", f"the {thr.confidence:.0%} interval of η̂ "
                                    f"[{_g(thr.lower)}, {_g(thr.upper)}] reaches the edge of the data "
                                    f"({what}; {span})"))
    tail = (1.0 - thr.confidence) / 2.0
    if thr.never_share is not None and thr.never_share > tail:
        out.append(CurveWarning("never_crosses", f"{thr.never_share:.0%} of bootstrap resamples never reach "
                                f"{level} (more than the {tail:.0%} tail of a {thr.confidence:.0%} interval); "
                                f"the threshold may lie beyond the data"))
    log = curve.logistic
    log_threshold = at.logistic_threshold
    if not log.converged:
        out.append(CurveWarning("logistic_failed", f"the logistic check did not converge ({log.message})"))
    elif thr.estimate is not None and thr.status == "crosses" and log_threshold is None:
        out.append(CurveWarning("logistic", f"the logistic check never reaches {level} (ceiling "
                                f"{_g(log.ceiling)}), but the isotonic curve crosses at η̂ = {_g(thr.estimate)}"))
    elif log_threshold is not None:
        outside_data = not (lo_r - tol <= log_threshold <= hi_r + tol)
        outside_interval = thr.estimate is not None and (
            (thr.lower is not None and log_threshold < thr.lower) or
            (thr.upper is not None and log_threshold > thr.upper))
        if thr.estimate is None or outside_interval or outside_data:
            where = []
            if thr.estimate is None:
                where.append("the isotonic curve does not cross inside the data")
            if outside_interval:
                where.append(f"outside the isotonic interval [{_g(thr.lower)}, {_g(thr.upper)}]")
            if outside_data:
                where.append(f"outside the data ({span})")
            out.append(CurveWarning("logistic", f"the logistic check puts the threshold at "
                                    f"{log_threshold:.4g}: {'; '.join(where)}"))
    return out


def resolution_warnings(n: Sequence[int | None], *, baseline: float, margin: float,
                        metric: str) -> list[str]:
    """Warnings when a test set is too small for the margin: the resolution of an accuracy
    on n items is 1/n, and its binomial standard error at the baseline sqrt(b(1-b)/n)."""
    counts = sorted({int(c) for c in n if c is not None and c > 0})
    if not counts:
        return []
    smallest = counts[0]
    messages = []
    if 1.0 / smallest > margin:
        messages.append(f"{metric}: resolution 1/n = {1.0 / smallest:.4g} (n = {smallest}) is coarser "
                        f"than the margin ε = {margin:g}; a one-item change moves past the threshold")
    if 0.0 < baseline < 1.0:
        se = math.sqrt(baseline * (1.0 - baseline) / smallest)
        if se > margin:
            messages.append(f"{metric}: binomial standard error at the baseline "
                            f"sqrt(b(1-b)/n) = {se:.4g} (n = {smallest}) exceeds the margin ε = {margin:g}; "
                            f"single checkpoints cannot resolve the threshold")
    return messages


# The text is a curve file's (hostile): the metric is what precedes the first ': ', n the last
# '(n = N)' after it, found in two linear steps (one pattern `^(.*?): .*\(n = ...` rescanned
# the rest of the text from every ': ', quadratic in a line of them).
_RESOLUTION_N = re.compile(r"\(n = ([0-9]{1,12})\)")


def _resolution_again(curve: CurveArtifact, text: str, margin: float) -> list[str]:
    """A stored resolution warning judged again at `margin` (its test-set size n is in it)."""
    metric, colon, rest = text.partition(": ")
    n = [found.group(1) for found in _RESOLUTION_N.finditer(rest)][-1:] if colon else []
    if not n:
        return [text]
    again = resolution_warnings([int(n[0])], baseline=curve.baseline, margin=margin, metric=metric)
    kind = "resolution 1/n" if "resolution 1/n" in text else "binomial standard error"
    return [m for m in again if kind in m]


def unresolved_warnings(curve: CurveArtifact, margin: float | None = None) -> list[CurveWarning]:
    """The warnings that leave the threshold at b_t + `margin` (default: the curve's)
    unresolved (empty: it is resolved)."""
    return [w for w in curve_warnings(curve, margin) if w.unresolved]


# -- presentation ------------------------------------------------------------------------------
REPORTED_INTERVAL = "threshold interval (band inversion, reported)"
DIAGNOSTIC_INTERVAL = "bootstrap percentile of the threshold (diagnostic)"


def threshold_intervals(threshold: Threshold, axis: str) -> dict[str, dict[str, Any]]:
    """The two intervals an artifact stores for η̂, each named, in the axis's units with
    lower ≤ upper (None: that end never reaches the level inside the data).

    `reported`: the band inverted (`threshold.lower`/`upper`), the interval alerts, reports and
    `curves predict` agree with. `diagnostic`: the percentile interval of the bootstrap
    resamples' own crossings (`threshold.bootstrap`), which no state is computed from.
    """
    boot = threshold.bootstrap
    # `early` is the earliest crossing in progress: the larger value on an axis where lower is progress.
    low, high = (boot.late, boot.early) if AXES[axis].lower_is_progress else (boot.early, boot.late)
    return {"reported": {"label": REPORTED_INTERVAL, "method": "band_inversion",
                         "lower": threshold.lower, "upper": threshold.upper},
            "diagnostic": {"label": DIAGNOSTIC_INTERVAL, "method": "bootstrap_percentile",
                           "lower": low, "upper": high, "median": boot.median}}


def curve_summary(curve: CurveArtifact) -> dict[str, Any]:
    """The headline numbers of a curve, as `lstar curves show --json` prints them."""
    return {"curve_id": curve.curve_id, "task": curve.task, "metric": curve.metric,
            "axis": curve.axis, "axis_label": curve.axis_label, "predictor": curve.predictor,
            "schema": curve.schema_, "n_imported": sum(p.imported for p in curve.points),
            "fit_family": curve.fit_family, "sigmoid": curve.sigmoid.model_dump() if curve.sigmoid else None,
            "extrapolation_widening": extrapolation_widening(curve), "lineage_spread": curve.lineage_spread or 0.0,
            "family_choice": curve.family_choice, "choice": curve.choice,
            "n_checkpoints": curve.n_checkpoints,
            "families": curve.families, "baseline": curve.baseline, "margin": curve.margin,
            "level": curve.level, "confidence": curve.confidence,
            "threshold": curve.threshold.model_dump(),
            "threshold_intervals": threshold_intervals(curve.threshold, curve.axis),
            "logistic_threshold": curve.logistic.threshold,
            "emergence_score": curve.emergence_score, "corpus_sha256": curve.corpus_sha256,
            "scoring_spec": curve.scoring_spec.describe() if curve.scoring_spec else None,
            "x_range": list(curve.x_range),
            "warnings": [w.message for w in curve_warnings(curve)],
            "threshold_resolved": not unresolved_warnings(curve) if curve.budget is None else None,
            "lofo": curve.lofo.model_dump() if curve.lofo else None,
            **({"budget": _budget_summary(curve)} if curve.budget is not None else {}),
            **({"at_budget": curve.at_budget_level} if curve.at_budget_level is not None else {})}


def _budget_summary(curve: CurveArtifact) -> dict[str, Any]:
    """Per budget level: the threshold and whether it is resolved (a budget curve's summary)."""
    info = curve.budget
    assert info is not None
    levels = []
    for value in info.levels:
        view = at_budget(curve, value)
        levels.append({"budget": value, "n_checkpoints": view.n_checkpoints,
                       "threshold": view.threshold.model_dump(),
                       "threshold_intervals": threshold_intervals(view.threshold, curve.axis),
                       "logistic_threshold": view.logistic.threshold,
                       "threshold_resolved": not unresolved_warnings(view),
                       "warnings": [w.message for w in curve_warnings(view)]})
    return {"column": info.column, "levels": list(info.levels), "method": info.method,
            "per_level": levels, "lofo": [r.model_dump() for r in info.lofo] if info.lofo else None}
