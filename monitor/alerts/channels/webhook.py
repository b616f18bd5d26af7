"""Webhook channel: Alertmanager-format JSON, signed per the Standard Webhooks spec.

Headers: `webhook-id` (the notification id: the same on every retry, so receivers can
de-duplicate), `webhook-timestamp` (Unix seconds of this attempt) and `webhook-signature`
(`v1,<base64 HMAC-SHA256 of "id.timestamp.body">` keyed by the `whsec_` secret).

Responses: 2xx delivered; 3xx failure (redirects are never followed: a signed body must
not be replayed to wherever a Location header points); 408, 429 and 5xx retry (429 and
502/503/504 with Retry-After throttle the whole channel); 410 disables the endpoint;
any other 4xx is permanent. Timeouts and connection errors retry.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import hmac
import ssl
from datetime import datetime
from typing import Any

import httpx

from monitor.backoff import MAX_RETRY_AFTER_S, parse_retry_after  # noqa: F401  (re-exported)
from monitor.alerts.channels.base import Outgoing, SendResult, redact_url
from monitor.errors import DeliveryError
from monitor.policy.secrets import read_secret

USER_AGENT = "lstar-monitor"
THROTTLE_STATUSES = frozenset({429, 502, 503, 504})


def decode_secret(secret: str) -> bytes:
    """The HMAC key of a Standard Webhooks secret (`whsec_` + base64)."""
    raw = secret.removeprefix("whsec_")
    try:
        key = base64.b64decode(raw + "=" * (-len(raw) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise DeliveryError("the webhook secret is not `whsec_` followed by base64",
                            hint="generate one with: python -c \"import base64,os;"
                                 "print('whsec_'+base64.b64encode(os.urandom(24)).decode())\"") from None
    if not key:
        raise DeliveryError("the webhook secret is empty")
    return key


def sign(secret: str, msg_id: str, timestamp: int, body: str) -> str:
    """The `webhook-signature` header value: `v1,<base64 HMAC-SHA256(id.timestamp.body)>`."""
    digest = hmac.new(decode_secret(secret), f"{msg_id}.{timestamp}.{body}".encode(), hashlib.sha256)
    return "v1," + base64.b64encode(digest.digest()).decode()


SIGNATURE_TOLERANCE_S = 300   # Standard Webhooks: refuse a timestamp further than this from now


def verify_signature(secret: str, headers: Any, body: bytes, *, now: datetime,
                     tolerance_s: int = SIGNATURE_TOLERANCE_S) -> str | None:
    """Check a received request as a Standard Webhooks receiver does: None when one of the
    `webhook-signature` values is `sign(secret, webhook-id, webhook-timestamp, body)` and the
    timestamp is within `tolerance_s` of `now`, else why not (one line)."""
    msg_id, stamp, given = (headers.get(name) for name in ("webhook-id", "webhook-timestamp", "webhook-signature"))
    if not msg_id or not stamp or not given:
        return "missing webhook-id, webhook-timestamp or webhook-signature header"
    try:
        timestamp = int(stamp)
        text = body.decode("utf-8")
    except (ValueError, UnicodeDecodeError):
        return "the timestamp is not an integer or the body is not UTF-8"
    if abs(now.timestamp() - timestamp) > tolerance_s:
        return f"the timestamp {timestamp} is more than {tolerance_s} s from now (a replay, or a clock off)"
    # Compared as bytes: a header may hold any byte (decoded as Latin-1), and compare_digest
    # refuses str with non-ASCII characters rather than answering "no match".
    expected = sign(secret, msg_id, timestamp, text).encode()
    if any(hmac.compare_digest(expected, value.encode("utf-8", "surrogatepass")) for value in given.split()):
        return None
    return "no v1 signature matches the secret"


def classify_response(status: int, headers: Any, *, now: datetime, url: str, text: str) -> SendResult:
    """Map an HTTP answer to an outcome (see the module docstring)."""
    retry_after = parse_retry_after(headers.get("retry-after"), now=now)
    snippet = " ".join(text.split())[:200]
    if 200 <= status < 300:
        return SendResult("delivered", status)
    if 300 <= status < 400:
        location = headers.get("location") or "?"
        return SendResult("retry", status, f"HTTP {status} redirect to {redact_url(location)} not "
                                           f"followed; point the receiver at the final URL")
    if status == 410:
        return SendResult("gone", status, f"HTTP 410 Gone from {redact_url(url)}: the endpoint asked "
                                          "not to be called again; receiver disabled")
    if status in THROTTLE_STATUSES:
        return SendResult("retry", status, f"HTTP {status} from {redact_url(url)}"
                                           + (f": {snippet}" if snippet else ""),
                          retry_after_s=retry_after,
                          throttle=status == 429 or retry_after is not None)
    if status == 408 or status >= 500:
        return SendResult("retry", status, f"HTTP {status} from {redact_url(url)}"
                                           + (f": {snippet}" if snippet else ""),
                          retry_after_s=retry_after)
    return SendResult("dead", status, f"HTTP {status} from {redact_url(url)} (a client error that "
                                      f"retrying cannot fix)" + (f": {snippet}" if snippet else ""))


@functools.lru_cache(maxsize=1)
def _tls_context() -> ssl.SSLContext:
    """The default CA bundle, loaded once per process (loading it takes ~0.1 s)."""
    return ssl.create_default_context()


class WebhookSender:
    """Sends through `receiver.webhook`. `transport` is httpx's seam (tests use real servers).

    One httpx client is kept for the sender's life (building one loads the CA bundle).
    """

    def __init__(self, transport: httpx.BaseTransport | None = None) -> None:
        self.transport = transport
        self._client: httpx.Client | None = None

    @property
    def client(self) -> httpx.Client:
        if self._client is None:
            self._client = httpx.Client(follow_redirects=False, transport=self.transport, trust_env=False,
                                        verify=_tls_context())
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def headers(self, message: Outgoing, secret: str | None, now: datetime) -> dict[str, str]:
        """The request headers of one attempt (signature over this attempt's timestamp)."""
        timestamp = int(now.timestamp())
        headers = {"content-type": "application/json", "user-agent": USER_AGENT,
                   "webhook-id": message.id, "webhook-timestamp": str(timestamp)}
        if secret is not None:
            headers["webhook-signature"] = sign(secret, message.id, timestamp, message.body_text)
        return headers

    def send(self, message: Outgoing, receiver: Any, policy: Any, *, now: datetime) -> SendResult:
        cfg = receiver.webhook
        try:
            secret = read_secret(cfg.secret_env, cfg.secret_file, policy,
                                 f"receiver {receiver.name!r} webhook secret")
            headers = self.headers(message, secret, now)
        except DeliveryError as exc:
            return SendResult("dead", None, exc.one_line())
        timeout = cfg.timeout.total_seconds()
        try:
            response = self.client.post(cfg.url, content=message.body_text.encode("utf-8"),
                                        headers=headers, timeout=timeout, follow_redirects=False)
        except httpx.TimeoutException:
            return SendResult("retry", None, f"no answer from {redact_url(cfg.url)} within {timeout:g} s")
        except httpx.HTTPError as exc:
            kind = type(exc).__name__
            return SendResult("retry", None, f"{kind} talking to {redact_url(cfg.url)}: "
                                             f"{str(exc) or 'connection failed'}"[:300])
        return classify_response(response.status_code, response.headers, now=now, url=cfg.url,
                                 text=response.text)
