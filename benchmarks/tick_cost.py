"""Evaluation tick cost: an idle tick (nothing new) and a tick with new scores, on a state of
N evaluated score runs.

The state is bulk-loaded with SQL into the store's own schema: N score runs of `--lineages`
lineages (one checkpoint row each), each evaluated for two tasks. One tick settles it (the
current code scans every run once, as after an upgrade); then idle ticks are timed, then a
tick after `--new` scores written through `Store.record_score_run`. The predictor is a
stand-in (no curve file), so the times are the store's and the outbox's own.

    python benchmarks/tick_cost.py [--runs 10000 100000] [--new 100] [--code DIR]

`--code DIR` imports `monitor` from another checkout (e.g. an older commit unpacked with
`git archive`) to compare.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
TASKS = ("cloze", "arith")


def _policy_text(corpus: str, folder: Path) -> str:
    tasks = "".join(f"  - name: {t}\n    curve: {t}.json\n" for t in TASKS)
    return (f"name: gov\ncorpora: {{public: '{corpus}'}}\ntasks:\n{tasks}"
            f"route: {{receiver: log, group_wait: 0s, group_interval: 0s}}\n"
            f"receivers:\n  - name: log\n    file: {{path: {folder / 'alerts.jsonl'}}}\n")


def build_state(store, n: int, lineages: int, corpus: str) -> None:
    """N evaluated score runs with their checkpoints and two tasks' predictions, by SQL."""
    from support.scores import TEST_SPEC

    store.conn.execute(
        "INSERT INTO checkpoints (repo, sha, source, lineage, rule, discovered_at, updated_at, status) "
        "SELECT 'org/m' || (i % ?)::VARCHAR, md5(i::VARCHAR) || 'abcdefgh', 'hub', 'org/m' || (i % ?)::VARCHAR, "
        "NULL, ?::TIMESTAMPTZ + INTERVAL 1 MINUTE * i, ?::TIMESTAMPTZ + INTERVAL 1 MINUTE * i, 'scored' "
        "FROM range(?) t(i)", [lineages, lineages, T0, T0, n])
    store.conn.execute(
        "INSERT INTO score_runs (run_id, checkpoint_id, model_repo, model_sha, model_source, tokenizer_fingerprint, "
        "corpus_sha256, spec_version, window_len, stride, prefix_policy, dtype, device, n_tokens, n_bytes, "
        "nll_sum, ce, ce_unigram, lstar, l_rel, l_gain, bits_per_byte, tokens_per_byte, se_ce, slices, spec, "
        "model, library_versions, wall_s, tokens_per_s, finished_at) "
        "SELECT 'run' || lpad(c.id::VARCHAR, 8, '0'), c.id, c.repo, c.sha, 'hub', 'f', ?, ?, ?, ?, ?, 'float32', "
        "'cpu', 1000, 4000, 9000, 9, 7, 2, 1.2, -0.2, 1, 0.25, 0.02, '{}', '{}', '{}', '{}', 1, 1000, "
        "c.discovered_at + INTERVAL 30 MINUTE FROM checkpoints c",
        [corpus, TEST_SPEC["spec_version"], TEST_SPEC["window_len"], TEST_SPEC["stride"], TEST_SPEC["prefix_policy"]])
    for task in TASKS:
        store.conn.execute(
            "INSERT INTO predictions (policy, task, run_id, repo, commit_sha, lineage, corpus_sha256, lstar, se, "
            "p_hat, lo, hi, threshold, state, curve_id, detail, evaluated_at) SELECT 'gov', ?, run_id, model_repo, "
            "model_sha, model_repo, corpus_sha256, 2, 0.02, 0.12, 0.11, 0.13, 0.3, 'clear', NULL, '{}', finished_at "
            "FROM score_runs", [task])
    store.checkpoint()


def predictor(policy, task, score):
    """A stand-in curve (always clear)."""
    from monitor.alerts.predict import TaskPrediction

    p = 0.1
    return TaskPrediction(task=task.name, lstar=score.lstar, se=score.se, p_hat=p, lo=p - 0.01, hi=p + 0.01,
                          floor=0.25, margin=0.05, confidence=0.95, state="clear", curve_id="c1",
                          corpus_sha256=score.corpus_sha256)


def measure(n: int, *, lineages: int, new: int, idle_ticks: int, folder: Path) -> dict[str, float]:
    from monitor.alerts import evaluate_pending
    from monitor.policy.load import load_policy
    from monitor.store import Store
    from support.scores import CALIB_V0_SHA256, fake_sha, record_fake_score

    (folder / f"gov{n}.yaml").write_text(_policy_text(CALIB_V0_SHA256, folder))
    policy = load_policy(folder / f"gov{n}.yaml", check_curves=False)
    with Store.open(folder / f"state{n}.duckdb") as store:
        t = time.perf_counter()
        build_state(store, n, lineages, CALIB_V0_SHA256)
        out = {"build_s": time.perf_counter() - t}
        t = time.perf_counter()
        evaluate_pending(store, [policy], now=T0 + timedelta(days=400), predictor=predictor)
        out["first_tick_s"] = time.perf_counter() - t
        times = []
        for _ in range(idle_ticks):
            t = time.perf_counter()
            report = evaluate_pending(store, [policy], now=T0 + timedelta(days=400), predictor=predictor)
            times.append(time.perf_counter() - t)
            assert report.predictions == 0
        out["idle_tick_s"] = statistics.median(times) if times else float("nan")
        out["new_tick_s"] = float("nan")
        if not new:
            return out
        for i in range(new):
            record_fake_score(store, repo=f"org/new{i % 10}", sha=fake_sha(f"new{i}"), lstar=1.5, se=0.02,
                              finished_at=T0 + timedelta(days=401, minutes=i))
        t = time.perf_counter()
        report = evaluate_pending(store, [policy], now=T0 + timedelta(days=402), predictor=predictor)
        out["new_tick_s"] = time.perf_counter() - t
        assert report.predictions == new * len(TASKS), report.as_dict()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, nargs="+", default=[10_000, 100_000], help="score runs in the state")
    parser.add_argument("--lineages", type=int, default=5000)
    parser.add_argument("--new", type=int, default=100, help="new scores for the last tick (0: none)")
    parser.add_argument("--idle-ticks", type=int, default=5, help="idle ticks timed (the median is shown; "
                        "0: none, e.g. for code whose every tick reads everything, where the first one is idle)")
    parser.add_argument("--code", type=Path, default=Path(__file__).resolve().parent.parent,
                        help="the checkout whose `monitor` is measured")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(args.code.resolve()))
    sys.path.insert(0, str(args.code.resolve() / "tests"))  # the tests' helpers: support.scores
    import monitor

    print(f"monitor from {Path(monitor.__file__).parent}")
    print(f"{'runs':>8} {'build s':>8} {'1st tick s':>10} {'idle tick s':>11} {f'+{args.new} new s':>10}")
    with tempfile.TemporaryDirectory(prefix="tick-cost-") as tmp:
        for n in args.runs:
            r = measure(n, lineages=args.lineages, new=args.new, idle_ticks=args.idle_ticks, folder=Path(tmp))
            print(f"{n:>8} {r['build_s']:>8.2f} {r['first_tick_s']:>10.3f} {r['idle_tick_s']:>11.4f} "
                  f"{r['new_tick_s']:>10.3f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
