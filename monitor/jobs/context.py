"""What a job needs of the daemon that runs it: `JobContext`, which
`monitor.service.daemon.Daemon` implements, so the jobs never import the daemon (as the API
reads it through `monitor.service.daemon_view.DaemonView`)."""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path
from typing import Any, Protocol


class JobConfig(Protocol):
    """The daemon settings the jobs read (`monitor.service.daemon.DaemonConfig`)."""

    state_dir: Path
    cache_dir: Path | None
    template: Any                 # the ScoreRequest every score starts from
    scoring_backend: str          # local | ray
    scoring_mode: str             # full | sequential
    score_batch: int
    score_timeout: float
    score_memory: int | None
    cache_keep: int | None
    cache_max_bytes: int | None
    retention: float

    @property
    def lease_s(self) -> float:
        """How long a lease on a queued job lasts."""


class JobContext(Protocol):
    """The daemon as its jobs see it.

    `job_memory` keeps what a job remembers from one run to the next (the problems it has
    already logged, so each is logged once); it lives as long as the process.
    """

    config: JobConfig
    owner: str                    # the lease owner of this daemon start
    metrics: Any                  # monitor.service.metrics.DaemonMetrics
    stopping: threading.Event
    job_memory: dict[str, Any]

    def policies(self) -> list[Any]:
        """The policies in force."""

    def job_store(self) -> contextlib.AbstractContextManager[Any]:
        """A writable store on a fresh cursor of its own."""

    def hub_client(self, store: Any) -> Any:
        """A Hub client with the daemon's retry policy, keeping its circuit state in `store`."""

    def scoring_backend(self) -> Any:
        """The scoring backend (`--scoring-backend`), made on first use."""

    def nudge(self, name: str) -> None:
        """Run job `name` as soon as possible (its schedule stays as it was)."""


__all__ = ["JobConfig", "JobContext"]
