"""Sequential scoring against full scores: tokens and wall time to a decision.

A lineage of tiny checkpoints (llama, the 1,000-token `spm-unigram-toy` tokenizer, weights drawn
with a growing standard deviation, so their L* spread over a few nats) is scored on calib-v0 in
full and sequentially. A policy of two tasks watches it; their curves are fitted on synthetic
labels (another seed) and placed so that the lineage's checkpoints lie at varied distances from
the thresholds: one crossing between two checkpoints, one a few standard errors from a third.

Printed: per checkpoint, its distance to each threshold (in the full score's SEs), tokens and
wall time to the decision in both modes, the decisions, and the totals; then a simulation that
replays each checkpoint's full per-document losses in many seeded orders through the same
stopping rule and counts the decisions that differ from the full score's, against δ.

    python benchmarks/sequential.py [--orders 100] [--every 1] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # the tests' helpers: support.sequential

from monitor.alerts.predict import predict_task
from monitor.alerts.sequential_plan import task_entry
from monitor.curves.artifact import ScoringRef
from monitor.lab.tiny_models import build_tiny_model
from monitor.policy import Task
from monitor.scoring import ScoreRequest
from monitor.scoring.engine import compute_score, prepare
from monitor.scoring.sequential import CurveTask, run_sequential
from monitor.scoring.sequential_run import sequential_plan
from support.sequential import synthetic_curve

SHARED = ROOT.parent / "shared"
STDS = (0.02, 0.06, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5)
WIDTH = 0.3   # the curves' logistic scale (nats of L*)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--orders", type=int, default=100, help="seeded orders per checkpoint in the simulation")
    ap.add_argument("--every", type=int, default=1, help="score every k-th corpus document")
    ap.add_argument("--json", type=Path, default=None, help="write the numbers here too")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    work = Path(tempfile.mkdtemp(prefix="lstar-seqbench-"))
    template = ScoreRequest(corpus_dir=SHARED / "corpus" / "calib-v0", every=args.every if args.every > 1 else None,
                            max_context=64, disjoint=True, dtype="float32", device="cpu", with_tcb=False,
                            progress=False, batch_size=32, resume_partial=False)
    # 1. full scores of the lineage (they also give each checkpoint's truth)
    checkpoints = []
    for i, std in enumerate(STDS):
        model = build_tiny_model(work / f"ckpt-{i}", SHARED / "tokenizers" / "spm-unigram-toy", seed=100 + i,
                                 max_positions=128, init_std=std)
        prepared = prepare(replace(template, model=str(model)))
        start = time.perf_counter()
        full = compute_score(prepared, None)
        wall = time.perf_counter() - start
        checkpoints.append({"name": f"std{std:g}", "prepared": prepared, "full": full.result, "full_wall_s": wall,
                            "docs": full.documents})
        print(f"scored {checkpoints[-1]['name']} in full: L* {full.result['lstar']:.4f} ± {full.result['se_ce']:.4f}",
              file=sys.stderr)
    corpus_sha = checkpoints[0]["full"]["corpus"]["sha256"]
    spec = ScoringRef(spec_version="lstar-score/1", window=64, stride=64,
                      prefix_policy=checkpoints[0]["full"]["spec"]["prefix"])
    # 2. the policy: two curves of one shape (synthetic labels, seed 7), shifted so that a state
    # boundary (where the predicted state changes) lies near checkpoints of the lineage
    ls = sorted((c["full"]["lstar"], c["full"]["se_ce"]) for c in checkpoints)
    shape = synthetic_curve(work / "curves" / "shape.json", midpoint=0.0, width=WIDTH, corpus_sha256=corpus_sha,
                            scoring_spec=spec, seed=7)
    se_typical = float(np.median([c["full"]["se_ce"] for c in checkpoints]))
    upper_edge, lower_edge = boundaries(shape, se_typical)   # emerged|at_risk, at_risk|clear
    # "between": the at_risk|clear boundary halfway between two checkpoints; "close": the
    # emerged|at_risk boundary 5 SEs above a third checkpoint
    crossings = {"between": (ls[2][0] + ls[3][0]) / 2 - lower_edge, "close": ls[5][0] + 5 * ls[5][1] - upper_edge}
    curves = {name: synthetic_curve(work / "curves" / f"{name}.json", midpoint=m, width=WIDTH,
                                    corpus_sha256=corpus_sha, task=name, scoring_spec=spec, seed=7)
              for name, m in crossings.items()}
    edges = {n: (m + upper_edge, m + lower_edge) for n, m in crossings.items()}
    plan = sequential_plan([task_entry("bench", n, cv) for n, cv in curves.items()])
    delta = 1 - min(c.confidence for c in curves.values())
    # 3. sequential scores, fresh (no resume)
    rows = []
    for c in checkpoints:
        truth = {n: predict_task(cv, Task(name=n, curve="x"), lstar=c["full"]["lstar"], se=c["full"]["se_ce"]).state
                 for n, cv in curves.items()}
        prepared = c["prepared"]
        prepared.request = replace(prepared.request, sequential=plan)
        start = time.perf_counter()
        seq = compute_score(prepared, None).result
        wall = time.perf_counter() - start
        rec = seq["sequential"]
        states = {t["task"].split("/", 1)[1]: t["state"] or "unresolved" for t in rec["tasks"]}
        rows.append({"checkpoint": c["name"], "lstar": c["full"]["lstar"], "se": c["full"]["se_ce"],
                     "distance_se": {n: min(((c["full"]["lstar"] - x) / c["full"]["se_ce"] for x in pair), key=abs)
                                     for n, pair in edges.items()},
                     "tokens_full": c["full"]["n_tokens"], "tokens_seq": rec["tokens_scored"],
                     "wall_full_s": c["full_wall_s"], "wall_seq_s": wall, "decision_full": truth,
                     "decision_seq": states, "reason": rec["reason"], "looks": rec["looks"]})
    _print_table(rows, delta)
    # 4. simulation: many seeded orders over each checkpoint's full per-document losses
    sim = simulate(checkpoints, curves, rows, delta, args.orders)
    print(f"\nsimulation: {sim['orders']} seeded orders × {len(checkpoints)} checkpoints = {sim['decisions']} "
          f"decisions; wrong {sim['wrong']} (rate {sim['rate']:.4f}, 95% upper bound {sim['rate_upper']:.4f}) "
          f"against δ = {delta:.3f}; mean tokens per decision {sim['mean_token_share']:.1%} of the selection")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "simulation": sim, "delta": delta}, indent=2, default=str))
    return 0


def boundaries(curve, se: float) -> tuple[float, float]:
    """The L* where the state changes emerged→at_risk and at_risk→clear (scan of 0.001)."""
    task = CurveTask("shape", task_entry("bench", "shape", curve))
    xs = np.arange(-4.0, 4.0, 0.001)
    states = [task.state(float(x), se) for x in xs]
    first = {s: xs[i] for i, s in reversed(list(enumerate(states)))}
    last = {s: xs[i] for i, s in enumerate(states)}
    return float((last["emerged"] + first["at_risk"]) / 2), float((last["at_risk"] + first["clear"]) / 2)


def _print_table(rows: list[dict], delta: float) -> None:
    print(f"δ = {delta:.3f}; d(task) = (L* − the task's nearest state boundary) / SE of the full score")
    head = (f"{'checkpoint':<10} {'L*':>8} {'d(between)':>10} {'d(close)':>9} {'tokens full':>11} {'tokens seq':>10} "
            f"{'ratio':>6} {'wall full':>9} {'wall seq':>8}  decision full → sequential")
    print(head)
    for r in rows:
        dec = ", ".join(f"{n}: {r['decision_full'][n]}→{r['decision_seq'][n]}" for n in r["decision_full"])
        print(f"{r['checkpoint']:<10} {r['lstar']:>8.4f} {r['distance_se']['between']:>10.1f} "
              f"{r['distance_se']['close']:>9.1f} {r['tokens_full']:>11,} {r['tokens_seq']:>10,} "
              f"{r['tokens_full'] / r['tokens_seq']:>5.1f}× {r['wall_full_s']:>8.1f}s {r['wall_seq_s']:>7.1f}s  {dec}")
    tf, ts = sum(r["tokens_full"] for r in rows), sum(r["tokens_seq"] for r in rows)
    wf, ws = sum(r["wall_full_s"] for r in rows), sum(r["wall_seq_s"] for r in rows)
    differ = sum(r["decision_full"][n] != r["decision_seq"][n] and r["decision_seq"][n] != "unresolved"
                 for r in rows for n in r["decision_full"])
    print(f"{'total':<10} {'':>8} {'':>10} {'':>9} {tf:>11,} {ts:>10,} {tf / ts:>5.1f}× {wf:>8.1f}s {ws:>7.1f}s  "
          f"decisions that differ (other than unresolved): {differ}")


def simulate(checkpoints: list[dict], curves: dict, rows: list[dict], delta: float, orders: int) -> dict:
    """Replay each checkpoint's per-document losses in `orders` seeded orders."""
    from scipy.stats import beta

    tasks = [CurveTask(n, task_entry("bench", n, cv)) for n, cv in curves.items()]
    wrong = decisions = 0
    shares = []
    for c, row in zip(checkpoints, rows):
        docs = c["docs"]   # (doc_id, slice, n_tokens, nll, n_bytes) in corpus order
        slices = [d[1] for d in docs]
        ntok = np.array([d[2] for d in docs], dtype=np.int64)
        nll = np.array([d[3] for d in docs], dtype=np.float64)
        ce_uni = c["full"]["ce_unigram"]
        block = max(1, math.ceil(len(docs) / 20))
        for seed in range(1, orders + 1):
            res = run_sequential(lambda idx, nll=nll, ntok=ntok: (nll[idx], ntok[idx]), doc_slices=slices, ce_unigram=ce_uni,
                                 tasks=tasks, delta=delta, block_documents=block, seed=seed)
            decisions += 1
            wrong += any(o.state != row["decision_full"][o.name] for o in res.tasks)
            shares.append(res.doc_ntok.sum() / ntok.sum())
    upper = float(beta.ppf(0.95, wrong + 1, decisions - wrong)) if wrong < decisions else 1.0
    return {"orders": orders, "decisions": decisions, "wrong": wrong, "rate": wrong / decisions,
            "rate_upper": upper, "mean_token_share": float(np.mean(shares))}


if __name__ == "__main__":
    sys.exit(main())
