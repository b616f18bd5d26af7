"""The connection-level guard of the daemon's local API: uvicorn's h11 protocol with the few
guarantees uvicorn does not give (docs/architecture.md, "The local API").

h11 parses every request (the framing authority); uvicorn runs the ASGI app. What this adds:

- **Waiting costs nothing but a socket.** A connection holds no worker while it waits for a
  request: it lives on the event loop, and a handler slot (`api_guard.HandlerSlots`) is taken
  only once a whole request head has arrived and is dispatched. Thousands of idle or
  trickling connections therefore cannot keep `/health` from its answer.
- **A bound on open connections** (`max_connections`, sized to the process's descriptor
  limit by `fit_connection_bound`). Every connection not being served is in
  `ConnectionLimits.waiting`, and at the bound a new connection closes its first: one
  already answered and closing, else the one that has waited longest for its request. The
  wait starts when the connection opens or its last answer is written, and bytes trickling
  in do not restart it, so a client cannot make its connections look fresh. A connection
  whose request is being served is never closed for room, nor one that has waited less than
  `MIN_WAIT` (it gets to send its request); when none qualifies, the newcomer gets the busy
  answer (503, Retry-After) and counts against the bound while it lingers.
- **A whole-request deadline.** uvicorn times out idle keep-alive connections only; a client
  that opens a connection and sends nothing, or a request head a byte at a time, is never
  timed out. Here a request (head and body) must arrive within `idle_timeout` of the moment
  the server starts waiting for it, and a connection lives `lifetime` seconds and
  `max_requests` answers at most. At a deadline an answer the client has not read is
  dropped (`abort()`; `close()` would wait for the read for ever).
- **A lifetime never cuts an answer the server is still producing.** The lifetime is there
  to drop clients that hold a connection, not to bound how long an answer takes (a week's
  report at 10^4 checkpoints on a loaded machine can take longer). When it ends during an
  answer, the connection closes after that answer.
- **A client must keep reading an answer in progress.** From the moment a request is
  dispatched until its answer is whole, the connection is checked every `idle_timeout`, and
  aborted when the client has not read what was already sent at the previous check (it
  stalls, or reads slower than about 64 KiB, uvicorn's write buffer, per `idle_timeout`). A
  streamed answer (`/report`) holds a handler slot and its data until it is written, so a
  client that stops reading one must not keep them until the lifetime ends. A server still
  computing, with nothing unread, is left to finish.
- **An answer never leaves a body unread on an open connection.** An answer that starts
  before the request's body is read says `Connection: close` (`RequestGuard`), and the
  connection lingers as after a refusal: without this, a client announcing a body it never
  sends would hold a connection that is neither served nor waiting, beyond the bound's
  reach, until the deadline.
- **A framing screen.** Before h11 sees a request head, its `Content-Length` must be one run
  of ASCII digits and `Transfer-Encoding` absent (`api_guard.body_length`): h11 would accept
  `12, 12` and chunked bodies, and would answer a malformed length, or a head over 16 KiB,
  with a plain-text 400 that does not say what was wrong. A refused request's body is never
  read: the answer is sent, the connection half-closed and what the client still sends
  dropped (bounded), then closed. Empty lines before a request line are skipped (RFC 9112
  section 2.2), as h11 would refuse them.

Heads are handed to h11 one at a time, and a body exactly as long as h11 framed it, so each
pipelined request passes the screen too.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import resource
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from monitor.service.api_guard import CLOSE_KEY, RequestRefused, body_length

log = logging.getLogger("lstar.api")

MAX_HEAD_BYTES = 16 << 10        # a request head; h11 refuses a longer one
DEFAULT_MAX_CONNECTIONS = 4096   # open connections at once; beyond, the one waiting longest is closed
# A burst of new connections waits in the kernel's listen queue. asyncio accepts up to this many
# per turn of the loop (uvicorn's `backlog` sets both) before any of them can close another for
# room, so the descriptors beyond the bound are two such batches (one accepted, the connections
# it evicted not yet closed) plus what the rest of the daemon needs.
LISTEN_BACKLOG = 128
FD_RESERVE = 2 * LISTEN_BACKLOG + 256   # descriptors kept beyond the bound (database, logs, pipes, models)
MIN_WAIT = 1.0                   # seconds a connection may wait for its request before it can be closed for room
MIN_CONNECTIONS = 16
LINGER_SECONDS = 2.0             # after refusing a body: how long its rest is drained, at most
LINGER_BYTES = 8 << 20
INBOX_BYTES = 1 << 16            # unread input held while an answer is written (pipelining)
_HEAD_END = re.compile(rb"\n\r?\n")   # h11's own end-of-head rule
_EMPTY_LINES = re.compile(rb"(?:\r?\n)+")


@dataclass
class ConnectionLimits:
    """What every connection of one API server shares: the limits and the open connections."""

    idle_timeout: float
    lifetime: float
    max_requests: int
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    open: set[Any] = field(default_factory=set)
    # Connections not being served, each with the moment it started waiting, the ones closed
    # first at the bound first: those already answered and closing (refused, or their body
    # unread), then those waiting for a request, longest first. Only the event loop's thread
    # uses it.
    waiting: OrderedDict[Any, float] = field(default_factory=OrderedDict)
    min_wait: float = MIN_WAIT
    evicted: int = 0

    def make_room(self) -> bool:
        """Close connections not being served, first those closing, then those waiting
        longest, until one more fits; False when none can be closed: every open connection
        is being served, or has waited less than `min_wait` (a client that connected a
        moment ago gets to send its request)."""
        while len(self.open) >= self.max_connections:
            if not self.waiting:
                return False
            idlest, since = next(iter(self.waiting.items()))
            if not idlest.draining and time.monotonic() - since < self.min_wait:
                return False
            del self.waiting[idlest]
            self.open.discard(idlest)   # its descriptor is freed on the loop's next turn
            self.evicted += 1
            idlest.evict()
        return True

    def closing_first(self, conn: Any) -> None:
        """`conn` has its answer and is closing: the first to go when room is needed."""
        self.waiting[conn] = time.monotonic()
        self.waiting.move_to_end(conn, last=False)

    def busy_body(self) -> bytes:
        """The body of the answer to a connection beyond the bound."""
        return json.dumps({"error": f"the API is busy ({len(self.open)} connections open, each being served "
                                    f"or opened less than {self.min_wait:g} s ago)",
                           "hint": "try again in a moment"}).encode()


def fit_connection_bound(requested: int) -> int:
    """The bound on open API connections this process's descriptor limit allows.

    The soft RLIMIT_NOFILE is raised toward the hard one when `requested` needs it (a
    container's soft limit is often 1024); whatever still falls short lowers the bound,
    keeping FD_RESERVE descriptors for the rest of the daemon, and is logged."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = requested + FD_RESERVE
    raised = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < raised:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
            soft = raised
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return requested
    bound = max(MIN_CONNECTIONS, soft - FD_RESERVE if soft > 2 * FD_RESERVE else soft // 2)
    bound = min(bound, requested)
    log.warning("the API holds at most %d connections, not %d: this process may open %d files "
                "(raise `ulimit -n`)", bound, requested, soft)
    return bound


def _answer_bytes(status: int, reason: str, body: bytes, headers: dict[str, str] | None = None) -> bytes:
    head = [f"HTTP/1.1 {status} {reason}", "Content-Type: application/json", f"Content-Length: {len(body)}"]
    head += [f"{k}: {v}" for k, v in (headers or {}).items()]
    head.append("Connection: close")
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


def screen_head(head: bytes) -> None:
    """Refuse (RequestRefused) a head whose framing the API does not accept; h11 parses the rest."""
    if len(head) > MAX_HEAD_BYTES:   # h11 would answer a plain-text 400, or accept one read whole
        raise RequestRefused(431, f"the request head is over {MAX_HEAD_BYTES:,} bytes",
                             hint="send fewer or shorter headers")
    lengths: list[str] = []
    encodings: list[str] = []
    for line in head.split(b"\n")[1:]:
        name, colon, value = line.rstrip(b"\r").partition(b":")
        if not colon:
            continue
        name = name.lower()
        if name == b"content-length":
            lengths.append(value.decode("latin-1"))
        elif name == b"transfer-encoding":
            encodings.append(value.decode("latin-1"))
    body_length(lengths or None, encodings or None, limit=1 << 62)


class _CycleTransport:
    """The transport uvicorn's request cycle writes an answer to. Its `close()` (after an
    answer that ends the connection) closes the guard's way: lingering when the client's
    input is unread, so the client reads the answer instead of a reset."""

    def __init__(self, protocol: "GuardedH11Protocol") -> None:
        self.protocol = protocol
        self.raw = protocol.transport

    def write(self, data: bytes) -> None:
        self.protocol.sent += len(data)
        self.raw.write(data)

    def is_closing(self) -> bool:
        return self.raw.is_closing() or self.protocol.draining

    def close(self) -> None:
        self.protocol.end_after_answer()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.raw, name)


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with the connection bound, the deadline and the framing screen.

    A subclass bound to one server's `ConnectionLimits` is made by `protocol_for`.
    """

    limits: ConnectionLimits

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        limits = self.limits
        self.inbox = bytearray()
        self.scanned = 0                 # bytes of the inbox searched for a head's end already
        self.body_left: int | None = 0   # bytes of the current body h11 still expects (None: unknown)
        self.answered = 0
        self.draining = False
        self.drained = 0
        self.eof = False
        self.timer: asyncio.TimerHandle | None = None
        self.life: asyncio.TimerHandle | None = None
        self.ends = time.monotonic() + limits.lifetime
        self.sent = 0                    # bytes of answers written to the transport
        self.read_mark = 0               # what the client must have read by the next check
        self.reader_check: asyncio.TimerHandle | None = None   # while an answer is in progress
        if not limits.make_room():
            busy = _answer_bytes(503, "Service Unavailable", limits.busy_body(), {"Retry-After": "1"})
            # Counted too: a refused connection holds its descriptor while its answer lingers,
            # and is the first closed when room is needed.
            limits.open.add(self)
            self._refuse_raw(busy)
            return
        limits.open.add(self)
        self.life = self.loop.call_later(limits.lifetime, self._life_over)
        self._wait_for_request()

    def connection_lost(self, exc: Exception | None) -> None:
        self.limits.open.discard(self)
        self.limits.waiting.pop(self, None)
        if self.life is not None:
            self.life.cancel()
        if self.reader_check is not None:
            self.reader_check.cancel()
        self._cancel_timer()
        super().connection_lost(exc)

    def evict(self) -> None:
        """Closed to make room for a newer connection: it was waiting, or closing with its
        answer sent; nothing is lost."""
        self.limits.waiting.pop(self, None)
        self._cancel_timer()
        self.transport.abort()

    def _close_now(self) -> None:
        """Close at a deadline. An answer the client has not read (still in our write
        buffer) is dropped: `close()` would wait for it to be read, holding its memory and
        descriptor for as long as the client likes."""
        if self.transport.get_write_buffer_size():
            self.transport.abort()
        else:
            self.transport.close()

    # -- time --------------------------------------------------------------------------------
    def _wait_for_request(self) -> None:
        """Start the deadline for the next request to arrive whole, and queue the connection
        among those waiting (the newest last)."""
        self._cancel_timer()
        left = min(self.limits.idle_timeout, self.ends - time.monotonic())
        self.timer = self.loop.call_later(max(0.0, left), self._late)
        self.limits.waiting[self] = time.monotonic()
        self.limits.waiting.move_to_end(self)

    def _cancel_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _late(self) -> None:
        """The request did not arrive in time (or the last answer was not read): close."""
        self.timer = None
        if not self.transport.is_closing() and not self.draining:
            self._close_now()

    def _life_over(self) -> None:
        """The connection's lifetime is over: close it, after the answer in progress if any."""
        if self.transport.is_closing() or self.draining:
            return
        if self.cycle is None or self.cycle.response_complete:
            self._close_now()
            return
        # The answer in progress is finished, however long the server takes to produce it
        # (a client that stops reading it is dropped by `_check_reader`, running since the
        # request was dispatched).
        self._close_after_answer()

    def read_by_client(self) -> int:
        """Bytes of the answers written that have left our buffer (the client has taken them)."""
        return self.sent - self.transport.get_write_buffer_size()

    def _watch_reader(self) -> None:
        """A request was dispatched: from now until its answer is whole, check every
        `idle_timeout` that the client reads it (`_check_reader`)."""
        if self.reader_check is not None:
            self.reader_check.cancel()
        self.read_mark = self.sent
        self.reader_check = self.loop.call_later(self.limits.idle_timeout, self._check_reader)

    def _check_reader(self) -> None:
        """During an answer: abort if the client has not read what was sent by the previous
        check, else look again in `idle_timeout`. Once the answer is whole, the deadline for
        the next request (or the close after the last answer) drops an unread answer."""
        self.reader_check = None
        if self.transport.is_closing() or self.draining:
            return
        if self.cycle is None or self.cycle.response_complete:
            return
        if self.read_by_client() < self.read_mark:
            log.info("API connection dropped: its client stopped reading the answer")
            self.transport.abort()
            return
        self.read_mark = self.sent
        self.reader_check = self.loop.call_later(self.limits.idle_timeout, self._check_reader)

    def _close_after_answer(self) -> None:
        if self.cycle is None:
            return
        if not self.cycle.response_started:
            self.scope.setdefault("extensions", {})[CLOSE_KEY] = True  # type: ignore[typeddict-unknown-key]
        self.cycle.keep_alive = False

    # -- input -------------------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        if self.draining:
            self.drained += len(data)
            if self.drained > LINGER_BYTES:
                self._close_now()
            return
        if self.transport.is_closing():
            return
        self._unset_keepalive_if_required()
        self.inbox += data
        self._pump()

    def _pump(self) -> None:
        """Hand h11 the next head (once screened) or the current body's bytes, never more."""
        while self.inbox and not self.transport.is_closing() and not self.draining:
            state = self.conn.their_state
            if state is h11.IDLE and self.conn.our_state is h11.IDLE:
                if not self._next_head():
                    return
            elif state is h11.SEND_BODY:
                n = len(self.inbox) if self.body_left is None else min(self.body_left, len(self.inbox))
                chunk = bytes(self.inbox[:n])
                del self.inbox[:n]
                if self.body_left is not None:
                    self.body_left -= n
                self.conn.receive_data(chunk)
                self.handle_events()
            else:  # the answer is being written: the rest waits (pipelining), bounded
                if len(self.inbox) > INBOX_BYTES:
                    self.flow.pause_reading()
                return
            if self.conn.their_state is h11.DONE or self.conn.their_state is h11.MUST_CLOSE:
                self._cancel_timer()   # the request is whole: the deadline is met

    def _next_head(self) -> bool:
        """Screen the head at the start of the inbox and hand it to h11; False while it is
        incomplete (or was refused)."""
        if self.scanned == 0:
            skipped = _EMPTY_LINES.match(self.inbox)
            if skipped is not None:   # RFC 9112 section 2.2: empty lines before a request line
                del self.inbox[:skipped.end()]
            if self.inbox in (b"", b"\r"):
                return False
        # Only the new bytes are searched (with 2 of the old, for an end split across reads).
        found = _HEAD_END.search(self.inbox, max(0, self.scanned - 2))
        end = found.end() if found is not None else len(self.inbox)
        if found is None and end <= MAX_HEAD_BYTES:
            self.scanned = end
            return False
        self.scanned = 0
        head = bytes(self.inbox[:end])
        try:
            screen_head(head)
        except RequestRefused as exc:
            self._refuse_raw(_answer_bytes(exc.status, _reason(exc.status),
                                           json.dumps({"error": str(exc), "hint": exc.hint}).encode()))
            return False
        del self.inbox[:end]
        before = self.cycle
        self.conn.receive_data(head)
        self.handle_events()
        if self.cycle is not before and self.cycle is not None:
            self._started_request()
        return True

    def _started_request(self) -> None:
        """A request head was parsed and dispatched: it is served now, never closed for room;
        count it and frame its body."""
        self.limits.waiting.pop(self, None)
        self.cycle.transport = _CycleTransport(self)   # its task has not run yet
        self._watch_reader()
        self.answered += 1
        length = dict(self.headers).get(b"content-length")
        self.body_left = int(length) if length is not None and length.isdigit() else None
        if self.answered >= self.limits.max_requests or time.monotonic() >= self.ends:
            self._close_after_answer()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.transport.is_closing() or self.draining:
            return
        self._unset_keepalive_if_required()   # the request deadline below replaces uvicorn's
        if self.eof:
            self._close_within(self.limits.idle_timeout)
            return
        if self.conn.their_state is h11.IDLE:
            if time.monotonic() >= self.ends:
                self._close_now()
                return
            self._wait_for_request()
            self._pump()
            return
        # Answered while the client still owes (part of) a body the answer did not need:
        # the connection ends here. Neither served nor waiting, it would otherwise sit out
        # the deadline beyond the reach of the bound.
        self._linger()

    def end_after_answer(self) -> None:
        """The answer just written ends the connection (uvicorn's cycle closes it)."""
        if self.draining or self.transport.is_closing():
            return
        if self.conn.their_state is h11.SEND_BODY or self.inbox:
            self._linger()   # input is unread: closing now would reset the answer away
        else:
            self._close_within(self.limits.idle_timeout)

    def _close_within(self, seconds: float) -> None:
        """Close once the answer is written, or drop it after `seconds` unread."""
        self.transport.close()
        if self.transport.get_write_buffer_size():
            self.loop.call_later(seconds, self.transport.abort)

    # -- refusals ----------------------------------------------------------------------------
    def _refuse_raw(self, answer: bytes) -> None:
        """Send `answer` (the connection ends with it), then linger."""
        self.transport.write(answer)
        self._linger()

    def _linger(self) -> None:
        """After an answer that ends the connection: half-close, drop what the client still
        sends (bounded), then close; closing with unread input would reset the connection
        before the client reads the answer. The connection is the first to go when room is
        needed, and its answer is dropped if still unread when the linger ends."""
        self._cancel_timer()
        self.draining = True
        self.drained = 0
        self.inbox.clear()
        if self in self.limits.open:
            self.limits.closing_first(self)
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.flow.resume_reading()
        self.loop.call_later(LINGER_SECONDS, self._close_now)

    def eof_received(self) -> bool | None:
        """A client that half-closes after its request still gets the answer (then we close)."""
        self.eof = True
        if self.draining:
            return None   # asyncio closes the transport; the linger's end drops an unread answer
        if self.cycle is None or self.cycle.response_complete:
            self._close_within(self.limits.idle_timeout)
            return True
        self._close_after_answer()
        return True

    def shutdown(self) -> None:
        if self.draining or self.cycle is None or self.cycle.response_complete:
            self._close_within(LINGER_SECONDS)
        else:
            self.cycle.keep_alive = False


def _reason(status: int) -> str:
    from http import HTTPStatus

    return HTTPStatus(status).phrase


def protocol_for(limits: ConnectionLimits) -> type[GuardedH11Protocol]:
    """The protocol class uvicorn builds each connection with, bound to `limits`."""
    return type("ApiProtocol", (GuardedH11Protocol,), {"limits": limits})


__all__ = ["ConnectionLimits", "GuardedH11Protocol", "protocol_for", "screen_head", "fit_connection_bound",
           "DEFAULT_MAX_CONNECTIONS", "MAX_HEAD_BYTES", "LISTEN_BACKLOG", "FD_RESERVE", "MIN_WAIT"]
