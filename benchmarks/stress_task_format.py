"""Task-format instability of SmolLM2-135M-Instruct and Gemma 3 270M (dequantised from Q4_K_M)
on cloze-v0, or of any checkpoints given, written as an lstar-stress/1 document with the
task_format section.

    PYTHONPATH=. python benchmarks/stress_task_format.py --every 15 --items 20 \
        --out benchmarks/results/stress/task-format-smollm2-gemma3.json
    PYTHONPATH=. python benchmarks/stress_task_format.py --name lab-v3-pilot/gpt2-large-s0 --kind lab \
        --task-file LAB/tasks/cloze.jsonl --every 20 --items 20 LAB/gpt2-large-s0/step* \
        --out benchmarks/results/stress/task-format-lab-gpt2-large-s0.json

Without checkpoints the two real models are the checkpoints: their instability is the share of
format pairs that disagree on which of the two ranks higher; each model's item flip rate is its
own. A checkpoint is a model reference `lstar score` accepts, optionally `label=ref` (a lab
step folder is labelled by its folder name)."""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

from monitor.stress.subject import SCHEMA, StressCheckpoint, StressOptions, StressSubject
from monitor.stress.task_format import format_stress

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task-file", type=Path, default=ROOT.parent / "shared" / "tasks" / "cloze-v0.jsonl")
    parser.add_argument("--every", type=int, default=5)
    parser.add_argument("--items", type=int, default=40)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("checkpoints", nargs="*", help="model references (default: the two real models)")
    parser.add_argument("--name", default=None)
    parser.add_argument("--kind", default="model", choices=("model", "lab"))
    args = parser.parse_args()
    if args.checkpoints:
        checkpoints = []
        for item in args.checkpoints:
            label, _, ref = item.rpartition("=")
            checkpoints.append(StressCheckpoint(ref, label or Path(ref).name or ref))
        name = args.name or "+".join(c.label for c in checkpoints)
    else:
        checkpoints = [StressCheckpoint("builtin:smollm2-135m", "smollm2-135m"),
                       StressCheckpoint("builtin:gemma3-270m", "gemma3-270m", note="dequantised from Q4_K_M")]
        name = args.name or "smollm2-135m+gemma3-270m"
    subject = StressSubject(kind=args.kind, name=name, corpus=ROOT.parent / "shared" / "corpus" / "calib-v0",
                            checkpoints=tuple(checkpoints))
    options = StressOptions(task_file=args.task_file, extra={"task_format_every": args.every,
                                                             "task_format_items": args.items,
                                                             "device": "cpu", "dtype": "float32"})
    started, cpu_started = time.perf_counter(), time.process_time()
    section = format_stress(subject, options)
    import torch
    import transformers

    document = {"schema": SCHEMA,
                "subject": {"kind": subject.kind, "name": subject.name, "curve_id": None,
                            "checkpoints": [{"ref": c.ref, "label": c.label, "note": c.note} for c in subject.checkpoints]},
                "sections": {"task_format": section},
                "run": {"wall_s": round(time.perf_counter() - started, 1),
                        "cpu_s": round(time.process_time() - cpu_started, 1), "device": "cpu", "dtype": "float32",
                        "python": platform.python_version(), "torch": torch.__version__,
                        "transformers": transformers.__version__}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    task = section["tasks"][0]
    print(f"{task['task']}: instability {task['instability']}, bound {task['accuracy_upper_bound']}, "
          f"flips {task['item_flips']}")


if __name__ == "__main__":
    main()
