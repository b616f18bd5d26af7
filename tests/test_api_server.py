"""The local API served by uvicorn in-process over a stand-in daemon: the connection guard's
framing screen on pipelined requests, long heads and empty lines before a request, answers to
half-closed clients, /health and /metrics under a thousand idle or trickling connections and
behind slow handlers on every worker, the bound on open connections, a port already in use,
the httpx client's error mapping, and the API reading the daemon only through `DaemonView`."""

from __future__ import annotations

import ast
import contextlib
import errno
import json
import os
import resource
import select
import socket
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from monitor.errors import PolicyError, ServiceError, StoreError
from monitor.service.api import ApiServer, listen_socket
from monitor.service.api_conn import FD_RESERVE, MIN_WAIT, fit_connection_bound
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


def request_bytes(server: ApiServer, path: str, *, close: bool = True) -> bytes:
    extra = "Connection: close\r\n" if close else ""
    return f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port_of(server)}\r\n{extra}\r\n".encode()


def timed_get(server: ApiServer, path: str) -> tuple[bytes, float]:
    """(the answer's status line, seconds from connecting to the whole answer) on a fresh connection."""
    start = time.monotonic()
    with socket.create_connection(("127.0.0.1", port_of(server)), timeout=10) as sock:
        sock.sendall(request_bytes(server, path))
        data = read_all(sock)
    return data.partition(b"\r\n")[0], time.monotonic() - start


def test_slow_handlers_on_every_worker_do_not_delay_health_and_one_more_request_is_busy_at_once(api):
    daemon = api.daemon
    daemon.hold = True
    slow = [socket.create_connection(("127.0.0.1", port_of(api)), timeout=30) for _ in range(2)]
    try:
        for sock in slow:
            sock.sendall(request_bytes(api, "/status"))
        for _ in slow:  # both handler slots are now inside status()
            assert daemon.entered.acquire(timeout=30)
        # /health and /metrics have threads of their own.
        for path in ("/health", "/metrics"):
            status, seconds = timed_get(api, path)
            assert status == b"HTTP/1.1 200 OK" and seconds < 1.0, (path, status, seconds)
        with socket.create_connection(("127.0.0.1", port_of(api)), timeout=30) as surplus:
            surplus.sendall(request_bytes(api, "/status"))
            data = read_all(surplus)   # answered at once, unserved: status() was not entered again
        assert data.startswith(b"HTTP/1.1 503 ") and b"retry-after: 1" in data.lower()
        assert json.loads(data.partition(b"\r\n\r\n")[2])["error"] == "the API is busy (2 requests in progress)"
        assert not daemon.entered.acquire(timeout=0.2)
    finally:
        daemon.release.set()
        answers = [read_all(sock) for sock in slow]   # the held requests finish and are answered
        for sock in slow:
            sock.close()
    assert all(a.startswith(b"HTTP/1.1 200 ") for a in answers)
    # The slots come back once the answers are written: the server's count is released on its own
    # loop a moment after the client has read the answer, so allow it that moment (a busy machine).
    deadline = time.monotonic() + 5
    while (status := timed_get(api, "/status")[0]) != b"HTTP/1.1 200 OK" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert status == b"HTTP/1.1 200 OK"


def test_a_head_over_the_limit_sent_in_pieces_gets_the_json_431(api):
    """h11 would answer a plain-text 400 once more than 16 KiB of an unfinished head arrived."""
    head = f"GET /health HTTP/1.1\r\nHost: 127.0.0.1:{port_of(api)}\r\n".encode()
    head += b"".join(f"X-Pad-{i}: {'v' * 40}\r\n".encode() for i in range(500)) + b"\r\n"   # about 24 KiB
    with socket.create_connection(("127.0.0.1", port_of(api)), timeout=30) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for start in range(0, len(head), 4096):
            try:
                sock.sendall(head[start:start + 4096])
            except OSError:   # refused before the last piece: the answer is already there
                break
            time.sleep(0.02)   # one read each
        data = read_all(sock)
    assert data.startswith(b"HTTP/1.1 431 "), data[:200]
    assert json.loads(data.partition(b"\r\n\r\n")[2])["error"] == "the request head is over 16,384 bytes"


def test_empty_lines_before_a_request_line_are_skipped(api):
    """RFC 9112 section 2.2: a server SHOULD ignore at least one empty line before a request."""
    first = request_bytes(api, "/health", close=False)
    with socket.create_connection(("127.0.0.1", port_of(api)), timeout=30) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for piece in (b"\r\n\r", b"\n", b"\n" + first[:5], first[5:]):   # split anywhere, bare LF too
            sock.sendall(piece)
            time.sleep(0.02)
        sock.sendall(b"\r\n" + request_bytes(api, "/metrics"))   # and between pipelined requests
        data = read_all(sock)
    assert [a[:3] for a in data.split(b"HTTP/1.1 ")[1:]] == [b"200", b"200"], data[:300]


# -- a thousand idle or trickling connections and the bound on open connections ------------------
def descriptors_for(n: int) -> None:
    """Raise this process's soft descriptor limit to hold `n` more (client and server end of
    each connection, in this one process), or skip."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 2 * n + 512
    if soft != resource.RLIM_INFINITY and soft < wanted:
        if hard != resource.RLIM_INFINITY and hard < wanted:
            pytest.skip(f"needs {wanted} open files; `ulimit -Hn` is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


class Crowd:
    """`idle` connections that send nothing and `slow` ones that send a request head one byte
    every 0.5 s; each is opened again when the server closes it."""

    def __init__(self, server: ApiServer, *, idle: int, slow: int) -> None:
        self.address = ("127.0.0.1", port_of(server))
        self.head = f"GET /status HTTP/1.1\r\nHost: 127.0.0.1:{port_of(server)}\r\nX-Slow: ".encode()
        self.kinds = ["idle"] * idle + ["slow"] * slow
        self.socks: list[socket.socket | None] = [None] * len(self.kinds)
        self.reopened = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._trickle, daemon=True)

    def _open(self, i: int) -> None:
        sock = socket.create_connection(self.address, timeout=5)
        sock.setblocking(False)
        self.socks[i] = sock

    def open_count(self) -> int:
        return sum(s is not None for s in self.socks)

    def __enter__(self) -> "Crowd":
        for i in range(len(self.kinds)):
            self._open(i)
        self.thread.start()
        return self

    def _trickle(self) -> None:
        sent = 0
        while not self.stop.wait(0.5):
            for i, kind in enumerate(self.kinds):
                sock = self.socks[i]
                try:
                    if sock is not None and self._closed(sock):
                        raise ConnectionResetError
                    if sock is not None and kind == "slow":
                        sock.send(self.head[sent:sent + 1] if sent < len(self.head) else b"z")
                except OSError:
                    sock.close()
                    self.socks[i] = None
                    with contextlib.suppress(OSError):
                        self._open(i)
                        self.reopened += 1
            sent += 1

    @staticmethod
    def _closed(sock: socket.socket) -> bool:
        """Whether the server closed `sock` (non-blocking: no answer is expected)."""
        try:
            return sock.recv(1 << 16) == b""
        except BlockingIOError:
            return False

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=30)
        for sock in self.socks:
            if sock is not None:
                sock.close()


def health_under_a_crowd(idle: int, slow: int, tmp_path: Path, *, every: float) -> list[float]:
    """Probe /health 20 times and /metrics twice, `every` seconds apart, while `idle` and
    `slow` connections are held; the seconds each probe took."""
    descriptors_for(idle + slow)
    daemon = StandIn(tmp_path)
    # Workers as the daemon's default; a request deadline longer than the test, so the crowd
    # is never closed (a real attacker reopens; the bound test covers a full house).
    with ApiServer(daemon, port=0, token="t" * 32, workers=8, idle_timeout=60, lifetime=120) as server:
        with Crowd(server, idle=idle, slow=slow) as crowd:
            time.sleep(1.2)   # every slow one has sent bytes
            probes = []
            for path in ["/health"] * 10 + ["/metrics"] + ["/health"] * 10 + ["/metrics"]:
                held = len(server.limits.open)
                probes.append((path, *timed_get(server, path), held))
                time.sleep(every)
            assert crowd.reopened == 0 and crowd.open_count() == idle + slow   # held all along
    late = [(path, status, round(seconds, 2), held) for path, status, seconds, held in probes
            if status != b"HTTP/1.1 200 OK" or seconds >= 1.0 or held < idle + slow]
    assert late == []
    return [seconds for _, _, seconds, _ in probes]


def test_health_and_metrics_answer_at_once_while_hundreds_of_connections_wait(tmp_path):
    health_under_a_crowd(idle=150, slow=150, tmp_path=tmp_path, every=0.05)


@pytest.mark.slow
def test_health_and_metrics_answer_within_a_second_while_a_thousand_connections_wait(tmp_path):
    # 22 probes over about 2.5 s: each slow connection sends 5 or more bytes meanwhile.
    health_under_a_crowd(idle=600, slow=600, tmp_path=tmp_path, every=0.1)


def closed_by_server(sock: socket.socket, wait: float) -> bool:
    if not select.select([sock], [], [], wait)[0]:
        return False
    try:
        return sock.recv(1 << 16) == b""
    except ConnectionResetError:
        return True


def test_at_the_bound_the_connection_waiting_longest_is_closed_never_one_being_served(tmp_path):
    daemon = StandIn(tmp_path)
    daemon.hold = True
    with ApiServer(daemon, port=0, token="t" * 32, workers=2, idle_timeout=30, lifetime=60,
                   max_connections=6) as server:
        address = ("127.0.0.1", port_of(server))
        served = socket.create_connection(address, timeout=30)   # the oldest, its request in a handler
        served.sendall(request_bytes(server, "/status"))
        assert daemon.entered.acquire(timeout=30)
        waiting = [socket.create_connection(address, timeout=30) for _ in range(5)]   # the bound reached
        newest: list[socket.socket] = []
        try:
            # The oldest waiting one trickles a head: bytes do not make it look fresh.
            waiting[0].sendall(b"GET /health HTTP/1.1\r\n")
            time.sleep(MIN_WAIT + 0.2)   # a connection may wait this long before it is closed for room
            for n in (1, 2):   # each newcomer is served and stays open (keep-alive)
                newest.append(socket.create_connection(address, timeout=30))
                newest[-1].sendall(request_bytes(server, "/health", close=False))
                assert newest[-1].recv(1 << 16).startswith(b"HTTP/1.1 200 ")
                assert [closed_by_server(s, 1.0 if i < n else 0.1) for i, s in enumerate(waiting)] == \
                    [True] * n + [False] * (5 - n)
            assert server.limits.evicted == 2
            daemon.release.set()
            assert read_all(served).startswith(b"HTTP/1.1 200 ")   # never closed for room
        finally:
            daemon.release.set()
            for sock in [served, *waiting, *newest]:
                sock.close()


def test_a_port_in_use_is_one_clear_error():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(ServiceError) as refused:
            listen_socket("127.0.0.1", port)
    assert refused.value.one_line() == (f"port {port} on 127.0.0.1 is already in use "
                                        f"({os.strerror(errno.EADDRINUSE)}); "
                                        "choose another with --api-port or stop the process holding it")


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


def test_the_client_builds_its_tls_context_once_for_all_its_requests(api, monkeypatch):
    """Each request opens its own httpx client; building a client's TLS context (its trust
    store) costs about 35 ms of CPU, which a command or test polling the daemon would pay every
    time. The clients share one context, built once, with verification on."""
    import ssl

    import httpx

    import monitor.service.client as client_module

    client_module._tls_context.cache_clear()
    built, given = [], []
    real_context, real_client = httpx.create_ssl_context, httpx.Client
    monkeypatch.setattr(httpx, "create_ssl_context", lambda **kw: built.append(kw) or real_context(**kw))
    monkeypatch.setattr(httpx, "Client", lambda **kw: given.append(kw["verify"]) or real_client(**kw))
    for _ in range(5):
        assert api_get(api.url, "/status") == {"ok": 1}
    assert len(built) == 1 and len(given) == 5 and all(v is given[0] for v in given)
    assert isinstance(given[0], ssl.SSLContext) and given[0].verify_mode == ssl.CERT_REQUIRED
    client_module._tls_context.cache_clear()


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


@pytest.mark.parametrize("soft, hard, can_raise, bound, raised_to", [
    (20000, 20000, True, 4096, None),                  # room enough: nothing changes
    (1024, 1 << 20, True, 4096, 4096 + FD_RESERVE),    # a container's soft limit: raised as far as needed
    (1024, 1024, True, 1024 - FD_RESERVE, None),       # no room to raise: the bound shrinks instead
    (1024, 1 << 20, False, 1024 - FD_RESERVE, 4096 + FD_RESERVE),   # the raise refused: likewise
    (256, 256, True, 128, None),                       # tiny: half of it
])
def test_the_connection_bound_fits_the_descriptor_limit(monkeypatch, soft, hard, can_raise, bound, raised_to):
    from monitor.service import api_conn

    asked = []

    def setrlimit(which, limits):
        asked.append(limits)
        if not can_raise:
            raise ValueError("not allowed")

    monkeypatch.setattr(api_conn.resource, "getrlimit", lambda which: (soft, hard))
    monkeypatch.setattr(api_conn.resource, "setrlimit", setrlimit)
    assert fit_connection_bound(4096) == bound
    assert asked == ([] if raised_to is None else [(raised_to, hard)])
