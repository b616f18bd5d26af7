"""The checkpoint queue: leases over `checkpoints` rows, with retries and fail points.

The database is the queue. A worker claims a row with a compare-and-set (attempts += 1,
lease_owner, lease_expires_at) in one transaction, does the work, and completes the row
only if it still holds the lease. A worker killed mid-job leaves a lease that expires (a
restarted daemon frees it at start, `Store.reclaim_checkpoint_leases`); the row is then
claimed again, at most `max_attempts` times in all, after which it is marked
failed with the last reason. Completion and the job's own rows (e.g. a score run) are
written in one transaction, so a job completes exactly once.

Fail points (`monitor.failpoints`): with `LSTAR_FAILPOINT=name[,name...]` set,
`failpoint(name)` kills the process with SIGKILL at that point (crash tests). Points used here: `after_claim`,
`before_complete`; workers add their own (the fetch step uses `mid_job`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import duckdb

from monitor.errors import (CorpusError, GateRefusedError, HubError, IntegrityError, LstarError,
                            ModelLoadError, SpecError, TokenizerError, UnsupportedCheckpointError)
from monitor.events import event
from monitor.failpoints import failpoint
from monitor.store import Store, utcnow
from monitor.store.rows import CheckpointRow

DEFAULT_STATUSES = ("gated", "fetched")
MAX_ATTEMPTS = 3
DEFAULT_LEASE_S = 1800.0
# Failures that no retry can fix: the row fails at once with the error as its reason.
PERMANENT_ERRORS: tuple[type[LstarError], ...] = (
    IntegrityError, GateRefusedError, ModelLoadError, SpecError, CorpusError, TokenizerError)
# Checkpoints this installation cannot handle (a quantization backend not installed): the
# row is skipped at once with the reason, like the gate's refusals.
SKIP_ERRORS: tuple[type[LstarError], ...] = (UnsupportedCheckpointError,)


@dataclass
class Outcome:
    """What a worker returns: the final status, and optionally rows to write atomically.

    `write(conn)` runs inside the completing transaction (use the connection it is given,
    never open another transaction); if the lease was lost nothing of it is written.
    """

    status: str
    reason: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    write: Callable[[duckdb.DuckDBPyConnection], None] | None = None


@dataclass
class JobResult:
    """One job `process_pending` handled, and the row's state afterwards."""

    id: int
    repo: str
    sha: str
    attempt: int
    status: str
    reason: str | None
    lease_lost: bool         # another owner held the row when this one tried to finish
    refunded: bool = False   # the lease and the attempt went back: the job did not run, not its fault

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


Worker = Callable[[CheckpointRow], Outcome]


def claim_next(store: Store, owner: str, now: datetime, lease_s: float = DEFAULT_LEASE_S,
               statuses: Sequence[str] = DEFAULT_STATUSES, max_attempts: int = MAX_ATTEMPTS,
               exclude: Sequence[int] = ()) -> CheckpointRow | None:
    """Lease the oldest claimable row (unleased, or its lease expired); None if there is none.

    Rows that already used `max_attempts` are failed on the way ("gave up after 3
    attempts: <last reason>"); ids in `exclude` are passed over.
    """
    return store.claim_checkpoint(owner, now=now, lease_s=lease_s, statuses=tuple(statuses),
                                  max_attempts=max_attempts, exclude=exclude)


def complete(store: Store, checkpoint_id: int, owner: str, status: str,
             meta: dict[str, Any] | None = None, *, reason: str | None = None,
             now: datetime | None = None,
             write: Callable[[duckdb.DuckDBPyConnection], None] | None = None) -> bool:
    """Finish a job if `owner` still holds its lease (compare-and-set); False otherwise."""
    return store.complete_checkpoint(checkpoint_id, owner, status=status, reason=reason, meta=meta,
                                     now=now or utcnow(), write=write)


def release(store: Store, checkpoint_id: int, owner: str, reason: str, *,
            now: datetime | None = None, max_attempts: int = MAX_ATTEMPTS,
            refund: bool = False) -> str | None:
    """Give a lease back after a retryable failure; the row fails once attempts are used up.

    `refund=True` returns the attempt too: the failure was the Hub's, not the job's.
    """
    return store.release_checkpoint(checkpoint_id, owner, reason=reason, now=now or utcnow(),
                                    max_attempts=max_attempts, refund=refund)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, LstarError):
        return exc.one_line()
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def settle(store: Store, job: CheckpointRow, owner: str, work: Callable[[], Outcome], *,
           now_fn: Callable[[], datetime] = utcnow,
           max_attempts: int = MAX_ATTEMPTS) -> tuple[JobResult, bool]:
    """Run `work` for a claimed `job` and record what happened; (the job's result, whether
    the Hub is down).

    Skip errors (an unsupported checkpoint) skip the row at once; permanent errors
    (integrity, gate refusal, model load, spec) fail it at once; a HubError gives the lease
    and the attempt back (the Hub is down); any other exception gives the lease back for a
    later run, up to `max_attempts` attempts in all. An `Outcome` completes the row together
    with its rows, if this owner still holds the lease.
    """
    hub_down = refunded = False
    outcome: Outcome | None = None
    try:
        outcome = work()
    except SKIP_ERRORS as exc:
        held = complete(store, job.id, owner, "skipped", {"error": type(exc).__name__},
                        reason=_reason(exc), now=now_fn())
    except PERMANENT_ERRORS as exc:
        held = complete(store, job.id, owner, "failed", {"error": type(exc).__name__},
                        reason=_reason(exc), now=now_fn())
    except HubError as exc:  # the Hub's fault: no attempt used, and stop asking it
        hub_down = refunded = True
        held = release(store, job.id, owner, f"waiting for the Hub: {_reason(exc)}",
                       now=now_fn(), max_attempts=max_attempts, refund=True) is not None
    except Exception as exc:  # retryable: the lease goes back, attempts decide
        held = release(store, job.id, owner, _reason(exc), now=now_fn(),
                       max_attempts=max_attempts) is not None
    else:
        failpoint("before_complete")
        held = complete(store, job.id, owner, outcome.status, outcome.meta,
                        reason=outcome.reason, now=now_fn(), write=outcome.write)
    row = store.get_checkpoint(job.id)
    status, reason = (row.status, row.reason) if row is not None else ("gone", None)
    ids = {"checkpoint": job.id, "repo": job.repo, "commit": job.sha, "attempt": job.attempts}
    if held and status == "scored" and outcome is not None:
        meta = outcome.meta
        event("scored", **ids, run=meta.get("run_id"), lstar=meta.get("lstar"), se=meta.get("se"),
              tokens_per_s=meta.get("tokens_per_s"), linked_from=meta.get("linked_from_run_id"))
    elif held and status in ("failed", "skipped"):
        event("score_failed", **ids, status=status, reason=reason)
    return JobResult(job.id, job.repo, job.sha, job.attempts, status, reason,
                     lease_lost=not held, refunded=refunded), hub_down


def claim_batch(store: Store, owner: str, *, now_fn: Callable[[], datetime] = utcnow,
                lease_s: float = DEFAULT_LEASE_S, limit: int | None = None,
                statuses: Sequence[str] = DEFAULT_STATUSES,
                max_attempts: int = MAX_ATTEMPTS) -> list[CheckpointRow]:
    """Lease up to `limit` jobs at once (a backend that runs several together); each one is
    then finished with `settle`."""
    claimed: list[CheckpointRow] = []
    while limit is None or len(claimed) < limit:
        job = claim_next(store, owner, now_fn(), lease_s, statuses, max_attempts,
                         exclude=[j.id for j in claimed])
        if job is None:
            break
        failpoint("after_claim")
        claimed.append(job)
    return claimed


def process_pending(store: Store, worker: Worker, *, owner: str,
                    now_fn: Callable[[], datetime] = utcnow, lease_s: float = DEFAULT_LEASE_S,
                    limit: int | None = None, statuses: Sequence[str] = DEFAULT_STATUSES,
                    max_attempts: int = MAX_ATTEMPTS) -> list[JobResult]:
    """Claim and run jobs until none is left (or `limit` jobs ran).

    The worker gets the claimed row (a `CheckpointRow`: id, repo, sha, status, attempts, meta, ...)
    and returns an `Outcome`; `settle` records what happened. A HubError ends the run (the
    Hub is down).
    """
    results: list[JobResult] = []
    hub_down = False
    while not hub_down and (limit is None or len(results) < limit):
        # A job is tried at most once per run, so one bad run cannot use up its attempts.
        job = claim_next(store, owner, now_fn(), lease_s, statuses, max_attempts,
                         exclude=[r.id for r in results])
        if job is None:
            break
        failpoint("after_claim")
        result, hub_down = settle(store, job, owner, lambda job=job: worker(job), now_fn=now_fn,
                                  max_attempts=max_attempts)
        results.append(result)
    store.checkpoint()
    return results
