"""Local receivers for tests and the offline demo: a webhook endpoint and an SMTP server.

Both listen on 127.0.0.1, record everything they receive, and answer as scripted, so a
test can make a receiver fail in a precise way (500 K times then 200, 429 with Retry-After,
410, a redirect, 400, a hang; SMTP 451, 554, bad credentials) and then check invariants
over what was recorded.

    with WebhookReceiver() as hook:
        hook.script([Reply(500)] * 3)          # then 200 forever
        ... send to hook.url ...
        assert [r.headers["webhook-id"] for r in hook.requests] == ...
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from email import message_from_bytes, policy as email_policy
from email.message import EmailMessage
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from monitor.served import ServedInThread


# -- webhook --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Reply:
    """One scripted HTTP answer. `hang_s` > 0 holds the request that long before answering."""

    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: str = ""
    hang_s: float = 0.0


@dataclass(frozen=True)
class RecordedRequest:
    """A request as the receiver saw it (header names lower-cased)."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    answered: int
    received_at: float

    def json(self) -> Any:
        import json

        return json.loads(self.body)


class WebhookReceiver(ServedInThread):
    """A threaded HTTP server on 127.0.0.1 that records every request and answers as scripted.

    Unscripted requests get `default` (200). Hanging replies are released by `stop()`.
    """

    path = "/hook"

    def __init__(self, default: Reply = Reply(200)) -> None:
        self.default = default
        self.requests: list[RecordedRequest] = []
        self._script: list[Reply] = []
        self._lock = threading.Lock()
        self._release = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # keep test output clean
                pass

            def _handle(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else b""
                reply = receiver._next()
                with receiver._lock:
                    receiver.requests.append(RecordedRequest(
                        self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body,
                        reply.status, time.time()))
                if reply.hang_s:
                    receiver._release.wait(reply.hang_s)
                try:
                    payload = reply.body.encode()
                    self.send_response(reply.status)
                    for k, v in reply.headers.items():
                        self.send_header(k, v)
                    self.send_header("content-length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout tests)

            do_POST = _handle
            do_GET = _handle
            do_PUT = _handle

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        # `stop()` returns once the serving loop has seen the shutdown, up to a poll interval
        # later: a receiver is started and stopped once per test, so 0.05 s (as the fake Hub's)
        # rather than socketserver's 0.5 s.
        super().__init__(server, name="webhook-receiver", poll_interval=0.05)

    def script(self, replies: Iterable[Reply]) -> None:
        """Answer the next requests with `replies`, in order (then `default`)."""
        with self._lock:
            self._script.extend(replies)

    def _next(self) -> Reply:
        with self._lock:
            return self._script.pop(0) if self._script else self.default

    def stop(self) -> None:
        self._release.set()   # hanging replies end first, so shutdown does not wait on them
        super().stop()


# -- SMTP -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class RecordedMail:
    """A message the SMTP server accepted."""

    mail_from: str
    rcpt_tos: list[str]
    message: EmailMessage
    raw: bytes


class SmtpReceiver:
    """aiosmtpd on 127.0.0.1 recording accepted mail.

    `data_replies`: scripted answers to DATA ("451 4.3.0 try later", "554 5.7.1 rejected"),
    consumed in order, then "250 OK". `users`: {username: password} enables AUTH (plain
    text allowed without TLS, for tests only).
    """

    def __init__(self, *, users: dict[str, str] | None = None, port: int | None = None,
                 starttls_context: Any = None, ssl_context: Any = None) -> None:
        from aiosmtpd.controller import Controller
        from aiosmtpd.smtp import AuthResult

        self.mails: list[RecordedMail] = []
        self.data_calls = 0
        self._replies: list[str] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler:
            async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
                with receiver._lock:
                    receiver.data_calls += 1
                    reply = receiver._replies.pop(0) if receiver._replies else "250 OK"
                if reply.startswith("250"):
                    raw = envelope.original_content or envelope.content
                    msg = message_from_bytes(raw, policy=email_policy.default)
                    with receiver._lock:
                        receiver.mails.append(RecordedMail(envelope.mail_from, list(envelope.rcpt_tos),
                                                           msg, raw))  # type: ignore[arg-type]
                return reply

        def authenticator(server: Any, session: Any, envelope: Any, mechanism: str, auth_data: Any) -> Any:
            login = getattr(auth_data, "login", b"") or b""
            password = getattr(auth_data, "password", b"") or b""
            ok = users is not None and users.get(login.decode()) == password.decode()
            return AuthResult(success=ok, handled=False)

        kwargs: dict[str, Any] = {}
        if users is not None:
            kwargs.update(authenticator=authenticator, auth_require_tls=False)
        if starttls_context is not None:
            kwargs.update(tls_context=starttls_context, require_starttls=True)
        if ssl_context is not None:
            kwargs.update(ssl_context=ssl_context)
        # aiosmtpd's start-up probe connects to the configured port, so pick a real one.
        self._controller = Controller(Handler(), hostname="127.0.0.1", port=port or free_port(), **kwargs)

    def script(self, replies: Iterable[str]) -> None:
        """Answer the next DATA commands with `replies` (then 250)."""
        with self._lock:
            self._replies.extend(replies)

    @property
    def port(self) -> int:
        return int(self._controller.port)

    def start(self) -> "SmtpReceiver":
        self._controller.start()
        return self

    def stop(self) -> None:
        self._controller.stop()

    def __enter__(self) -> "SmtpReceiver":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def free_port() -> int:
    """A port nothing listens on right now (for 'server down' tests)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
