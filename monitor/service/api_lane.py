"""The reserved lane of the daemon's local API: `/health` and `/metrics` answered while every
general worker is busy, whatever other clients on the machine do.

A connection that arrives when the general workers are all taken is not refused at once: one
thread watches up to `capacity` such connections together, without blocking on any, until
its request head has arrived, for `timeout` seconds at most. A GET or HEAD of a reserved path
is then served by a small pool of its own (one request, then the connection closes); anything
else, a head that is late or too large, or a full lane gets the busy answer (503). Since the
lane waits on no client with a thread, slow clients cannot fill its workers: only whole
reserved requests reach them, and a client that sends nothing holds a place for `timeout`.
"""

from __future__ import annotations

import contextlib
import logging
import selectors
import socket
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlsplit

log = logging.getLogger("lstar.api")

MAX_HEAD_BYTES = 16 << 10   # a probe's request head is a few hundred bytes
RESERVED_METHODS = ("GET", "HEAD")


class _Waiting:
    """A connection whose request head is still arriving."""

    __slots__ = ("sock", "address", "deadline", "data")

    def __init__(self, sock: socket.socket, address: Any, deadline: float) -> None:
        self.sock = sock
        self.address = address
        self.deadline = deadline
        self.data = bytearray()


def head_complete(data: bytes | bytearray) -> bool:
    """Whether `data` holds a whole request head (a blank line ends it, CRLF or bare LF)."""
    return b"\n\r\n" in data or b"\n\n" in data


class ReservedLane:
    """Serves GET/HEAD of `paths` on connections the general workers had no room for.

    `serve(sock, address, head)` answers a connection whose head (with whatever followed it)
    has been read; `refuse(sock)` sends the busy answer and closes. Both own the socket.
    """

    def __init__(self, paths: Iterable[str], *, serve: Callable[[socket.socket, Any, bytes], None],
                 refuse: Callable[[socket.socket], None], workers: int = 2, timeout: float = 2.0,
                 capacity: int = 64) -> None:
        self.paths = frozenset(paths)
        self.serve = serve
        self.refuse = refuse
        self.timeout = timeout
        self.capacity = capacity
        self.slots = threading.BoundedSemaphore(workers)
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="lstar-api-reserved")
        self.selector = selectors.DefaultSelector()
        self.wake_r, self.wake_w = socket.socketpair()
        self.wake_r.setblocking(False)
        self.wake_w.setblocking(False)
        self.selector.register(self.wake_r, selectors.EVENT_READ, None)
        self.lock = threading.Lock()
        self.arrivals: list[_Waiting] = []
        self.held = 0          # arrivals and waiting connections together (under `lock`)
        self.closed = False
        self.waiting: dict[socket.socket, _Waiting] = {}   # the lane's thread alone touches it
        self.thread = threading.Thread(target=self._run, name="lstar-api-lane", daemon=True)
        self.thread.start()

    def admits(self, method: str, target: str) -> bool:
        """Whether a request for `target` by `method` is one the lane serves."""
        return method in RESERVED_METHODS and urlsplit(target).path in self.paths

    def offer(self, sock: socket.socket, address: Any) -> None:
        """Take a connection the general workers have no room for (called by the accepting thread)."""
        with self.lock:
            taken = not self.closed and self.held < self.capacity
            if taken:
                self.held += 1
                self.arrivals.append(_Waiting(sock, address, time.monotonic() + self.timeout))
        if not taken:
            self.refuse(sock)
            return
        with contextlib.suppress(OSError):  # BlockingIOError: a wake-up is already pending
            self.wake_w.send(b"\0")

    def close(self) -> None:
        """Stop watching: waiting connections are closed unanswered, running answers finish."""
        with self.lock:
            self.closed = True
            arrivals, self.arrivals = self.arrivals, []
        with contextlib.suppress(OSError):
            self.wake_w.send(b"\0")
        for waiting in arrivals:
            waiting.sock.close()
        self.pool.shutdown(wait=False, cancel_futures=True)

    # -- the lane's thread ---------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while True:
                with self.lock:
                    if self.closed:
                        return
                    arrivals, self.arrivals = self.arrivals, []
                try:
                    self._step(arrivals)
                except Exception:  # noqa: BLE001 - the lane must outlive one connection's surprise
                    log.warning("the API's reserved lane failed a step", exc_info=True)
                    time.sleep(0.1)  # a failure that repeats must not spin
        finally:
            for waiting in list(self.waiting.values()):
                self._detach(waiting)
                waiting.sock.close()
            self.selector.close()
            self.wake_r.close()
            self.wake_w.close()

    def _step(self, arrivals: list[_Waiting]) -> None:
        """Watch the new arrivals, refuse the late, read what came (waiting for it a second at most)."""
        for waiting in arrivals:
            self._watch(waiting)
        now = time.monotonic()
        for waiting in [w for w in self.waiting.values() if w.deadline <= now]:
            self._end(waiting)
        first = min((w.deadline for w in self.waiting.values()), default=now + 1.0)
        for key, _ in self.selector.select(max(0.0, min(first - now, 1.0))):
            if key.data is None:
                with contextlib.suppress(OSError):
                    self.wake_r.recv(4096)
            else:
                self._read(key.data)

    def _watch(self, waiting: _Waiting) -> None:
        try:
            waiting.sock.setblocking(False)
            self.selector.register(waiting.sock, selectors.EVENT_READ, waiting)
        except (OSError, ValueError):  # closed meanwhile
            self._release()
            waiting.sock.close()
            return
        self.waiting[waiting.sock] = waiting

    def _read(self, waiting: _Waiting) -> None:
        try:
            chunk = waiting.sock.recv(1 << 12)
        except BlockingIOError:
            return
        except OSError:
            self._detach(waiting)
            waiting.sock.close()
            return
        if not chunk:  # the client stopped sending before its head was whole
            self._end(waiting)
            return
        waiting.data += chunk
        if not head_complete(waiting.data):
            if len(waiting.data) > MAX_HEAD_BYTES:
                self._end(waiting)
            return
        self._detach(waiting)
        words = bytes(waiting.data).split(b"\n", 1)[0].decode("latin-1").split()
        if len(words) == 3 and self.admits(words[0], words[1]) and self.slots.acquire(blocking=False):
            try:
                self.pool.submit(self._serve, waiting)
                return
            except RuntimeError:  # the pool is shutting down
                self.slots.release()
        self.refuse(waiting.sock)

    def _serve(self, waiting: _Waiting) -> None:
        try:
            self.serve(waiting.sock, waiting.address, bytes(waiting.data))
        finally:
            self.slots.release()

    def _end(self, waiting: _Waiting) -> None:
        """Late, too large, cut short: the busy answer."""
        self._detach(waiting)
        self.refuse(waiting.sock)

    def _detach(self, waiting: _Waiting) -> None:
        if self.waiting.pop(waiting.sock, None) is None:
            return
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(waiting.sock)
        self._release()

    def _release(self) -> None:
        with self.lock:
            self.held -= 1


__all__ = ["ReservedLane", "head_complete", "MAX_HEAD_BYTES"]
