"""What the local API reads of the daemon: a small interface the daemon implements, so the API
never imports the daemon (and the daemon imports the API to serve it)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Protocol


class ApiConfig(Protocol):
    """The daemon's settings the API uses."""

    state_dir: Path
    policies_dir: Path
    webhook_secret_file: Path | None


class Metrics(Protocol):
    def render(self) -> bytes:
        """The Prometheus text exposition."""


class DaemonView(Protocol):
    """The daemon as the API sees it (`monitor.service.daemon.Daemon` implements it).

    `health`, `metrics.render` and `status` are called from the API's worker threads;
    `read_store`/`job_store` hand each call a store on a cursor of its own.
    """

    config: ApiConfig
    metrics: Metrics

    def health(self) -> tuple[bool, list[str]]:
        """(healthy, reasons) from in-memory state."""

    def status(self) -> dict[str, Any]:
        """What /status answers."""

    def policies(self) -> list[Any]:
        """The policies in force."""

    def read_store(self) -> contextlib.AbstractContextManager[Any]:
        """A read-only store on a fresh cursor."""

    def job_store(self) -> contextlib.AbstractContextManager[Any]:
        """A writable store on a fresh cursor."""

    def request_poll(self) -> None:
        """Poll the Hub as soon as possible."""


__all__ = ["DaemonView", "ApiConfig", "Metrics"]
