"""The connection-level guard of the daemon's local API: uvicorn's h11 protocol with the few
guarantees uvicorn does not give (docs/architecture.md, "The local API").

h11 parses every request (the framing authority); uvicorn runs the ASGI app. What this adds:

- **A whole-request deadline.** uvicorn times out idle keep-alive connections only; a client
  that opens a connection and sends nothing, or a request head a byte at a time, is never
  timed out. Here a request (head and body) must arrive within `idle_timeout` of the moment
  the server starts waiting for it, and a connection lives `lifetime` seconds and
  `max_requests` answers at most.
- **Connection slots and the reserved lane.** `workers` connections are served in full.
  One that arrives while every slot is held is admitted to the lane (up to `lane_capacity`):
  it may ask one GET or HEAD of `/health` or `/metrics` within `lane_seconds`; anything else
  gets the busy answer (503, Retry-After), unserved. A client holding every slot with slow
  or endless requests therefore cannot keep a probe from its answer.
- **A framing screen.** Before h11 sees a request head, its `Content-Length` must be one run
  of ASCII digits and `Transfer-Encoding` absent (`api_guard.body_length`): h11 would accept
  `12, 12` and chunked bodies, and would answer a malformed length with a plain-text 400
  that does not say which header was wrong. A refused request's body is never read: the
  answer is sent, the connection half-closed and what the client still sends dropped
  (bounded), then closed.

Heads are handed to h11 one at a time, and a body exactly as long as h11 framed it, so each
pipelined request passes the screen too.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from dataclasses import dataclass, field
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from monitor.service.api_guard import CLOSE_KEY, LANE_KEY, RequestRefused, body_length


MAX_HEAD_BYTES = 16 << 10        # a request head; h11 refuses a longer one
LANE_SECONDS = 2.0               # the reserved lane's whole budget for one connection
LANE_CAPACITY = 64               # connections the lane holds at once; beyond, the busy answer at once
LINGER_SECONDS = 2.0             # after refusing a body: how long its rest is drained, at most
LINGER_BYTES = 8 << 20
INBOX_BYTES = 1 << 16            # unread input held while an answer is written (pipelining)
_HEAD_END = re.compile(rb"\n\r?\n")   # h11's own end-of-head rule


@dataclass
class ConnectionLimits:
    """What every connection of one API server shares: the limits and the counts."""

    workers: int
    idle_timeout: float
    lifetime: float
    max_requests: int
    lane_seconds: float = LANE_SECONDS
    lane_capacity: int = LANE_CAPACITY
    general: int = 0              # connections holding a slot (the event loop's thread alone counts)
    lane: int = 0
    open: set[Any] = field(default_factory=set)

    def busy_body(self) -> bytes:
        """The body of the busy answer."""
        return json.dumps({"error": f"the API is busy ({self.workers} connections open)",
                           "hint": "try again in a moment"}).encode()


def _answer_bytes(status: int, reason: str, body: bytes, headers: dict[str, str] | None = None) -> bytes:
    head = [f"HTTP/1.1 {status} {reason}", "Content-Type: application/json", f"Content-Length: {len(body)}"]
    head += [f"{k}: {v}" for k, v in (headers or {}).items()]
    head.append("Connection: close")
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


def screen_head(head: bytes) -> None:
    """Refuse (RequestRefused) a head whose framing the API does not accept; h11 parses the rest."""
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


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with the deadline, the slots and lane, and the framing screen.

    A subclass bound to one server's `ConnectionLimits` is made by `protocol_for`.
    """

    limits: ConnectionLimits

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        limits = self.limits
        now = time.monotonic()
        self.inbox = bytearray()
        self.body_left: int | None = 0   # bytes of the current body h11 still expects (None: unknown)
        self.answered = 0
        self.draining = False
        self.drained = 0
        self.eof = False
        self.timer: asyncio.TimerHandle | None = None
        self.kind = "general"
        if limits.general < limits.workers:
            limits.general += 1
            self.ends = now + limits.lifetime
        elif limits.lane < limits.lane_capacity:
            limits.lane += 1
            self.kind = "lane"
            self.ends = now + limits.lane_seconds
        else:
            self.kind = "refused"
            self.ends = now
            self._refuse_raw(_answer_bytes(503, "Service Unavailable", limits.busy_body(), {"Retry-After": "1"}))
            return
        limits.open.add(self)
        self.life = self.loop.call_at(self.loop.time() + (self.ends - now), self._life_over)
        self._wait_for_request()

    def connection_lost(self, exc: Exception | None) -> None:
        limits = self.limits
        if self in limits.open:
            limits.open.discard(self)
            if self.kind == "general":
                limits.general -= 1
            elif self.kind == "lane":
                limits.lane -= 1
            self.life.cancel()
        self._cancel_timer()
        super().connection_lost(exc)

    # -- time --------------------------------------------------------------------------------
    def _wait_for_request(self) -> None:
        """Start the deadline for the next request to arrive whole."""
        self._cancel_timer()
        left = min(self.limits.idle_timeout, self.ends - time.monotonic())
        self.timer = self.loop.call_later(max(0.0, left), self._late)

    def _cancel_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _late(self) -> None:
        """The request did not arrive in time: the lane answers busy, a slot just closes."""
        self.timer = None
        if self.transport.is_closing() or self.draining:
            return
        if self.kind == "lane":
            self._refuse_raw(_answer_bytes(503, "Service Unavailable", self.limits.busy_body(),
                                           {"Retry-After": "1"}))
        else:
            self.transport.close()

    def _life_over(self) -> None:
        """The connection's lifetime is over: close it, after the answer in progress if any."""
        if self.transport.is_closing() or self.draining:
            return
        if self.cycle is None or self.cycle.response_complete:
            self.transport.close()
            return
        self._close_after_answer()
        # An answer the client never reads must not hold the connection either.
        self.loop.call_later(self.limits.idle_timeout, self.transport.close)

    def _close_after_answer(self) -> None:
        if self.cycle is None:
            return
        if not self.cycle.response_started:
            self.scope.setdefault("extensions", {})[CLOSE_KEY] = True  # type: ignore[typeddict-unknown-key]
        self.cycle.keep_alive = False

    # -- input -------------------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        if self.kind == "refused" or self.transport.is_closing() and not self.draining:
            return
        if self.draining:
            self.drained += len(data)
            if self.drained > LINGER_BYTES:
                self.transport.close()
            return
        self._unset_keepalive_if_required()
        self.inbox += data
        self._pump()

    def _pump(self) -> None:
        """Hand h11 the next head (once screened) or the current body's bytes, never more."""
        while self.inbox and not self.transport.is_closing():
            state = self.conn.their_state
            if state is h11.IDLE and self.conn.our_state is h11.IDLE:
                found = _HEAD_END.search(self.inbox)
                if found is None and len(self.inbox) <= MAX_HEAD_BYTES:
                    return
                end = found.end() if found is not None else len(self.inbox)
                head = bytes(self.inbox[:end])
                if found is not None:
                    try:
                        if end > MAX_HEAD_BYTES:   # a whole head in one read: h11 limits only partial ones
                            raise RequestRefused(431, f"the request head is {end:,} bytes, over "
                                                 f"{MAX_HEAD_BYTES:,}", hint="send fewer or shorter headers")
                        screen_head(head)
                    except RequestRefused as exc:
                        self._refuse_raw(_answer_bytes(exc.status, _reason(exc.status),
                                                       json.dumps({"error": str(exc), "hint": exc.hint}).encode()))
                        return
                del self.inbox[:end]
                before = self.cycle
                self.conn.receive_data(head)
                self.handle_events()
                if self.cycle is not before and self.cycle is not None:
                    self._started_request()
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

    def _started_request(self) -> None:
        """A request head was parsed: count it, frame its body, mark the lane's."""
        self.answered += 1
        length = dict(self.headers).get(b"content-length")
        self.body_left = int(length) if length is not None and length.isdigit() else None
        if self.kind == "lane":
            self.scope.setdefault("extensions", {})[LANE_KEY] = True  # type: ignore[typeddict-unknown-key]
        if self.kind == "lane" or self.answered >= self.limits.max_requests or time.monotonic() >= self.ends:
            self._close_after_answer()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.transport.is_closing():
            return
        self._unset_keepalive_if_required()   # the request deadline below replaces uvicorn's
        if self.eof:
            self.transport.close()
            return
        if self.conn.their_state is h11.IDLE:
            if time.monotonic() >= self.ends:
                self.transport.close()
                return
            self._wait_for_request()
            self._pump()
        # else: the client is still sending a body the answer did not need; h11 drops it as
        # it arrives, within the deadline still running.

    # -- refusals ----------------------------------------------------------------------------
    def _refuse_raw(self, answer: bytes) -> None:
        """Send `answer`, half-close, drop what the client still sends (bounded), then close:
        closing with unread input would reset the connection before the client reads it."""
        self._cancel_timer()
        self.draining = True
        self.drained = 0
        self.transport.write(answer)
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.flow.resume_reading()
        self.loop.call_later(LINGER_SECONDS, self.transport.close)

    def eof_received(self) -> bool | None:
        """A client that half-closes after its request still gets the answer (then we close)."""
        self.eof = True
        if self.draining or self.cycle is None or self.cycle.response_complete:
            return None   # nothing in progress: asyncio closes the transport
        self._close_after_answer()
        return True

    def shutdown(self) -> None:
        if self.draining or self.kind == "refused" or self.cycle is None or self.cycle.response_complete:
            self.transport.close()
        else:
            self.cycle.keep_alive = False


def _reason(status: int) -> str:
    from http import HTTPStatus

    return HTTPStatus(status).phrase


def protocol_for(limits: ConnectionLimits) -> type[GuardedH11Protocol]:
    """The protocol class uvicorn builds each connection with, bound to `limits`."""
    return type("ApiProtocol", (GuardedH11Protocol,), {"limits": limits})


__all__ = ["ConnectionLimits", "GuardedH11Protocol", "protocol_for", "screen_head", "LANE_KEY", "MAX_HEAD_BYTES"]
