"""Run the full emergence lab, version 3, resumably (or time one of its lineages).

    python benchmarks/lab_v3.py --pool POOL --out state/lab-v3
                                [--families-dir DIR] [--families a,b] [--seeds 0,1,2]
                                [--workers 2] [--nice 10] [--shared ../shared]
    python benchmarks/lab_v3.py --pool ... --out ... --measure gpt2:0

Trains and scores every (family, seed) lineage of `monitor.lab.config.race_v3_config` (every
kept family of --families-dir by the pre-registered distinctness rule (a full race needs 20),
else v2's six and starcoder2 and gpt-4o of shared/tokenizers; the one
size; seeds 0, 1, 2; docs/lab.md "Sizing v3"), two at a time, one per core, each on its own
pinned data, and writes OUT/lab.json (`lstar-lab/3`). Each finished lineage is saved as
OUT/<lineage>/scores.json and a lineage interrupted mid-training resumes from its last
checkpoint, so the command can be stopped and started again with the same arguments (families
may be added: scored lineages are reused). `--nice N` lowers the run's priority. `--measure
FAMILY:SEED` runs that one lineage in this process and prints the CPU seconds of each phase
(also in OUT/<lineage>/timing.json). This is a measurement, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    from monitor.lab.config import race_v3_config
    from monitor.lab.family_set import FamilySetRule
    from monitor.lab.race import SCORES_FILE, lineage_id
    from monitor.lab.race_v3 import (TIMING_FILE, family_checks_v3, prepare_race_v3, race_v3_jobs, run_race_v3,
                                     run_race_v3_lineage)

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("state") / "lab-v3")
    parser.add_argument("--pool", type=Path, required=True, help="The lab pool (built from data/lab-pool-v2.manifest.json).")
    parser.add_argument("--families-dir", type=Path, default=None, help="A folder of family (tokenizer) folders.")
    parser.add_argument("--families", default=None, help="Comma-separated families (default: all of them).")
    parser.add_argument("--seeds", default=None, help="Comma-separated seeds (default 0,1,2).")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--nice", type=int, default=0, help="Lower the priority by this much (0-19).")
    parser.add_argument("--measure", default=None, metavar="FAMILY:SEED", help="Time one lineage in-process.")
    parser.add_argument("--shared", type=Path, default=Path("../shared"))
    args = parser.parse_args(argv)
    if args.nice:
        os.nice(max(0, min(19, args.nice)))
    config = race_v3_config(args.pool, args.shared, families_dir=args.families_dir)
    if args.seeds:
        config = config.with_(seeds=tuple(int(s) for s in args.seeds.split(",")))
    if args.families:
        config = config.with_(families=tuple(f.strip() for f in args.families.split(",") if f.strip()))
    config.validate()
    size = config.size_spec.name
    if args.measure:
        family, _, seed = args.measure.partition(":")
        config = config.with_(families=(family,), seeds=(int(seed or 0),)).validate()
        args.out.mkdir(parents=True, exist_ok=True)
        start = time.process_time()
        inputs = prepare_race_v3(config, args.out)
        family_checks_v3(config, inputs)
        setup = time.process_time() - start
        run_race_v3_lineage(config, family, int(seed or 0), args.out, inputs)
        timing = json.loads((args.out / lineage_id(family, size, int(seed or 0)) / TIMING_FILE).read_text())
        timing["cpu_seconds"]["setup_pool_tasks_round_trip"] = setup
        print(json.dumps(timing, indent=1))
        return 0
    jobs = race_v3_jobs(config)
    done = sum((args.out / lineage_id(f, size, s) / SCORES_FILE).is_file() for f, s in jobs)
    print(f"lab v3: up to {len(jobs)} lineages ({len(config.families)} families x {len(config.seeds)} seeds), "
          f"{done} with saved scores in {args.out}", flush=True)
    start = time.monotonic()
    # From a folder of families the set is checked first by the pre-registered rule (without
    # --families: every kept family, at least 20; with it: each one named must be kept).
    rule = None if args.families_dir is None else FamilySetRule.preregistered(
        chosen=config.families if args.families else None, full_race=True)
    record = run_race_v3(config, args.out, workers=args.workers, progress=True, family_set=rule)
    print(f"{len(record.checkpoints)} checkpoints in {time.monotonic() - start:.0f} s -> {args.out / 'lab.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
