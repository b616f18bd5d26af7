"""The daemon's local HTTP API (127.0.0.1 only), and the client the read commands use.

    GET  /health                200 {"ok": true} | 503 {"ok": false, "reasons": [...]}
    GET  /metrics               Prometheus text format
    GET  /status                JSON: checkpoints by status, jobs, policy errors, disk, outages
    GET  /checkpoints?status=S&repo=R&limit=N   rows as `lstar checkpoints --json` prints them
    GET  /db/info               as `lstar db info --json`
    GET  /report/latest         the newest file under STATE/reports (404 when none)
    POST /hooks/hub             Hub webhook: `X-Webhook-Secret` checked in constant time;
                                401 when missing, 403 when wrong, 202 and a poll when right

The webhook secret comes from $LSTAR_HUB_WEBHOOK_SECRET or the file given to `lstar run
--webhook-secret-file`; without one the endpoint answers 404. Reads use their own DuckDB
cursor, so a job holding the database never blocks them.
"""

from __future__ import annotations

import hmac
import json
import os
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

if TYPE_CHECKING:
    from monitor.daemon import Daemon

SECRET_ENV = "LSTAR_HUB_WEBHOOK_SECRET"
MAX_HOOK_BODY = 1 << 20
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
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
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
            else:
                self._send(404, _json_bytes({"error": f"no such endpoint {url.path}"}))
        except Exception as exc:  # noqa: BLE001 - an API error must not kill the server thread
            self._send(500, _json_bytes({"error": f"{type(exc).__name__}: {exc}"}))

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
        daemon = self.server.daemon
        if urlsplit(self.path).path != "/hooks/hub":
            self._send(404, _json_bytes({"error": "no such endpoint"}))
            return
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

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet by default
        pass


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
    """GET `path` from the daemon's API and decode the JSON answer."""
    from urllib.parse import urlencode

    query = {k: v for k, v in (params or {}).items() if v is not None}
    target = f"{url}{path}" + (f"?{urlencode(query)}" if query else "")
    with urllib.request.urlopen(target, timeout=30) as response:
        return json.loads(response.read())
