"""The progress axes a task curve can be fitted on and a prediction made on: a closed set.

docs/measurement.md §2a. Every axis says what it is (name, label, unit), which way is progress,
and how to read its value and standard error from a stored score run and from a task label:

- score axes, measured by every score run (`monitor/scoring/metrics.py`), each with its
  standard error from the one seeded document bootstrap of the run:
  `lstar` (L* = CE − CE_uni, nats/token), `raw_ce` (CE, nats/token), `bits_per_byte`
  (Σ nll / Σ bytes / ln 2), `lstar_per_byte` (bits/byte minus the unigram model's bits/byte,
  i.e. L* · tokens/byte / ln 2), `l_rel` (CE / CE_uni) and `l_gain` ((CE_uni − CE) / CE_uni,
  higher is progress);
- external axes, declared rather than measured (standard error 0): `log_params` (log10 of the
  parameter count of the loaded safetensors weights, which the score run records) and
  `log_flops` (log10 of training FLOPs, only where a label file or the run's model info
  declares them).

The axis names are also the column names of a labels CSV (`<name>` for the value, `<name>_se`
for its standard error; `log_params`/`log_flops` are log10 values, `params`/`flops` raw
counts), so a row may carry a published value directly (an imported point).

`axis_value(row, name)` reads (value, SE) from a score-run row, or returns the reason why the
row has no such value; the reason is what an evaluation stores as `not_evaluated`. This module
imports only numpy, so policies and the daemon can use it cheaply.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from monitor.errors import CurveError


class LabelLike(Protocol):
    """What an axis reads of a task label (`monitor.curves.labels.Label`, which sits above this
    module): each axis's raw value by its `column` name, L*'s SE, and the other axes' SEs."""

    @property
    def lstar_se(self) -> float | None: ...

    @property
    def axis_se(self) -> Mapping[str, float]: ...


LN2 = math.log(2.0)


@dataclass(frozen=True)
class Axis:
    """One progress axis.

    `column` is the Label attribute holding the (raw) value; with `log10` the axis is its
    base-10 logarithm. `score_column`/`se_column` are the `score_runs` columns of the value
    and its standard error (None: not a score axis). `source` is "score" (measured by every
    score run), "external" (declared: parameter count, FLOPs) or "task" (one value per
    checkpoint and task, read from a labels or history file: the task loss).
    """

    name: str
    label: str
    column: str
    lower_is_progress: bool
    log10: bool = False
    unit: str = ""
    score_column: str | None = None
    se_column: str | None = None
    source: str = "score"

    @property
    def direction(self) -> str:
        """How the task curve runs along this axis (the artifact's `direction`)."""
        return "non-increasing" if self.lower_is_progress else "non-decreasing"

    def values(self, labels: Sequence[LabelLike]) -> np.ndarray | None:
        """The axis value of each label, or None when any row lacks it (or it is not positive
        where a logarithm is taken)."""
        raw = [getattr(label, self.column) for label in labels]
        if any(v is None or not math.isfinite(v) for v in raw):
            return None
        arr = np.asarray(raw, dtype=np.float64)
        if self.log10:
            if np.any(arr <= 0):
                return None
            arr = np.log10(arr)
        return arr

    def label_se(self, label: LabelLike) -> float | None:
        """The standard error of a label's value on this axis, where the label has one."""
        if self.name == "lstar":
            return label.lstar_se
        if self.source == "external":
            return 0.0
        return label.axis_se.get(self.name)

    def describe(self, value: float, se: float | None = None, digits: int = 4) -> str:
        """`bits/byte 0.9120 ± 0.0040` (the number as alerts and reports print it)."""
        text = f"{self.label} {value:.{digits}f}"
        return text if se is None else f"{text} ± {se:.{digits}f}"


# In table order. Predictor(name, label, column, lower_is_progress) positional order is kept.
AXES: dict[str, Axis] = {
    "lstar": Axis("lstar", "L*", "lstar", True, unit="nats/token", score_column="lstar", se_column="se_ce"),
    "bits_per_byte": Axis("bits_per_byte", "bits/byte", "bits_per_byte", True, unit="bits/byte",
                          score_column="bits_per_byte", se_column="se_bits_per_byte"),
    "lstar_per_byte": Axis("lstar_per_byte", "L* per byte", "lstar_per_byte", True, unit="bits/byte",
                           score_column="lstar_per_byte", se_column="se_lstar_per_byte"),
    "l_rel": Axis("l_rel", "L_rel", "l_rel", True, unit="ratio", score_column="l_rel", se_column="se_l_rel"),
    "l_gain": Axis("l_gain", "L_gain", "l_gain", False, unit="ratio", score_column="l_gain", se_column="se_l_gain"),
    "raw_ce": Axis("raw_ce", "raw CE", "raw_ce", True, unit="nats/token", score_column="ce", se_column="se_ce"),
    "log_params": Axis("log_params", "log10 params", "params", False, log10=True, unit="log10 parameters",
                       source="external"),
    "log_flops": Axis("log_flops", "log10 FLOPs", "flops", False, log10=True, unit="log10 FLOPs",
                      source="external"),
    # The loss of the task's own correct answers (bits per byte of the answer text), one value
    # per checkpoint and task, as training logs report it (OLMo's `downstream_bpb`). No score run
    # measures it: it comes from a labels or history file.
    "task_loss": Axis("task_loss", "task loss", "task_loss", True, unit="bits/byte", source="task"),
}
AXIS_NAMES: tuple[str, ...] = tuple(AXES)
SCORE_AXES: tuple[str, ...] = tuple(n for n, a in AXES.items() if a.source == "score")
DEFAULT_AXIS = "lstar"


def get_axis(name: str) -> Axis:
    """The axis called `name`; an unknown name is a CurveError listing the axes."""
    try:
        return AXES[name]
    except KeyError:
        raise CurveError(f"unknown axis {name!r}", hint=f"choose from {', '.join(AXES)}") from None


def _get(row: Any, key: str) -> Any:
    if isinstance(row, Mapping):
        return row.get(key)
    return getattr(row, key, None)


def _model_info(row: Any) -> dict[str, Any]:
    model = _get(row, "model")
    if isinstance(model, str):
        try:
            model = json.loads(model)
        except ValueError:
            return {}
    return model if isinstance(model, dict) else {}


def _finite(v: Any) -> float | None:
    if v is None or isinstance(v, bool):
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def axis_value(row: Any, name: str) -> tuple[float, float] | str:
    """(value, standard error) of axis `name` for a score-run row, or the reason it has none.

    `row` is a `score_runs` row (a ScoreRunRow, a CheckpointScoreRow, an evaluation candidate,
    or a mapping with the same column names). A run scored before per-axis standard errors
    were stored has none for bits/byte and L* per byte: the reason says to rescore it.
    External axes read the run's model info: `n_params` (the loaded weights' parameter count)
    and `flops` (declared only; no score run measures FLOPs), with standard error 0.
    """
    axis = get_axis(name)
    run = _get(row, "run_id")
    where = f"score run {run}" if run else "the score"
    if axis.source == "external":
        key = {"log_params": "n_params", "log_flops": "flops"}[name]
        raw = _finite(_model_info(row).get(key))
        if raw is None or raw <= 0:
            what = ("parameter count in its model info" if name == "log_params"
                    else "declared training FLOPs (a score run measures none; they come only with the model info "
                         "a campaign declares, or a labels file)")
            return f"{where} has no {what}, so a {axis.label} curve cannot be applied to it"
        return math.log10(raw), 0.0
    if axis.source == "task":
        return (f"{where} has no {axis.label}: no score measures a task's own loss, so a {axis.label} curve "
                f"applies only to a history's per-task values (lstar backtest)")
    assert axis.score_column is not None and axis.se_column is not None
    value = _finite(_get(row, axis.score_column))
    if value is None and name == "lstar_per_byte":  # derivable exactly from stored columns
        lstar, tpb = _finite(_get(row, "lstar")), _finite(_get(row, "tokens_per_byte"))
        value = None if lstar is None or tpb is None else lstar * tpb / LN2
    if value is None:
        return f"{where} has no {axis.label} value"
    se = _finite(_get(row, axis.se_column))
    if se is None and name in ("l_rel", "l_gain"):  # CE_uni is a constant: SE(CE) / CE_uni
        se_ce, uni = _finite(_get(row, "se_ce")), _finite(_get(row, "ce_unigram"))
        se = se_ce / uni if se_ce is not None and uni else None
    if se is None or se < 0:
        return (f"{where} has no standard error of {axis.label} (scored before per-axis standard "
                "errors were stored); rescore the checkpoint")
    return value, se


def require_axis_value(row: Any, name: str) -> tuple[float, float]:
    """`axis_value`, raising CurveError with the reason when the row has no such value."""
    got = axis_value(row, name)
    if isinstance(got, str):
        raise CurveError(got, hint="fit the task's curve on an axis every score has, e.g. lstar")
    return got


def label_point(label: LabelLike, name: str) -> tuple[float, float | None] | None:
    """A label's (value, SE) on an axis (log10 applied), or None when it has none."""
    axis = get_axis(name)
    raw = _finite(getattr(label, axis.column))
    if raw is None or (axis.log10 and raw <= 0):
        return None
    return (math.log10(raw) if axis.log10 else raw), axis.label_se(label)


__all__ = ["AXES", "AXIS_NAMES", "DEFAULT_AXIS", "LN2", "SCORE_AXES", "Axis", "axis_value", "get_axis",
           "label_point", "require_axis_value"]
