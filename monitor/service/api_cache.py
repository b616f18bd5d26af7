"""One render shared by every concurrent request for it: the API's `/metrics`.

Prometheus text is rendered from the daemon's database (two aggregate queries). Rendered once
per request on a pool of two threads, a few hundred clients pipelining scrapes would queue a
real scrape behind thousands of renders. `SharedRender` runs at most one render at a time;
every request that arrives while it runs waits for that one, and a render less than `max_age`
seconds old is served as it is. However many scrapes come, the database sees at most one
render in flight and about one a second, and a scrape waits at most for one render.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

log = logging.getLogger("lstar.api")

MAX_AGE = 1.0   # seconds a render is served again; a scrape interval is 15 s or more


class SharedRender:
    """`get()`: the latest render, if under `max_age` seconds old, else the one in progress,
    else a new one by `render()` (an async callable). Used from the event loop only."""

    def __init__(self, render: Callable[[], Awaitable[bytes]], *, max_age: float = MAX_AGE) -> None:
        self.render = render
        self.max_age = max_age
        self.value: bytes | None = None
        self.rendered_at = 0.0
        self.in_flight: asyncio.Future[bytes] | None = None
        self.renders = 0

    async def get(self) -> bytes:
        if self.value is not None and time.monotonic() - self.rendered_at < self.max_age:
            return self.value
        if self.in_flight is None:
            self.in_flight = asyncio.ensure_future(self._render())
            # Read the outcome even when every waiter has gone, so a failed render is not
            # reported as "Future exception was never retrieved" with its cause lost.
            self.in_flight.add_done_callback(_retrieve)
        # Shielded: a waiter that goes away does not cancel the render the others wait for.
        return await asyncio.shield(self.in_flight)

    async def _render(self) -> bytes:
        try:
            started = time.monotonic()
            value = await self.render()
            self.renders += 1
            self.value, self.rendered_at = value, started
            return value
        finally:
            self.in_flight = None


def _retrieve(future: asyncio.Future[bytes]) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.warning("the /metrics render failed: %s", future.exception())


__all__ = ["SharedRender", "MAX_AGE"]
