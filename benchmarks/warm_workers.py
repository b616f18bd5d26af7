"""Warm scoring workers against a fresh child per job: the start-up each job pays.

N tiny checkpoints (built as the tests build them: one tokenizer, N seeds) are scored one
job after another, as the daemon scores its queue, first by the cold local backend (a new
child process per job: Python, torch and transformers imported, the tokenizer loaded and the
corpus tokenized, every time) and then by a pool of warm workers (`--scoring-workers 1`: the
pool is started inside the measured time, so the first job pays the warm-up). Every
checkpoint's L* is checked equal between the two sides (to 1e-12).

Per job: wall time from hand-over to outcome, the forward pass's own time (`wall_s` of the
score), and their difference, the start-up: process start, imports, loading, tokenization,
baseline. Printed as a table with the cold/warm ratio, and written to
benchmarks/out/warm_workers.json.

    python benchmarks/warm_workers.py [--checkpoints 6] [--hidden 64] [--every 12] [--max-jobs 20]

This is a measurement, not a test: it prints what it measured.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ["DISABLE_SAFETENSORS_CONVERSION"] = "1"


def _side(backend, jobs) -> list[dict]:
    """Score `jobs` one at a time on `backend`; per job: wall, forward and start-up seconds."""
    rows = []
    for job in jobs:
        started = time.perf_counter()
        [outcome] = list(backend.run([job]))
        wall = time.perf_counter() - started
        if not outcome.ok:
            raise SystemExit(f"{job.name()} failed: {outcome.error}")
        forward = float(outcome.scored.result["wall_s"])
        rows.append({"job": job.name(), "wall_s": wall, "forward_s": forward, "startup_s": wall - forward,
                     "lstar": outcome.scored.result["lstar"], "worker": outcome.worker})
    return rows


def _summary(rows: list[dict], total: float, processes: int) -> dict:
    startups = [r["startup_s"] for r in rows]
    return {"total_s": total, "mean_job_s": statistics.mean(r["wall_s"] for r in rows),
            "mean_startup_s": statistics.mean(startups), "median_startup_s": statistics.median(startups),
            "later_startup_s": statistics.mean(startups[1:]) if len(startups) > 1 else startups[0],
            "processes": processes}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoints", type=int, default=6, help="tiny checkpoints to score")
    parser.add_argument("--hidden", type=int, default=64, help="width of the tiny models (2 layers)")
    parser.add_argument("--every", type=int, default=12, help="score every Nth calib-v0 document")
    parser.add_argument("--max-jobs", type=int, default=20, help="jobs per warm worker before it is replaced")
    parser.add_argument("--shared", type=Path, default=Path(__file__).resolve().parents[2] / "shared")
    args = parser.parse_args(argv)

    from monitor.lab.tiny_models import build_tiny_model
    from monitor.scoring.backends import LocalBackend, ScoreJob, WarmBackend
    from monitor.scoring.engine import ScoreRequest, corpus_selection

    with tempfile.TemporaryDirectory(prefix="lstar-warm-bench-") as tmp:
        root = Path(tmp)
        jobs = []
        for seed in range(args.checkpoints):
            model = build_tiny_model(root / f"model-{seed}", args.shared / "tokenizers" / "gpt2", arch="llama",
                                     seed=seed, hidden=args.hidden, layers=2, heads=4, max_positions=256)
            request = ScoreRequest(model=str(model), corpus_dir=args.shared / "corpus" / "calib-v0",
                                   every=args.every, max_context=128, device="cpu", dtype="float32",
                                   with_tcb=False, n_boot=200, progress=False)
            jobs.append(ScoreJob(checkpoint_id=seed, repo=f"bench/tiny-{seed}", sha=f"{seed:040d}",
                                 request=request, corpus_sha256=corpus_selection(request).sha256))

        cold_backend = LocalBackend(timeout_s=1800, workdir=root / "cold")
        started = time.perf_counter()
        cold = _side(cold_backend, jobs)
        cold_total = time.perf_counter() - started

        started = time.perf_counter()
        pool = WarmBackend(workers=1, max_jobs=args.max_jobs, timeout_s=1800, workdir=root / "warm")
        try:
            warm = _side(pool, jobs)
        finally:
            pool.close()
        warm_total = time.perf_counter() - started

    worst = max(abs(c["lstar"] - w["lstar"]) for c, w in zip(cold, warm, strict=True))
    if worst > 1e-12:
        raise SystemExit(f"cold and warm L* differ by {worst:.3g}: the warm path is wrong")
    # Cold: a child per job (the outcome names the daemon's pid); warm: the workers' pids.
    sides = {"cold": _summary(cold, cold_total, len(cold)),
             "warm": _summary(warm, warm_total, len({r["worker"] for r in warm}))}

    print(f"{args.checkpoints} tiny checkpoints (llama, width {args.hidden}, 2 layers), calib-v0 every "
          f"{args.every}th document, one job after another; max |L* cold - warm| = {worst:.1e}")
    print()
    print(f"{'job':<28} {'cold wall s':>11} {'cold start-up s':>15} {'warm wall s':>11} {'warm start-up s':>15}")
    for c, w in zip(cold, warm, strict=True):
        print(f"{c['job']:<28} {c['wall_s']:>11.2f} {c['startup_s']:>15.2f} {w['wall_s']:>11.2f} {w['startup_s']:>15.2f}")
    print()
    print(f"{'':<28} {'cold':>9} {'warm':>9} {'cold/warm':>10}")
    for key, label in (("total_s", "total wall s"), ("mean_job_s", "mean job wall s"),
                       ("mean_startup_s", "mean start-up s"), ("later_startup_s", "start-up s, jobs 2..N"),
                       ("median_startup_s", "median start-up s")):
        c, w = sides["cold"][key], sides["warm"][key]
        print(f"{label:<28} {c:>9.2f} {w:>9.2f} {c / w if w else float('inf'):>9.2f}x")
    print(f"{'scoring processes started':<28} {sides['cold']['processes']:>9} {sides['warm']['processes']:>9}")

    out = Path(__file__).resolve().parent / "out"
    out.mkdir(exist_ok=True)
    (out / "warm_workers.json").write_text(json.dumps(
        {"args": {k: str(v) for k, v in vars(args).items()}, "cold": cold, "warm": warm, "summary": sides,
         "max_lstar_difference": worst}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
