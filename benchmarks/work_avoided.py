"""Work avoided: identical weights scored once, each (tokenizer, corpus) baseline computed once.

A fake Hub holds U distinct tiny models, each published under M repos (mirrors: the same
files under another name, as re-uploads and forks are). The daemon's scoring driver
(`monitor.scoring.scoring_driver.score_queue_on`, local backend, one job per lease as the
daemon runs it) scores the whole queue. The naive side scores every checkpoint as a job of
its own with no cached baseline, as `lstar score` on each one would. Both sides use the same
backend, corpus selection and options, and every checkpoint's L* is checked equal between
them; the scoring-child start-up (importing torch) is part of both, as it is in the daemon.

    python benchmarks/work_avoided.py [--models 3] [--mirrors 3] [--every 12] [--hidden 128]

This is a measurement, not a test: it prints what it measured.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ["DISABLE_SAFETENSORS_CONVERSION"] = "1"
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=3, help="distinct models on the fake Hub")
    parser.add_argument("--mirrors", type=int, default=3, help="repos holding each model's files")
    parser.add_argument("--every", type=int, default=12, help="score every Nth calib-v0 document")
    parser.add_argument("--hidden", type=int, default=128, help="width of the tiny models (4 layers)")
    parser.add_argument("--shared", type=Path, default=Path(__file__).resolve().parents[2] / "shared")
    args = parser.parse_args(argv)

    from monitor.demo.fakehub import FakeHub
    from monitor.demo.hub_repos import tiny_model_files
    from monitor.environment import quiet_hub_progress
    from monitor.hub.client import HubClient
    from monitor.hub.fetch import snapshot_dir
    from monitor.hub.gate import gate_pending
    from monitor.hub.poll import poll_once
    from monitor.hub.rules import WatchRule
    from monitor.scoring.backends import LocalBackend
    from monitor.scoring.engine import ScoreRequest
    from monitor.scoring.scoring_driver import JobBuilder, score_queue_on
    from monitor.store import Store

    class CountingBackend(LocalBackend):
        """The local backend, counting the forward-pass jobs it is handed."""

        def __init__(self, **options):
            super().__init__(**options)
            self.jobs = 0

        def run(self, jobs):
            jobs = list(jobs)
            self.jobs += len(jobs)
            return super().run(jobs)

    quiet_hub_progress()
    root = Path(tempfile.mkdtemp(prefix="lstar-work-avoided-"))
    template = ScoreRequest(corpus_dir=args.shared / "corpus" / "calib-v0", every=args.every, max_context=128,
                            device="cpu", dtype="float32", with_tcb=False, n_boot=200, progress=False)
    with FakeHub() as hub:
        for u in range(args.models):
            files = tiny_model_files("gpt2", arch="llama", seed=100 + u, hidden=args.hidden, layers=4, heads=4)
            for m in range(args.mirrors):
                hub.add_repo(f"acme/model{u}-copy{m}", files)
        db, cache = root / "state.duckdb", root / "hf-cache"
        with Store.open(db) as store:
            client = HubClient(hub.url, store=store)
            rules = [WatchRule(name="acme", author="acme")]
            poll_once(store, client, rules)
            gated = gate_pending(store, client, rules, cache_dir=cache)
            assert all(o.status == "gated" for o in gated), gated

            ours = CountingBackend(timeout_s=600, workdir=root / "ours")
            start = time.perf_counter()
            while score_queue_on(store, client, ours, template, owner="bench", state_dir=root,
                                 cache_dir=cache, limit=1):
                pass
            ours_s = time.perf_counter() - start
            rows = store.list_checkpoints()
            assert all(r.status == "scored" for r in rows), [(r.repo, r.status, r.reason) for r in rows]
            lstar = {r.repo: r.meta["lstar"] for r in rows}
            linked = sum(1 for r in rows if r.meta.get("linked_from_run_id"))
            computed = sum(1 for r in rows if r.meta.get("baseline") == "computed")

            naive = CountingBackend(timeout_s=600, workdir=root / "naive")
            builder = JobBuilder(store, template, root / "naive-state")
            naive_lstar: dict[str, float] = {}
            naive_computed = 0
            start = time.perf_counter()
            for row in rows:
                job, flat = builder.build(row, snapshot_dir(cache, row.repo, row.sha))
                [outcome] = naive.run([dataclasses.replace(job, baselines=())])
                scored = outcome.unwrap()
                naive_lstar[row.repo] = scored.result["lstar"]
                naive_computed += scored.baseline_source == "computed"
            naive_s = time.perf_counter() - start

    same = all(naive_lstar[repo] == value for repo, value in lstar.items())
    n = len(rows)
    print(f"work avoided — {args.models} distinct tiny models (llama, width {args.hidden}, 4 layers, gpt2 "
          f"tokenizer) x {args.mirrors} repos each = {n} checkpoints; calib-v0 every {args.every}th document; "
          f"local backend; {os.cpu_count()} CPUs")
    print()
    print(f"{'':34}{'lstar driver':>14}{'naive':>10}")
    print(f"{'forward-pass jobs':34}{ours.jobs:>14}{naive.jobs:>10}")
    print(f"{'scores linked to an earlier run':34}{linked:>14}{0:>10}")
    print(f"{'unigram baselines computed':34}{computed:>14}{naive_computed:>10}")
    print(f"{'wall time (s)':34}{ours_s:>14.1f}{naive_s:>10.1f}")
    print()
    print(f"naive / lstar wall time: {naive_s / ours_s:.2f}x; every checkpoint's L* equal on both sides: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
