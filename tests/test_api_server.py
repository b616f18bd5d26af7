"""The local API served by uvicorn in-process over a stand-in daemon: the connection guard's
framing screen on pipelined requests, answers to half-closed clients, the reserved lane's
capacity, slow handlers that cannot delay /health, the httpx client's error mapping, and the
API reading the daemon only through `DaemonView`."""

from __future__ import annotations

import ast
import contextlib
import json
import socket
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from monitor.errors import PolicyError, StoreError
from monitor.service.api import ApiServer
from monitor.service.api_conn import LANE_CAPACITY
from monitor.service.client import api_get

ROOT = Path(__file__).resolve().parents[1]


class StandIn:
    """What the API reads of a daemon; `status()` waits on `release` when `hold` is set."""

    def __init__(self, tmp: Path) -> None:
        self.config = SimpleNamespace(state_dir=tmp, policies_dir=tmp, webhook_secret_file=None)
        self.metrics = SimpleNamespace(render=lambda: b"# TYPE up gauge\nup 1\n")
        self.hold = False
        self.release = threading.Event()
        self.entered = threading.Semaphore(0)

    def health(self) -> tuple[bool, list[str]]:
        return True, []

    def status(self) -> dict:
        if self.hold:
            self.entered.release()
            self.release.wait(30)
        return {"ok": 1}

    def policies(self) -> list:
        return []

    def read_store(self):
        raise AssertionError("not used here")

    job_store = read_store

    def request_poll(self) -> None:
        pass


@pytest.fixture()
def api(tmp_path):
    daemon = StandIn(tmp_path)
    with ApiServer(daemon, port=0, token="t" * 32, workers=2, idle_timeout=5, lifetime=30) as server:
        server.daemon = daemon
        yield server
    daemon.release.set()


def port_of(server: ApiServer) -> int:
    return int(server.url.rsplit(":", 1)[1])


def read_all(sock: socket.socket) -> bytes:
    data = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(1 << 16):
            data += chunk
    return data


def test_each_pipelined_head_passes_the_framing_screen(api):
    host = f"Host: 127.0.0.1:{port_of(api)}\r\n"
    good = f"GET /health HTTP/1.1\r\n{host}\r\n"
    bad = f"POST /silences HTTP/1.1\r\n{host}Content-Type: application/json\r\nContent-Length: 2, 2\r\n\r\n{{}}"
    after = f"GET /metrics HTTP/1.1\r\n{host}\r\n"
    with socket.create_connection(("127.0.0.1", port_of(api)), timeout=30) as sock:
        sock.sendall((good + bad + after).encode())
        data = read_all(sock)
    answers = data.split(b"HTTP/1.1 ")[1:]
    # The first is answered; the second refused by its length; what follows it never served.
    assert [a[:3] for a in answers] == [b"200", b"400"], data
    assert b"Content-Length '2, 2' is not a byte count" in answers[1]


def test_a_whole_head_over_the_limit_in_one_read_is_refused(api):
    """h11 limits only an incomplete head; one that arrives whole in a single read is held to
    the same 16 KiB."""
    host = f"Host: 127.0.0.1:{port_of(api)}\r\n"
    padding = "".join(f"X-Pad-{i}: {'v' * 40}\r\n" for i in range(1000))   # about 48 KiB
    with socket.create_connection(("127.0.0.1", port_of(api)), timeout=30) as sock:
        sock.sendall(f"GET /health HTTP/1.1\r\n{host}{padding}\r\n".encode())
        data = read_all(sock)
    assert data.startswith(b"HTTP/1.1 431 "), data[:200]


@pytest.mark.parametrize("url, ok", [
    ("http://127.0.0.1:8080", True),
    ("http://127.0.0.1:8080/", True),
    ("http://127.0.0.1:1@example.org:8080", False),   # the user part: httpx would go to example.org
    ("http://127.0.0.1:80a", False),
    ("http://127.0.0.1:8080/api", False),
    ("https://127.0.0.1:8080", False),
    ("http://localhost:8080", False),
])
def test_the_client_sends_its_token_only_to_the_loopback_daemon(url, ok):
    from monitor.service.client import is_loopback_url

    assert is_loopback_url(url) is ok


def test_a_half_closed_client_still_gets_its_answer(api):
    with socket.create_connection(("127.0.0.1", port_of(api)), timeout=30) as sock:
        sock.sendall(f"GET /status HTTP/1.1\r\nHost: 127.0.0.1:{port_of(api)}\r\n\r\n".encode())
        sock.shutdown(socket.SHUT_WR)
        data = read_all(sock)
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ") and json.loads(body) == {"ok": 1}


def test_slow_handlers_on_every_worker_do_not_delay_health_and_a_full_lane_answers_busy_at_once(api):
    daemon = api.daemon
    daemon.hold = True
    request = f"GET /status HTTP/1.1\r\nHost: 127.0.0.1:{port_of(api)}\r\n\r\n".encode()
    slow = [socket.create_connection(("127.0.0.1", port_of(api)), timeout=30) for _ in range(2)]
    lane: list[socket.socket] = []
    try:
        for sock in slow:
            sock.sendall(request)
        for _ in slow:  # both general threads are now inside status()
            assert daemon.entered.acquire(timeout=30)
        # The lane's own pool answers /health while both handler threads are held.
        with socket.create_connection(("127.0.0.1", port_of(api)), timeout=30) as probe:
            probe.sendall(f"GET /health HTTP/1.1\r\nHost: 127.0.0.1:{port_of(api)}\r\n\r\n".encode())
            assert read_all(probe).startswith(b"HTTP/1.1 200 ")
        lane = [socket.create_connection(("127.0.0.1", port_of(api)), timeout=30) for _ in range(LANE_CAPACITY)]
        with socket.create_connection(("127.0.0.1", port_of(api)), timeout=30) as surplus:
            data = read_all(surplus)  # sent nothing: the answer comes unasked, then the close
        assert data.startswith(b"HTTP/1.1 503 ") and b"Retry-After: 1" in data
        assert json.loads(data.partition(b"\r\n\r\n")[2])["error"] == "the API is busy (2 connections open)"
    finally:
        daemon.release.set()
        for sock in slow + lane:
            sock.close()


def test_the_client_raises_the_error_the_daemon_names(api, tmp_path):
    with pytest.raises(StoreError) as refused:
        api_get(api.url, "/report")
    assert refused.value.message == "the running daemon answered 400 to GET /report: name the policies: " \
                                         "/report?policy=NAME"
    with pytest.raises(PolicyError) as missing:
        api_get(api.url, "/report", {"policy": ["nothing"]})
    assert missing.value.message == "the running daemon has no policy 'nothing' loaded"
    assert api_get(api.url, "/status") == {"ok": 1}
    with pytest.raises(StoreError, match="did not answer GET /status"):
        api_get("http://127.0.0.1:9", "/status")


def _imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_the_api_reads_the_daemon_only_through_its_view():
    # Not even under TYPE_CHECKING: the API depends on the interface, the daemon on the API.
    for path in sorted((ROOT / "monitor" / "service").glob("api*.py")):
        assert "monitor.service.daemon" not in _imported_modules(path), path.name
    from monitor.service.daemon import Daemon
    from monitor.service.daemon_view import DaemonView

    wanted = [name for name, value in vars(DaemonView).items() if callable(value) and not name.startswith("_")]
    assert wanted and [name for name in wanted if not callable(getattr(Daemon, name, None))] == []


def test_the_api_path_has_one_http_client_and_no_hand_built_server():
    paths = [*(ROOT / "monitor" / "service").glob("*.py"), *(ROOT / "monitor" / "commands").glob("*.py"),
             ROOT / "tests" / "support" / "daemon_harness.py"]
    offenders = {p.relative_to(ROOT).as_posix(): sorted(_imported_modules(p) & {"urllib.request", "urllib.error",
                                                                               "http.server", "http.client"})
                 for p in paths}
    assert {k: v for k, v in offenders.items() if v} == {}
