"""The daemon's local HTTP API (127.0.0.1 unless `lstar run --api-host 0.0.0.0`). The client side is `monitor.service.client`.

    GET  /                      the live status page: HTML, refreshing itself (`monitor.service.status_page`)
    GET  /health                200 {"ok": true} | 503 {"ok": false, "reasons": [...]} (unhealthy, or
                                degraded: a task the scoring settings can never evaluate)
    GET  /metrics               Prometheus text format
    GET  /status                JSON: checkpoints by status, jobs, policy errors, disk, outages
    GET  /checkpoints?status=S&repo=R&limit=N&cursor=C&fields=meta   a page of rows as `lstar
                                checkpoints --json` prints it: {"items", "total", "next_cursor", "limit"};
                                each row's `meta` holds only the keys a listing shows
                                (`listings.LISTING_META_KEYS`), all of it with `fields=meta`
    GET  /checkpoints/ID        one checkpoint's row with its whole meta (404 when there is none)
    GET  /db/info               as `lstar db info --json`
    GET  /runs?limit=N&cursor=C score runs newest first, a page as `lstar runs --json`
    GET  /report/latest?format=html|md|json|png   the newest file under STATE/reports (404: none)
    GET  /report?policy=NAME...&since=T&until=T   `lstar report --json` of loaded policies, each
                                named by its name or its file name in the policies folder (never a
                                path); its `policy_version` says which version in force it was
                                computed under; `since`/`until` (as `lstar report --since/--until`)
                                report on that window instead of the period since the last report
    GET  /watchlist?status=S&task=T&policy=P&repo=GLOB&limit=N&cursor=C   a page as
                                `lstar watchlist --json`: each watched lineage × task at its
                                current checkpoint, closest to its level first
    GET  /alerts?policy=P&state=S&limit=N&cursor=C   a page as `lstar alerts list --json`
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

Requests are served by uvicorn (h11) with Starlette routes; `RequestGuard` is the middleware
that checks Host, Origin, framing and the token, and `monitor.service.api_conn` the
connection-level guard: a connection waits for its request on the event loop and holds no
worker while it does; each request must arrive whole within the idle timeout (a silent or
trickling client is closed after that long), a connection lives at most its lifetime (and
100 answers), and at most `max_connections` are open (at the bound the one that has waited
longest for its request is closed). `workers` requests are served at once, each on a handler
thread; one more gets 503 with Retry-After, unserved. GET /health and /metrics hold no slot
and run on small pools of their own, so neither waiting clients nor slow reads delay them;
concurrent /metrics scrapes share one render (`monitor.service.api_cache`). The status page
`/` holds no slot either: it renders on a pool of its own, one render shared by every request
for two seconds, and needs the token beyond loopback like every other read.

The webhook secret comes from $LSTAR_HUB_WEBHOOK_SECRET or the file given to `lstar run
--webhook-secret-file`; without one the endpoint answers 404. Reads use their own DuckDB
cursor, so a job holding the database never blocks them.
"""

from __future__ import annotations

import errno
import hmac
import json
import logging
import os
import re
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import anyio
import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from monitor.alerts import expire_silence
from monitor.alerts.state_ops import add_silence_from_args, parse_now, retry_dead_letters
from monitor.errors import DeliveryError, LstarError, PolicyError, ServiceError
from monitor.policy.vocabulary import OBSERVED_STATES, OPERATOR_STATES, STATES
from monitor.reports import iter_json, report_for_cli
from monitor.reports.watchlist import MAX_GLOB_CHARS, STATUSES, watchlist_page
from monitor.reports.window import WindowError, report_window, window_report
from monitor.service.api_cache import SharedRender
from monitor.service.api_conn import (DEFAULT_MAX_CONNECTIONS, LISTEN_BACKLOG, MAX_HEAD_BYTES, ConnectionLimits,
                                      fit_connection_bound, protocol_for)
from monitor.service.api_guard import (DEFAULT_LIFETIME, DEFAULT_MAX_REQUESTS, MAX_LIMIT, TOKEN_NAME,
                                       HandlerSlots, RequestGuard, RequestRefused, refusal_body)
from monitor.service.daemon_view import DaemonView
from monitor.service.status_page import HEADERS as STATUS_PAGE_HEADERS
from monitor.service.status_page import MAX_AGE as STATUS_PAGE_MAX_AGE
from monitor.service.status_page import render_status_page
from monitor.store import utcnow
from monitor.store.listings import alerts_page, checkpoint_detail, checkpoints_page, runs_page, silences_page
from monitor.store.pages import DEFAULT_LIMIT

log = logging.getLogger("lstar.api")

SECRET_ENV = "LSTAR_HUB_WEBHOOK_SECRET"
MAX_HOOK_BODY = 1 << 20
MAX_JSON_BODY = 1 << 16
DEFAULT_IDLE_TIMEOUT = 15.0
DEFAULT_WORKERS = 8
RESERVED_WORKERS = 2                       # threads of /health, and two of /metrics, alone
RESERVED_PATHS = ("/health", "/metrics")   # answered even while every slot and worker is busy
STATUS_PAGE = "/"                          # also answered beside the slots, on a pool of its own
ALERT_ID = re.compile(r"\d{1,18}")
ALERT_STATES = STATES + OBSERVED_STATES + OPERATOR_STATES    # what an alert's `state` can be
STATE_PATH = re.compile(r"/silences|/silences/[^/]+/expire|/alerts/[^/]+/retry")
REPORT_TYPES = {".html": "text/html; charset=utf-8", ".md": "text/markdown; charset=utf-8",
                ".json": "application/json", ".png": "image/png"}
# The query parameters each GET endpoint takes; anything else is refused.
GET_PARAMS = {STATUS_PAGE: (), "/health": (), "/metrics": (), "/status": (), "/db/info": (),
              "/checkpoints": ("status", "repo", "limit", "cursor", "fields"), "/runs": ("limit", "cursor"),
              "/report/latest": ("format",), "/report": ("policy", "since", "until"),
              "/watchlist": ("status", "task", "policy", "repo", "limit", "cursor"),
              "/alerts": ("policy", "state", "limit", "cursor"),
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
    # Compact, so the C encoder does it: `indent` falls back to the pure-Python one, and a
    # 1,000-row page indented is twice the bytes.
    return json.dumps(obj, default=str, separators=(",", ":")).encode()


def _json(obj: Any, status: int = 200) -> Response:
    return Response(_json_bytes(obj), status_code=status, media_type="application/json")


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


def _text(body: dict[str, Any], key: str, *, required: bool = True) -> str | None:
    value = body.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str):
        raise RequestRefused(400, f"{key!r} must be a string")
    return value


class ApiApp:
    """The API's routes over a `DaemonView`: an ASGI app (`asgi`) with the request guard in
    front. Handlers run in a thread pool of `workers` threads, one per handler slot; /health
    and /metrics each in a pool of their own (/metrics reads the database; /health must not
    wait behind it)."""

    def __init__(self, daemon: DaemonView, *, token: str, workers: int, reads_need_token: bool,
                 allowed_hosts: tuple[str, ...] = ()) -> None:
        self.daemon = daemon
        self.token = token
        self.workers = workers
        self.slots = HandlerSlots(workers)
        self.reads_need_token = reads_need_token
        self.limiters: dict[str, anyio.CapacityLimiter] = {}   # made on the event loop, at first use
        # Every concurrent scrape shares one render (at most one a second).
        self.metrics_render = SharedRender(lambda: anyio.to_thread.run_sync(
            daemon.metrics.render, limiter=self._limiter("/metrics")))
        self.status_page_render = SharedRender(lambda: anyio.to_thread.run_sync(
            render_status_page, daemon, limiter=self._limiter(STATUS_PAGE)), max_age=STATUS_PAGE_MAX_AGE)
        get = ["GET"]  # HEAD comes with GET
        routes = [Route(STATUS_PAGE, self._status_page, methods=get),
                  Route("/health", self._route(self._health, pool="/health"), methods=get),
                  Route("/metrics", self._metrics, methods=get),
                  Route("/status", self._route(lambda r, q: _json(daemon.status())), methods=get),
                  Route("/checkpoints", self._route(self._checkpoints), methods=get),
                  Route("/checkpoints/{ident}", self._route(self._checkpoint), methods=get),
                  Route("/db/info", self._route(self._db_info), methods=get),
                  Route("/runs", self._route(self._runs), methods=get),
                  Route("/report/latest", self._route(self._latest_report), methods=get),
                  Route("/report", self._route(self._reports), methods=get),
                  Route("/watchlist", self._route(self._watchlist), methods=get),
                  Route("/alerts", self._route(self._alerts), methods=get),
                  Route("/alerts/{ident}", self._route(self._alert), methods=get),
                  Route("/silences", self._route(self._silences), methods=get),
                  Route("/silences", self._posted(self._add_silence), methods=["POST"]),
                  Route("/silences/{ident}/expire", self._posted(self._expire), methods=["POST"]),
                  Route("/alerts/{ident}/retry", self._posted(self._retry), methods=["POST"]),
                  Route("/hooks/hub", self._hub_hook, methods=["POST"])]
        # the hint of every 404 for a path the API does not serve
        self.endpoints_hint = "the endpoints are " + ", ".join(
            f"{'/'.join(sorted(set(route.methods or ()) - {'HEAD'}))} {route.path}" for route in routes)
        app = Starlette(routes=routes, exception_handlers={HTTPException: self._no_route})
        app.router.redirect_slashes = False
        hint = f"send `Authorization: Bearer TOKEN` with the token in {daemon.config.state_dir / TOKEN_NAME}" \
            if daemon.config is not None else "send `Authorization: Bearer TOKEN`"
        self.asgi = RequestGuard(app, token=token, allowed_hosts=tuple(h.lower() for h in allowed_hosts),
                                 reserved_paths=(*RESERVED_PATHS, STATUS_PAGE), body_limit=self._body_limit,
                                 needs_token=self._needs_token, slots=self.slots, token_hint=hint)

    # -- what the guard asks -------------------------------------------------------------------
    @staticmethod
    def _body_limit(method: str, path: str) -> int:
        if method != "POST":
            return 0
        return MAX_HOOK_BODY if path == "/hooks/hub" else MAX_JSON_BODY

    def _needs_token(self, method: str, path: str) -> str | None:
        if method == "POST" and STATE_PATH.fullmatch(path):
            return "this request changes state and needs the API token"
        if method != "POST" and self.reads_need_token and path not in RESERVED_PATHS:
            return "this API is reachable beyond this machine; reads need the API token"
        return None

    # -- running handlers ----------------------------------------------------------------------
    def _limiter(self, pool: str) -> anyio.CapacityLimiter:
        if pool not in self.limiters:
            self.limiters[pool] = anyio.CapacityLimiter(self.workers if pool == "general" else RESERVED_WORKERS)
        return self.limiters[pool]

    async def _run(self, request: Request, work: Callable[[], Response], *, pool: str = "general") -> Response:
        """`work()` in its bounded pool; refusals and errors become the answers the API documents."""
        try:
            return await anyio.to_thread.run_sync(work, limiter=self._limiter(pool))
        except RequestRefused as exc:
            return Response(refusal_body(exc), status_code=exc.status, media_type="application/json",
                            headers=exc.headers)
        except LstarError as exc:
            return Response(_error_body(exc), status_code=400, media_type="application/json")
        except Exception:
            log.exception("API %s %s failed", request.method, request.scope['path'])
            return _json({"error": INTERNAL_ERROR}, 500)

    def _route(self, handler: Callable[[Request, _Query], Response], *, pool: str = "general"):
        async def endpoint(request: Request) -> Response:
            def work() -> Response:
                return handler(request, _Query(request.scope["path"], request.scope["query_string"].decode("latin-1")))
            return await self._run(request, work, pool=pool)
        return endpoint

    def _posted(self, handler: Callable[[Request, dict[str, Any]], Any]):
        """A state-changing POST: a JSON object body, then `handler` on the daemon's own store."""
        async def endpoint(request: Request) -> Response:
            content_type = (request.headers.get("content-type") or "").split(";")[0].strip().lower()
            if content_type != "application/json":
                exc = RequestRefused(415, "send the body as Content-Type: application/json")
                return Response(refusal_body(exc), status_code=415, media_type="application/json",
                                headers={"Connection": "close"})
            try:
                raw = await request.body()
            except ClientDisconnect:  # gone, or cut off by the request deadline: nobody to answer
                return Response(status_code=400)

            def work() -> Response:
                try:
                    body = json.loads(raw or b"{}")
                except ValueError as exc:
                    raise RequestRefused(400, f"the body is not JSON: {exc}") from None
                if not isinstance(body, dict):
                    raise RequestRefused(400, "the body must be a JSON object")
                return _json(handler(request, body))
            return await self._run(request, work)
        return endpoint

    async def _no_route(self, request: Request, exc: Exception) -> Response:
        exc = RequestRefused(404, f"no such endpoint {request.scope['path'][:200]}", hint=self.endpoints_hint)
        return Response(refusal_body(exc), status_code=404, media_type="application/json")

    # -- reads ---------------------------------------------------------------------------------
    def _health(self, request: Request, query: _Query) -> Response:
        ok, reasons = self.daemon.health()
        return _json({"ok": ok, "reasons": reasons}, 200 if ok else 503)

    async def _metrics(self, request: Request) -> Response:
        """Prometheus text, rendered once for every scrape that comes while it renders and
        served again for a second (`api_cache.SharedRender`)."""
        from prometheus_client import CONTENT_TYPE_LATEST

        return await self._shared_page(request, self.metrics_render, path="/metrics", media_type=CONTENT_TYPE_LATEST)

    async def _status_page(self, request: Request) -> Response:
        """The live status page (`monitor.service.status_page`), rendered once for every
        request that comes while it renders and served again for two seconds."""
        return await self._shared_page(request, self.status_page_render, path="/",
                                       media_type="text/html; charset=utf-8", headers=STATUS_PAGE_HEADERS)

    async def _shared_page(self, request: Request, render: SharedRender, *, path: str, media_type: str,
                           headers: dict[str, str] | None = None) -> Response:
        """A page one `SharedRender` renders for every request that comes while it renders: the
        query checked first (a refused one answered in JSON), a failed render logged and a 500."""
        try:
            _Query(request.scope["path"], request.scope["query_string"].decode("latin-1"))
            body = await render.get()
        except RequestRefused as exc:
            return Response(refusal_body(exc), status_code=exc.status, media_type="application/json")
        except Exception:
            log.exception("API GET %s failed", path)
            return _json({"error": INTERNAL_ERROR}, 500)
        return Response(body, media_type=media_type, headers=headers)

    def _checkpoints(self, request: Request, query: _Query) -> Response:
        limit = query.limit()
        with self.daemon.read_store() as store:
            page = checkpoints_page(store, status=query.one("status"), repo=query.one("repo"), limit=limit,
                                    cursor=query.one("cursor"), with_meta=query.choice("fields", ("meta",)) == "meta")
        return _json(page.as_dict())

    def _checkpoint(self, request: Request, query: _Query) -> Response:
        ident = request.path_params["ident"]
        if not ALERT_ID.fullmatch(ident):
            raise RequestRefused(404, f"no such endpoint {request.scope['path'][:200]}", hint=self.endpoints_hint)
        with self.daemon.read_store() as store:
            detail = checkpoint_detail(store, int(ident))
        if detail is None:
            raise RequestRefused(404, f"no checkpoint with id {ident}", hint="see `lstar checkpoints`")
        return _json(detail)

    def _db_info(self, request: Request, query: _Query) -> Response:
        with self.daemon.read_store() as store:
            return _json(store.info())

    def _runs(self, request: Request, query: _Query) -> Response:
        limit = query.limit()
        with self.daemon.read_store() as store:
            page = runs_page(store, limit=limit, cursor=query.one("cursor"))
        return _json(page.as_dict())

    def _alerts(self, request: Request, query: _Query) -> Response:
        limit = query.limit()
        with self.daemon.read_store() as store:
            page = alerts_page(store, policy=query.one("policy"), state=query.choice("state", ALERT_STATES),
                               limit=limit, cursor=query.one("cursor"))
        return _json(page.as_dict())

    def _watchlist(self, request: Request, query: _Query) -> Response:
        limit = query.limit()
        repo = query.one("repo")
        if repo is not None and len(repo) > MAX_GLOB_CHARS:
            raise RequestRefused(400, f"repo must be a glob of at most {MAX_GLOB_CHARS} characters")
        with self.daemon.read_store() as store:
            page = watchlist_page(store, status=query.choice("status", STATUSES), task=query.one("task"),
                                  policy=query.one("policy"), repo=repo, limit=limit, cursor=query.one("cursor"))
        return _json(page.as_dict())

    def _alert(self, request: Request, query: _Query) -> Response:
        ident = request.path_params["ident"]
        if not ALERT_ID.fullmatch(ident):
            raise RequestRefused(404, f"no such endpoint {request.scope['path'][:200]}", hint=self.endpoints_hint)
        with self.daemon.read_store() as store:
            detail = store.alert_detail(int(ident))
        if detail is None:
            error = DeliveryError(f"no alert with id {ident}", hint="see `lstar alerts list`")
            return Response(_error_body(error), status_code=404, media_type="application/json")
        return _json(detail.as_dict())

    def _silences(self, request: Request, query: _Query) -> Response:
        include_expired = query.choice("all", ("0", "1")) == "1"
        now = parse_now(query.one("now"))
        limit = query.limit()
        with self.daemon.read_store() as store:
            page = silences_page(store, now=now, include_expired=include_expired, limit=limit,
                                 cursor=query.one("cursor"))
        return _json(page.as_dict())

    def _reports(self, request: Request, query: _Query) -> Response:
        """`lstar report --json` of each named loaded policy, as data (times in ISO 8601)."""
        names = query.lists.get("policy", [])
        if not names:
            raise RequestRefused(400, "name the policies: /report?policy=NAME",
                                 hint="a loaded policy's name, or its file name in the policies folder")
        if len(names) > 100:
            raise RequestRefused(400, f"{len(names)} policies asked for; at most 100 at a time")
        policies = [self._loaded_policy(name) for name in names]
        now = utcnow()
        try:
            window = report_window(since=query.one("since"), until=query.one("until"), now=now)
        except WindowError as exc:
            raise RequestRefused(400, str(exc).replace("--since", "since").replace("--until", "until")) from None
        with self.daemon.read_store() as store:
            if window is not None:
                reports = [window_report(store, p, start=window[0], end=window[1], now=now) for p in policies]
            else:
                reports = [report_for_cli(store, p, now=now) for p in policies]
        # Encoded once, as the response is sent (a week's report at 10^5 checkpoints is tens of
        # MB: not held a second time as text, nor decoded and encoded again).
        return StreamingResponse((chunk.encode("utf-8") for chunk in iter_json(reports)),
                                 media_type="application/json")

    def _loaded_policy(self, name: str) -> Any:
        """The policy in force called `name`, or loaded from the file `name` in the policies folder."""
        folder = self.daemon.config.policies_dir
        if not name or name in (".", "..") or any(c in name for c in "/\\\0"):
            raise RequestRefused(400, f"policy={name[:200]!r} is not a policy name",
                                 hint=f"name a policy the daemon has loaded (its name, or its file name in {folder}), "
                                      "not a path")
        loaded = self.daemon.policies()
        for policy in loaded:
            if policy.name == name:
                return policy
        for policy in loaded:
            if policy.path is not None and Path(policy.path).name == name:
                return policy
        names = ", ".join(p.name for p in loaded) or "none"
        raise PolicyError(f"the running daemon has no policy {name!r} loaded",
                          hint=f"loaded: {names}; put its file in {folder} (read within the reload interval)")

    def _latest_report(self, request: Request, query: _Query) -> Response:
        fmt = query.choice("format", tuple(s.lstrip(".") for s in REPORT_TYPES))
        folder = self.daemon.config.state_dir / "reports"
        suffixes = [f".{fmt}"] if fmt else list(REPORT_TYPES)
        files = [p for p in folder.rglob("*") if p.is_file() and p.suffix in suffixes] if folder.is_dir() else []
        if not files:
            raise RequestRefused(404, "no report yet", hint=f"reports are written under {folder}")
        newest = max(files, key=lambda p: (p.stat().st_mtime, p.suffix == ".html"))
        return Response(newest.read_bytes(), media_type=REPORT_TYPES[newest.suffix])

    # -- writes --------------------------------------------------------------------------------
    async def _hub_hook(self, request: Request) -> Response:
        """The Hub's webhook: the secret is checked before its body is read; a poll follows."""
        secret = webhook_secret(self.daemon.config.webhook_secret_file)
        refused = None
        given = request.headers.get("x-webhook-secret")
        if secret is None:
            refused = RequestRefused(404, "the Hub webhook is off",
                                     hint=f"set ${SECRET_ENV} or `lstar run --webhook-secret-file`")
        elif given is None:
            refused = RequestRefused(401, "missing X-Webhook-Secret")
        elif not hmac.compare_digest(given.encode(), secret.encode()):
            refused = RequestRefused(403, "wrong X-Webhook-Secret")
        if refused is not None:
            unread = request.headers.get("content-length", "0") != "0"
            return Response(refusal_body(refused), status_code=refused.status, media_type="application/json",
                            headers={"Connection": "close"} if unread else None)
        try:
            await request.body()  # only a signal: the poll asks the Hub itself
        except ClientDisconnect:
            return Response(status_code=400)
        self.daemon.request_poll()
        return _json({"poll": "requested"}, 202)

    def _now(self, body: dict[str, Any]) -> Any:
        return parse_now(_text(body, "now", required=False))

    def _expire(self, request: Request, body: dict[str, Any]) -> Any:
        now = self._now(body)
        silence_id = request.path_params["ident"]
        with self.daemon.job_store() as store:
            silence_id = expire_silence(store, silence_id, now=now)   # a unique prefix names the whole id
        return {"expired": silence_id}

    def _retry(self, request: Request, body: dict[str, Any]) -> Any:
        now = self._now(body)
        with self.daemon.job_store() as store:
            return {"requeued": retry_dead_letters(store, request.path_params["ident"], now=now)}

    def _add_silence(self, request: Request, body: dict[str, Any]) -> Any:
        now = self._now(body)
        match = body.get("match")
        with self.daemon.job_store() as store:
            if not isinstance(match, list) or not all(isinstance(m, str) for m in match):
                raise RequestRefused(400, "'match' must be a list of strings")
            return add_silence_from_args(
                store, match=match, until=_text(body, "until"), comment=_text(body, "comment"),
                start=_text(body, "start", required=False), now=now,
                created_by=_text(body, "created_by", required=False))


API_LOOPBACK_HOSTS = ("127.0.0.1",)
API_HOSTS = ("127.0.0.1", "0.0.0.0")   # loopback, or every interface (a container's published port)


def listen_socket(host: str, port: int) -> socket.socket:
    """A socket bound to `host`:`port` (0: a free port), or ServiceError naming the port.

    The daemon calls this before it writes anything to its state directory, so a port that
    is taken costs one line and changes nothing. It listens only once `ApiServer.start` has
    everything ready (`start_listening`): a client that connects while the daemon starts (its
    migrations, its policies) is refused at once instead of waiting unanswered in the
    backlog. The bind catches a port another process listens on; two sockets with
    SO_REUSEADDR may both bind a port while neither listens, and then the second to listen
    gets the same error from `start_listening`."""
    if host not in API_HOSTS:
        raise ValueError(f"API host {host!r}: use one of {', '.join(API_HOSTS)}")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # a port in TIME_WAIT is free
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise _listen_error(host, port, exc) from None
    return sock


def start_listening(sock: socket.socket) -> None:
    """Listen on a socket `listen_socket` bound; ServiceError naming the port if it is taken."""
    host, port = sock.getsockname()[:2]
    try:
        sock.listen(LISTEN_BACKLOG)
    except OSError as exc:
        raise _listen_error(host, port, exc) from None


def _listen_error(host: str, port: int, exc: OSError) -> ServiceError:
    reason = exc.strerror or str(exc)
    if exc.errno == errno.EADDRINUSE:
        return ServiceError(f"port {port} on {host} is already in use ({reason})",
                            hint="choose another with --api-port or stop the process holding it")
    return ServiceError(f"cannot listen on {host} port {port} ({reason})",
                        hint="choose another with --api-port (1024 or above needs no privilege)")


class ApiServer:
    """The API on `host`:`port` (0 picks a free port), served by uvicorn from a background thread.

    `host` is 127.0.0.1, or 0.0.0.0 inside a container (every GET but /health and /metrics
    then needs the token, and `allowed_hosts` are accepted in `Host` beside the loopback names).

    `token` guards the state-changing requests; `workers` bounds the requests served at once
    and the threads that run handlers; a request must arrive whole within `idle_timeout`
    seconds, a connection closes `lifetime` seconds after it was accepted, and at most
    `max_connections` are open (fewer when the descriptor limit allows fewer). `sock` is a
    socket `listen_socket` made already (the daemon checks its port before anything else);
    without one, `host`:`port` is bound here.
    """

    def __init__(self, daemon: DaemonView, *, port: int, token: str, workers: int = DEFAULT_WORKERS,
                 idle_timeout: float = DEFAULT_IDLE_TIMEOUT, lifetime: float = DEFAULT_LIFETIME,
                 host: str = "127.0.0.1", allowed_hosts: tuple[str, ...] = (),
                 max_requests: int = DEFAULT_MAX_REQUESTS, max_connections: int = DEFAULT_MAX_CONNECTIONS,
                 sock: socket.socket | None = None) -> None:
        if host not in API_HOSTS:
            raise ValueError(f"API host {host!r}: use one of {', '.join(API_HOSTS)}")
        self.limits = ConnectionLimits(idle_timeout=idle_timeout, lifetime=lifetime, max_requests=max_requests,
                                       max_connections=fit_connection_bound(max_connections))
        # Beyond loopback, reads (which show repos, alerts and receivers) need the token too.
        self.server = ApiApp(daemon, token=token, workers=workers,
                             reads_need_token=host not in API_LOOPBACK_HOSTS, allowed_hosts=allowed_hosts)
        self.socket = sock if sock is not None else listen_socket(host, port)
        config = uvicorn.Config(
            self.server.asgi, http=protocol_for(self.limits), ws="none", lifespan="off", loop="asyncio",
            interface="asgi3", log_config=None, access_log=False, server_header=False,
            # No `limit_concurrency`: it counts waiting connections too and answers /health a
            # plain 503; the connection guard bounds connections, the handler slots requests.
            limit_concurrency=None,
            h11_max_incomplete_event_size=MAX_HEAD_BYTES, timeout_keep_alive=max(1, int(idle_timeout)),
            timeout_graceful_shutdown=2, backlog=LISTEN_BACKLOG)
        self.uvicorn = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.uvicorn.run, kwargs={"sockets": [self.socket]},
                                       name="lstar-api", daemon=True)

    @property
    def url(self) -> str:
        """The URL this machine's commands use: loopback, whatever the bind (0.0.0.0 includes it)."""
        return f"http://127.0.0.1:{self.socket.getsockname()[1]}"

    def start(self) -> "ApiServer":
        """Serve from the background thread; returns once the API accepts connections."""
        logging.getLogger("uvicorn.error").setLevel(max(logging.WARNING, logging.getLogger("uvicorn.error").level))
        try:
            start_listening(self.socket)
            self.thread.start()
            deadline = time.monotonic() + 30
            while not self.uvicorn.started:
                if not self.thread.is_alive() or time.monotonic() > deadline:
                    raise RuntimeError("the API server did not start; see the log above")
                time.sleep(0.01)
        except BaseException:   # the caller never gets this server: its socket and thread end here
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop accepting, close connections (answers in progress get 2 s) and join the thread."""
        self.uvicorn.should_exit = True
        if self.thread.is_alive():
            self.thread.join(timeout=10)
        self.socket.close()

    def __enter__(self) -> "ApiServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


__all__ = ["ApiServer", "ApiApp", "API_HOSTS", "listen_socket", "start_listening", "webhook_secret", "SECRET_ENV"]
