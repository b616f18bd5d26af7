"""The score job: lease queued checkpoints, fetch each verified from the Hub, score it on the
scoring backend and settle the result (`monitor.scoring.scoring_driver.score_queue_on`); a row
moves `gated → fetched → scored` (or `skipped` / `failed` with the reason, or back to `gated`
with its attempt refunded when the Hub is down or the daemon stops).

Fetching has no job of its own: it happens under the scoring lease, so a checkpoint is
downloaded only by the run that scores it. The child process that scores never opens the
database; the score rows are written with the lease's completion in one transaction. After a
batch that did something, the Hub cache is pruned (`prune_after_scoring`).
"""

from __future__ import annotations

from typing import Any, Protocol, TYPE_CHECKING

from monitor.jobs.context import JobContext
from monitor.scoring.scoring_driver import prune_after_scoring, score_queue_on

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from datetime import datetime

    import duckdb

    from monitor.store.rows import CheckpointRow, HubStateRow, ScoreRunRow, ScoredRunRef


class ScoreStore(Protocol):
    """What scoring reads and writes (`score_queue_on`, `prune_after_scoring`)."""

    def advance_checkpoint(self, checkpoint_id: int, owner: str, *, status: str,
                           meta: Mapping[str, Any] | None, now: datetime) -> bool: ...
    def baselines_for_corpus(self, corpus_sha256: str) -> list[tuple[str, str, dict[str, Any]]]: ...
    def checkpoint(self) -> None: ...
    def claim_checkpoint(self, owner: str, *, now: datetime, lease_s: float, statuses: Sequence[str],
                         max_attempts: int, exclude: Sequence[int] = ()) -> CheckpointRow | None: ...
    def close_hub_outage(self, endpoint: str, *, now: datetime) -> None: ...
    def complete_checkpoint(self, checkpoint_id: int, owner: str, *, status: str, reason: str | None,
                            meta: Mapping[str, Any] | None, now: datetime, write: Any = None) -> bool: ...
    def get_checkpoint(self, checkpoint_id: int) -> CheckpointRow | None: ...
    def get_hub_state(self, endpoint: str) -> HubStateRow | None: ...
    def hub_checkpoints_at(self, shas: Sequence[str]) -> list[CheckpointRow]: ...
    def insert_score_digest(self, conn: duckdb.DuckDBPyConnection, run_id: str, checkpoint_id: int | None,
                            key: Mapping[str, str], *, linked_from_run_id: str | None = None,
                            linked_from_checkpoint_id: int | None = None) -> None: ...
    def link_score_run(self, conn: duckdb.DuckDBPyConnection, source: ScoredRunRef, *, run_id: str,
                       checkpoint: CheckpointRow, key: Mapping[str, str], now: datetime) -> None: ...
    def open_hub_outage(self, endpoint: str, *, now: datetime, failures: int, error: str | None) -> int: ...
    def put_hub_state(self, endpoint: str, state: Mapping[str, Any], *, now: datetime) -> None: ...
    def release_checkpoint(self, checkpoint_id: int, owner: str, *, reason: str, now: datetime,
                           max_attempts: int, refund: bool = False) -> str | None: ...
    def score_run(self, run_id: str) -> ScoreRunRow | None: ...
    def scored_run_with(self, key: Mapping[str, str]) -> ScoredRunRef | None: ...


def sequential_plan(ctx: JobContext, job: Any) -> dict[str, Any]:
    """The tasks a sequential score of `job` must settle: every task of every policy in
    force that watches its repo (`monitor.alerts.sequential_plan.plan_for_repo`)."""
    from monitor.alerts.sequential_plan import plan_for_repo

    return plan_for_repo(ctx.policies(), job.repo, job.rule, seed=ctx.config.template.seed, strict=False)


def score_batch(ctx: JobContext, store: ScoreStore) -> list[Any]:
    """Fetch and score up to `score_batch` queued checkpoints on the scoring backend, then
    prune the Hub cache; returns what happened to each job (`monitor.hub.JobResult`)."""
    cfg = ctx.config
    backend = ctx.scoring_backend()
    # As many jobs as the local backend runs at once (one, or one per warm worker: the next
    # is leased when it can start); a Ray cluster takes the whole batch at once.
    limit = min(cfg.score_batch, backend.concurrency or cfg.score_batch)
    plan_for = (lambda job: sequential_plan(ctx, job)) if cfg.scoring_mode == "sequential" else None
    results = score_queue_on(store, ctx.hub_client(store), backend, cfg.template,  # type: ignore[arg-type]
                             owner=ctx.owner, state_dir=cfg.state_dir, cache_dir=cfg.cache_dir,
                             lease_s=cfg.lease_s, limit=limit, stopping=ctx.stopping.is_set,
                             plan_for=plan_for)
    if any(r.status in ("scored", "skipped", "failed") for r in results):
        prune_after_scoring(store, cache_dir=cfg.cache_dir, keep_last=cfg.cache_keep,  # type: ignore[arg-type]
                            max_bytes=cfg.cache_max_bytes)
    return results


def run(ctx: JobContext) -> list[dict[str, Any]]:
    """Score batches until the queue is empty, every job of a batch went back untouched, or
    the daemon stops; asks for an evaluation run once something was scored."""
    done: list[dict[str, Any]] = []
    while not ctx.stopping.is_set():
        with ctx.job_store() as store:
            results = score_batch(ctx, store)
        if not results:
            break
        for r in results:
            ctx.metrics.scores.labels(result=r.status).inc()
        done.extend(r.as_dict() for r in results)
        if all(r.refunded for r in results):
            # Every job went back untouched (the Hub is down, the backend failed): asking
            # again at once would spin; the next scheduled run tries again.
            break
    if any(r["status"] == "scored" for r in done):
        ctx.nudge("evaluate")
    return done


__all__ = ["ScoreStore", "run", "score_batch", "sequential_plan"]
