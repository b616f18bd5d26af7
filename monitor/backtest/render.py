"""A backtest's result as text: one row per task × target lineage, for the terminal (the
command's rich table, `monitor.commands.backtest`) and Markdown (every string from the input escaped with `monitor.escape.markdown_text`).

Both read `BacktestResult.as_dict()`, the same numbers `--json` prints, so the outputs agree.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from monitor.escape import markdown_text

COLUMNS = ("task", "lineage", "checkpoints", "first warning", "crossing", "lead (steps)", "lead (tokens)",
           "outcome", "false emerged", "coverage", "final p̂", "final observed", "rel. error", "paper")


def num(value: Any, digits: int = 3) -> str:
    """A number for a table ('—' for none); whole numbers without decimals."""
    if value is None:
        return "—"
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 1e15:
            return f"{int(value):,}"
        return f"{value:.{digits}g}" if abs(value) >= 1e4 else f"{value:.{digits}f}"
    return str(value)


def pct(value: Any) -> str:
    return "—" if value is None else f"{value * 100:+.1f} %"


def step_of(where: Mapping[str, Any] | None) -> str:
    return "—" if where is None else num(where.get("step"))


def extrapolated_text(final: Mapping[str, Any], unit: str = "") -> str:
    """` (extrapolated by 0.148 nats/token beyond the most advanced reference)` where the final
    prediction lies outside the references' range (`monitor.bands.extrapolation_words`)."""
    from monitor.bands import extrapolation_words

    if not final.get("extrapolated"):
        return ""
    words = extrapolation_words(final.get("extrapolation"), unit)  # type: ignore[arg-type]
    return f" ({words or 'extrapolated'})"


def outcome(item: Mapping[str, Any]) -> str:
    """One word for a task × lineage: warned ahead, late, missed, false alarm or quiet."""
    if item["crossing"] is not None:
        if item.get("crossed_at_start") is not None:
            return "crossed at start"
        if item["lead"] is not None:
            return "warned ahead"
        return "late warning" if item["late_warning"] is not None else "missed"
    return "false alarm" if item["false_alarm"] is not None else "quiet"


def coverage_text(cov: Mapping[str, Any]) -> str:
    if not cov.get("checked"):
        return "—"
    return (f"{cov['covered']}/{cov['checked']} = {cov['coverage']:.2f} "
            f"[{cov['coverage_lo']:.2f}, {cov['coverage_hi']:.2f}] vs {cov['nominal']:.2f}")


def table_rows(data: Mapping[str, Any]) -> list[list[str]]:
    """The cells of the per task × lineage table, as plain strings (not yet escaped)."""
    from monitor.curves.axes import AXES

    unit = AXES[data["axis"]].unit if data.get("axis") in AXES else ""
    rows = []
    for item in data["results"]:
        lead = item["lead"] or {}
        final = item["final"] or {}
        rows.append([item["task"], item["lineage"], str(item["checkpoints"]), step_of(item["first_warning"]),
                     step_of(item["crossing"]), num(lead.get("steps")), num(lead.get("tokens")), outcome(item),
                     ", ".join(num(w["step"]) for w in item["false_emerged"]) or "none",
                     coverage_text(item["coverage"]), num(final.get("p_hat")), num(final.get("observed")),
                     pct(final.get("relative_error")) + extrapolated_text(final, unit),
                     pct(final.get("paper_relative_error"))])
    return rows


def summary_lines(data: Mapping[str, Any]) -> list[str]:
    """The headline numbers, one per line (plain text)."""
    s = data["summary"]
    alerts = data["alerts"]
    return [f"history {data['history']}: axis {data['axis']}, family {data['family']}, tasks from {data['policy']}",
            f"references: {', '.join(data['references'])}",
            f"targets: {', '.join(data['targets'])}",
            f"crossings {s['crossings']} ({s['crossed_at_start']} already at the first checkpoint), "
            f"warned ahead {s['warned_ahead']}, misses {s['misses']} "
            f"(late warnings {s['late_warnings']}), false alarms {s['false_alarms']}, "
            f"false emerged {s['false_emerged']}",
            f"coverage (all tasks pooled): {coverage_text(s['coverage'])}; inside the references' range "
            f"{coverage_text(s['coverage_inside_references'])}, beyond it "
            f"{coverage_text(s['coverage_beyond_references'])}",
            f"mean |relative error| at the final checkpoints: "
            f"{'—' if s['mean_abs_relative_error'] is None else format(s['mean_abs_relative_error'] * 100, '.1f') + ' %'}",
            f"alerts: {alerts['count']} raised, {alerts['notifications']} notifications written"
            + (f" to {alerts['file']}" if alerts["file"] else " (no --alerts-out: not kept)")]


CURVE_COLUMNS = ("task", "family", "forward |error| isotonic", "forward |error| sigmoid", "level",
                 "reference range", "widening c", "spread a")


def curve_rows(data: Mapping[str, Any]) -> list[list[str]]:
    """One row per task's curve: the family forward validation chose on the references, each
    family's forward mean absolute error (in the metric's units), the level, the axis range the references span, and
    the widening beyond it (docs/measurement.md §3a)."""
    rows = []
    for task, curve in sorted(data.get("curves", {}).items()):
        forward = (curve.get("family_choice") or {}).get("forward") or {}

        def mae(family: str) -> str:
            value = (forward.get(family) or {}).get("mae")
            return "—" if value is None else f"{value:.4f}"

        low, high = curve.get("x_range") or (None, None)
        rows.append([task, str(curve.get("family")), mae("isotonic"), mae("sigmoid"), num(curve.get("level")),
                     "—" if low is None else f"{low:.4g} … {high:.4g}", num(curve.get("extrapolation_widening")),
                     num(curve.get("lineage_spread"))])
    return rows


def markdown(data: Mapping[str, Any]) -> str:
    """The result as a Markdown document."""
    out = ["# Backtest", ""]
    out += [f"- {markdown_text(line)}" for line in summary_lines(data)]
    out += ["", "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    out += ["| " + " | ".join(markdown_text(cell) for cell in row) + " |" for row in table_rows(data)]
    out += ["", "The curves, fitted on the references only:", "", "| " + " | ".join(CURVE_COLUMNS) + " |",
            "|" + "---|" * len(CURVE_COLUMNS)]
    out += ["| " + " | ".join(markdown_text(cell) for cell in row) + " |" for row in curve_rows(data)]
    out += ["", "Outcome: *warned ahead* (first at_risk/emerged before the first checkpoint observed emerged), "
                "*crossed at start* (observed emerged at the lineage's first checkpoint: no warning could come "
                "earlier, so neither a miss nor a lead), "
                "*late warning* (first warning at or after it; also a miss), *missed* (never warned), "
                "*false alarm* (a warning on a lineage never observed emerged), *quiet*. Steps are training steps."]
    return "\n".join(out) + "\n"


__all__ = ["COLUMNS", "CURVE_COLUMNS", "curve_rows", "markdown", "outcome", "summary_lines", "table_rows"]
