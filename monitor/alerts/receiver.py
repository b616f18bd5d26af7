"""`lstar receiver`: a local webhook receiver that checks the Standard Webhooks signature of
what the watcher sends (`monitor.alerts.channels.webhook.verify_signature`, the signing code's
own counterpart) and prints each request it gets.

It is for trying a policy's webhook receiver on one machine (`lstar alerts test oncall`), not
for production: it listens on 127.0.0.1 only, keeps nothing, and answers 204 to a request
whose signature holds, 401 to one whose signature does not, 413 to a body over
`MAX_BODY_BYTES` (read no further) and 405 to anything but POST.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from monitor.alerts.channels.webhook import decode_secret, verify_signature
from monitor.escape import plain_text

MAX_BODY_BYTES = 1 << 20   # an alert batch is a few KiB; anything far larger is not the watcher's


def describe(method: str, path: str, headers: Any, body: bytes, verdict: str | None) -> str:
    """What `lstar receiver` prints for one request: a line with the signature's verdict and
    the message id, then the body (indented JSON when it parses, else as text), control
    characters shown as escapes."""
    status = "signature ok" if verdict is None else f"signature REFUSED: {verdict}"
    lines = [f"{method} {path} · {status} · webhook-id {headers.get('webhook-id') or '—'}"]
    try:
        payload = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        payload = None
    if isinstance(payload, dict) and isinstance(payload.get("alerts"), list):
        lines.append(f"  status {payload.get('status')}, {len(payload['alerts'])} alert(s), "
                     f"receiver {payload.get('receiver')}")
    text = json.dumps(payload, indent=2, ensure_ascii=False) if payload is not None else \
        body.decode("utf-8", errors="replace")
    lines.extend("  " + line for line in text.splitlines())
    return "\n".join(plain_text(line) for line in lines)


def receiver_app(secret: str, emit: Callable[[str], None], *,
                 clock: Callable[[], datetime] = lambda: datetime.now(timezone.utc)) -> Starlette:
    """The receiver as an ASGI app: every POST, on any path, is checked against `secret` and
    described to `emit`."""
    decode_secret(secret)   # a malformed secret is refused before the first request

    async def receive(request: Request) -> Response:
        if request.method != "POST":
            return Response("POST only\n", status_code=405, headers={"allow": "POST"})
        # the path is the sender's text (a web page can POST to 127.0.0.1): printed as plain text
        too_large = plain_text(f"POST {request.url.path} · refused: body over {MAX_BODY_BYTES} bytes")
        declared = request.headers.get("content-length")
        if declared is not None and (not (declared.isascii() and declared.isdigit()) or int(declared) > MAX_BODY_BYTES):
            emit(too_large)
            return Response("body too large\n", status_code=413)
        body = bytearray()
        async for chunk in request.stream():
            body.extend(chunk)
            if len(body) > MAX_BODY_BYTES:
                emit(too_large)
                return Response("body too large\n", status_code=413)
        verdict = verify_signature(secret, request.headers, bytes(body), now=clock())
        emit(describe("POST", request.url.path, request.headers, bytes(body), verdict))
        return Response(status_code=204) if verdict is None else Response(verdict + "\n", status_code=401)

    methods = ["GET", "POST", "PUT", "PATCH", "DELETE"]
    return Starlette(routes=[Route("/", receive, methods=methods), Route("/{path:path}", receive, methods=methods)])


__all__ = ["MAX_BODY_BYTES", "describe", "receiver_app"]
