"""A stand-in daemon for the status page: what the API reads of a daemon (`DaemonView`), over a
real store (each read on a cursor of its own, as the daemon's are) and the policies given."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

LAST_POLL = "2025-03-01T18:55:00+00:00"


class StatusDaemon:
    def __init__(self, store: Any, policies: list[Any], folder: Path, *, healthy: bool = True,
                 reasons: tuple[str, ...] = ()) -> None:
        self.store = store
        self._policies = policies
        self.config = SimpleNamespace(state_dir=folder, policies_dir=folder, webhook_secret_file=None)
        self.metrics = SimpleNamespace(render=lambda: b"")
        self.healthy, self.reasons = healthy, list(reasons)

    def health(self) -> tuple[bool, list[str]]:
        return self.healthy, self.reasons

    def status(self) -> dict[str, Any]:
        with self.read_store() as store:
            counts = store.checkpoint_counts()
        return {"checkpoints": counts, "hub_outages": [],
                "jobs": {"poll": {"runs": 3, "failures": 0, "last_start": LAST_POLL, "last_success": LAST_POLL,
                                  "last_error": None, "next_run": None}}}

    def policies(self) -> list[Any]:
        return list(self._policies)

    @contextlib.contextmanager
    def read_store(self) -> Iterator[Any]:
        from monitor.store import Store

        store = Store(self.store.cursor(), self.store.path, read_only=True)
        try:
            yield store
        finally:
            store.conn.close()

    job_store = read_store

    def request_poll(self) -> None:
        pass


__all__ = ["StatusDaemon", "LAST_POLL"]
