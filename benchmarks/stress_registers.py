"""The registers stress test on real checkpoints: writes one `lstar-stress/1` document holding
the `registers` section, with the wall time, to --out.

    PYTHONPATH=. python benchmarks/stress_registers.py --name smollm2 --docs 8 \
        --registers /tmp/registers builtin:smollm2-135m --out benchmarks/results/stress/registers-smollm2.json

--registers is a folder built by `lstar corpus build-registers` (one sub-folder per register);
each checkpoint is a model reference `lstar score` accepts, optionally `label=ref`.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

from monitor.stress.registers import register_stress
from monitor.stress.subject import SCHEMA, StressCheckpoint, StressOptions, StressSubject


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoints", nargs="+")
    parser.add_argument("--name", required=True)
    parser.add_argument("--kind", default="model", choices=("model", "lab"))
    parser.add_argument("--corpus", type=Path, default=Path("../shared/corpus/calib-v0"))
    parser.add_argument("--registers", type=Path, required=True)
    parser.add_argument("--docs", type=int, default=None)
    parser.add_argument("--every", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--curve", type=Path, default=None)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    checkpoints = []
    for item in args.checkpoints:
        label, _, ref = item.rpartition("=")
        checkpoints.append(StressCheckpoint(ref=ref, label=label or Path(ref).name or ref))
    subject = StressSubject(kind=args.kind, name=args.name, checkpoints=tuple(checkpoints), corpus=args.corpus)
    registers = tuple(sorted(p for p in args.registers.iterdir() if (p / "register.json").is_file()))
    options = StressOptions(seed=args.seed, max_documents=args.docs, register_corpora=registers,
                            curve_path=args.curve, extra={"device": "cpu", "dtype": "float32", "every": args.every})
    start, cpu_start = time.perf_counter(), time.process_time()
    section = register_stress(subject, options)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    document = {"schema": SCHEMA,
                "subject": {"kind": subject.kind, "name": subject.name, "corpus": str(subject.corpus),
                            "checkpoints": [{"label": c.label, "ref": c.ref} for c in checkpoints]},
                "sections": {"registers": section},
                "run": {"wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "documents_per_corpus": args.docs, "every": args.every, "device": "cpu",
                        "dtype": "float32", "machine": platform.machine(), "python": platform.python_version()}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document, indent=1, sort_keys=True) + "\n")
    print(json.dumps({"lstar": section["lstar"], "kendall_tau": section["kendall_tau"], "wall_s": round(wall, 1)},
                     indent=1))


if __name__ == "__main__":
    main()
