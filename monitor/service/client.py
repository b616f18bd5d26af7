"""The client side of the daemon's local API: what the read commands and the runtime-state
commands (silences, retries) use while `lstar run` holds the database.

Requests that change state carry the token the daemon wrote to STATE/api.token
(`Authorization: Bearer ...`); reads need none unless the API listens beyond loopback
(`lstar run --api-host 0.0.0.0`), so reads send the token too when it can be read. An error answer raises the `monitor.errors`
class the daemon names, so a command prints the same one line either way.
"""

from __future__ import annotations

import functools
import json
import os
import re
import time
from pathlib import Path
from urllib.parse import urlsplit
from typing import TYPE_CHECKING, Any

from monitor import errors
from monitor.errors import LstarError, StoreError
from monitor.service.api_guard import read_api_token

if TYPE_CHECKING:
    import ssl

    import httpx

# httpx is imported where a request is made: a command reading a state folder with no daemon
# running never loads it.

MAX_ANSWER_BYTES = 256 << 20   # the daemon's answers are JSON rows; far below this
_TIME_TEXT = re.compile(r"\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}")
_STATE_OF_URL: dict[str, Path] = {}   # the state directory whose daemon answers at a URL (its token)
BUSY_RETRIES = 10


def is_loopback_url(url: str) -> bool:
    """Whether `url` is exactly `http://127.0.0.1:PORT` (the address the daemon writes): no
    user part (`http://127.0.0.1:1@elsewhere` goes elsewhere), no path, a numeric port."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return False
    return (parts.scheme == "http" and parts.hostname == "127.0.0.1" and parts.username is None
            and parts.password is None and port is not None and parts.netloc == f"127.0.0.1:{port}"
            and parts.path in ("", "/") and not parts.query and not parts.fragment)


def live_daemon_url(state_dir: Path) -> str | None:
    """The API URL of a daemon running on `state_dir`, or None when there is none.

    STATE/daemon.json must name a live pid whose /health answers (200 or 503).
    """
    info_path = state_dir / "daemon.json"
    try:
        info = json.loads(info_path.read_text())
        os.kill(int(info["pid"]), 0)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    url = str(info.get("url", ""))
    if not is_loopback_url(url):
        return None
    _STATE_OF_URL[url] = state_dir
    import httpx

    try:
        httpx.get(f"{url}/health", timeout=3, trust_env=False)
    except httpx.HTTPError:
        return None
    return url  # 200, or 503: alive but unhealthy, still answers reads


def api_get(url: str, path: str, params: dict[str, Any] | None = None) -> Any:
    """GET `path` from the daemon's API and decode the JSON answer (list values repeat the
    parameter); an error answer raises as `_call` says."""
    import httpx

    query = {k: v for k, v in (params or {}).items() if v is not None}
    headers = {}
    state_dir = _STATE_OF_URL.get(url)
    if state_dir is not None:
        try:  # a daemon bound beyond loopback wants it for reads; one on loopback ignores it
            headers["Authorization"] = f"Bearer {read_api_token(state_dir)}"
        except StoreError:
            pass
    return _call(httpx.Request("GET", f"{url}{path}", params=query, headers=headers))


def api_post(url: str, path: str, body: dict[str, Any], *, state_dir: Path) -> Any:
    """POST `body` as JSON to `path` on the API of the daemon running on `state_dir`, with the
    token it wrote there, and decode the JSON answer."""
    import httpx

    token = read_api_token(state_dir)
    data = json.dumps(body, default=str).encode()
    return _call(httpx.Request("POST", f"{url}{path}", content=data,
                               headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"}))


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """The TLS context an httpx client builds by default (verification on), built once:
    a client builds it anew each time, about 35 ms of CPU, and a command or a test polling the
    daemon sends many requests. The daemon's API is plain HTTP on the loopback, so the context
    is for a proxying setup that puts TLS in front of it."""
    import httpx

    return httpx.create_ssl_context(trust_env=False)


def send_when_free(request: httpx.Request, *, timeout: float) -> httpx.Response:
    """Send `request` (its answer read whole), waiting out the API's "busy" answers: when every
    connection slot is taken the server answers 503 with `Retry-After` without serving the
    request, so sending it again is safe."""
    import httpx

    with httpx.Client(timeout=timeout, trust_env=False, verify=_tls_context()) as client:
        for attempt in range(BUSY_RETRIES + 1):
            response = client.send(request, stream=True)
            try:
                announced = int(response.headers.get("Content-Length", "0"))
                if announced > MAX_ANSWER_BYTES:
                    raise StoreError(f"the running daemon's answer to {request.method} {request.url.path} is "
                                     f"{announced} bytes, over {MAX_ANSWER_BYTES >> 20} MiB",
                                     hint="ask for a smaller page (--limit)")
                response.read()
            finally:
                response.close()
            retry_after = response.headers.get("Retry-After") if response.status_code == 503 else None
            if retry_after is None or not retry_after.isdigit() or attempt == BUSY_RETRIES:
                return response
            time.sleep(min(float(retry_after), 2.0))
    raise AssertionError("unreachable")


def _call(request: httpx.Request) -> Any:
    """Send `request`; an error answer raises the `monitor.errors` class it names (the daemon
    refused what the command itself would refuse), else a StoreError naming the daemon."""
    import httpx

    what = f"{request.method} {request.url.path}"
    try:
        response = send_when_free(request, timeout=60)
    except httpx.HTTPError as exc:
        raise StoreError(f"the running daemon did not answer {what}: {exc}",
                         hint="it may have stopped; run the command again") from None
    if response.is_error:
        try:
            answer = response.json()
        except ValueError:
            answer = {}
        answer = answer if isinstance(answer, dict) else {}
        cls = getattr(errors, str(answer.get("kind")), None)
        if isinstance(cls, type) and issubclass(cls, LstarError):
            raise cls(str(answer.get("error")), hint=answer.get("hint"))
        hint = answer.get("hint") if isinstance(answer.get("hint"), str) else None
        raise StoreError(f"the running daemon answered {response.status_code} to {what}: "
                         f"{answer.get('error') or response.reason_phrase}",
                         hint=hint or "see the daemon's log; `lstar status` shows its state")
    try:
        return response.json()
    except ValueError:
        raise StoreError(f"the running daemon's answer to {what} is not JSON",
                         hint="see the daemon's log") from None


def revive_times(obj: Any, keys: tuple[str, ...] = ()) -> Any:
    """The API's JSON with its times as datetimes again: strings under keys ending in `_at`,
    or named in `keys`, that read as ISO 8601. Re-encoding gives the text the daemon sent."""
    from datetime import datetime

    if isinstance(obj, list):
        return [revive_times(x, keys) for x in obj]
    if not isinstance(obj, dict):
        return obj
    out = {}
    for k, v in obj.items():
        if isinstance(v, str) and (k.endswith("_at") or k in keys) and _TIME_TEXT.match(v):
            try:
                v = datetime.fromisoformat(v)
            except ValueError:
                pass
        out[k] = revive_times(v, keys)
    return out


__all__ = ["live_daemon_url", "api_get", "api_post", "send_when_free", "revive_times"]
