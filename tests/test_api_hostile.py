"""The local API against clients that try to take it down (docs/reliability.md rows 38, 68, 69 and 70):
at the bound on open connections a new /health probe is served whatever the others do; a
burst of connections never runs the daemon out of descriptors; answers a client does not read
are dropped at the deadline; pipelined scrapes share one /metrics render; the port listens
only once the API is ready."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from monitor.service.api import ApiServer, listen_socket
from monitor.service.api_cache import SharedRender
from monitor.service.api_conn import MIN_WAIT
from test_api_server import StandIn, descriptors_for, port_of, read_all, request_bytes, timed_get

ROOT = Path(__file__).resolve().parents[1]
BOUND = 24


def _unread_body(port: int) -> bytes:
    return f"POST /nosuch HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 65536\r\n\r\n".encode()


# What each of the other connections does: the bytes sent when it opens, and one more later.
CROWDS = {
    "idle": (lambda port: b"", b""),
    "trickling head": (lambda port: f"GET /status HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nX-Slow: ".encode(), b"z"),
    # Answered 404 at once while the body is still owed: it must not stay open beyond reach.
    "unread body after an answer": (_unread_body, b""),
    "trickling body": (_unread_body, b"z"),
    "body to a refused write": (lambda port: f"POST /silences HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                                             "Content-Type: application/json\r\nContent-Length: 4096\r\n\r\n{".encode(),
                                b" "),
    "pipelined, answers unread": (lambda port: request_bytes_for(port, "/metrics") * 20, b""),
}


def request_bytes_for(port: int, path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()


@pytest.mark.parametrize("kind", list(CROWDS))
def test_at_the_bound_a_new_health_probe_is_served_whatever_the_others_do(tmp_path, kind):
    first, later = CROWDS[kind]
    daemon = StandIn(tmp_path)
    with ApiServer(daemon, port=0, token="t" * 32, workers=8, idle_timeout=30, lifetime=60,
                   max_connections=BOUND) as server:
        port = port_of(server)
        crowd = []
        try:
            for _ in range(BOUND):
                sock = socket.create_connection(("127.0.0.1", port), timeout=10)
                sock.sendall(first(port))
                crowd.append(sock)
            # A connection being served is never closed for room, and its wait restarts at each
            # answer: the pipelined crowd is served for as long as its 480 answers take (under
            # 0.3 s idle, over a second on a busy machine). Once none is being served, each may
            # be closed for room after MIN_WAIT.
            deadline = time.monotonic() + 30
            while len(server.limits.waiting) < BOUND and time.monotonic() < deadline:
                time.sleep(0.05)
            assert len(server.limits.waiting) == BOUND, (kind, len(server.limits.waiting))
            time.sleep(MIN_WAIT + 0.2)   # each may now be closed for room
            for sock in crowd:
                with contextlib.suppress(OSError):
                    sock.sendall(later)
            time.sleep(0.1)
            assert len(server.limits.open) <= BOUND + 1
            for path in ("/health", "/metrics", "/health"):
                status, seconds = timed_get(server, path)
                assert status == b"HTTP/1.1 200 OK" and seconds < 1.0, (kind, path, status, seconds)
        finally:
            for sock in crowd:
                sock.close()


def test_an_answer_sent_before_the_body_is_read_closes_the_connection_and_is_read_whole(api_server):
    port = port_of(api_server)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(_unread_body(port))   # the body never comes
        data = read_all(sock)              # the server half-closes after its answer
    head = data.partition(b"\r\n\r\n")[0].lower()
    assert head.startswith(b"http/1.1 404 ") and b"connection: close" in head, data[:300]
    assert data.endswith(b"}")


def test_a_connection_opened_less_than_the_minimum_wait_ago_is_not_closed_for_room(tmp_path):
    """A client that has just connected gets to send its request: at a bound full of such
    connections, a newcomer is told busy (503) instead of a reset for someone else."""
    daemon = StandIn(tmp_path)
    with ApiServer(daemon, port=0, token="t" * 32, workers=2, idle_timeout=30, lifetime=60,
                   max_connections=8) as server:
        address = ("127.0.0.1", port_of(server))
        fresh = [socket.create_connection(address, timeout=10) for _ in range(8)]
        try:
            with socket.create_connection(address, timeout=10) as newcomer:
                newcomer.sendall(request_bytes(server, "/health"))
                data = read_all(newcomer)
            assert data.startswith(b"HTTP/1.1 503 ") and b"retry-after: 1" in data.lower(), data[:200]
            assert server.limits.evicted == 0
            fresh[0].sendall(request_bytes(server, "/health"))   # the one that waited is served
            assert read_all(fresh[0]).startswith(b"HTTP/1.1 200 ")
        finally:
            for sock in fresh:
                sock.close()


# -- descriptors ---------------------------------------------------------------------------------
# The daemon's side, under a lowered descriptor limit: the API, and a thread opening a file every
# half millisecond as the daemon's jobs do (the database, logs, pipes); "stop" on stdin ends it.
DAEMON = textwrap.dedent("""
    import logging, os, resource, sys, threading, time
    from pathlib import Path
    resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[1]), int(sys.argv[1])))
    logging.disable(logging.CRITICAL)
    from test_api_server import StandIn
    from monitor.service.api import ApiServer
    server = ApiServer(StandIn(Path(sys.argv[2])), port=0, token="t" * 32, workers=2, idle_timeout=15,
                       lifetime=60, max_connections=4096).start()
    print(server.url.rsplit(":", 1)[1], server.limits.max_connections, flush=True)
    stop = threading.Event()
    counts = [0, 0, 0]   # failed, tried, the highest descriptor

    def open_files():
        while not stop.is_set():
            counts[1] += 1
            try:
                fd = os.open("/dev/null", os.O_RDONLY)
                counts[2] = max(counts[2], fd)
                os.close(fd)
            except OSError:
                counts[0] += 1
            time.sleep(0.0005)

    thread = threading.Thread(target=open_files)
    thread.start()
    sys.stdin.readline()
    stop.set()
    thread.join()
    print(counts[0], counts[1], server.limits.evicted, counts[2], flush=True)
""")


@pytest.mark.slow
def test_a_burst_of_connections_never_runs_the_daemon_out_of_descriptors(tmp_path):
    """asyncio accepts a whole listen backlog per turn of its loop before any new connection
    can close another for room: the descriptors kept beyond the bound cover that."""
    soft = 1100   # the bound is then 1100 - FD_RESERVE
    descriptors_for(soft)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*sys.path, str(ROOT), str(ROOT / "tests")])}
    server = subprocess.Popen([sys.executable, "-c", DAEMON, str(soft), str(tmp_path)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    try:
        port, bound = map(int, server.stdout.readline().split())
        held = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(bound)]
        time.sleep(MIN_WAIT + 0.2)
        for _ in range(2):
            burst = []
            for _ in range(600):
                try:
                    burst.append(socket.create_connection(("127.0.0.1", port), timeout=2))
                except OSError:
                    break
            time.sleep(0.3)
            for sock in burst:
                sock.close()
        for sock in held:
            sock.close()
        server.stdin.write("stop\n")
        server.stdin.flush()
        failed, tries, evicted, highest = map(int, server.stdout.readline().split())
    finally:
        server.kill()
        server.wait()
    assert bound < soft and tries > 100 and evicted > 0 and highest < soft
    assert failed == 0, f"the daemon's own open() failed {failed} times of {tries}"


# -- unread answers ------------------------------------------------------------------------------
@pytest.mark.parametrize("idle_timeout, lifetime", [(1.0, 30.0), (10.0, 1.5)])
def test_answers_a_client_does_not_read_are_dropped_at_the_deadline(tmp_path, idle_timeout, lifetime):
    """`close()` waits for the answer to be read; a client that never reads would hold the
    answer's memory and its descriptor for ever."""
    (tmp_path / "reports").mkdir()
    (tmp_path / "reports" / "big.html").write_bytes(b"x" * (4 << 20))
    daemon = StandIn(tmp_path)
    with ApiServer(daemon, port=0, token="t" * 32, workers=4, idle_timeout=idle_timeout, lifetime=lifetime) as server:
        clients = []
        try:
            for _ in range(4):
                sock = socket.socket()
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                sock.connect(("127.0.0.1", port_of(server)))
                sock.sendall(request_bytes(server, "/report/latest", close=False))
                clients.append(sock)
            time.sleep(0.5)
            assert len(server.limits.open) == 4   # answered, the answers unread
            deadline = time.monotonic() + min(idle_timeout, lifetime) + 3
            while server.limits.open and time.monotonic() < deadline:
                time.sleep(0.1)
            assert len(server.limits.open) == 0
        finally:
            for sock in clients:
                sock.close()


# -- /metrics ------------------------------------------------------------------------------------
def answers_delivered(held: list[socket.socket], buffers: list[bytearray]) -> int:
    """Answers the server has written so far to the held connections (read without blocking)."""
    for sock, buffer in zip(held, buffers):
        sock.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            while chunk := sock.recv(1 << 16):
                buffer += chunk
        sock.setblocking(True)
    return sum(buffer.count(b"HTTP/1.1 200 OK") for buffer in buffers)


# A real scrape's wall time is the event loop's CPU share: measured 0.23-0.38 s on an idle
# two-core machine, 0.67-1.03 s with three busy loops beside it. The wall bound allows a machine
# busy with other tests; that the scrape does not wait for the queued scrapes is checked by
# counting the answers written meanwhile, which does not depend on load: 150 connections each
# pipeline 200 scrapes, 30,000 in all, several seconds of work for the server.
REAL_SCRAPE_SECONDS = 3.0
PIPELINED, PER_CONNECTION = 150, 200


def test_pipelined_scrapes_share_one_render_and_a_real_scrape_answers_at_once(tmp_path):
    daemon = StandIn(tmp_path)
    renders = []

    def render() -> bytes:
        renders.append(time.monotonic())
        time.sleep(0.005)   # two aggregate queries on the daemon's database
        return b"# TYPE up gauge\nup 1\n"

    daemon.metrics.render = render
    descriptors_for(PIPELINED)
    queued = PIPELINED * PER_CONNECTION
    with ApiServer(daemon, port=0, token="t" * 32, workers=8, idle_timeout=15, lifetime=60) as server:
        scrape = request_bytes_for(port_of(server), "/metrics")
        held = []
        try:
            for _ in range(PIPELINED):
                sock = socket.create_connection(("127.0.0.1", port_of(server)), timeout=10)
                sock.sendall(scrape * PER_CONNECTION)
                held.append(sock)
            time.sleep(0.3)
            buffers = [bytearray() for _ in held]
            for attempt in range(3):
                before = answers_delivered(held, buffers)
                status, seconds = timed_get(server, "/metrics")
                assert status == b"HTTP/1.1 200 OK" and seconds < REAL_SCRAPE_SECONDS, seconds
                if attempt == 0:   # answered before the scrapes queued ahead of it are all worked off
                    during = answers_delivered(held, buffers) - before
                    assert during < 0.5 * (queued - before), (before, during)
        finally:
            for sock in held:
                sock.close()
    # Thousands of scrapes answered in a few seconds: about one render a second.
    assert len(renders) <= 2 + 2 * (renders[-1] - renders[0])


def test_a_shared_render_runs_once_for_concurrent_waiters_and_again_after_its_age_or_an_error():
    calls = []

    async def render() -> bytes:
        calls.append(1)
        await asyncio.sleep(0.05)
        if len(calls) == 2:
            raise RuntimeError("database gone")
        return f"render {len(calls)}".encode()

    async def scenario() -> None:
        shared = SharedRender(render, max_age=0.2)
        assert await asyncio.gather(*[shared.get() for _ in range(50)]) == [b"render 1"] * 50
        assert await shared.get() == b"render 1" and len(calls) == 1   # young enough
        await asyncio.sleep(0.25)
        results = await asyncio.gather(*[shared.get() for _ in range(5)], return_exceptions=True)
        assert [str(r) for r in results] == ["database gone"] * 5 and len(calls) == 2
        assert await shared.get() == b"render 3"   # an error is not kept

    asyncio.run(scenario())


# -- start-up ------------------------------------------------------------------------------------
def test_the_port_refuses_connections_until_the_api_is_ready(tmp_path):
    """Bound early (a taken port is one line before anything is written), listening late: a
    probe during the daemon's start-up is refused at once instead of hanging in the backlog."""
    sock = listen_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    with ApiServer(StandIn(tmp_path), port=port, token="t" * 32, sock=sock) as server:
        assert timed_get(server, "/health")[0] == b"HTTP/1.1 200 OK"


@pytest.fixture()
def api_server(tmp_path):
    with ApiServer(StandIn(tmp_path), port=0, token="t" * 32, workers=2, idle_timeout=5, lifetime=30) as server:
        yield server
