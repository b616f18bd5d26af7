"""Driving the scoring queue: lease a gated checkpoint, fetch it verified, score it, complete it.

The queue (`monitor.hub.queue`) gives each job a lease and at most three attempts.
`score_queue` downloads the pinned snapshot (recording the fetch), hands it to a scorer,
and writes the score run and the lease's completion in one transaction, so a job completes
exactly once. Two scorers:

- `score_in_process` runs the forward passes here (`lstar score --pending`);
- `score_in_child` runs them in `monitor.scoring.child`, which never opens the database, so
  a model that eats all memory or never finishes cannot take the daemon down.

`score_queue_on` (the daemon's path) leases a batch of jobs, fetches each, and hands them
together to a scoring backend (`monitor.scoring.backends`: `local` child processes, or a
Ray cluster that runs them in parallel); each outcome is written with its lease's
completion as it arrives. Workers never open the database; the cached unigram baselines
travel with the jobs, and a baseline a worker computed comes back to be cached.

After a run that finished jobs, the daemon prunes the Hub cache (`prune_after_scoring`).
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

from monitor.errors import HubError
from monitor.failpoints import failpoint
from monitor.hub import (DEFAULT_LEASE_S, HubClient, JobResult, LayoutError, Outcome, fetch_job,
                         process_pending, prune_cache, resolve_cache_dir)
from monitor.hub.queue import claim_batch, release, settle
from monitor.scoring import (ScoredRun, ScoreRequest, ScoringInterrupted, compute_score, prepare,
                             run_score_child)
from monitor.scoring.backends import ScoreJob, ScoreOutcome, ScoringBackend, estimate_memory
from monitor.scoring.engine import corpus_selection
from monitor.store import Store, utcnow

log = logging.getLogger("lstar.daemon")

# A scorer turns a leased job and its verified snapshot into a score run (not yet written).
Scorer = Callable[[dict[str, Any], Path], ScoredRun]


def score_queue(store: Store, client: HubClient | None, scorer: Scorer, *, owner: str,
                cache_dir: Path | None = None, lease_s: float = DEFAULT_LEASE_S, limit: int | None = None,
                now_fn: Callable[[], datetime] = utcnow,
                stopping: Callable[[], bool] | None = None) -> list[JobResult]:
    """Fetch and score queued checkpoints, each job exactly once; returns what happened to each.

    With `stopping` given and true before a job starts, the job's lease and attempt go back
    and the run ends (it runs after the restart).
    """
    def worker(job: dict[str, Any]) -> Outcome:
        if stopping is not None and stopping():
            raise HubError("the daemon stopped before this job started", hint="it runs after the restart")
        snapshot = fetch_job(store, job, owner=owner, client=client, cache_dir=cache_dir, now_fn=now_fn)
        scored = scorer(job, snapshot)
        failpoint("mid_score")
        result = scored.result
        return Outcome("scored", meta={"run_id": result["run_id"], "lstar": result["lstar"],
                                       "se": result["se_ce"], "corpus_sha256": result["corpus"]["sha256"]},
                       write=lambda conn: scored.write(store, conn))

    return process_pending(store, worker, owner=owner, now_fn=now_fn, lease_s=lease_s, limit=limit)


def _hub_info(job: dict[str, Any]) -> dict[str, Any]:
    return {"repo": job["repo"], "sha": job["sha"], "source": "hub"}


def score_in_process(store: Store, template: ScoreRequest) -> Scorer:
    """Score in this process with the spec of `template`."""
    def scorer(job: dict[str, Any], snapshot: Path) -> ScoredRun:
        # snapshots/<sha>/ links into the repo's blobs/: both live under the repo cache folder
        request = replace(template, model=str(snapshot), checkpoint_id=job["id"],
                          model_root=snapshot.parent.parent,
                          extra_model_info={**_hub_info(job), "path": str(snapshot)})
        return compute_score(prepare(request), store)

    return scorer


def score_in_child(template: ScoreRequest, *, state_dir: Path, timeout_s: float,
                   memory_bytes: int | None) -> Scorer:
    """Score in a child process (killed past `timeout_s` or `memory_bytes`), on a flat copy
    of the snapshot under `state_dir/tmp`."""
    def scorer(job: dict[str, Any], snapshot: Path) -> ScoredRun:
        flat = materialize_snapshot(snapshot, state_dir / "tmp" / f"checkpoint-{job['id']}")
        try:
            request = replace(template, model=str(flat), checkpoint_id=job["id"], progress=False,
                              extra_model_info={**_hub_info(job), "files_sha256_dir": str(snapshot)})
            return run_score_child(request, timeout_s=timeout_s, memory_bytes=memory_bytes,
                                   workdir=state_dir / "tmp", log_path=state_dir / "scoring.log")
        except ScoringInterrupted as exc:
            # Killed by our own shutdown: the lease and the attempt go back.
            raise HubError(f"the daemon stopped while scoring this job ({exc})",
                           hint="it runs after the restart") from None
        finally:
            shutil.rmtree(flat, ignore_errors=True)

    return scorer


def absolute_paths(template: ScoreRequest) -> ScoreRequest:
    """The request with every path made absolute: a worker may run in another directory."""
    def resolved(path: Path | None) -> Path | None:
        return Path(path).expanduser().resolve() if path is not None else None

    return replace(template, corpus_dir=resolved(template.corpus_dir),  # type: ignore[arg-type]
                   tokenizer_dir=resolved(template.tokenizer_dir),
                   reference_tokenizer=resolved(template.reference_tokenizer), progress=False)


class JobBuilder:
    """Turns a leased, fetched checkpoint into a self-contained `ScoreJob`.

    The corpus selection is read once per batch (its sha256 is what every score must be
    of); the baselines the store has for it go with each job.
    """

    def __init__(self, store: Store, template: ScoreRequest, state_dir: Path) -> None:
        self.store = store
        self.template = absolute_paths(template)
        self.state_dir = state_dir
        self._corpus_sha: str | None = None

    def corpus_sha256(self) -> str:
        if self._corpus_sha is None:
            self._corpus_sha = corpus_selection(self.template).sha256
        return self._corpus_sha

    def build(self, job: dict[str, Any], snapshot: Path) -> tuple[ScoreJob, Path]:
        """The job, and the flat copy of its snapshot (removed by the caller when done)."""
        corpus_sha = self.corpus_sha256()
        flat = materialize_snapshot(snapshot, self.state_dir / "tmp" / f"checkpoint-{job['id']}")
        request = replace(self.template, model=str(flat), checkpoint_id=job["id"],
                          extra_model_info={**_hub_info(job), "files_sha256_dir": str(snapshot)})
        try:
            memory = estimate_memory(flat, dtype=request.dtype, device=request.device)
        except (LayoutError, OSError):
            memory = None   # the loader refuses such a checkpoint with the reason
        score_job = ScoreJob(checkpoint_id=job["id"], repo=job["repo"], sha=job["sha"], request=request,
                             corpus_sha256=corpus_sha, memory_bytes=memory,
                             baselines=tuple(self.store.baselines_for_corpus(corpus_sha)))
        return score_job, flat


def _raising(exc: BaseException) -> Callable[[], Outcome]:
    def work() -> Outcome:
        raise exc
    return work


def outcome_to_queue(store: Store, outcome: ScoreOutcome) -> Outcome:
    """A backend's outcome as the queue's: the score's rows to write, or its error raised."""
    if outcome.error is not None and outcome.error.error_class == "ScoringInterrupted":
        # Killed by our own shutdown: the lease and the attempt go back.
        raise HubError(f"the daemon stopped while scoring this job ({outcome.error.message})",
                       hint="it runs after the restart")
    scored = outcome.unwrap()
    failpoint("mid_score")
    result = scored.result
    return Outcome("scored", meta={"run_id": result["run_id"], "lstar": result["lstar"],
                                   "se": result["se_ce"], "corpus_sha256": result["corpus"]["sha256"],
                                   "baseline": scored.baseline_source,
                                   **({"worker": outcome.worker} if outcome.worker else {})},
                   write=lambda conn: scored.write(store, conn))


def _give_back(store: Store, job: dict[str, Any], owner: str, reason: str,
               now_fn: Callable[[], datetime]) -> JobResult:
    """Return a job's lease and its attempt: it did not run, through no fault of its own."""
    held = release(store, job["id"], owner, reason, now=now_fn(), refund=True) is not None
    row = store.get_checkpoint(job["id"]) or {"status": "gone", "reason": None}
    return JobResult(job["id"], job["repo"], job["sha"], job["attempts"], row["status"], row["reason"],
                     lease_lost=not held)


def score_queue_on(store: Store, client: HubClient | None, backend: ScoringBackend, template: ScoreRequest,
                   *, owner: str, state_dir: Path, cache_dir: Path | None = None,
                   lease_s: float = DEFAULT_LEASE_S, limit: int | None = None,
                   now_fn: Callable[[], datetime] = utcnow,
                   stopping: Callable[[], bool] | None = None) -> list[JobResult]:
    """Lease up to `limit` queued checkpoints, fetch them, score them together on `backend`.

    Each outcome is written with its lease's completion as it arrives, so a job completes
    exactly once whatever the backend does; a job whose worker died goes back to the queue
    (at most three attempts in all). When the Hub goes down or the daemon stops before a
    job is handed over, that job's lease and attempt go back.
    """
    claimed = claim_batch(store, owner, now_fn=now_fn, lease_s=lease_s, limit=limit)
    builder = JobBuilder(store, template, state_dir)
    results: list[JobResult] = []
    ready: dict[int, tuple[dict[str, Any], Path]] = {}
    jobs: list[ScoreJob] = []
    hub_down = False
    try:
        for job in claimed:
            if hub_down or (stopping is not None and stopping()):
                why = "the Hub is down" if hub_down else "the daemon stopped before this job started"
                results.append(_give_back(store, job, owner, f"waiting: {why}", now_fn))
                continue
            try:
                snapshot = fetch_job(store, job, owner=owner, client=client, cache_dir=cache_dir, now_fn=now_fn)
                score_job, flat = builder.build(job, snapshot)
            except Exception as exc:  # settle classifies it: retry, fail, skip, or the Hub is down
                result, hub_down = settle(store, job, owner, _raising(exc), now_fn=now_fn)
                results.append(result)
                continue
            ready[job["id"]] = (job, flat)
            jobs.append(score_job)
        try:
            for outcome in backend.run(jobs):
                job, flat = ready.pop(outcome.job.checkpoint_id)  # type: ignore[arg-type]
                shutil.rmtree(flat, ignore_errors=True)
                result, _ = settle(store, job, owner, lambda outcome=outcome: outcome_to_queue(store, outcome),
                                   now_fn=now_fn)
                results.append(result)
        except Exception as exc:  # the backend itself failed (a lost cluster): not the jobs' fault
            reason = f"the scoring backend failed: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
            log.warning("%s; %d job(s) go back to the queue", reason, len(ready))
            for job, _ in list(ready.values()):
                results.append(_give_back(store, job, owner, reason, now_fn))
            ready.clear()
    finally:
        for _, flat in ready.values():
            shutil.rmtree(flat, ignore_errors=True)
    store.checkpoint()
    return results


def prune_after_scoring(store: Store, *, cache_dir: Path | None, keep_last: int | None,
                        max_bytes: int | None) -> None:
    """Prune the Hub cache to `keep_last` / `max_bytes` (no pruning when `keep_last` is None);
    a failure is logged, not raised."""
    if keep_last is None:
        return
    try:
        report = prune_cache(store, resolve_cache_dir(cache_dir), keep_last=keep_last, max_bytes=max_bytes)
    except OSError as exc:
        log.warning("pruning the Hub cache failed (retried after the next scoring run): %s", exc)
        return
    if report.removed:
        log.info("pruned the Hub cache: removed %d checkpoint(s), %d bytes freed; kept %s",
                 len(report.removed), report.freed_bytes, ", ".join(report.kept) or "none")


def materialize_snapshot(snapshot: Path, dest: Path) -> Path:
    """The verified snapshot as a self-contained folder of regular files.

    A Hub cache snapshot is links into `blobs/`, which the loader refuses (nothing it loads
    may resolve outside the checkpoint folder). Hard links cost no space; across file
    systems the files are copied.
    """
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    for entry in sorted(snapshot.rglob("*")):
        if entry.is_dir():
            continue
        target = dest / entry.relative_to(snapshot)
        target.parent.mkdir(parents=True, exist_ok=True)
        real = entry.resolve()
        try:
            os.link(real, target)
        except OSError:
            shutil.copyfile(real, target)
    return dest
