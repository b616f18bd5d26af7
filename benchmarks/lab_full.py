"""Run the full emergence lab, version 2, resumably, and print its progress.

    python benchmarks/lab_full.py --out state/lab-v2 --pool /work/pool/lab-pool-v1 [--workers 2]
                                  [--seeds 0,1,2] [--families gpt2,llama-2,...] [--shared ../shared]

Trains and scores every lineage of `monitor.lab.config.race_full_config` (six lossless
tokenizers × two sizes × three seeds, docs/lab.md "Sizing v2"), two at a time, one per core,
each reading the pool's train split once in its seed's order, and writes OUT/lab.json
(`lstar-lab/2`). Each finished lineage is saved as OUT/<lineage>/scores.json and a lineage
interrupted mid-training resumes from its last checkpoint, so the command can be stopped
and started again with the same arguments; the lab.json it writes in the end is the same.
A line is printed per finished lineage with the elapsed time. The statistics are
`lstar lab report --lab OUT`. This is a measurement, not a test.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    from monitor.lab.config import race_full_config
    from monitor.lab.race import race_jobs, run_race

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("state") / "lab-v2")
    parser.add_argument("--pool", type=Path, required=True, help="The lab pool (e.g. /work/pool/lab-pool-v1).")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seeds", default=None, help="Comma-separated seeds (default 0,1,2).")
    parser.add_argument("--families", default=None, help="Comma-separated lossless tokenizers (default: six).")
    parser.add_argument("--stress-families", default=None, help="Lossy tokenizers run as a labelled stress test.")
    parser.add_argument("--shared", type=Path, default=Path("../shared"))
    args = parser.parse_args(argv)
    config = race_full_config(args.pool, args.shared)
    if args.seeds:
        config = config.with_(seeds=tuple(int(s) for s in args.seeds.split(",")))
    if args.families:
        config = config.with_(families=tuple(f.strip() for f in args.families.split(",") if f.strip()))
    if args.stress_families:
        config = config.with_(stress_families=tuple(f.strip() for f in args.stress_families.split(",") if f.strip()))
    config.validate()
    done = sum((args.out / f"{f}-{s}-s{seed}" / "scores.json").is_file() for f, s, seed in race_jobs(config))
    print(f"lab v2: {len(race_jobs(config))} lineages, {done} already scored in {args.out}", flush=True)
    start = time.monotonic()
    record = run_race(config, args.out, workers=args.workers, progress=True)
    print(f"{len(record.checkpoints)} checkpoints in {time.monotonic() - start:.0f} s -> {args.out / 'lab.json'}")
    print(f"report: lstar lab report --lab {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
