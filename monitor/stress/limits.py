"""The documented limits that turn stress-test numbers into flags on a curve.

One place holds every limit, its number and the reason for the number, so `policy check`, an
alert's caveat and the report's problems section show the same flag for the same numbers
(docs/stress.md, "Limits", prints this table). A flag says the curve's forecasts rest on a
coordinate that the stress test found not portable; it does not change any state.

Which curve a result qualifies: the `registers` section names its curves (`curves[].curve_id`);
the `tokenization` and `task_format` sections qualify the subject's curve
(`subject.curve_id`). A section without a curve flags nothing.

The limits, and why each number:

- `register_threshold_shift`: |threshold shift across registers| > the curve's own threshold
  interval width. Refitting the curve on another calibration register moves its L* threshold;
  when that move is larger than the whole interval the curve reports for the threshold, the
  interval understates the forecast's uncertainty: the choice of calibration corpus matters more
  than the curve's statistical error.
- `format_instability`: task-format instability > 0.10 (`monitor.stress.task_format`), i.e. the
  pairwise accuracy bound of any scalar progress metric falls below 0.90. With two formats this
  is one checkpoint pair in five ordered differently by equivalent surface forms; a forecast of
  that task cannot be right more often than the task agrees with itself, so beyond a tenth the
  format, not the progress coordinate, limits the forecast.
- `tokenization_alpha`: |α − 1| > 0.10 in L*_perturbed ≈ α·L* + β. α stretches L* differences;
  a 10 % stretch of a typical 0.3 nats/token gap between checkpoints is 0.03 nats/token, the size
  of one L* score's standard error on calib-v0 (0.016–0.064 in committed results), so beyond it
  the tokenization moves forecasts by more than measurement noise.
- `tokenization_residual`: residual variance of that fit > 0.03² = 9e-4 (nats/token)²: a
  residual standard deviation above one score's typical standard error means the perturbed L*
  is not a linear function of L* to within measurement noise, so no rescaling carries the curve
  across tokenizations.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

FORMAT_INSTABILITY_MAX = 0.10
TOKENIZATION_ALPHA_TOLERANCE = 0.10
TOKENIZATION_RESIDUAL_VARIANCE_MAX = 0.03 ** 2


@dataclass(frozen=True)
class Limit:
    name: str
    test: str
    bound: str
    reason: str


LIMITS: tuple[Limit, ...] = (
    Limit("register_threshold_shift", "registers", "|shift| > the curve's threshold interval width",
          "the calibration register then moves the threshold more than the curve's own uncertainty"),
    Limit("format_instability", "task_format", f"instability > {FORMAT_INSTABILITY_MAX:.2f}",
          "equivalent task formats then disagree on more than a tenth of checkpoint orderings, capping "
          "any progress metric's pairwise accuracy below 0.90"),
    Limit("tokenization_alpha", "tokenization", f"|alpha - 1| > {TOKENIZATION_ALPHA_TOLERANCE:.2f}",
          "a 10% stretch of a 0.3 nats/token gap is one L* score's standard error (~0.03)"),
    Limit("tokenization_residual", "tokenization", f"residual variance > {TOKENIZATION_RESIDUAL_VARIANCE_MAX:.4g}",
          "a residual SD above ~0.03 nats/token (one score's SE) is not a rescaling of L*"),
)
LIMITS_BY_NAME = {limit.name: limit for limit in LIMITS}


@dataclass(frozen=True)
class StressFlag:
    """One exceeded limit: on which curve, which number, against what bound, in words."""

    limit: str
    test: str
    curve_id: str
    value: float
    bound: float
    message: str
    report_id: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _number(value: Any) -> float | None:
    """A finite float, or None for anything else (a stored document is read as hostile)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


MAX_NAME_CHARS = 80


def _name(value: Any) -> str:
    """A name a stored document gives (register, task, variant), cut to `MAX_NAME_CHARS`: it
    goes into every caveat, alert and report line of the curve, so its size is the writer's
    to choose only up to a point."""
    text = str(value)
    return text if len(text) <= MAX_NAME_CHARS else text[:MAX_NAME_CHARS - 1] + "…"


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _dict(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def register_flags(section: Mapping[str, Any], curve_id: str) -> list[StressFlag]:
    flags = []
    for entry in _list(section.get("curves")):
        entry = _dict(entry)
        if entry.get("curve_id") != curve_id:
            continue
        shift, width = _number(entry.get("threshold_shift_lstar")), _number(entry.get("threshold_interval_width"))
        if shift is None or width is None or abs(shift) <= width:
            continue
        flags.append(StressFlag(
            "register_threshold_shift", "registers", curve_id, abs(shift), width,
            f"stress: refitted on the {_name(entry.get('register', '?'))} register the threshold moves {abs(shift):.3f} "
            f"L*, more than the curve's own threshold interval ({width:.3f} wide)"))
    return flags


def format_flags(section: Mapping[str, Any], curve_id: str) -> list[StressFlag]:
    flags = []
    for task in _list(section.get("tasks")):
        task = _dict(task)
        value = _number(task.get("instability"))
        if value is None or value <= FORMAT_INSTABILITY_MAX:
            continue
        bound = _number(task.get("accuracy_upper_bound"))
        flags.append(StressFlag(
            "format_instability", "task_format", curve_id, value, FORMAT_INSTABILITY_MAX,
            f"stress: task {_name(task.get('task', '?'))} has format instability {value:.3f} > {FORMAT_INSTABILITY_MAX:.2f}"
            + (f" (no progress metric can order its checkpoints better than {bound:.2f})" if bound is not None else "")))
    return flags


def tokenization_flags(section: Mapping[str, Any], curve_id: str) -> list[StressFlag]:
    flags = []
    for fit in _list(section.get("fits")):
        fit = _dict(fit)
        variant = _name(fit.get("variant", "?"))
        alpha = _number(fit.get("alpha"))
        if alpha is not None and abs(alpha - 1.0) > TOKENIZATION_ALPHA_TOLERANCE:
            flags.append(StressFlag(
                "tokenization_alpha", "tokenization", curve_id, alpha, TOKENIZATION_ALPHA_TOLERANCE,
                f"stress: under tokenization {variant} L* scales by alpha = {alpha:.3f} (|alpha - 1| > "
                f"{TOKENIZATION_ALPHA_TOLERANCE:.2f})"))
        residual = _number(fit.get("residual_variance"))
        if residual is not None and residual > TOKENIZATION_RESIDUAL_VARIANCE_MAX:
            flags.append(StressFlag(
                "tokenization_residual", "tokenization", curve_id, residual, TOKENIZATION_RESIDUAL_VARIANCE_MAX,
                f"stress: under tokenization {variant} the L* fit leaves residual variance {residual:.2g} > "
                f"{TOKENIZATION_RESIDUAL_VARIANCE_MAX:.2g}"))
    return flags


def curves_of(document: Mapping[str, Any]) -> set[str]:
    """Every curve id a stress document qualifies (the subject's and the register section's)."""
    ids = set()
    subject_curve = _dict(document.get("subject")).get("curve_id")
    if isinstance(subject_curve, str) and subject_curve:
        ids.add(subject_curve)
    registers = _dict(_dict(document.get("sections")).get("registers"))
    for entry in _list(registers.get("curves")):
        curve = _dict(entry).get("curve_id")
        if isinstance(curve, str) and curve:
            ids.add(curve)
    return ids


def measured_tests(document: Mapping[str, Any], curve_id: str) -> set[str]:
    """The tests whose section in `document` holds a number the limits read for `curve_id`: a
    `registers` row for the curve, a task's instability or a tokenization fit of the subject's
    curve. A section that measured nothing for the curve (no curve file, one checkpoint) leaves
    an older result of that test in force rather than clearing its flag."""
    sections = _dict(document.get("sections"))
    measured = set()
    registers = _dict(sections.get("registers"))
    if any(_dict(e).get("curve_id") == curve_id and _number(_dict(e).get("threshold_shift_lstar")) is not None
           for e in _list(registers.get("curves"))):
        measured.add("registers")
    if _dict(document.get("subject")).get("curve_id") == curve_id:
        if any(_number(_dict(t).get("instability")) is not None
               for t in _list(_dict(sections.get("task_format")).get("tasks"))):
            measured.add("task_format")
        if any(_number(_dict(f).get("alpha")) is not None
               for f in _list(_dict(sections.get("tokenization")).get("fits"))):
            measured.add("tokenization")
    return measured


def flags_for(document: Mapping[str, Any], curve_id: str, *, tests: set[str] | None = None,
              report_id: str | None = None) -> list[StressFlag]:
    """The flags an `lstar-stress/1` document raises on `curve_id` (only `tests`' sections when given)."""
    sections = _dict(document.get("sections"))
    subject_curve = _dict(document.get("subject")).get("curve_id")
    flags: list[StressFlag] = []
    if tests is None or "registers" in tests:
        flags += register_flags(_dict(sections.get("registers")), curve_id)
    if subject_curve == curve_id:
        if tests is None or "task_format" in tests:
            flags += format_flags(_dict(sections.get("task_format")), curve_id)
        if tests is None or "tokenization" in tests:
            flags += tokenization_flags(_dict(sections.get("tokenization")), curve_id)
    return [StressFlag(**{**f.as_dict(), "report_id": report_id}) for f in flags]
