"""The evaluate job: judge every scored checkpoint against each policy task that watches it
(`monitor.alerts.evaluation_tick.evaluate_pending`): a prediction row per (checkpoint, task), and the alerts
and their deliveries it calls for in the outbox; a scored checkpoint moves from not evaluated to
evaluated for each task (or is skipped with a reason code, logged and counted once).

The evaluation logic stays in `monitor.alerts`; this module only runs it on the daemon's
schedule and asks for the dispatch (deliveries to send) and observe (predictions to check)
runs that follow.
"""

from __future__ import annotations

from typing import Any, Protocol, TYPE_CHECKING

from monitor.events import event
from monitor.jobs.context import JobContext
from monitor.store import utcnow

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from datetime import datetime

    from monitor.store.lineage_batch import LineageBatch
    from monitor.store.rows import (EvaluationCandidateRow, EvaluationGapRow, LatestScoreRow,
        LineageHistory, NotEvaluatedRow)


class EvaluateStore(Protocol):
    """What the evaluation tick reads and writes (`monitor.alerts.evaluation_tick.evaluate_pending`)."""

    def checkpoint(self) -> None: ...
    def complete_score(self, repo: str, sha: str, corpus_sha256: str | None = None,
                       spec: Mapping[str, Any] | None = None) -> dict[str, Any] | None: ...
    def derivative_keys(self) -> set[tuple[str, str]]: ...
    def drain_evaluation_queue(self, run_ids: Sequence[str]) -> int: ...
    def end_evaluation_gap(self, gap_id: int, *, now: datetime) -> bool: ...
    def evaluation_candidates(self, policy: str, task: str, corpus_sha256: str,
                              curve_id: str | None = None) -> list[EvaluationCandidateRow]: ...
    def evaluation_consumers(self) -> list[tuple[str, str, str]]: ...
    def evaluation_queue(self) -> dict[str, str]: ...
    def evaluation_scopes(self, policy: str) -> dict[tuple[str, str], str]: ...
    def forget_evaluation_scopes(self, policy: str | None = None, *,
                                 consumers: Sequence[tuple[str, str, str]] = ()) -> int: ...
    def hub_checkpoint_base(self, repo: str, sha: str) -> dict[str, Any] | None: ...
    def labelled_derivatives(self, relation: str, task: str, metric: str) -> list[dict[str, Any]]: ...
    def latest_score(self, repo: str, commit_sha: str, corpus_sha256: str) -> LatestScoreRow | None: ...
    def lineage_history(self, policy: str, task: str, lineage: str,
                        checkpoint: tuple[str, str, datetime | None] | None = None) -> LineageHistory: ...
    def observed_label(self, repo: str, sha: str, task: str, metric: str) -> dict[str, Any] | None: ...
    def observed_states(self, pairs: Sequence[tuple[str, str]], *,
                        until: datetime | None = None) -> dict[tuple[str, str], list[dict[str, Any]]]: ...
    def open_evaluation_gap(self, policy: str) -> EvaluationGapRow | None: ...
    def open_not_evaluated(self, policy: str, tasks: Sequence[str]) -> list[NotEvaluatedRow]: ...
    def raise_operator_alerts(self, alerts: Sequence[Mapping[str, Any]], *, now: datetime,
                              hub_outage_id: int | None = None, evaluation_gap_id: int | None = None,
                              miscalibration_id: int | None = None) -> int: ...
    def record_evaluation_scope(self, policy: str, task: str, corpus_sha256: str, scope: str, *,
                                now: datetime) -> None: ...
    def requeue_evaluation(self, run_ids: Sequence[str], corpus_sha256: str, *, now: datetime) -> None: ...
    def start_evaluation_gap(self, policy: str, *, reason: str, now: datetime) -> EvaluationGapRow: ...
    def write_outbox_rows(self, predictions: Sequence[Mapping[str, Any]], *, now: datetime,
                          before_commit: Any = None) -> dict[tuple[str, str, str], dict[str, int]]: ...
    def lineage_batch(self, policy: str, task: str,
                      runs: Sequence[tuple[str, str, str, str]]) -> LineageBatch: ...
    def latest_scores(self, pairs: Sequence[tuple[str, str]], corpus_sha256: str) -> dict[tuple[str, str], LatestScoreRow]: ...
    def query_json(self, sql: str, params: Sequence[Any] | None, json_columns: Sequence[str]) -> list[dict[str, Any]]: ...


def evaluate(store: EvaluateStore, policies: list[Any], *, stop: Any) -> dict[str, Any]:
    """One evaluation pass over everything scored and not yet judged; its report."""
    from monitor.alerts import evaluate_pending

    return evaluate_pending(store, policies, now=utcnow(), complete=True,  # type: ignore[arg-type]
                            stop=stop).as_dict()


def log_new_skips(ctx: JobContext, skips: dict[str, str]) -> None:
    """Log and count each skipped evaluation (line -> reason code) not skipped in the
    previous pass: a policy-level skip is found again every pass until it is mended."""
    seen = ctx.job_memory.get("skips_seen", set())
    for line, reason in skips.items():
        if line not in seen:
            event("evaluation_skipped", reason=reason, detail=line)
            ctx.metrics.evaluations_skipped.labels(reason=reason).inc()
    ctx.job_memory["skips_seen"] = set(skips)


def run(ctx: JobContext) -> dict[str, Any]:
    """One evaluation pass; asks for a dispatch when deliveries wait and an observe run when
    new predictions can be checked."""
    policies = ctx.policies()
    with ctx.job_store() as store:
        report = evaluate(store, policies, stop=ctx.stopping.is_set)
    ctx.metrics.alerts_raised.inc(report["alerts"])
    log_new_skips(ctx, report["skip_reasons"])
    if report["deliveries"]:
        ctx.nudge("dispatch")
    if report["predictions"] and any(t.evaluate is not None for p in ctx.policies() for t in p.tasks):
        ctx.nudge("observe")
    return report


__all__ = ["EvaluateStore", "evaluate", "log_new_skips", "run"]
