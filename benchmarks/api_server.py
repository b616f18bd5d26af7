"""The local API's latency: /health on fresh connections, alone and while hostile clients try to
hold every connection slot, and a 50-row /checkpoints page over a state of many checkpoints.

Both servers run in this process over the same stand-in daemon (a real DuckDB state): the
current one (Starlette on uvicorn/h11) and, when git can still show it, the hand-built
http.server one of commit OLD_COMMIT, loaded from `git show` into a temporary package.

    python benchmarks/api_server.py [--checkpoints 20000] [--probes 200] [--hogs 24] [--json]
    python benchmarks/api_server.py --hostile [--crowd 1000] [--json]

Hostile clients (`--hogs`, for 8 slots): a third send nothing, a third send a request head a
byte every 0.2 s, a third send a whole /status every 0.05 s on one connection; each reconnects
when closed. Timings are wall-clock on whatever machine runs it; compare the two columns of
one run, not runs on different machines.

`--hostile` compares the API of this checkout with those of HOSTILE_COMMITS (the design
before the connection guard's bound, and its first version), each served by its own process (so its CPU seconds are
its own), through the shapes that once took it down: `--crowd` connections held open, half
silent and half sending a head a byte every 0.5 s; a bound's worth of `POST`s to an unknown
path announcing a body never sent; 200 connections pipelining 20 `/metrics` each without
reading (a render takes 5 ms, as the daemon's two aggregate queries). Each phase probes
`/health` and `/metrics` on fresh connections and reports the answers, their latency, and
the server's CPU seconds and the phase's wall seconds.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

OLD_COMMIT = "b00c1bb"
OLD_FILES = ("api_guard", "api_lane", "api")
# The design before the connection guard's bound, and the first design with it.
HOSTILE_COMMITS = ("dca40b4", "d70465b")
HOSTILE_FILES = ("api_conn", "api_guard", "api")
WORKERS = 8


def build_state(path: Path, n: int) -> Path:
    """A state of `n` checkpoints over 50 repos (bulk SQL, seconds even for 10^5)."""
    from monitor.store import Store

    t0 = datetime(2030, 1, 1, tzinfo=timezone.utc)
    with Store.open(path) as store, store.transaction() as conn:
        conn.execute("INSERT INTO checkpoints (id, repo, sha, source, lineage, discovered_at, updated_at, status) "
                     "SELECT i + 1, 'org/m' || (i % 50), lpad(printf('%x', i), 40, '0'), 'hub', 'org/m' || (i % 50), "
                     "?::TIMESTAMPTZ + to_seconds(i), ?::TIMESTAMPTZ + to_seconds(i), "
                     "CASE WHEN i % 3 = 0 THEN 'failed' ELSE 'scored' END FROM range(?) t(i)",
                     [t0, t0, n])
    return path


class QuietDaemon:
    """What every stand-in daemon answers the same way: healthy, a trivial status, no policies."""

    def health(self) -> tuple[bool, list[str]]:
        return True, []

    def status(self) -> dict[str, Any]:
        return {"ok": True}

    def policies(self) -> list[Any]:
        return []


class StandIn(QuietDaemon):
    """What the API reads of a daemon: health, metrics, status, and stores on fresh cursors of
    one open connection, as the daemon hands them out."""

    def __init__(self, db: Path) -> None:
        from monitor.store import Store

        self.db = db
        self.store = Store.open(db)
        self.config = SimpleNamespace(state_dir=db.parent, policies_dir=db.parent, webhook_secret_file=None)
        self.metrics = SimpleNamespace(render=lambda: b"# TYPE up gauge\nup 1\n")

    @contextlib.contextmanager
    def read_store(self):
        from monitor.store import Store

        cursor = self.store.cursor()
        try:
            yield Store(cursor, self.db, read_only=True)
        finally:
            cursor.close()

    job_store = read_store

    def request_poll(self) -> None:
        pass


def write_old_package(tmp: Path, commit: str, files: tuple[str, ...]) -> bool:
    """The API modules `files` of `commit` as package `old_lstar_api` under `tmp`; False when
    git cannot show them."""
    package = tmp / "old_lstar_api"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for name in files:
        shown = subprocess.run(["git", "show", f"{commit}:monitor/service/{name}.py"], cwd=ROOT,
                               capture_output=True, text=True)
        if shown.returncode != 0:
            return False
        text = shown.stdout
        for other in files:
            text = text.replace(f"monitor.service.{other} ", f"old_lstar_api.{other} ")
            text = text.replace(f"monitor.service.{other}\n", f"old_lstar_api.{other}\n")
        (package / f"{name}.py").write_text(text)
    return True


def old_api_module(tmp: Path) -> Any | None:
    """The API module of OLD_COMMIT as package `old_lstar_api`, or None when git cannot show it."""
    if not write_old_package(tmp, OLD_COMMIT, OLD_FILES):
        return None
    sys.path.insert(0, str(tmp))
    try:
        return importlib.import_module("old_lstar_api.api")
    except Exception as exc:  # noqa: BLE001 - the old code no longer fits today's modules
        print(f"the API of {OLD_COMMIT} cannot be loaded here: {type(exc).__name__}: {exc}", file=sys.stderr)
        return None


def get(port: int, path: str, timeout: float = 30) -> tuple[int, float]:
    """(status, seconds from connect to the whole answer) of one GET on a fresh connection."""
    start = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n".encode())
        data = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := sock.recv(1 << 16):
                data += chunk
    return int(data.split()[1]) if data.startswith(b"HTTP/1.") else 0, time.perf_counter() - start


class Hogs:
    """Clients that try to hold every connection slot (see the module's docstring)."""

    def __init__(self, port: int, n: int) -> None:
        self.port = port
        self.stop = threading.Event()
        kinds = ["idle", "drip", "busy"]
        self.threads = [threading.Thread(target=self._run, args=(kinds[i % 3],), daemon=True) for i in range(n)]

    def __enter__(self) -> "Hogs":
        for t in self.threads:
            t.start()
        time.sleep(1.0)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=10)

    def _run(self, kind: str) -> None:
        head = f"GET /status HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\n"
        while not self.stop.is_set():
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=5) as sock:
                sock.settimeout(0.2)
                if kind == "drip":
                    sock.sendall((head + "X-Slow: ").encode())
                while not self.stop.is_set():
                    if kind == "busy":
                        sock.sendall((head + "\r\n").encode())
                    elif kind == "drip":
                        sock.sendall(b"z")
                    try:
                        if sock.recv(1 << 16) == b"" and kind != "busy":
                            break
                    except TimeoutError:
                        continue
                    if kind == "busy":
                        self.stop.wait(0.05)
            self.stop.wait(0.05)


def summary(samples: list[tuple[int, float]]) -> dict[str, Any]:
    ms = sorted(s * 1000 for _, s in samples)
    statuses: dict[int, int] = {}
    for status, _ in samples:
        statuses[status] = statuses.get(status, 0) + 1
    return {"median_ms": round(statistics.median(ms), 2), "p95_ms": round(ms[int(0.95 * (len(ms) - 1))], 2),
            "max_ms": round(ms[-1], 2), "statuses": statuses}


def measure(server: Any, port: int, probes: int, hogs: int) -> dict[str, Any]:
    for _ in range(20):  # warm-up: imports, thread pools, DuckDB's caches
        get(port, "/health")
        get(port, "/checkpoints?limit=50&status=scored")
    out = {"/health": summary([get(port, "/health") for _ in range(probes)]),
           "/checkpoints?limit=50": summary([get(port, "/checkpoints?limit=50&status=scored")
                                             for _ in range(probes)])}
    with Hogs(port, hogs):
        out[f"/health with {hogs} hostile clients"] = summary([get(port, "/health") for _ in range(probes)])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoints", type=int, default=20000)
    parser.add_argument("--probes", type=int, default=200)
    parser.add_argument("--hogs", type=int, default=24)
    parser.add_argument("--hostile", action="store_true", help="the hostile comparison (see above)")
    parser.add_argument("--crowd", type=int, default=1000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.hostile:
        from api_hostile import run_hostile

        results = run_hostile(args.crowd)
        if args.json:
            print(json.dumps(results, indent=2))
            return
        for name, phases in results.items():
            print(name)
            for phase, r in (phases.items() if isinstance(phases, dict) else [("", phases)]):
                print(f"  {phase:44s} {r}")
        return

    from monitor.service.api import ApiServer

    results: dict[str, Any] = {"checkpoints": args.checkpoints, "probes": args.probes, "hogs": args.hogs,
                               "workers": WORKERS}
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "state").mkdir()
        db = build_state(Path(tmp) / "state" / "lstar.duckdb", args.checkpoints)
        daemon = StandIn(db)
        with ApiServer(daemon, port=0, token="t" * 32, workers=WORKERS, idle_timeout=2, lifetime=5) as new:
            results["new (starlette+uvicorn)"] = measure(new, int(new.url.rsplit(":", 1)[1]), args.probes, args.hogs)
        old_module = old_api_module(Path(tmp))
        if old_module is None:
            results[f"old ({OLD_COMMIT})"] = "not measured: git cannot show the old API here"
        else:
            with old_module.ApiServer(daemon, port=0, token="t" * 32, workers=WORKERS, idle_timeout=2,
                                      lifetime=5) as old:
                results[f"old ({OLD_COMMIT}, http.server)"] = measure(old, int(old.url.rsplit(":", 1)[1]),
                                                                       args.probes, args.hogs)
        daemon.store.close()
    if args.json:
        print(json.dumps(results, indent=2))
        return
    for name, value in results.items():
        if not isinstance(value, dict):
            print(f"{name}: {value}")
            continue
        print(name)
        for what, s in value.items():
            print(f"  {what:38s} median {s['median_ms']:8.2f} ms  p95 {s['p95_ms']:8.2f} ms  "
                  f"max {s['max_ms']:8.2f} ms  statuses {s['statuses']}")


if __name__ == "__main__":
    main()
