"""What each test file costs, how many workers run the files, and the order they take them in.

pytest-xdist's `--dist loadfile` hands out whole files from a queue. By default it sorts that
queue by the number of tests in a file, most first, so the files with one long test (the demo's
end to end, the daemon in subprocesses) were handed out last and ran alone at the end while the
other worker sat idle. The suite now runs with `--no-loadscope-reorder`, and the collection is
put in the order of `tests/file_costs.json` (CPU-seconds per file, measured), the costliest file
first: the longest jobs start at once and the short ones fill the gaps, so the workers finish
close together (longest-processing-time-first scheduling).

There is one worker more than the cores (`suite_workers`, through xdist's `-n auto`): many tests
wait with a core idle (a job's time limit run out, a daemon's next tick, a client held at an API
deadline), and the extra worker's tests use that core meanwhile (on 2 cores: 14:56 of wall time
with two workers, 12:17 with three, docs/testing.md).

`TEST_COSTS_DIR=DIR` makes each process of a run write, per test, the CPU-seconds it used
(itself and the subprocesses it waited for) and its wall time to `DIR/<worker>.jsonl`;
`python tests/support/file_costs.py DIR` sums them per file, prints the table, estimates the
suite's wall time on idle cores and, with `--write`, updates `tests/file_costs.json`
(docs/testing.md).
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from collections import deque
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

COSTS_FILE = Path(__file__).resolve().parents[1] / "file_costs.json"
# Not LSTAR_*: `lstar run` warns about every LSTAR_ variable that is not one of its settings, and
# the daemon tests check its stderr line by line.
COSTS_ENV = "TEST_COSTS_DIR"
# At most this many bytes of costs are read: the file is ours, but a broken merge could make it huge.
MAX_COSTS_BYTES = 1 << 20


def load_costs(path: Path = COSTS_FILE) -> dict[str, float]:
    """File name -> CPU-seconds, from the committed table; {} when it is missing or unreadable,
    so a broken table only loses the ordering, never the run."""
    try:
        with path.open("rb") as fh:
            data = json.loads(fh.read(MAX_COSTS_BYTES + 1)[:MAX_COSTS_BYTES])
        files = data["files"]
        return {str(name): float(row["cpu_s"]) for name, row in files.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def costliest_first(items: list, costs: dict[str, float]) -> list:
    """`items` (pytest items) grouped by file, the files in descending cost, each file's tests in
    their own order. A file without a measured cost comes after the measured ones, in the order
    it was collected (a stable sort), so the order is the same in every worker."""
    first_seen: dict[str, int] = {}
    for item in items:
        first_seen.setdefault(item.nodeid.split("::", 1)[0], len(first_seen))

    def key(item) -> tuple[float, int]:
        path = item.nodeid.split("::", 1)[0]
        return (-costs.get(Path(path).name, 0.0), first_seen[path])

    return sorted(items, key=key)


def _cpu_s() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@contextmanager
def recorded(nodeid: str, folder: str | None) -> Iterator[None]:
    """Append `nodeid`'s CPU-seconds and wall seconds (setup, call and teardown) to the worker's
    file under `folder`; nothing when `folder` is None."""
    if not folder:
        yield
        return
    cpu0, wall0 = _cpu_s(), time.perf_counter()
    try:
        yield
    finally:
        row = {"nodeid": nodeid, "cpu_s": round(_cpu_s() - cpu0, 3), "wall_s": round(time.perf_counter() - wall0, 3)}
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        Path(folder).mkdir(parents=True, exist_ok=True)
        with (Path(folder) / f"{worker}.jsonl").open("a") as fh:
            fh.write(json.dumps(row) + "\n")


def per_file(rows: Iterable[dict]) -> dict[str, dict[str, float]]:
    """The rows of `recorded`, summed per test file."""
    out: dict[str, dict[str, float]] = {}
    for row in rows:
        name = Path(row["nodeid"].split("::", 1)[0]).name
        acc = out.setdefault(name, {"cpu_s": 0.0, "wall_s": 0.0, "tests": 0})
        acc["cpu_s"] += float(row["cpu_s"])
        acc["wall_s"] += float(row["wall_s"])
        acc["tests"] += 1
    return out


def quota_cores(cpu_max: str) -> int | None:
    """The cores a cgroup v2 `cpu.max` line allows ("QUOTA PERIOD", rounded up), or None for
    "max" (no quota) or a line that is not one."""
    try:
        quota, period = cpu_max.split()[:2]
        if quota == "max":
            return None
        return max(1, -(-int(quota) // int(period)))
    except (ValueError, ZeroDivisionError):
        return None


def usable_cores(cgroup_root: Path = Path("/sys/fs/cgroup"), self_cgroup: Path = Path("/proc/self/cgroup")) -> int:
    """The cores this process may run on: its CPU affinity, lowered by the tightest cgroup v2 CPU
    quota on its cgroup's path (a container given 2 CPUs of a larger host sees all of the host's
    in its affinity; a quota set on a parent cgroup binds too)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:                      # not on Linux
        cores = os.cpu_count() or 1
    try:
        path = next((line.split("::", 1)[1].strip() for line in self_cgroup.read_text().splitlines()
                     if line.startswith("0::")), "/")
    except OSError:
        path = "/"
    folder = (cgroup_root / path.lstrip("/")).resolve()
    root = cgroup_root.resolve()
    if folder != root and root not in folder.parents:
        folder = root                           # a path that leaves the hierarchy: its root only
    while True:
        try:
            cores = min(cores, quota_cores((folder / "cpu.max").read_text()) or cores)
        except OSError:
            pass
        if folder == root:
            break
        folder = folder.parent
    return max(1, cores)


# Each worker is a Python process that may hold a model; more than this many is memory, not speed.
MAX_WORKERS = 8


def suite_workers(cores: int | None = None) -> int:
    """The number of xdist workers: one more than the cores, at most MAX_WORKERS."""
    return min((usable_cores() if cores is None else cores) + 1, MAX_WORKERS)


def estimate_wall_s(costs: dict[str, float], workers: int = 3, cores: int = 2) -> float:
    """The suite's wall time on `cores` idle cores with `workers` workers, if each file takes its
    CPU-seconds: files handed out costliest first, each to the worker that is free first (what
    `--dist loadfile --no-loadscope-reorder` does with our order), the busy workers sharing the
    cores evenly. It counts no waiting (what the extra worker is for) and counts a file whose
    tests use two cores (torch threads) at its CPU-seconds, so it is an estimate, not a bound;
    the sum of CPU-seconds / `cores` is the floor."""
    queue = deque(sorted(costs.values(), reverse=True))
    running: list[float] = []                   # CPU-seconds left of the file each busy worker runs
    elapsed = 0.0
    while queue or running:
        while queue and len(running) < workers:
            running.append(queue.popleft())
        speed = min(1.0, cores / len(running))  # CPU-seconds per second of each busy worker
        step = min(running) / speed
        elapsed += step
        running = [left - step * speed for left in running if left - step * speed > 1e-9]
    return elapsed


def _main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python tests/support/file_costs.py DIR [--write]\n"
              "Sum the per-test costs a run with TEST_COSTS_DIR=DIR wrote, per file; print the table and the "
              "estimated wall time on 2 idle cores with 3 workers; --write stores the CPU-seconds in tests/file_costs.json.")
        return 0 if argv else 2
    folder = Path(argv[0])
    rows = [json.loads(line) for path in sorted(folder.glob("*.jsonl")) for line in path.read_text().splitlines()
            if line.strip()]
    files = per_file(rows)
    total = sum(f["cpu_s"] for f in files.values())
    print(f"{'file':44} {'tests':>5} {'CPU-s':>9} {'wall-s':>9}")
    for name, f in sorted(files.items(), key=lambda kv: -kv[1]["cpu_s"]):
        print(f"{name:44} {f['tests']:5d} {f['cpu_s']:9.1f} {f['wall_s']:9.1f}")
    estimate = estimate_wall_s({n: f["cpu_s"] for n, f in files.items()})
    print(f"{len(rows)} tests, {total:.0f} CPU-s; estimated wall on 2 idle cores with 3 workers: {estimate / 60:.1f} min "
          f"(floor {total / 2 / 60:.1f} min)")
    if "--write" in argv[1:]:
        # files not measured keep their cost; files that no longer exist are dropped
        present = {p.name for p in COSTS_FILE.parent.glob("test_*.py")}
        merged = {**{n: {"cpu_s": c} for n, c in load_costs(COSTS_FILE).items() if n in present},
                  **{n: {"cpu_s": round(f["cpu_s"], 1)} for n, f in files.items()}}
        lines = [f" {json.dumps(name)}: {json.dumps(row)}" for name, row in sorted(merged.items())]
        COSTS_FILE.write_text('{\n "unit": "CPU-seconds per test file (tests/support/file_costs.py)",\n "files": {\n '
                              + ",\n ".join(lines) + "\n }\n}\n")   # one line per file: readable diffs
        print(f"wrote {COSTS_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
