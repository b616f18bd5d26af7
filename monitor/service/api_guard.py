"""The defences of the daemon's local API: the token the CLI sends, the checks a request
passes before it is served, and the bounded server that serves it.

- **Token.** `lstar run` writes a fresh random token to STATE/api.token at every start:
  created with mode 0600 under a temporary name and renamed into place, so no other user can
  ever read it. The CLI reads it and sends `Authorization: Bearer TOKEN` with every request
  that changes state; the daemon compares in constant time.
- **Host and Origin.** The API listens on 127.0.0.1, but a web page can still reach it by
  DNS rebinding (its own name resolving to 127.0.0.1). Such a request carries the page's
  name in `Host` (and `Origin`), so `Host` must be a loopback name with the API's port, and
  an `Origin`, when present, the same. Names given with `--api-allowed-host` are accepted
  beside the loopback names (a container's service name), never any name at all.
- **Framing.** `Content-Length` is one run of ASCII digits (no sign, no second header, no
  `Transfer-Encoding`), checked before a single byte of the body is read.
- **Time.** A request (line, headers and body) must arrive within the idle timeout of the
  moment the server starts waiting for it; a client that trickles bytes cannot stretch it.
  A connection's whole life is bounded too (`lifetime`, and `max_requests` answers), so a
  client that keeps sending requests on one connection cannot hold a worker either.
- **Connections.** A fixed pool of worker threads serves them; when every worker is busy a
  new connection gets neither a thread nor a place in a queue: the reserved lane
  (`monitor.service.api_lane`) answers it if it asks for a reserved path (`/health`,
  `/metrics`), with the same checks, and anything else gets 503, unserved.
"""

from __future__ import annotations

import contextlib
import hmac
import io
import json
import logging
import os
import re
import secrets
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from monitor.errors import StoreError
from monitor.service.api_lane import ReservedLane
from monitor.store.pages import MAX_LIMIT

log = logging.getLogger("lstar.api")

TOKEN_NAME = "api.token"
MAX_TOKEN_BYTES = 256
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
LINGER_SECONDS = 2.0            # after refusing a body: how long its rest is drained, at most
LINGER_BYTES = 8 << 20
DEFAULT_LIFETIME = 60.0         # seconds a connection may live, however busy it keeps
DEFAULT_MAX_REQUESTS = 100      # answers on one connection, then it closes
LANE_SECONDS = 2.0              # the reserved lane's whole budget for one connection
_DIGITS = re.compile(r"[0-9]{1,18}")
_BEARER = re.compile(r"Bearer[ \t]+(\S+)[ \t]*", re.IGNORECASE)


class RequestRefused(Exception):
    """A request the API does not serve: the HTTP status, a one-line message and a hint."""

    def __init__(self, status: int, message: str, *, hint: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.hint = hint
        self.headers = headers or {}


# -- the token ---------------------------------------------------------------------------------
def create_api_token(state_dir: Path) -> str:
    """Write a fresh random token to STATE/api.token (mode 0600 from its creation) and return it.

    The file is created by `mkstemp` (O_EXCL, mode 0600) and renamed over the old one, so a
    reader sees the old token or the new one, and nobody but the owner ever sees either.
    """
    token = secrets.token_urlsafe(32)
    state_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{TOKEN_NAME}.", dir=state_dir)
    try:
        os.fchmod(fd, 0o600)  # mkstemp's mode already; stated so a changed default cannot widen it
        os.write(fd, f"{token}\n".encode())
        os.fsync(fd)
        os.close(fd)
        fd = -1
        os.replace(tmp, state_dir / TOKEN_NAME)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return token


def read_api_token(state_dir: Path) -> str:
    """The token the daemon running on `state_dir` wrote; StoreError naming the file if unreadable."""
    path = state_dir / TOKEN_NAME
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        try:
            text = os.read(fd, MAX_TOKEN_BYTES + 1).decode("ascii").strip()
        finally:
            os.close(fd)
    except PermissionError:
        raise StoreError(f"cannot read the daemon's API token {path}: permission denied",
                         hint="run the command as the user that runs `lstar run` (the file is "
                              "readable by its owner only)") from None
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else "not a token file"
        raise StoreError(f"cannot read the daemon's API token {path}: {reason}",
                         hint="`lstar run` writes it at start; restart the daemon if it is missing") from None
    if not text or len(text) > MAX_TOKEN_BYTES or not text.isascii() or any(c.isspace() for c in text):
        raise StoreError(f"the daemon's API token {path} is empty or malformed",
                         hint="restart the daemon (`lstar run` writes a fresh token at start)")
    return text


def bearer_matches(authorization: str | None, token: str) -> bool | None:
    """None when no bearer token was sent, else whether it is `token` (constant time)."""
    if authorization is None:
        return None
    found = _BEARER.fullmatch(authorization.strip())
    if found is None:
        return None
    return hmac.compare_digest(found.group(1).encode(), token.encode())


# -- Host and Origin -----------------------------------------------------------------------------
def loopback_authority(text: str, port: int, *, default_port: int = 80, allowed: tuple[str, ...] = ()) -> bool:
    """Whether `text` (HOST[:PORT]) names this API: a loopback name (or one of `allowed`,
    lower-case host names) and its port."""
    text = text.strip().lower()
    if text.startswith("["):
        name, bracket, rest = text.partition("]")
        name += bracket
    else:
        name, colon, port_text = text.partition(":")
        rest = colon + port_text
    if name not in LOOPBACK_NAMES and name not in allowed:
        return False
    if not rest:
        return port == default_port
    if not rest.startswith(":") or not _DIGITS.fullmatch(rest[1:]):
        return False
    return int(rest[1:]) == port


def check_host_and_origin(hosts: list[str] | None, origins: list[str] | None, port: int, *,
                          allowed: tuple[str, ...] = ()) -> None:
    """Refuse (403) a request not addressed to this API by a loopback name or one of the
    `allowed` host names (DNS rebinding)."""
    hint = f"address the API as http://127.0.0.1:{port} (or localhost)"
    if not hosts or len(hosts) != 1 or not loopback_authority(hosts[0], port, allowed=allowed):
        shown = "none" if not hosts else ", ".join(repr(h[:100]) for h in hosts[:3])
        raise RequestRefused(403, f"Host {shown} is not this API", hint=hint)
    if not origins:
        return
    ok = False
    if len(origins) == 1:
        parts = urlsplit(origins[0].strip())
        ok = (parts.scheme == "http" and not parts.path and not parts.query and not parts.username
              and loopback_authority(parts.netloc, port, allowed=allowed))
    if not ok:
        raise RequestRefused(403, f"Origin {origins[0][:100]!r} is not this API", hint=hint)


# -- framing -------------------------------------------------------------------------------------
def body_length(lengths: list[str] | None, transfer_encodings: list[str] | None, *, limit: int) -> int:
    """The body length a request announces, checked before anything of it is read."""
    if transfer_encodings:
        raise RequestRefused(411, "a Transfer-Encoding body is not accepted",
                             hint="send the body with a Content-Length")
    if not lengths:
        return 0
    values = {v.strip() for v in lengths}
    if len(values) != 1:
        raise RequestRefused(400, "conflicting Content-Length headers")
    text = values.pop()
    if not _DIGITS.fullmatch(text):
        raise RequestRefused(400, f"Content-Length {text[:40]!r} is not a byte count",
                             hint="send a whole number of bytes, 0 or more")
    length = int(text)
    if length > limit:
        raise RequestRefused(413, f"the body is {length} bytes; at most {limit} are accepted")
    return length


class DeadlineReader(io.RawIOBase):
    """Reads a socket until `deadline()` (a time.monotonic() value), then raises TimeoutError.

    A socket timeout alone bounds each recv; a client sending one byte just before each one
    would hold the connection forever. Here every recv gets only the time left. `prefix` is
    what was already read from the socket (the reserved lane reads a request's head first).
    """

    def __init__(self, sock: socket.socket, deadline: Callable[[], float], *, prefix: bytes = b"") -> None:
        super().__init__()
        self.sock = sock
        self.deadline = deadline
        self.prefix = memoryview(prefix)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # type: ignore[override]
        if self.prefix:
            n = min(len(buffer), len(self.prefix))
            buffer[:n] = self.prefix[:n]
            self.prefix = self.prefix[n:]
            return n
        left = self.deadline() - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request did not arrive in time (the idle timeout or the connection's lifetime)")
        self.sock.settimeout(left)
        return self.sock.recv_into(buffer)


def discard_input(sock: socket.socket, *, seconds: float, max_bytes: int) -> None:
    """Read and drop what the client still sends, bounded in time and bytes.

    Closing a socket with unread input resets the connection, and the client may lose the
    answer it has not read yet; after refusing a body we half-close and drain first.
    """
    buffer = bytearray(1 << 16)
    end = time.monotonic() + seconds
    total = 0
    with contextlib.suppress(OSError):
        while total < max_bytes:
            left = end - time.monotonic()
            if left <= 0:
                return
            sock.settimeout(left)
            n = sock.recv_into(buffer)
            if n == 0:
                return
            total += n


# -- the handler and the server ------------------------------------------------------------------
class GuardedHandler(BaseHTTPRequestHandler):
    """An HTTP/1.1 handler whose every request must arrive whole by a deadline (the server's
    `idle_timeout` from when it starts waiting, and never past the connection's end), and
    which can refuse a body unread.

    A connection ends `lifetime` seconds after it was accepted or after `max_requests`
    answers, whichever comes first; one the reserved lane hands over (`reserved`) serves a
    single request of a reserved path within the lane's budget.
    """

    server: "BoundedHTTPServer"
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        super().setup()
        head = self.server.take_head(self.connection)
        self.reserved = head is not None
        now = time.monotonic()
        self.ends = now + (self.server.lane_seconds if self.reserved else self.server.lifetime)
        self.answered = 0
        self.deadline = min(now + self.server.idle_timeout, self.ends)
        self.body_pending = False
        # The stock reader bounds each recv only; this one bounds the whole request.
        self.rfile.close()
        self.rfile = io.BufferedReader(DeadlineReader(self.connection, lambda: self.deadline, prefix=head or b""))

    def handle_one_request(self) -> None:
        now = time.monotonic()
        if now >= self.ends or self.answered >= self.server.max_requests:
            self.close_connection = True  # its life is over, however busy the client keeps it
            return
        self.deadline = min(now + self.server.idle_timeout, self.ends)
        self.body_pending = False
        super().handle_one_request()

    def parse_request(self) -> bool:
        if not super().parse_request():
            return False
        self.answered += 1
        if self.reserved or self.answered >= self.server.max_requests:
            self.close_connection = True  # and the answer says so (`Connection: close`)
        lane = self.server.lane
        if self.reserved and (lane is None or not lane.admits(self.command, self.path)):
            self.send_bytes(503, self.server.busy_body(), "application/json", {"Retry-After": "1"})
            return False
        return True

    def admit(self, *, body_limit: int) -> int:
        """The checks before anything else: Host/Origin, then framing. Returns the body's
        length (still unread); `body_limit` 0 means the request takes no body."""
        lengths, encodings = self.headers.get_all("Content-Length"), self.headers.get_all("Transfer-Encoding")
        # Until the framing is known good, whatever follows the headers is unread body.
        self.body_pending = bool(lengths or encodings)
        check_host_and_origin(self.headers.get_all("Host"), self.headers.get_all("Origin"),
                              self.server.server_address[1], allowed=self.server.allowed_hosts)
        length = body_length(lengths, encodings, limit=body_limit or 1 << 16)
        self.body_pending = length > 0
        if length and not body_limit:
            raise RequestRefused(400, f"{self.command} takes no body")
        return length

    def read_body(self, length: int) -> bytes:
        """The body `admit` announced (TimeoutError past the deadline, ConnectionError if cut short)."""
        raw = self.rfile.read(length)
        if len(raw) < length:
            raise ConnectionError("the client closed the connection mid-body")
        self.body_pending = False
        return raw

    def send_bytes(self, status: int, body: bytes, content_type: str,
                   headers: dict[str, str] | None = None) -> None:
        """One whole answer; it closes the connection when a body was left unread."""
        # An answer the client never reads ends too.
        self.connection.settimeout(self.server.lane_seconds if self.reserved else self.server.idle_timeout)
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        if self.body_pending or self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def linger(self) -> None:
        """After answering a request whose body stays unread: half-close and drop what the
        client still sends (bounded), since a close with unread input would reset the
        connection before the client reads the answer."""
        if not self.body_pending:
            return
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_WR)
        left = min(LINGER_SECONDS, self.ends - time.monotonic())  # within the connection's life
        discard_input(self.connection, seconds=left, max_bytes=LINGER_BYTES)
        self.close_connection = True

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet by default
        pass


class BoundedHTTPServer(HTTPServer):
    """An HTTP server whose connections are served by a fixed pool of `workers` threads.

    The accepting thread hands a connection to a free worker or, when all are busy, to the
    reserved lane (when `reserved_paths` names any), which serves those paths alone and
    answers anything else 503; without a lane it answers 503 itself. Nothing waits in an
    unbounded queue or gets a thread of its own.
    """

    allow_reuse_address = True
    allowed_hosts: tuple[str, ...] = ()   # Host names accepted beside the loopback names

    def __init__(self, address: tuple[str, int], handler: type[GuardedHandler], *, workers: int,
                 idle_timeout: float, lifetime: float = DEFAULT_LIFETIME,
                 max_requests: int = DEFAULT_MAX_REQUESTS, reserved_paths: tuple[str, ...] = ()) -> None:
        super().__init__(address, handler)
        self.idle_timeout = idle_timeout
        self.lifetime = lifetime
        self.max_requests = max_requests
        self.lane_seconds = min(LANE_SECONDS, idle_timeout)
        self.workers = workers
        self.slots = threading.BoundedSemaphore(workers)
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="lstar-api")
        self.active: set[socket.socket] = set()
        self.heads: dict[socket.socket, bytes] = {}   # what the lane read of a connection it hands over
        self.active_lock = threading.Lock()
        self.lane = (ReservedLane(reserved_paths, serve=self._serve_reserved, refuse=self._busy,
                                  timeout=self.lane_seconds) if reserved_paths else None)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):
            if self.lane is not None:
                self.lane.offer(request, client_address)
            else:
                self._busy(request)
            return
        with self.active_lock:
            self.active.add(request)
        try:
            self.pool.submit(self._serve, request, client_address)
        except RuntimeError:  # the pool is shutting down
            self._done(request)
            self.slots.release()

    def take_head(self, request: socket.socket) -> bytes | None:
        """The head the reserved lane read of `request`, or None for a general connection."""
        with self.active_lock:
            return self.heads.pop(request, None)

    def _serve(self, request: Any, client_address: Any) -> None:
        try:
            self._answer(request, client_address)
        finally:
            self.slots.release()

    def _serve_reserved(self, request: socket.socket, client_address: Any, head: bytes) -> None:
        with self.active_lock:
            self.active.add(request)
            self.heads[request] = head
        request.settimeout(self.lane_seconds)  # the lane left it non-blocking
        self._answer(request, client_address)

    def _answer(self, request: Any, client_address: Any) -> None:
        try:
            self.finish_request(request, client_address)
        except Exception:  # noqa: BLE001 - one connection's failure must not end the worker
            self.handle_error(request, client_address)
        finally:
            self._done(request)

    def _done(self, request: Any) -> None:
        with self.active_lock:
            self.active.discard(request)
            self.heads.pop(request, None)
        self.shutdown_request(request)

    def busy_body(self) -> bytes:
        """The body of the busy answer."""
        return json.dumps({"error": f"the API is busy ({self.workers} connections open)",
                           "hint": "try again in a moment"}).encode()

    def _busy(self, request: socket.socket) -> None:
        body = self.busy_body()
        head = (f"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\nRetry-After: 1\r\nConnection: close\r\n\r\n")
        with contextlib.suppress(OSError):
            request.settimeout(1.0)
            request.sendall(head.encode() + body)
            request.shutdown(socket.SHUT_WR)
            request.setblocking(False)
            for _ in range(16):  # what already arrived (bounded), so the close does not reset
                if not request.recv(1 << 16):
                    break
        self.close_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            log.debug("API client %s went away", client_address)  # its own doing: no traceback
        else:
            log.warning("API connection from %s failed", client_address, exc_info=True)

    def server_close(self) -> None:
        super().server_close()
        if self.lane is not None:
            self.lane.close()
        with self.active_lock:
            for sock in self.active:  # wakes workers waiting on idle clients
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
        self.pool.shutdown(wait=False, cancel_futures=True)


__all__ = ["TOKEN_NAME", "MAX_LIMIT", "DEFAULT_LIFETIME", "DEFAULT_MAX_REQUESTS", "RequestRefused",
           "create_api_token", "read_api_token", "bearer_matches", "loopback_authority", "check_host_and_origin",
           "body_length", "DeadlineReader", "discard_input", "GuardedHandler", "BoundedHTTPServer"]
