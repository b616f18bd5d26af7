"""A backtest's result: per task × target lineage, the metrics of `monitor.backtest.compare`,
and pooled coverage; `as_dict()` is JSON-safe (finite numbers only, None elsewhere)."""

from __future__ import annotations

import statistics

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from monitor.backtest import compare
from monitor.backtest.compare import Row
from monitor.curves.observe import Coverage


def finite(value: Any) -> Any:
    """Numbers made JSON-safe: a non-finite float becomes None; containers recursively."""
    if isinstance(value, bool) or value is None or isinstance(value, (str, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return str(value)


def _point(row: Row) -> dict[str, Any]:
    p = row.predicted
    return {**row.where(), "observed": row.observed, "n": row.n, "stderr": row.stderr,
            "observed_interval": [row.observed_lo, row.observed_hi], "observed_state": row.observed_state,
            "predicted_state": p.state if p else None, "p_hat": p.p_hat if p else None,
            "interval": [p.lo, p.hi] if p else None, "axis_value": p.value if p else None,
            "extrapolated": bool(p.extrapolated) if p else False,
            **({"extrapolation": p.extrapolation} if p is not None and p.extrapolation is not None else {}),
            "covered": compare.covered(row)}


@dataclass(frozen=True)
class LineageResult:
    """One task on one target lineage."""

    task: str
    lineage: str
    rows: tuple[Row, ...]
    paper_error: float | None = None

    @property
    def coverage(self) -> Coverage:
        return compare.coverage_of(self.rows, self.rows[0].confidence if self.rows else 0.9)

    @property
    def relative_error(self) -> float | None:
        return compare.final_relative_error(self.rows)

    def as_dict(self) -> dict[str, Any]:
        def at(row: Row | None) -> dict[str, Any] | None:
            return row.where() if row is not None else None

        last = self.rows[-1] if self.rows else None
        return {"task": self.task, "lineage": self.lineage, "checkpoints": len(self.rows),
                "level": self.rows[0].level if self.rows else None,
                "first_warning": at(compare.first_warning(self.rows)), "crossing": at(compare.crossing(self.rows)),
                "lead": compare.lead(self.rows), "crossed_at_start": at(compare.crossed_at_start(self.rows)),
                "missed": at(compare.missed(self.rows)),
                "late_warning": at(compare.late_warning(self.rows)),
                "false_alarm": at(compare.false_alarm(self.rows)),
                "false_emerged": [r.where() for r in compare.false_emerged(self.rows)],
                "coverage": self.coverage.as_dict(),
                "final": None if last is None else {**last.where(), "observed": last.observed,
                                                    "p_hat": last.predicted.p_hat if last.predicted else None,
                                                    "relative_error": self.relative_error,
                                                    "paper_relative_error": self.paper_error,
                                                    "extrapolated": bool(last.predicted and last.predicted.extrapolated),
                                                    "extrapolation": last.predicted.extrapolation
                                                    if last.predicted else None},
                "points": [_point(r) for r in self.rows]}


@dataclass
class BacktestResult:
    """Everything one backtest found."""

    history: str
    axis: str
    family: str
    source: str
    references: list[str]
    targets: list[str]
    curves: dict[str, dict[str, Any]]
    results: list[LineageResult]
    alerts: list[dict[str, Any]] = field(default_factory=list)
    alerts_file: str | None = None
    notifications: int = 0
    not_evaluated: list[str] = field(default_factory=list)

    def pooled_coverage(self, task: str | None = None) -> Coverage:
        rows = [r for res in self.results if task is None or res.task == task for r in res.rows]
        return compare.coverage_of(rows)   # nominal: the mean of the rows' own levels

    def summary(self) -> dict[str, Any]:
        """Counts over every task × lineage."""
        errors = [abs(e) for e in (r.relative_error for r in self.results) if e is not None]
        leads = [d["steps"] for d in (compare.lead(r.rows) for r in self.results) if d is not None]
        return {"task_lineages": len(self.results),
                "crossings": sum(compare.crossing(r.rows) is not None for r in self.results),
                "warned_ahead": len(leads),
                "crossed_at_start": sum(compare.crossed_at_start(r.rows) is not None for r in self.results),
                "misses": sum(compare.missed(r.rows) is not None for r in self.results),
                "late_warnings": sum(compare.late_warning(r.rows) is not None for r in self.results),
                "false_alarms": sum(compare.false_alarm(r.rows) is not None for r in self.results),
                "false_emerged": sum(len(compare.false_emerged(r.rows)) for r in self.results),
                "mean_abs_relative_error": sum(errors) / len(errors) if errors else None,
                "median_lead_steps": statistics.median(leads) if leads else None,
                "coverage": self.pooled_coverage().as_dict(),
                # where the extrapolation widening is what holds the band open, and where it is not
                "coverage_inside_references": self._coverage_where(extrapolated=False).as_dict(),
                "coverage_beyond_references": self._coverage_where(extrapolated=True).as_dict()}

    def _coverage_where(self, *, extrapolated: bool) -> Coverage:
        """Pooled coverage of the rows predicted inside (or beyond) the references' axis range."""
        rows = [r for res in self.results for r in res.rows
                if r.predicted is not None and bool(r.predicted.extrapolated) is extrapolated]
        return compare.coverage_of(rows)   # nominal: the mean of the rows' own levels

    def as_dict(self) -> dict[str, Any]:
        return finite({
            "history": self.history, "axis": self.axis, "family": self.family, "policy": self.source,
            "references": self.references, "targets": self.targets, "curves": self.curves,
            "summary": self.summary(),
            "coverage_by_task": {t: self.pooled_coverage(t).as_dict() for t in sorted({r.task for r in self.results})},
            "results": [r.as_dict() for r in self.results],
            "alerts": {"count": len(self.alerts), "file": self.alerts_file, "notifications": self.notifications,
                       "list": self.alerts},
            "not_evaluated": self.not_evaluated})


def group_rows(rows: Sequence[Row]) -> list[tuple[str, str, list[Row]]]:
    """Rows grouped by (task, lineage), each group in training order."""
    groups: dict[tuple[str, str], list[Row]] = {}
    for row in rows:
        groups.setdefault((row.task, row.lineage), []).append(row)
    return [(t, lin, sorted(g, key=lambda r: r.step)) for (t, lin), g in groups.items()]


__all__ = ["BacktestResult", "LineageResult", "finite", "group_rows"]
