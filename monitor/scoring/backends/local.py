"""The `local` backend: each job in a child process beside the daemon (`monitor.scoring.child`).

One job at a time, bounded by the child's time and address-space limits; the daemon's
`--scoring-workers 0`. By default the daemon keeps its scoring children warm between jobs
instead (`monitor.scoring.backends.warm`), with the same limits per job.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable, Iterator
from pathlib import Path

from monitor.errors import CorpusError
from monitor.scoring.backends.base import ScoreError, ScoreJob, ScoreOutcome, workdir_default
from monitor.scoring.child import kill_active_children, run_score_child
from monitor.scoring.engine import ScoredRun


def check_corpus(job: ScoreJob, scored: ScoredRun) -> None:
    """Refuse a score of another corpus selection than the one the job expects (the worker
    read a corpus folder that differs from the daemon's)."""
    got = scored.run_row.get("corpus_sha256")
    if job.corpus_sha256 is not None and got != job.corpus_sha256:
        raise CorpusError(f"the worker scored corpus selection {str(got)[:12]} but the job expects "
                          f"{job.corpus_sha256[:12]}",
                          hint="the corpus folder differs between the daemon and the worker; make them the same")


def score_job(job: ScoreJob, *, timeout_s: float, memory_bytes: int | None, workdir: Path,
              log_path: Path | None = None) -> ScoreOutcome:
    """Score one job in a child process; every failure becomes the outcome's error."""
    worker = f"{socket.gethostname()}:{os.getpid()}"
    try:
        scored = run_score_child(job.request, timeout_s=timeout_s, memory_bytes=memory_bytes,
                                 workdir=workdir, log_path=log_path, baselines=job.baselines)
        check_corpus(job, scored)
    except Exception as exc:  # the queue classifies it (retry, fail, skip) from its class
        return ScoreOutcome(job, error=ScoreError.from_exception(exc), worker=worker)
    return ScoreOutcome(job, scored=scored, worker=worker)


class LocalBackend:
    """Scores jobs one after another in child processes of this process."""

    name = "local"
    concurrency = 1

    def __init__(self, *, timeout_s: float = 3600.0, memory_bytes: int | None = None,
                 workdir: str | Path | None = None, log_path: str | Path | None = None) -> None:
        self.timeout_s = timeout_s
        self.memory_bytes = memory_bytes
        self.workdir = Path(workdir) if workdir is not None else workdir_default()
        self.log_path = Path(log_path) if log_path is not None else None

    def run(self, jobs: Iterable[ScoreJob]) -> Iterator[ScoreOutcome]:
        """Score `jobs` in order, yielding each outcome as soon as it is known."""
        for job in jobs:
            yield score_job(job, timeout_s=self.timeout_s, memory_bytes=self.memory_bytes,
                            workdir=self.workdir, log_path=self.log_path)

    def interrupt(self) -> int:
        """Kill the scoring children of this process; their jobs end `ScoringInterrupted`."""
        return kill_active_children()

    def close(self) -> None:
        """Nothing to release: every child has exited when its job's outcome was yielded."""
