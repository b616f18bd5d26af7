"""Sigmoid fits with their solves batched (`monitor.curves.batch_trf`) beside the same fits
solved one problem at a time (`monitor.curves.small_trf`), in one run.

Two workloads, each run both ways in this process, CPU seconds (this process's user + system)
and wall seconds side by side with their ratio, and the largest difference between the two
results:
- a band: `fit_sigmoid_band` with its default 1,000 resamples, on 30 checkpoints of a noisy
  rise (the shape of a task curve on L*);
- an axis choice: `lstar curves validate --task gsm8k --axes all` on the published-evaluation
  labels (examples/public-evals/make_labels.py over ../shared/data/public-evals), with 20
  family resamples and 50 band resamples (the suite's settings; the defaults are 200 and 200).

    python benchmarks/sigmoid_fits.py [--shared ../shared]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import os
import resource
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from monitor.curves import parametric
from monitor.curves.axes import AXES


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _timed(run: Callable[[], Any]) -> tuple[float, float, Any]:
    cpu, wall = _cpu(), time.perf_counter()
    out = run()
    return _cpu() - cpu, time.perf_counter() - wall, out


def _one_at_a_time(flag: bool) -> None:
    parametric._SMALLEST_BATCH = 10 ** 9 if flag else _BATCHED


_BATCHED = parametric._SMALLEST_BATCH


def _band() -> np.ndarray:
    rng = np.random.default_rng(3)
    x = np.linspace(-1.5, 0.5, 30)
    y = np.clip(0.1 + 0.7 / (1 + np.exp(6 * (x + 0.4))) + rng.normal(0, 0.03, 30), 0, 1)
    fit = parametric.fit_sigmoid_band(x, y, np.full(30, 200.0), predictor=AXES["lstar"], level=0.5, seed=1)
    t = fit.threshold
    return np.concatenate([fit.lower, fit.upper, fit.knots_y, [t["estimate"], t["lower"], t["upper"]]])


def _axis_choice(labels: Path) -> np.ndarray:
    from monitor.cli import main

    with contextlib.redirect_stdout(io.StringIO()) as out:
        code = main(["curves", "validate", "--labels", str(labels), "--task", "gsm8k", "--axes", "all",
                     "--baseline", "0", "--margin", "0.1", "--family-resamples", "20", "--bootstrap", "50", "--json"])
    if code != 0:
        raise SystemExit(f"curves validate exited {code}")
    values: list[float] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for key in sorted(node):
                walk(node[key])
        elif isinstance(node, list):
            for item in node:
                walk(item)
        elif isinstance(node, float):
            values.append(node)

    walk(json.loads(out.getvalue()))
    return np.array(values)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shared", type=Path, default=ROOT.parent / "shared")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        spec = importlib.util.spec_from_file_location("make_labels", ROOT / "examples" / "public-evals" / "make_labels.py")
        assert spec is not None and spec.loader is not None
        make_labels = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(make_labels)
        with contextlib.redirect_stdout(io.StringIO()):
            make_labels.main(["--data", str(args.shared / "data" / "public-evals"), "--out", tmp])
        labels = Path(tmp) / "obsscaling-hkust.csv"
        _band()                                  # imports and first-call costs outside the timings
        print(f"{os.cpu_count()} CPUs, load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}; "
              f"Python {sys.version.split()[0]}, numpy {np.__version__}")
        print(f"{'workload':44s} {'one at a time':>22s} {'batched':>22s} {'ratio':>13s}  max |difference|")
        print(f"{'':44s} {'CPU s':>10s} {'wall s':>11s} {'CPU s':>10s} {'wall s':>11s} {'CPU':>6s} {'wall':>6s}")
        for name, run in (("band, 1,000 resamples, 30 checkpoints", _band),
                          ("axis choice, gsm8k, all axes (20 / 50)", lambda: _axis_choice(labels))):
            _one_at_a_time(True)
            slow = _timed(run)
            _one_at_a_time(False)
            fast = _timed(run)
            diff = float(np.max(np.abs(slow[2] - fast[2]))) if len(slow[2]) == len(fast[2]) else float("nan")
            print(f"{name:44s} {slow[0]:10.2f} {slow[1]:11.2f} {fast[0]:10.2f} {fast[1]:11.2f} "
                  f"{slow[0] / fast[0]:5.1f}× {slow[1] / fast[1]:5.1f}×  {diff:.1e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
