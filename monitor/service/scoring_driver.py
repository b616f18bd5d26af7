"""Driving the scoring queue: lease a gated checkpoint, fetch it verified, score it, complete it.

The queue (`monitor.hub.queue.process_pending`) gives each job a lease and at most three
attempts. `score_queue` downloads the pinned snapshot (recording the fetch), hands it to a
scorer, and writes the score run and the lease's completion in one transaction, so a job
completes exactly once. Two scorers:

- `score_in_process` runs the forward passes here (`lstar score --pending`);
- `score_in_child` runs them in `monitor.scoring.child`, which never opens the database, so
  a model that eats all memory or never finishes cannot take the daemon down.

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
from monitor.hub import (DEFAULT_LEASE_S, HubClient, JobResult, Outcome, fetch_job, process_pending,
                         prune_cache, resolve_cache_dir)
from monitor.scoring import (ScoredRun, ScoreRequest, ScoringInterrupted, compute_score, prepare,
                             run_score_child)
from monitor.store import Store, utcnow
from monitor.store.rows import CheckpointRow

log = logging.getLogger("lstar.daemon")

# A scorer turns a leased job and its verified snapshot into a score run (not yet written).
Scorer = Callable[[CheckpointRow, Path], ScoredRun]


def score_queue(store: Store, client: HubClient | None, scorer: Scorer, *, owner: str,
                cache_dir: Path | None = None, lease_s: float = DEFAULT_LEASE_S, limit: int | None = None,
                now_fn: Callable[[], datetime] = utcnow,
                stopping: Callable[[], bool] | None = None) -> list[JobResult]:
    """Fetch and score queued checkpoints, each job exactly once; returns what happened to each.

    With `stopping` given and true before a job starts, the job's lease and attempt go back
    and the run ends (it runs after the restart).
    """
    def worker(job: CheckpointRow) -> Outcome:
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


def _hub_info(job: CheckpointRow) -> dict[str, Any]:
    return {"repo": job.repo, "sha": job.sha, "source": "hub"}


def score_in_process(store: Store, template: ScoreRequest) -> Scorer:
    """Score in this process with the spec of `template`."""
    def scorer(job: CheckpointRow, snapshot: Path) -> ScoredRun:
        # snapshots/<sha>/ links into the repo's blobs/: both live under the repo cache folder
        request = replace(template, model=str(snapshot), checkpoint_id=job.id,
                          model_root=snapshot.parent.parent,
                          extra_model_info={**_hub_info(job), "path": str(snapshot)})
        return compute_score(prepare(request), store)

    return scorer


def score_in_child(template: ScoreRequest, *, state_dir: Path, timeout_s: float,
                   memory_bytes: int | None) -> Scorer:
    """Score in a child process (killed past `timeout_s` or `memory_bytes`), on a flat copy
    of the snapshot under `state_dir/tmp`."""
    def scorer(job: CheckpointRow, snapshot: Path) -> ScoredRun:
        flat = materialize_snapshot(snapshot, state_dir / "tmp" / f"checkpoint-{job.id}")
        try:
            request = replace(template, model=str(flat), checkpoint_id=job.id, progress=False,
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
