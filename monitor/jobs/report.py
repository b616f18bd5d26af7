"""The report job: write each policy's scheduled report once it is due
(`monitor.reports.schedule.write_due_reports`) under STATE/reports; a report period moves from
due to written.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TYPE_CHECKING

from monitor.jobs.context import JobContext
from monitor.store import utcnow

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from datetime import datetime

    from monitor.store.report_ranks import ReportRanks
    from monitor.store.rows import CheckpointRow, PredictionRow, ReportRow, ReportScoreRow


class ReportStore(Protocol):
    """What the scheduled reports read and record (`write_due_reports`)."""

    def checkpoint_refs(self, pairs: Sequence[tuple[str, str]]) -> dict[tuple[str, str], list[str]]: ...
    def complete_scores(self, pairs: Sequence[tuple[str, str]],
                        corpus_sha256: str | None = None) -> dict[tuple[str, str], list[dict[str, Any]]]: ...
    def hub_checkpoint_bases(self,
                             pairs: Sequence[tuple[str, str]]) -> dict[tuple[str, str], dict[str, Any]]: ...
    def last_report(self, policy: str, name: str) -> ReportRow | None: ...
    def observed_states(self, pairs: Sequence[tuple[str, str]], *,
                        until: datetime | None = None) -> dict[tuple[str, str], list[dict[str, Any]]]: ...
    def policy_changes(self, policy: str, *, start: datetime, end: datetime) -> list[dict[str, Any]]: ...
    def record_report(self, report: Mapping[str, Any]) -> int | None: ...
    def predictions_by_id(self, ids: Sequence[int]) -> list[PredictionRow]: ...
    def report_repo_rules(self, corpus_sha256: str | None, *, end: datetime) -> list[tuple[str, str | None]]: ...
    def report_ranks(self, corpus_sha256: str | None, *, start: datetime, end: datetime,
                     watched: Sequence[tuple[str, str | None]] | None) -> ReportRanks: ...
    def report_new_checkpoints(self, *, start: datetime, end: datetime) -> list[CheckpointRow]: ...
    def report_predictions(self, policy: str, *, start: datetime, end: datetime) -> list[PredictionRow]: ...
    def report_runs_by_id(self, run_ids: Sequence[str]) -> list[ReportScoreRow]: ...
    def set_report_deliveries(self, report_id: int, deliveries: Sequence[Mapping[str, Any]]) -> None: ...
    def superseded_observations(self, policy: str, *, since: datetime | None = None,
                                until: datetime | None = None) -> list[dict[str, Any]]: ...
    def track_record(self, policy: str | None = None) -> list[dict[str, Any]]: ...
    def query_json(self, sql: str, params: Sequence[Any] | None, json_columns: Sequence[str]) -> list[dict[str, Any]]: ...


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
