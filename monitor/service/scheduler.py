"""The scheduler, only a clock: UTC interval jobs that coalesce, never overlap, and run late
rather than not at all (docs/reliability.md)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any


def build_scheduler(intervals: dict[str, float], *, blocking: bool = False, executor: Any = None):
    """A UTC scheduler with the job defaults docs/reliability.md asks for.

    `misfire_grace_time` is the longest interval (and per job its own interval), so a late
    run still runs; `coalesce` folds a backlog into one run; `max_instances=1` never
    overlaps a job with itself.
    """
    from apscheduler.executors.pool import ThreadPoolExecutor
    from apscheduler.schedulers.background import BackgroundScheduler
    from apscheduler.schedulers.blocking import BlockingScheduler

    grace = max(1, int(max(intervals.values(), default=60)))
    cls = BlockingScheduler if blocking else BackgroundScheduler
    return cls(timezone=timezone.utc,
               executors={"default": executor or ThreadPoolExecutor(max_workers=len(intervals) + 2)},
               job_defaults={"misfire_grace_time": grace, "coalesce": True, "max_instances": 1})


def add_interval_job(scheduler: Any, name: str, fn: Callable[[], None], seconds: float,
                     first_run: datetime | None) -> None:
    """An interval job in UTC whose misfire grace is one whole interval."""
    from apscheduler.triggers.interval import IntervalTrigger

    scheduler.add_job(fn, IntervalTrigger(seconds=seconds, timezone=timezone.utc), id=name, name=name,
                      misfire_grace_time=max(1, int(seconds)), next_run_time=first_run)
