"""The hostile comparison of `benchmarks/api_server.py --hostile` (its docstring says what runs).

Each API is served by a child process of its own (this file run as a script), so the CPU
seconds reported are the server's alone; the clients run here.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from api_server import HOSTILE_COMMITS, HOSTILE_FILES, QuietDaemon, write_old_package  # noqa: E402  (benchmarks/ is this script's own folder)

ROOT = Path(__file__).resolve().parents[1]
BOUND = 1200          # --api-max-connections of the new API in the hostile run (the old has none)
PIPELINERS = 200


class StandIn(QuietDaemon):
    """What the API reads of a daemon; a /metrics render takes 5 ms (two aggregate queries)."""

    def __init__(self, tmp: Path) -> None:
        self.config = SimpleNamespace(state_dir=tmp, policies_dir=tmp, webhook_secret_file=None)
        self.metrics = SimpleNamespace(render=self._render)

    @staticmethod
    def _render() -> bytes:
        time.sleep(0.005)
        return b"# TYPE up gauge\nup 1\n"


def serve(which: str, tmp: str) -> None:
    """The child: serve `which` API ("new", or "old" from package old_lstar_api under `tmp`);
    print its port; answer "cpu" with its CPU seconds, stop at EOF."""
    import logging

    logging.disable(logging.CRITICAL)
    if which == "old":
        sys.path.insert(0, tmp)
        from old_lstar_api.api import ApiServer
    else:
        from monitor.service.api import ApiServer
    kwargs: dict[str, Any] = {}
    if "max_connections" in inspect.signature(ApiServer).parameters:
        kwargs["max_connections"] = BOUND
    server = ApiServer(StandIn(Path(tmp)), port=0, token="t" * 32, workers=8, idle_timeout=15, lifetime=60,
                       **kwargs).start()
    print(server.url.rsplit(":", 1)[1], flush=True)
    for line in sys.stdin:
        times = os.times()
        print(round(times.user + times.system, 3), flush=True)
    server.stop()


def _more_descriptors(n: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < n:
        resource.setrlimit(resource.RLIMIT_NOFILE, (n if hard == resource.RLIM_INFINITY else min(n, hard), hard))


def _get(port: int, path: str) -> tuple[str, float]:
    start = time.perf_counter()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n".encode())
            data = b""
            while chunk := sock.recv(1 << 16):
                data += chunk
        status = data.split(b" ")[1].decode() if data.startswith(b"HTTP/1.") else "no answer"
    except OSError as exc:
        status = type(exc).__name__
    return status, time.perf_counter() - start


def _probe(port: int) -> str:
    samples = []
    for path in ["/health"] * 10 + ["/metrics"] * 2:
        samples.append(_get(port, path))
        time.sleep(0.1)
    statuses: dict[str, int] = {}
    for status, _ in samples:
        statuses[status] = statuses.get(status, 0) + 1
    ms = [s * 1000 for _, s in samples]
    return (f"{', '.join(f'{n} x {s}' for s, n in sorted(statuses.items()))}; median "
            f"{statistics.median(ms):.1f} ms, max {max(ms):.0f} ms")


def _open(port: int, n: int, first: bytes) -> list[socket.socket]:
    socks = []
    for _ in range(n):
        with contextlib.suppress(OSError):
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
            if first:
                sock.sendall(first)
            socks.append(sock)
    return socks


def _phases(port: int, crowd: int) -> dict[str, tuple[str, int]]:
    host = f"Host: 127.0.0.1:{port}\r\n"
    return {
        f"{crowd:,} held: half silent, half 1 byte / 0.5 s": (f"GET /status HTTP/1.1\r\n{host}X-Slow: ", crowd),
        f"{BOUND:,} POSTs to /nosuch, body never sent": (f"POST /nosuch HTTP/1.1\r\n{host}Content-Length: 65536\r\n\r\n",
                                                        BOUND),
        f"{PIPELINERS} x 20 pipelined /metrics, unread": (f"GET /metrics HTTP/1.1\r\n{host}\r\n" * 20, PIPELINERS),
    }


def measure(which: str, tmp: str, crowd: int) -> dict[str, str]:
    child = subprocess.Popen([sys.executable, __file__, which, tmp], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    out: dict[str, str] = {}
    try:
        port = int(child.stdout.readline())

        def cpu() -> float:
            child.stdin.write("cpu\n")
            child.stdin.flush()
            return float(child.stdout.readline())

        out["idle server"] = _probe(port)
        for name, (first, n) in _phases(port, crowd).items():
            cpu0, wall0 = cpu(), time.monotonic()
            slow = name.startswith(f"{crowd:,} held")
            socks = _open(port, n // 2, b"") + _open(port, n - n // 2, first.encode()[:20]) if slow \
                else _open(port, n, first.encode())
            stop = threading.Event()

            def trickle() -> None:
                i = 20
                while not stop.wait(0.5):
                    for sock in socks[n // 2:]:
                        with contextlib.suppress(OSError):
                            sock.send(b"z" if i >= len(first) else first.encode()[i:i + 1])
                    i += 1
            thread = threading.Thread(target=trickle, daemon=True)
            if slow:
                thread.start()
            time.sleep(1.2)
            result = _probe(port)
            stop.set()
            if slow:
                thread.join()
            out[name] = f"{result}; server {cpu() - cpu0:.2f} CPU s over {time.monotonic() - wall0:.1f} s wall"
            for sock in socks:
                sock.close()
            time.sleep(0.5)
    finally:
        child.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(timeout=15)
        child.kill()
    return out


def run_hostile(crowd: int) -> dict[str, Any]:

    _more_descriptors(2 * (max(crowd, BOUND) + 512))
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        results["new (this checkout)"] = measure("new", tmp, crowd)
        for commit in HOSTILE_COMMITS:
            folder = Path(tmp) / commit
            folder.mkdir()
            if write_old_package(folder, commit, HOSTILE_FILES):
                results[f"old ({commit})"] = measure("old", str(folder), crowd)
            else:
                results[f"old ({commit})"] = "not measured: git cannot show the old API here"
    return results


if __name__ == "__main__":
    _more_descriptors(2 * (BOUND + 512))
    serve(sys.argv[1], sys.argv[2])
