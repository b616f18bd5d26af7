"""Time the lab race (`monitor.lab.analysis.race`) on rows the size of the full lab.

    python benchmarks/lab_race_timing.py [--families 6] [--seeds 3] [--steps 20] [--resamples 200]

Builds synthetic race rows (`monitor.lab.synthetic`: families × 2 sizes × seeds lineages of
`steps` checkpoints, on both evaluation texts, two tasks of three metrics) and races every axis
with the default settings (two-stage refit bootstrap on the calib text), in this one process
(one core). Prints the CPU and wall time and the primary verdict. A measurement, not a test.
"""

from __future__ import annotations

import argparse
import time


def main(argv: list[str] | None = None) -> int:
    from monitor.lab.analysis import RaceConfig, race
    from monitor.lab.synthetic import synthetic_race_rows

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", type=int, default=6)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--resamples", type=int, default=200)
    args = parser.parse_args(argv)
    rows = synthetic_race_rows(families=args.families, seeds=args.seeds, steps=args.steps)
    lineages = len({(r["family"], r["size"], r["seed"]) for r in rows})
    cpu, wall = time.process_time(), time.monotonic()
    result = race(rows, RaceConfig(resamples=args.resamples))
    cpu, wall = time.process_time() - cpu, time.monotonic() - wall
    print(f"{lineages} lineages × {args.steps} checkpoints × 2 texts ({len(rows)} rows), "
          f"{len(result['metrics'])} task metrics, {len(result['axes'])} axes, {args.resamples} resamples: "
          f"{cpu:.1f} s CPU, {wall:.1f} s wall")
    print(f"primary: {result['primary']['statement']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
