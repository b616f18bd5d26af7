"""Where scoring runs: the backend seam between the daemon's queue and the forward passes.

`make_backend("local")` (the default) scores each job in a child process beside the daemon
(`workers=N`: on a pool of N warm scoring children, `WarmBackend`; 0: a fresh child per job);
`make_backend("ray", address=...)` scores jobs as tasks on a Ray cluster (Ray is an optional
extra, imported only here). Either way the daemon stays the only writer of the database:
a backend takes `ScoreJob`s and yields `ScoreOutcome`s, and the queue writes the rows.
"""

from __future__ import annotations

from typing import Any

from monitor.errors import SpecError
from monitor.scoring.backends.base import ScoreError, ScoreJob, ScoreOutcome, ScoringBackend
from monitor.scoring.backends.local import LocalBackend
from monitor.scoring.backends.placement import estimate_memory, gpus_needed
from monitor.scoring.backends.warm import WarmBackend

BACKENDS = ("local", "ray")


def make_backend(name: str = "local", **config: Any) -> ScoringBackend:
    """The backend called `name` with its options (see `LocalBackend`, `WarmBackend` and
    `RayBackend`). For `local`, `workers` (default 0) above 0 gives the warm pool, with
    `max_jobs` and `max_rss_bytes`; 0 a fresh child process per job."""
    if name == "local":
        workers = config.pop("workers", 0) or 0
        warm_options = {k: config.pop(k) for k in ("max_jobs", "max_rss_bytes") if k in config}
        if workers > 0:
            return WarmBackend(workers=workers, **warm_options, **config)
        return LocalBackend(**config)
    if name == "ray":
        from monitor.scoring.backends.ray import RayBackend  # imports ray: only when asked for

        return RayBackend(**config)
    raise SpecError(f"unknown scoring backend {name!r}", hint=f"use one of: {', '.join(BACKENDS)}")


def check_ray_installed() -> None:
    """Raise a clear error (how to install it) when the ray package cannot be imported."""
    from monitor.scoring.backends.ray import import_ray

    import_ray()


__all__ = ["BACKENDS", "check_ray_installed", "LocalBackend", "ScoreError", "ScoreJob", "ScoreOutcome", "ScoringBackend",
           "WarmBackend", "estimate_memory", "gpus_needed", "make_backend"]
