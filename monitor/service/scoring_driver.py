"""The daemon's scoring step: lease a queued checkpoint, fetch it, score it in a child process.

The queue (`monitor.hub.queue.process_pending`) gives each job a lease and at most three
attempts. Here the worker downloads the pinned snapshot in the daemon (the fetch status is
written by the daemon), scores it in `monitor.scoring.child` (which never opens the
database), and hands the rows back so that the run and the lease's completion are written
in one transaction. The same fetch-then-score steps as `engine.score_pending`, with the
forward passes moved out of the daemon's process. After a run that finished jobs, the Hub
cache is pruned to the configured policy (`monitor.hub.cache_prune`).
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from monitor.errors import HubError
from monitor.failpoints import failpoint
from monitor.hub import Outcome, fetch_job, process_pending, prune_cache, resolve_cache_dir
from monitor.scoring import ScoringInterrupted, run_score_child
from monitor.store import Store

log = logging.getLogger("lstar.daemon")

if TYPE_CHECKING:
    from monitor.hub import JobResult
    from monitor.service.daemon import Daemon


def score_next(daemon: "Daemon", store: Store) -> list["JobResult"]:
    """Fetch and score up to `score_batch` queued checkpoints; returns what happened to each."""
    cfg = daemon.config
    client = daemon.hub_client(store)

    def worker(job: dict[str, Any]) -> Outcome:
        if daemon.stopping.is_set():
            # Hands the lease back with its attempt refunded, and ends this batch.
            raise HubError("the daemon stopped before this job started", hint="it runs after the restart")
        snapshot = fetch_job(store, job, owner=daemon.owner, client=client, cache_dir=cfg.cache_dir)
        flat = materialize_snapshot(snapshot, cfg.state_dir / "tmp" / f"checkpoint-{job['id']}")
        try:
            request = replace(cfg.template, model=str(flat), checkpoint_id=job["id"], progress=False,
                              extra_model_info={"repo": job["repo"], "sha": job["sha"], "source": "hub",
                                                "files_sha256_dir": str(snapshot)})
            scored = run_score_child(request, timeout_s=cfg.score_timeout, memory_bytes=cfg.score_memory,
                                     workdir=cfg.state_dir / "tmp", log_path=cfg.state_dir / "scoring.log")
        except ScoringInterrupted as exc:
            # Killed by our own shutdown: the lease and the attempt go back.
            raise HubError(f"the daemon stopped while scoring this job ({exc})",
                           hint="it runs after the restart") from None
        finally:
            shutil.rmtree(flat, ignore_errors=True)
        failpoint("mid_score")
        result = scored.result
        return Outcome("scored", meta={"run_id": result["run_id"], "lstar": result["lstar"],
                                       "se": result["se_ce"], "corpus_sha256": result["corpus"]["sha256"]},
                       write=lambda conn: scored.write(store, conn))

    results = process_pending(store, worker, owner=daemon.owner, lease_s=cfg.lease_s, limit=cfg.score_batch)
    if any(r.status in ("scored", "skipped", "failed") for r in results):
        prune_after_scoring(daemon, store)
    return results


def prune_after_scoring(daemon: "Daemon", store: Store) -> None:
    """Prune the Hub cache to `--cache-keep` / `--cache-max-bytes`; a failure is logged, not raised."""
    cfg = daemon.config
    if cfg.cache_keep is None:
        return
    try:
        report = prune_cache(store, resolve_cache_dir(cfg.cache_dir), keep_last=cfg.cache_keep,
                             max_bytes=cfg.cache_max_bytes)
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
