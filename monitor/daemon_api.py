"""The daemon's local HTTP API (127.0.0.1 only), and the client the read commands use.

    GET  /health                200 {"ok": true} | 503 {"ok": false, "reasons": [...]}
    GET  /metrics               Prometheus text format
    GET  /status                JSON: checkpoints by status, jobs, policy errors, disk, outages
    GET  /checkpoints?status=S&repo=R&limit=N   rows as `lstar checkpoints --json` prints them
    GET  /db/info               as `lstar db info --json`
    GET  /report/latest         the newest file under STATE/reports (404 when none)
    GET  /report?policy=FILE... `lstar report --json` of each policy file (absolute paths)
    GET  /alerts?policy=P&limit=N   as `lstar alerts list --json`
    GET  /alerts/ID             as `lstar alerts show ID --json` (404 when there is none)
    GET  /silences?all=1&now=T  as `lstar silence list --json`
    POST /silences              `lstar silence add`: {"match": [...], "until", "comment",
                                "start", "now", "created_by"}; answers the new silence's row
    POST /silences/ID/expire    `lstar silence expire ID`: {"now"}; answers {"expired": ID}
    POST /alerts/IDENT/retry    `lstar alerts retry IDENT`: {"now"}; answers {"requeued": [...]}
    POST /hooks/hub             Hub webhook: `X-Webhook-Secret` checked in constant time;
                                401 when missing, 403 when wrong, 202 and a poll when right

Errors the commands would raise come back as 4xx {"error", "hint", "kind"} and the client
raises the same `monitor.errors` class, so the command prints the same one line either way.
The state-changing POSTs need `Content-Type: application/json` (a web page cannot send that
to 127.0.0.1 without a CORS preflight, which this server never grants) and write through the
daemon's own connection, on a fresh cursor, as its jobs do.

The webhook secret comes from $LSTAR_HUB_WEBHOOK_SECRET or the file given to `lstar run
--webhook-secret-file`; without one the endpoint answers 404. Reads use their own DuckDB
cursor, so a job holding the database never blocks them.
"""

from __future__ import annotations

import hmac
import json
import os
import re
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, unquote, urlsplit

from monitor.errors import LstarError, StoreError

if TYPE_CHECKING:
    from monitor.daemon import Daemon

SECRET_ENV = "LSTAR_HUB_WEBHOOK_SECRET"
MAX_HOOK_BODY = 1 << 20
MAX_JSON_BODY = 1 << 16
ALERT_PATH = re.compile(r"/alerts/(\d+)")
EXPIRE_PATH = re.compile(r"/silences/([^/]+)/expire")
RETRY_PATH = re.compile(r"/alerts/([^/]+)/retry")
REPORT_TYPES = {".html": "text/html; charset=utf-8", ".md": "text/markdown; charset=utf-8",
                ".json": "application/json", ".png": "image/png"}


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


class _BadRequest(Exception):
    """A request the API cannot take (status, message)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class _Handler(BaseHTTPRequestHandler):
    server: "_Server"
    protocol_version = "HTTP/1.1"

    def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        daemon = self.server.daemon
        url = urlsplit(self.path)
        lists = parse_qs(url.query)
        query = {k: v[-1] for k, v in lists.items()}
        try:
            if url.path == "/health":
                ok, reasons = daemon.health()
                self._send(200 if ok else 503, _json_bytes({"ok": ok, "reasons": reasons}))
            elif url.path == "/metrics":
                from prometheus_client import CONTENT_TYPE_LATEST

                self._send(200, daemon.metrics.render(), CONTENT_TYPE_LATEST)
            elif url.path == "/status":
                self._send(200, _json_bytes(daemon.status()))
            elif url.path == "/checkpoints":
                limit = int(query["limit"]) if query.get("limit") else None
                with daemon.read_store() as store:
                    rows = store.list_checkpoints(status=query.get("status"), repo=query.get("repo"),
                                                  limit=limit)
                self._send(200, _json_bytes(rows))
            elif url.path == "/db/info":
                with daemon.read_store() as store:
                    self._send(200, _json_bytes(store.info()))
            elif url.path == "/report/latest":
                self._latest_report(daemon.config.state_dir / "reports", query.get("format"))
            elif url.path == "/report":
                self._send(200, _json_bytes(self._reports(lists.get("policy", []))))
            elif url.path == "/alerts":
                limit = int(query["limit"]) if query.get("limit") else 50
                with daemon.read_store() as store:
                    self._send(200, _json_bytes(store.list_alerts(limit=limit, policy=query.get("policy"))))
            elif (m := ALERT_PATH.fullmatch(url.path)) is not None:
                with daemon.read_store() as store:
                    detail = store.alert_detail(int(m.group(1)))
                if detail is None:
                    from monitor.errors import DeliveryError

                    error = DeliveryError(f"no alert with id {m.group(1)}", hint="see `lstar alerts list`")
                    self._send(404, _error_body(error))
                else:
                    self._send(200, _json_bytes(detail))
            elif url.path == "/silences":
                from monitor.notify.silences import list_silences
                from monitor.state_ops import parse_now

                now = parse_now(query.get("now"))
                with daemon.read_store() as store:
                    rows = list_silences(store, now=now, include_expired=query.get("all") == "1")
                self._send(200, _json_bytes(rows))
            else:
                self._send(404, _json_bytes({"error": f"no such endpoint {url.path}"}))
        except LstarError as exc:
            self._send(400, _error_body(exc))
        except ValueError as exc:
            self._send(400, _json_bytes({"error": f"bad request {url.path}: {exc}"}))
        except Exception as exc:  # noqa: BLE001 - an API error must not kill the server thread
            self._send(500, _json_bytes({"error": f"{type(exc).__name__}: {exc}"}))

    def _reports(self, files: list[str]) -> list[dict[str, Any]]:
        """`lstar report --json` of each policy file, as data (times in ISO 8601)."""
        from monitor.policy import load_policies
        from monitor.report import report_for_cli, to_json
        from monitor.store import utcnow

        paths = [Path(f) for f in files]
        if not paths or any(not p.is_absolute() or p.suffix not in (".yaml", ".yml") for p in paths):
            raise ValueError("give each policy as an absolute path to a .yaml/.yml file")
        policies = load_policies(paths)
        now = utcnow()
        with self.server.daemon.read_store() as store:
            return [json.loads(to_json(report_for_cli(store, p, now=now))) for p in policies]

    def do_HEAD(self) -> None:  # noqa: N802
        self.do_GET()

    def _latest_report(self, folder: Path, fmt: str | None) -> None:
        suffixes = [f".{fmt}"] if fmt else list(REPORT_TYPES)
        files = [p for p in folder.rglob("*") if p.is_file() and p.suffix in suffixes] if folder.is_dir() else []
        if not files:
            self._send(404, _json_bytes({"error": f"no report under {folder} yet"}))
            return
        newest = max(files, key=lambda p: (p.stat().st_mtime, p.suffix == ".html"))
        self._send(200, newest.read_bytes(), REPORT_TYPES[newest.suffix])

    def do_POST(self) -> None:  # noqa: N802
        path = urlsplit(self.path).path
        if path != "/hooks/hub":
            self._state_change(path)
            return
        daemon = self.server.daemon
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_HOOK_BODY:
            self._send(413, _json_bytes({"error": "body too large"}))
            return
        self.rfile.read(length)
        secret = webhook_secret(daemon.config.webhook_secret_file)
        if secret is None:
            self._send(404, _json_bytes({"error": f"the Hub webhook is off (set ${SECRET_ENV})"}))
            return
        given = self.headers.get("X-Webhook-Secret")
        if given is None:
            self._send(401, _json_bytes({"error": "missing X-Webhook-Secret"}))
            return
        if not hmac.compare_digest(given.encode(), secret.encode()):
            self._send(403, _json_bytes({"error": "wrong X-Webhook-Secret"}))
            return
        daemon.request_poll()
        self._send(202, _json_bytes({"poll": "requested"}))

    def _json_body(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_JSON_BODY:
            raise _BadRequest(413, "body too large")
        raw = self.rfile.read(length)
        content_type = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        if content_type != "application/json":
            raise _BadRequest(415, "send the body as Content-Type: application/json")
        try:
            body = json.loads(raw or b"{}")
        except ValueError as exc:
            raise _BadRequest(400, f"the body is not JSON: {exc}") from None
        if not isinstance(body, dict):
            raise _BadRequest(400, "the body must be a JSON object")
        return body

    def _state_change(self, path: str) -> None:
        """The POSTs that change runtime state (silences, retries), written by the daemon."""
        from monitor.state_ops import add_silence_from_args, parse_now, retry_dead_letters

        daemon = self.server.daemon
        try:
            expire = EXPIRE_PATH.fullmatch(path)
            retry = RETRY_PATH.fullmatch(path)
            if path != "/silences" and expire is None and retry is None:
                raise _BadRequest(404, f"no such endpoint {path}")
            body = self._json_body()
            now = parse_now(_text(body, "now", required=False))
            with daemon.job_store() as store:
                if expire is not None:
                    from monitor.notify.silences import expire_silence

                    silence_id = unquote(expire.group(1))
                    expire_silence(store, silence_id, now=now)
                    answer: Any = {"expired": silence_id}
                elif retry is not None:
                    answer = {"requeued": retry_dead_letters(store, unquote(retry.group(1)), now=now)}
                else:
                    match = body.get("match")
                    if not isinstance(match, list) or not all(isinstance(m, str) for m in match):
                        raise _BadRequest(400, "'match' must be a list of strings")
                    answer = add_silence_from_args(
                        store, match=match, until=_text(body, "until"), comment=_text(body, "comment"),
                        start=_text(body, "start", required=False), now=now,
                        created_by=_text(body, "created_by", required=False))
            self._send(200, _json_bytes(answer))
        except _BadRequest as exc:
            self.close_connection = True  # the body may be unread: this connection is done
            self._send(exc.status, _json_bytes({"error": str(exc)}))
        except LstarError as exc:
            self._send(400, _error_body(exc))
        except Exception as exc:  # noqa: BLE001 - an API error must not kill the server thread
            self._send(500, _json_bytes({"error": f"{type(exc).__name__}: {exc}"}))

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet by default
        pass


def _text(body: dict[str, Any], key: str, *, required: bool = True) -> str | None:
    value = body.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str):
        raise _BadRequest(400, f"{key!r} must be a string")
    return value


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], daemon: "Daemon") -> None:
        super().__init__(address, _Handler)
        self.daemon = daemon


class ApiServer:
    """The API on 127.0.0.1:`port` (0 picks a free port), served from a background thread."""

    def __init__(self, daemon: "Daemon", *, port: int) -> None:
        self.server = _Server(("127.0.0.1", port), daemon)
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.2},
                                       name="lstar-api", daemon=True)

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> "ApiServer":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# -- the client side ---------------------------------------------------------------------------
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
    if not url.startswith("http://127.0.0.1:"):
        return None
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=3):
            return url
    except urllib.error.HTTPError:
        return url  # 503: alive but unhealthy, still answers reads
    except (urllib.error.URLError, OSError):
        return None


def api_get(url: str, path: str, params: dict[str, Any] | None = None) -> Any:
    """GET `path` from the daemon's API and decode the JSON answer (list values repeat the
    parameter); an error answer raises as `_call` says."""
    from urllib.parse import urlencode

    query = {k: v for k, v in (params or {}).items() if v is not None}
    target = f"{url}{path}" + (f"?{urlencode(query, doseq=True)}" if query else "")
    return _call(urllib.request.Request(target))


def api_post(url: str, path: str, body: dict[str, Any]) -> Any:
    """POST `body` as JSON to `path` on the daemon's API and decode the JSON answer."""
    data = json.dumps(body, default=str).encode()
    return _call(urllib.request.Request(f"{url}{path}", data=data, method="POST",
                                        headers={"Content-Type": "application/json"}))


def _call(request: urllib.request.Request) -> Any:
    """Send `request`; an error answer raises the `monitor.errors` class it names (the daemon
    refused what the command itself would refuse), else a StoreError naming the daemon."""
    from monitor import errors

    what = f"{request.get_method()} {urlsplit(request.full_url).path}"
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        try:
            answer = json.loads(exc.read())
        except ValueError:
            answer = {}
        answer = answer if isinstance(answer, dict) else {}
        cls = getattr(errors, str(answer.get("kind")), None)
        if isinstance(cls, type) and issubclass(cls, LstarError):
            raise cls(str(answer.get("error")), hint=answer.get("hint")) from None
        raise StoreError(f"the running daemon answered {exc.code} to {what}: "
                         f"{answer.get('error') or exc.reason}",
                         hint="see the daemon's log; `lstar status` shows its state") from None
    except (urllib.error.URLError, OSError) as exc:
        raise StoreError(f"the running daemon did not answer {what}: {exc}",
                         hint="it may have stopped; run the command again") from None


_TIME_TEXT = re.compile(r"\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}")


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
