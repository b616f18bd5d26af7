"""The multiple-choice evaluator with its output layer on the continuation positions alone
(transformers' `logits_to_keep`) beside the same evaluation with every position's logits, in
one run.

A small model with GPT-2's full vocabulary (50,257 ids, hidden size 64, 2 layers: the output
layer is most of its arithmetic) evaluates the pinned cloze task (300 items, 4 options) both
ways, alternately, `--repeats` times each; the script prints CPU seconds (this process's user +
system) and wall seconds per side, their ratio, the largest difference between the two sides'
log-likelihoods and whether their accuracies agree.

    python benchmarks/task_eval.py [--shared ../shared] [--repeats 2]
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shared", type=Path, default=ROOT.parent / "shared")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)

    import torch
    from transformers import AutoModelForCausalLM

    from monitor.curves import evaluator
    from monitor.lab.tiny_models import build_tiny_model
    from monitor.scoring.tokenizer import load_tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        folder = build_tiny_model(Path(tmp) / "model", args.shared / "tokenizers" / "gpt2", arch="llama", seed=1,
                                  hidden=64, layers=2, heads=4, max_positions=256)
        model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    handle = load_tokenizer(args.shared / "tokenizers" / "gpt2")
    task = evaluator.load_mc_task(args.shared / "tasks" / "cloze-v0.jsonl")
    real = evaluator._takes_logits_to_keep
    sides = {"every position": lambda m: False, "continuation only": real}
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in sides}
    results = {}
    evaluator._takes_logits_to_keep = sides["every position"]
    evaluator.evaluate_multiple_choice(model, handle.tokenizer, task, prefix_token_id=handle.prefix_token_id)  # warm-up
    for _ in range(args.repeats):
        for name, rule in sides.items():
            evaluator._takes_logits_to_keep = rule
            cpu, wall = _cpu(), time.perf_counter()
            results[name] = evaluator.evaluate_multiple_choice(model, handle.tokenizer, task,
                                                               prefix_token_id=handle.prefix_token_id)
            times[name].append((_cpu() - cpu, time.perf_counter() - wall))
    evaluator._takes_logits_to_keep = real
    full, kept = results["every position"], results["continuation only"]
    diff = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
               for a, b in zip(full.loglikelihoods, kept.loglikelihoods))
    print(f"{os.cpu_count()} CPUs, load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}; "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads; cloze-v0, {len(task.items)} items")
    print(f"{'side':<20}{'CPU s (best)':>14}{'wall s (best)':>15}")
    best = {name: (min(c for c, _ in t), min(w for _, w in t)) for name, t in times.items()}
    for name, (c, w) in best.items():
        print(f"{name:<20}{c:>14.2f}{w:>15.2f}")
    (c0, w0), (c1, w1) = best["every position"], best["continuation only"]
    print(f"ratio: {c0 / c1:.1f}x CPU, {w0 / w1:.1f}x wall; largest log-likelihood difference {diff:.1e} nats; "
          f"accuracy {full.metrics['acc'][0]:.4f} and {kept.metrics['acc'][0]:.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
