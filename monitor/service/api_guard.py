"""The defences of the daemon's local API: the token the CLI sends and the checks a request
passes before it is served (the connection-level ones are in `monitor.service.api_conn`).

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
  `Transfer-Encoding`), checked before a single byte of the body is read, and within the
  endpoint's limit.

`RequestGuard` applies them, as ASGI middleware in front of the routes, in the order the API
documents: Host and Origin, the body's length, the token, then a handler slot (`HandlerSlots`):
every request but a GET or HEAD of `/health` and `/metrics` holds one while it is served, and
one that finds them all held gets the busy answer (503, Retry-After), unserved.
"""
from __future__ import annotations

import contextlib
import hmac
import json
import os
import re
import secrets
import tempfile
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from monitor.errors import StoreError
from monitor.store.pages import MAX_LIMIT


TOKEN_NAME = "api.token"
MAX_TOKEN_BYTES = 256
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
DEFAULT_LIFETIME = 60.0         # seconds a connection may live, however busy it keeps
DEFAULT_MAX_REQUESTS = 100      # answers on one connection, then it closes
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


# -- the middleware ------------------------------------------------------------------------------
Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]]
CLOSE_KEY = "lstar.close"          # in the ASGI scope's extensions: the connection ends after this answer
RESERVED_METHODS = ("GET", "HEAD")


class HandlerSlots:
    """The API's `workers` handler slots. A request takes one once its head is whole and it
    is dispatched, and gives it back when its answer is written; waiting connections hold
    none. Used from the event loop's thread only, so a plain count suffices."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self.taken = 0

    def busy_body(self) -> bytes:
        """The body of the busy answer."""
        return json.dumps({"error": f"the API is busy ({self.workers} requests in progress)",
                           "hint": "try again in a moment"}).encode()


def refusal_body(exc: RequestRefused) -> bytes:
    """The JSON body of a refusal: its message and hint."""
    return json.dumps({"error": str(exc), "hint": exc.hint}, indent=2).encode()


async def send_json(send: Callable[[Any], Awaitable[None]], status: int, body: bytes,
                    headers: dict[str, str] | None = None) -> None:
    """One whole JSON answer through ASGI `send`."""
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(k.encode("latin-1"), v.encode("latin-1")) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


class RequestGuard:
    """ASGI middleware: the checks every request passes before a route sees it.

    `body_limit(method, path)` is the largest body a request may announce (0: none);
    `needs_token(method, path)` whether it must carry the bearer `token` (checked in constant
    time). A GET or HEAD of one of `reserved_paths` is served at once (its handlers have
    threads of their own); any other request holds one of `slots` while it is served, and
    gets the busy answer (503) when none is free. A refused request's body stays unread and
    the answer closes the connection.
    """

    def __init__(self, app: ASGIApp, *, token: str, allowed_hosts: tuple[str, ...], reserved_paths: tuple[str, ...],
                 body_limit: Callable[[str, str], int], needs_token: Callable[[str, str], str | None],
                 slots: HandlerSlots, token_hint: str) -> None:
        self.app = app
        self.token = token
        self.allowed_hosts = allowed_hosts
        self.reserved_paths = frozenset(reserved_paths)
        self.body_limit = body_limit
        self.needs_token = needs_token
        self.slots = slots
        self.token_hint = token_hint

    async def __call__(self, scope: Scope, receive: Callable[[], Awaitable[Any]],
                       send: Callable[[Any], Awaitable[None]]) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        method, path = scope["method"], scope["path"]
        headers: dict[bytes, list[str]] = {}
        for name, value in scope["headers"]:
            headers.setdefault(name, []).append(value.decode("latin-1"))
        lengths = headers.get(b"content-length")
        try:
            check_host_and_origin(headers.get(b"host"), headers.get(b"origin"), scope["server"][1],
                                  allowed=self.allowed_hosts)
            limit = self.body_limit(method, path)
            length = body_length(lengths, headers.get(b"transfer-encoding"), limit=limit or 1 << 16)
            if length and not limit:
                raise RequestRefused(400, f"{method} takes no body")
            why = self.needs_token(method, path)
            if why is not None:
                self._check_token((headers.get(b"authorization") or [None])[0], why)
        except RequestRefused as exc:
            extra = dict(exc.headers)
            if lengths and lengths != ["0"]:
                extra["Connection"] = "close"   # the body stays unread: the connection ends
            await send_json(send, exc.status, refusal_body(exc), extra)
            return
        receive, send = self._closing(scope, receive, send, unread=bool(lengths) and lengths != ["0"])
        if method in RESERVED_METHODS and path in self.reserved_paths:
            await self.app(scope, receive, send)
            return
        slots = self.slots
        if slots.taken >= slots.workers:
            extra = {"Retry-After": "1"}
            if lengths and lengths != ["0"]:
                extra["Connection"] = "close"
            await send_json(send, 503, slots.busy_body(), extra)
            return
        slots.taken += 1
        try:
            await self.app(scope, receive, send)
        finally:
            slots.taken -= 1

    @staticmethod
    def _closing(scope: Scope, receive: Callable[[], Awaitable[Any]], send: Callable[[Any], Awaitable[None]], *,
                 unread: bool) -> tuple[Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]]:
        """`receive` and `send`, adding `Connection: close` to an answer that starts while
        the request's body is still unread (`unread`: it announced one), or when the
        connection guard has decided (late: the connection's last answer, its lifetime
        over) that it ends the connection."""
        body = {"unread": unread}

        async def receive_tracking() -> Any:
            message = await receive()
            if message["type"] != "http.request" or not message.get("more_body", False):
                body["unread"] = False
            return message

        async def send_closing(message: Any) -> None:
            if message["type"] == "http.response.start" and (
                    body["unread"] or scope.get("extensions", {}).get(CLOSE_KEY)):
                names = {name.lower() for name, _ in message.get("headers", [])}
                if b"connection" not in names:
                    message = {**message, "headers": [*message.get("headers", []), (b"Connection", b"close")]}
            await send(message)

        return receive_tracking, send_closing

    def _check_token(self, authorization: str | None, why: str) -> None:
        matched = bearer_matches(authorization, self.token)
        if matched is None:
            raise RequestRefused(401, why, hint=self.token_hint,
                                 headers={"WWW-Authenticate": 'Bearer realm="lstar"'})
        if not matched:
            raise RequestRefused(403, "wrong API token",
                                 hint=f"{self.token_hint} (the daemon writes a new one at each start)")


__all__ = ["TOKEN_NAME", "MAX_LIMIT", "DEFAULT_LIFETIME", "DEFAULT_MAX_REQUESTS", "RequestRefused",
           "create_api_token", "read_api_token", "bearer_matches", "loopback_authority", "check_host_and_origin",
           "body_length", "RequestGuard", "HandlerSlots", "CLOSE_KEY", "send_json", "refusal_body"]
