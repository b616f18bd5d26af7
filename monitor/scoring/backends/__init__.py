"""Where scoring runs: the backend seam between the daemon's queue and the forward passes.

`make_backend("local")` (the default) scores each job in a child process beside the daemon;
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

BACKENDS = ("local", "ray")


def make_backend(name: str = "local", **config: Any) -> ScoringBackend:
    """The backend called `name` with its options (see `LocalBackend` and `RayBackend`)."""
    if name == "local":
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
           "estimate_memory", "gpus_needed", "make_backend"]
