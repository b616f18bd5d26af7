"""The daemon's local HTTP API (127.0.0.1 unless `lstar run --api-host 0.0.0.0`). The client side is `monitor.service.client`.

    GET  /health                200 {"ok": true} | 503 {"ok": false, "reasons": [...]} (unhealthy, or
                                degraded: a task the scoring settings can never evaluate)
    GET  /metrics               Prometheus text format
    GET  /status                JSON: checkpoints by status, jobs, policy errors, disk, outages
    GET  /checkpoints?status=S&repo=R&limit=N&cursor=C   a page of rows as `lstar checkpoints --json`
                                prints it: {"items", "total", "next_cursor", "limit"}
    GET  /db/info               as `lstar db info --json`
    GET  /runs?limit=N&cursor=C score runs newest first, a page as `lstar runs --json`
    GET  /report/latest?format=html|md|json|png   the newest file under STATE/reports (404: none)
    GET  /report?policy=NAME... `lstar report --json` of loaded policies, each named by its
                                name or its file name in the policies folder (never a path)
    GET  /alerts?policy=P&limit=N&cursor=C   a page as `lstar alerts list --json`
    GET  /alerts/ID             as `lstar alerts show ID --json` (404 when there is none)
    GET  /silences?all=1&now=T&limit=N&cursor=C   a page as `lstar silence list --json`
    POST /silences              `lstar silence add`: {"match": [...], "until", "comment",
                                "start", "now", "created_by"}; answers the new silence's row
    POST /silences/ID/expire    `lstar silence expire ID`: {"now"}; answers {"expired": ID}
    POST /alerts/IDENT/retry    `lstar alerts retry IDENT`: {"now"}; answers {"requeued": [...]}
    POST /hooks/hub             Hub webhook: `X-Webhook-Secret` checked in constant time;
                                401 when missing, 403 when wrong, 202 and a poll when right

Every request must name the API by a loopback `Host` (and `Origin`, if any) with its port;
POSTs other than the Hub webhook need `Authorization: Bearer TOKEN`, the token `lstar run`
writes to STATE/api.token (`monitor.service.api_guard`). Bound to every interface (`--api-host
0.0.0.0`, for a container whose port is published), every GET but /health and /metrics needs
the token too, and `Host` may also be a name given with `--api-allowed-host`. The body's length, the token and the
webhook secret are checked before the body is read; a refused body is never read. Query
parameters are validated: unknown or malformed ones get 400 with what is expected.

Every listing answers one page: `limit` rows at most (default 50, at most 1000), the total
with the same filters, and `next_cursor` (null on the last page) to pass as `cursor` for the
next; a cursor the listing did not hand out gets 400 (`monitor.store.pages`).

Errors the commands would raise come back as 4xx {"error", "hint", "kind"} and the client
raises the same `monitor.errors` class, so the command prints the same one line either way.
Any other failure is logged with its traceback and answered 500 with a short message. The
state-changing POSTs need `Content-Type: application/json` and write through the daemon's
own connection, on a fresh cursor, as its jobs do.

Connections are served by a fixed pool of worker threads. A request must arrive whole within
the idle timeout, so a silent or trickling client frees its worker after that long, and a
connection lives at most its lifetime (and 100 answers), so a busy one frees it too. When
every worker is busy, the reserved lane still answers GET /health and /metrics; any other
request gets 503 with Retry-After, unserved.

The webhook secret comes from $LSTAR_HUB_WEBHOOK_SECRET or the file given to `lstar run
--webhook-secret-file`; without one the endpoint answers 404. Reads use their own DuckDB
cursor, so a job holding the database never blocks them.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, unquote, urlsplit

from monitor.alerts import expire_silence
from monitor.alerts.state_ops import add_silence_from_args, parse_now, retry_dead_letters
from monitor.errors import DeliveryError, LstarError, PolicyError
from monitor.reports import report_for_cli, to_json
from monitor.served import ServedInThread
from monitor.service.api_guard import (DEFAULT_LIFETIME, MAX_LIMIT, TOKEN_NAME, BoundedHTTPServer,
                                       GuardedHandler, RequestRefused, bearer_matches)
from monitor.service.client import api_get, api_post, live_daemon_url, revive_times
from monitor.store import utcnow
from monitor.store.listings import alerts_page, checkpoints_page, runs_page, silences_page
from monitor.store.pages import DEFAULT_LIMIT

if TYPE_CHECKING:
    from monitor.service.daemon import Daemon

log = logging.getLogger("lstar.api")

SECRET_ENV = "LSTAR_HUB_WEBHOOK_SECRET"
MAX_HOOK_BODY = 1 << 20
MAX_JSON_BODY = 1 << 16
DEFAULT_IDLE_TIMEOUT = 15.0
DEFAULT_WORKERS = 8
RESERVED_PATHS = ("/health", "/metrics")   # answered even while every worker is busy
ALERT_PATH = re.compile(r"/alerts/(\d{1,18})")
EXPIRE_PATH = re.compile(r"/silences/([^/]+)/expire")
RETRY_PATH = re.compile(r"/alerts/([^/]+)/retry")
REPORT_TYPES = {".html": "text/html; charset=utf-8", ".md": "text/markdown; charset=utf-8",
                ".json": "application/json", ".png": "image/png"}
# The query parameters each GET endpoint takes; anything else is refused.
GET_PARAMS = {"/health": (), "/metrics": (), "/status": (), "/db/info": (),
              "/checkpoints": ("status", "repo", "limit", "cursor"), "/runs": ("limit", "cursor"),
              "/report/latest": ("format",), "/report": ("policy",), "/alerts": ("policy", "limit", "cursor"),
              "/silences": ("all", "now", "limit", "cursor")}
INTERNAL_ERROR = "internal error; the daemon's log has the details"


def webhook_secret(secret_file: Path | None) -> str | None:
    """The Hub webhook secret: the environment variable, else the file's first line."""
    value = os.environ.get(SECRET_ENV)
    if value:
        return value
    if secret_file is not None and secret_file.is_file():
        text = secret_file.read_text().strip()
        return text or None
    return None


def _json_bytes(obj: Any) -> bytes:
    return json.dumps(obj, indent=2, default=str).encode()


def _error_body(exc: LstarError) -> bytes:
    return _json_bytes({"error": exc.message, "hint": exc.hint, "kind": type(exc).__name__})


class _Query:
    """The query string of one GET: only the parameters its endpoint takes, each at most once
    (`policy` may repeat)."""

    def __init__(self, path: str, text: str) -> None:
        try:
            self.lists = parse_qs(text, keep_blank_values=True, max_num_fields=100)
        except ValueError:
            raise RequestRefused(400, "too many query parameters") from None
        known = GET_PARAMS.get(path, ())
        for name, values in self.lists.items():
            if name not in known:
                raise RequestRefused(400, f"unknown query parameter {name[:40]!r} for {path}",
                                     hint=f"it takes: {', '.join(known) or 'none'}")
            if len(values) > 1 and name != "policy":
                raise RequestRefused(400, f"query parameter {name!r} given {len(values)} times")

    def one(self, name: str) -> str | None:
        values = self.lists.get(name)
        return values[0] if values else None

    def limit(self, default: int = DEFAULT_LIMIT) -> int:
        text = self.one("limit")
        if text is None or text == "":
            return default
        if not re.fullmatch(r"[0-9]{1,18}", text) or not 1 <= int(text) <= MAX_LIMIT:
            raise RequestRefused(400, f"limit must be a whole number from 1 to {MAX_LIMIT}, got {text[:40]!r}")
        return int(text)

    def choice(self, name: str, allowed: tuple[str, ...]) -> str | None:
        text = self.one(name)
        if text is not None and text not in allowed:
            raise RequestRefused(400, f"{name} must be one of {', '.join(allowed)}, got {text[:40]!r}")
        return text


class _Handler(GuardedHandler):
    server: "_Server"

    def _send(self, status: int, body: bytes, content_type: str = "application/json",
              headers: dict[str, str] | None = None) -> None:
        self.send_bytes(status, body, content_type, headers)

    def _refuse(self, exc: RequestRefused) -> None:
        self._send(exc.status, _json_bytes({"error": str(exc), "hint": exc.hint}), headers=exc.headers)
        self.linger()

    def _answer(self, serve: Callable[[], None]) -> None:
        """Run `serve`; its refusals and errors become the answers the API documents."""
        try:
            serve()
        except RequestRefused as exc:
            self._refuse(exc)
        except LstarError as exc:
            self._send(400, _error_body(exc))
        except (TimeoutError, ConnectionError):
            self.close_connection = True  # the client is gone or too slow: nobody to answer
        except Exception:
            log.exception("API %s %s failed", self.command, urlsplit(self.path).path)
            self._send(500, _json_bytes({"error": INTERNAL_ERROR}))

    # -- reads ---------------------------------------------------------------------------------
    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        self._answer(self._get)

    def do_HEAD(self) -> None:  # noqa: N802
        self._answer(self._get)

    def _get(self) -> None:
        self.admit(body_limit=0)
        daemon = self.server.daemon
        url = urlsplit(self.path)
        if self.server.reads_need_token and url.path not in RESERVED_PATHS:
            self._check_token("this API is reachable beyond this machine; reads need the API token")
        alert = ALERT_PATH.fullmatch(url.path)
        if url.path not in GET_PARAMS and alert is None:
            raise RequestRefused(404, f"no such endpoint {url.path[:200]}")
        query = _Query(url.path, url.query)
        if url.path == "/health":
            ok, reasons = daemon.health()
            self._send(200 if ok else 503, _json_bytes({"ok": ok, "reasons": reasons}))
        elif url.path == "/metrics":
            from prometheus_client import CONTENT_TYPE_LATEST

            self._send(200, daemon.metrics.render(), CONTENT_TYPE_LATEST)
        elif url.path == "/status":
            self._send(200, _json_bytes(daemon.status()))
        elif url.path == "/checkpoints":
            limit = query.limit()
            with daemon.read_store() as store:
                page = checkpoints_page(store, status=query.one("status"), repo=query.one("repo"), limit=limit,
                                        cursor=query.one("cursor"))
            self._send(200, _json_bytes(page.as_dict()))
        elif url.path == "/db/info":
            with daemon.read_store() as store:
                self._send(200, _json_bytes(store.info()))
        elif url.path == "/runs":
            limit = query.limit()
            with daemon.read_store() as store:
                page = runs_page(store, limit=limit, cursor=query.one("cursor"))
            self._send(200, _json_bytes(page.as_dict()))
        elif url.path == "/report/latest":
            fmt = query.choice("format", tuple(s.lstrip(".") for s in REPORT_TYPES))
            self._latest_report(daemon.config.state_dir / "reports", fmt)
        elif url.path == "/report":
            self._send(200, _json_bytes(self._reports(query.lists.get("policy", []))))
        elif url.path == "/alerts":
            limit = query.limit()
            with daemon.read_store() as store:
                page = alerts_page(store, policy=query.one("policy"), limit=limit, cursor=query.one("cursor"))
            self._send(200, _json_bytes(page.as_dict()))
        elif alert is not None:
            with daemon.read_store() as store:
                detail = store.alert_detail(int(alert.group(1)))
            if detail is None:
                error = DeliveryError(f"no alert with id {alert.group(1)}", hint="see `lstar alerts list`")
                self._send(404, _error_body(error))
            else:
                self._send(200, _json_bytes(detail.as_dict()))
        else:  # /silences
            include_expired = query.choice("all", ("0", "1")) == "1"
            now = parse_now(query.one("now"))
            limit = query.limit()
            with daemon.read_store() as store:
                page = silences_page(store, now=now, include_expired=include_expired, limit=limit,
                                     cursor=query.one("cursor"))
            self._send(200, _json_bytes(page.as_dict()))

    def _reports(self, names: list[str]) -> list[dict[str, Any]]:
        """`lstar report --json` of each named loaded policy, as data (times in ISO 8601)."""
        if not names:
            raise RequestRefused(400, "name the policies: /report?policy=NAME",
                                 hint="a loaded policy's name, or its file name in the policies folder")
        if len(names) > 100:
            raise RequestRefused(400, f"{len(names)} policies asked for; at most 100 at a time")
        policies = [self._loaded_policy(name) for name in names]
        now = utcnow()
        with self.server.daemon.read_store() as store:
            return [json.loads(to_json(report_for_cli(store, p, now=now))) for p in policies]

    def _loaded_policy(self, name: str) -> Any:
        """The policy in force called `name`, or loaded from the file `name` in the policies folder."""
        daemon = self.server.daemon
        folder = daemon.config.policies_dir
        if not name or name in (".", "..") or any(c in name for c in "/\\\0"):
            raise RequestRefused(400, f"policy={name[:200]!r} is not a policy name",
                                 hint=f"name a policy the daemon has loaded (its name, or its file name in {folder}), "
                                      "not a path")
        loaded = daemon.policies()
        for policy in loaded:
            if policy.name == name:
                return policy
        for policy in loaded:
            if policy.path is not None and Path(policy.path).name == name:
                return policy
        names = ", ".join(p.name for p in loaded) or "none"
        raise PolicyError(f"the running daemon has no policy {name!r} loaded",
                          hint=f"loaded: {names}; put its file in {folder} (read within the reload interval)")

    def _latest_report(self, folder: Path, fmt: str | None) -> None:
        suffixes = [f".{fmt}"] if fmt else list(REPORT_TYPES)
        files = [p for p in folder.rglob("*") if p.is_file() and p.suffix in suffixes] if folder.is_dir() else []
        if not files:
            raise RequestRefused(404, "no report yet", hint=f"reports are written under {folder}")
        newest = max(files, key=lambda p: (p.stat().st_mtime, p.suffix == ".html"))
        self._send(200, newest.read_bytes(), REPORT_TYPES[newest.suffix])

    # -- writes --------------------------------------------------------------------------------
    def do_POST(self) -> None:  # noqa: N802
        path = urlsplit(self.path).path
        if path == "/hooks/hub":
            self._answer(self._hub_hook)
        else:
            self._answer(lambda: self._state_change(path))

    def _hub_hook(self) -> None:
        """The Hub's webhook: the secret is checked before its body is read; a poll follows."""
        length = self.admit(body_limit=MAX_HOOK_BODY)
        daemon = self.server.daemon
        secret = webhook_secret(daemon.config.webhook_secret_file)
        if secret is None:
            raise RequestRefused(404, "the Hub webhook is off",
                                 hint=f"set ${SECRET_ENV} or `lstar run --webhook-secret-file`")
        given = self.headers.get("X-Webhook-Secret")
        if given is None:
            raise RequestRefused(401, "missing X-Webhook-Secret")
        if not hmac.compare_digest(given.encode(), secret.encode()):
            raise RequestRefused(403, "wrong X-Webhook-Secret")
        self.read_body(length)  # only a signal: the poll asks the Hub itself
        daemon.request_poll()
        self._send(202, _json_bytes({"poll": "requested"}))

    def _check_token(self, why: str = "this request changes state and needs the API token") -> None:
        matched = bearer_matches(self.headers.get("Authorization"), self.server.token)
        hint = (f"send `Authorization: Bearer TOKEN` with the token in "
                f"{self.server.daemon.config.state_dir / TOKEN_NAME}")
        if matched is None:
            raise RequestRefused(401, why, hint=hint,
                                 headers={"WWW-Authenticate": 'Bearer realm="lstar"'})
        if not matched:
            raise RequestRefused(403, "wrong API token",
                                 hint=f"{hint} (the daemon writes a new one at each start)")

    def _json_body(self, length: int) -> dict[str, Any]:
        content_type = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        if content_type != "application/json":
            raise RequestRefused(415, "send the body as Content-Type: application/json")
        raw = self.read_body(length)
        try:
            body = json.loads(raw or b"{}")
        except ValueError as exc:
            raise RequestRefused(400, f"the body is not JSON: {exc}") from None
        if not isinstance(body, dict):
            raise RequestRefused(400, "the body must be a JSON object")
        return body

    def _state_change(self, path: str) -> None:
        """The POSTs that change runtime state (silences, retries), written by the daemon."""
        length = self.admit(body_limit=MAX_JSON_BODY)
        expire = EXPIRE_PATH.fullmatch(path)
        retry = RETRY_PATH.fullmatch(path)
        if path != "/silences" and expire is None and retry is None:
            raise RequestRefused(404, f"no such endpoint {path[:200]}")
        self._check_token()
        body = self._json_body(length)
        now = parse_now(_text(body, "now", required=False))
        with self.server.daemon.job_store() as store:
            if expire is not None:
                silence_id = unquote(expire.group(1))
                expire_silence(store, silence_id, now=now)
                answer: Any = {"expired": silence_id}
            elif retry is not None:
                answer = {"requeued": retry_dead_letters(store, unquote(retry.group(1)), now=now)}
            else:
                match = body.get("match")
                if not isinstance(match, list) or not all(isinstance(m, str) for m in match):
                    raise RequestRefused(400, "'match' must be a list of strings")
                answer = add_silence_from_args(
                    store, match=match, until=_text(body, "until"), comment=_text(body, "comment"),
                    start=_text(body, "start", required=False), now=now,
                    created_by=_text(body, "created_by", required=False))
        self._send(200, _json_bytes(answer))


def _text(body: dict[str, Any], key: str, *, required: bool = True) -> str | None:
    value = body.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str):
        raise RequestRefused(400, f"{key!r} must be a string")
    return value


class _Server(BoundedHTTPServer):
    def __init__(self, address: tuple[str, int], daemon: "Daemon", *, token: str, workers: int,
                 idle_timeout: float, lifetime: float, allowed_hosts: tuple[str, ...] = ()) -> None:
        super().__init__(address, _Handler, workers=workers, idle_timeout=idle_timeout, lifetime=lifetime,
                         reserved_paths=RESERVED_PATHS)
        self.daemon = daemon
        self.token = token
        self.allowed_hosts = tuple(h.lower() for h in allowed_hosts)
        # Beyond loopback, reads (which show repos, alerts and receivers) need the token too.
        self.reads_need_token = address[0] not in API_LOOPBACK_HOSTS


API_LOOPBACK_HOSTS = ("127.0.0.1",)
API_HOSTS = ("127.0.0.1", "0.0.0.0")   # loopback, or every interface (a container's published port)


class ApiServer(ServedInThread):
    """The API on `host`:`port` (0 picks a free port), served from a background thread.

    `host` is 127.0.0.1, or 0.0.0.0 inside a container (every GET but /health and /metrics
    then needs the token, and `allowed_hosts` are accepted in `Host` beside the loopback names).

    `token` guards the state-changing requests; `workers` bounds the connections served at
    once; a request must arrive whole within `idle_timeout` seconds, and a connection closes
    `lifetime` seconds after it was accepted.
    """

    def __init__(self, daemon: "Daemon", *, port: int, token: str, workers: int = DEFAULT_WORKERS,
                 idle_timeout: float = DEFAULT_IDLE_TIMEOUT, lifetime: float = DEFAULT_LIFETIME,
                 host: str = "127.0.0.1", allowed_hosts: tuple[str, ...] = ()) -> None:
        if host not in API_HOSTS:
            raise ValueError(f"API host {host!r}: use one of {', '.join(API_HOSTS)}")
        super().__init__(_Server((host, port), daemon, token=token, workers=workers, idle_timeout=idle_timeout,
                                 lifetime=lifetime, allowed_hosts=allowed_hosts), name="lstar-api", poll_interval=0.2)

    @property
    def url(self) -> str:
        """The URL this machine's commands use: loopback, whatever the bind (0.0.0.0 includes it)."""
        return f"http://127.0.0.1:{self.server.server_address[1]}"


__all__ = ["ApiServer", "API_HOSTS", "webhook_secret", "SECRET_ENV", "live_daemon_url", "api_get", "api_post",
           "revive_times"]
