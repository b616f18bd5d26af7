"""What every channel shares: the message handed to a sender and the outcome it reports
(secrets are read, never stored or logged, by `monitor.policy.secrets`)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, Protocol
from urllib.parse import urlsplit

Outcome = Literal["delivered", "retry", "dead", "gone"]


@dataclass(frozen=True)
class Outgoing:
    """One notification as a sender sees it.

    id: stable across retries (the `webhook-id`; the email Message-ID derives from it)
    body: the Alertmanager-format payload; `body_text` is its canonical JSON, byte-identical
    on every attempt.
    """

    id: str
    policy: str
    receiver: str
    body: dict[str, Any]
    # The body already encoded as `canonical_json` would (a report of tens of MB is encoded once,
    # not on every signing and sending); None: encoded from `body` when asked.
    encoded: str | None = field(default=None, repr=False, compare=False)

    @property
    def body_text(self) -> str:
        return self.encoded if self.encoded is not None else canonical_json(self.body)


def canonical_json(data: Any) -> str:
    """The one JSON spelling of a body (sorted keys, no spaces): stored and sent as is."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


@dataclass(frozen=True)
class SendResult:
    """What one attempt did.

    outcome: delivered; retry (transient: try again later); dead (permanent: retrying
    cannot help); gone (HTTP 410: the endpoint asked never to be called again).
    throttle: the channel as a whole must wait (429, 503 with Retry-After).
    """

    outcome: Outcome
    status_code: int | None = None
    error: str | None = None
    retry_after_s: float | None = None
    throttle: bool = False


class Sender(Protocol):
    """A channel: sends one notification through one receiver, never raises for delivery faults."""

    def send(self, message: Outgoing, receiver: Any, policy: Any, *, now: datetime) -> SendResult:
        ...


def redact_url(url: str) -> str:
    """scheme://host[:port]/path without credentials or query (tokens often live there)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return f"{parts.scheme}://{host}{parts.path}"
