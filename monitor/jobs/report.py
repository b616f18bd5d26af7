"""The report job: write each policy's scheduled report once it is due
(`monitor.reports.schedule.write_due_reports`) under STATE/reports; a report period moves from
due to written.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from monitor.jobs.context import JobContext
from monitor.store import utcnow


class ReportStore(Protocol):
    """What the scheduled reports read and record (`write_due_reports`)."""


def report_function() -> Callable[..., Any] | None:
    """`monitor.reports.schedule.write_due_reports` when the report module provides it (the
    daemon schedules no report job otherwise)."""
    try:
        from monitor.reports import schedule
    except ImportError:
        return None
    return getattr(schedule, "write_due_reports", None)


def write_reports(store: ReportStore, policies: list[Any], write: Callable[..., Any], *, ctx: JobContext) -> Any:
    """The reports due now, written with `write` (`report_function()`)."""
    return write(store, policies, out_dir=ctx.config.state_dir / "reports", now=utcnow())


def run(ctx: JobContext, write: Callable[..., Any]) -> Any:
    with ctx.job_store() as store:
        return write_reports(store, ctx.policies(), write, ctx=ctx)


__all__ = ["ReportStore", "report_function", "run", "write_reports"]
