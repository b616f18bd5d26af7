"""An HTTP server on 127.0.0.1 served from a daemon thread: the lifecycle the daemon's local
API and the demo's webhook receiver share (start, stop, the URL it answers on)."""

from __future__ import annotations

import threading
from socketserver import BaseServer
from typing import Any, TypeVar

Self = TypeVar("Self", bound="ServedInThread")


class ServedInThread:
    """`server` served by `serve_forever` in a daemon thread named `name`.

    `path` is appended to the URL (a receiver that answers on one path names it there).
    """

    path = ""

    def __init__(self, server: BaseServer, *, name: str, poll_interval: float = 0.5) -> None:
        self.server: Any = server
        self.thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": poll_interval},
                                       name=name, daemon=True)

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}{self.path}"

    def start(self: Self) -> Self:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self: Self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
