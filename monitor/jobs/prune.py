"""The prune job: delete the log-like rows (Hub polls, delivery attempts, ...) older than the
retention (`Store.prune_logs`); a row moves from kept to deleted, nothing else changes.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Protocol

from monitor.jobs.context import JobContext
from monitor.store import utcnow

log = logging.getLogger("lstar.daemon")


class PruneStore(Protocol):
    """The retention of the log tables."""

    def checkpoint(self) -> None: ...
    def prune_logs(self, cutoff: datetime) -> dict[str, int]: ...


def prune(store: PruneStore, cutoff: datetime) -> dict[str, int]:
    """Delete the log rows older than `cutoff`; the rows deleted per table."""
    deleted = store.prune_logs(cutoff)
    if any(deleted.values()):
        store.checkpoint()
        log.info("pruned rows older than %s: %s", cutoff.isoformat(),
                 ", ".join(f"{n} {table}" for table, n in deleted.items() if n))
    return deleted


def run(ctx: JobContext) -> dict[str, int]:
    """Delete log rows older than the retention."""
    cutoff = utcnow() - timedelta(seconds=ctx.config.retention)
    with ctx.job_store() as store:
        return prune(store, cutoff)


__all__ = ["PruneStore", "prune", "run"]
