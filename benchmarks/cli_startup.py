"""Start-up cost of the `lstar` command line beside `python -c "import typer"`, in one run.

Each case runs N times in a fresh interpreter; wall seconds are timed around the child, CPU
seconds (user + system) come from the child's rusage. The table shows each case's median,
its ratio to `import typer`, and the number of modules the case ends with (`sys.modules`,
standard library included, counted in one extra run). `lstar checkpoints` reads an empty
state (a database migrated in a temporary folder, no daemon).

    python benchmarks/cli_startup.py [--repeat 7]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Runs `lstar ARGS` as the console script does; prints the module count when asked to.
_LSTAR = ("import sys; args = sys.argv[1:]; from monitor.cli import main; code = main(args); "
          "import os; os.environ.get('COUNT_MODULES') and print('MODULES', len(sys.modules), file=sys.stderr); "
          "sys.exit(code)")
_TYPER = ("import sys, os, typer; "
          "os.environ.get('COUNT_MODULES') and print('MODULES', len(sys.modules), file=sys.stderr)")


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
            "COLUMNS": "120", **extra}


def run_once(argv: list[str]) -> tuple[float, float]:
    """Wall and CPU seconds of one child running `argv`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(argv, env=_env(), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def module_count(argv: list[str]) -> int:
    proc = subprocess.run(argv, env=_env(COUNT_MODULES="1"), cwd=ROOT, capture_output=True, text=True)
    line = [x for x in proc.stderr.splitlines() if x.startswith("MODULES ")][-1]
    return int(line.split()[1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7, help="runs of each case (the median is shown)")
    args = parser.parse_args(argv)
    py = sys.executable
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "state"
        subprocess.run([py, "-c", _LSTAR, "db", "migrate", "--state", str(state)], env=_env(), cwd=ROOT,
                       check=True, stdout=subprocess.DEVNULL)
        cases = [('python -c "import typer"', [py, "-c", _TYPER]),
                 ("lstar --help", [py, "-c", _LSTAR, "--help"]),
                 ("lstar checkpoints --help", [py, "-c", _LSTAR, "checkpoints", "--help"]),
                 ("lstar checkpoints (empty state)", [py, "-c", _LSTAR, "checkpoints", "--state", str(state)])]
        rows = []
        for name, command in cases:
            run_once(command)   # warm the bytecode caches
            times = [run_once(command) for _ in range(args.repeat)]
            rows.append((name, statistics.median(t[0] for t in times), statistics.median(t[1] for t in times),
                         module_count(command)))
    base_wall, base_cpu = rows[0][1], rows[0][2]
    load = os.getloadavg()
    print(f"median of {args.repeat} runs each; {os.cpu_count()} CPUs, load average "
          f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; Python {sys.version.split()[0]}\n")
    print("| case | wall s | CPU s | wall × typer | CPU × typer | modules |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, wall, cpu, modules in rows:
        print(f"| `{name}` | {wall:.3f} | {cpu:.3f} | {wall / base_wall:.2f} | {cpu / base_cpu:.2f} | {modules} |")
    print(json.dumps({name: {"wall_s": w, "cpu_s": c, "modules": m} for name, w, c, m in rows}), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
