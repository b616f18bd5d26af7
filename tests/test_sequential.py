"""Sequential scoring: the pinned order, the ratio estimator and the anytime-valid stop."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy.stats import beta, norm

from monitor.scoring.sequential import (
    ThresholdTask,
    block_schedule,
    confidence_box,
    look_delta,
    min_documents,
    ratio_estimate,
    run_sequential,
    stratified_order,
)


def _population(seed: int, n: int = 300):
    rng = np.random.default_rng(seed)
    ntok = rng.integers(40, 1500, size=n)
    per_token = rng.normal(3.0, 0.6, size=n)             # document-level difficulty
    nll = ntok * per_token + rng.normal(0, 4.0, size=n)
    slices = np.array(["a", "b", "c", "d"])[rng.integers(0, 4, size=n)]
    return nll, ntok, slices


def test_order_is_a_seeded_permutation_with_every_slice_in_proportion():
    slices = ["x"] * 30 + ["y"] * 10 + ["z"] * 20
    order = stratified_order(slices, seed=3)
    assert sorted(order.tolist()) == list(range(60))
    assert order.tolist() == stratified_order(slices, seed=3).tolist()
    assert order.tolist() != stratified_order(slices, seed=4).tolist()
    names = np.asarray(slices)[order]
    for k in range(1, 61):   # every prefix: each slice within one document of its share
        for name, size in (("x", 30), ("y", 10), ("z", 20)):
            assert abs((names[:k] == name).sum() - k * size / 60) <= 1.0
    # keys x 1/60, z 1/40, x 3/60, y 1/20 (x first on the tie): four documents hold every slice
    assert min_documents(slices, order, block_documents=2, min_blocks=1) == 4
    assert min_documents(slices, order, block_documents=2, min_blocks=3) == 6


def test_ratio_estimator_against_a_naive_computation():
    nll = np.array([10.0, 30.0, 12.0, 50.0])
    ntok = np.array([5, 10, 6, 20])
    est = ratio_estimate(nll, ntok, n_population=10)
    r = 102.0 / 41.0
    d = [10 - 5 * r, 30 - 10 * r, 12 - 6 * r, 50 - 20 * r]
    s2 = sum(v * v for v in d) / 3
    assert est.ce == pytest.approx(r, rel=1e-15)
    assert est.se == pytest.approx(math.sqrt((1 - 4 / 10) * s2 / 4) / (41 / 4), rel=1e-12)
    assert est.se_full == pytest.approx(math.sqrt(s2 / 10) / (41 / 4), rel=1e-12)
    assert ratio_estimate(nll, ntok, n_population=4).se == 0.0     # the whole selection


def test_spending_sums_to_delta():
    assert sum(look_delta(k, 0.05) for k in range(1, 200_000)) == pytest.approx(0.05, rel=1e-4)
    assert block_schedule(10, 4) == [4, 8, 10]


def test_wrong_decision_rate_is_within_delta_over_many_orders():
    """Known truth: the full selection's L* and SE; 200 seeded orders, tasks placed near it."""
    delta, z = 0.1, float(norm.ppf(0.975))
    nll, ntok, slices = _population(0)
    full = ratio_estimate(nll, ntok, len(nll))
    ce_uni = 1.0
    truth_lstar, truth_se = full.ce - ce_uni, full.se_full
    # performance is −L*: thresholds a few SEs either side of the truth, and on it
    thresholds = [-truth_lstar + c * truth_se for c in (-12.0, -6.0, 0.0, 6.0, 12.0)]
    tasks = [ThresholdTask(f"t{i}", t, z) for i, t in enumerate(thresholds)]
    truth = [t.state(truth_lstar, truth_se) for t in tasks]

    def scorer(idx):
        return nll[idx], ntok[idx]

    wrong, stopped_early, orders = 0, 0, 200
    for seed in range(orders):
        res = run_sequential(scorer, doc_slices=slices, ce_unigram=ce_uni, tasks=tasks, delta=delta,
                             block_documents=15, seed=seed)
        states = [o.state for o in res.tasks]
        wrong += states != truth
        stopped_early += res.partial
    # the rate's one-sided 99 % Clopper–Pearson lower bound must not exceed δ
    lower = beta.ppf(0.01, wrong, orders - wrong + 1) if wrong else 0.0
    assert lower <= delta, f"{wrong} wrong decisions of {orders}"
    assert stopped_early > 0     # the rule does stop before the end on some orders


def test_the_box_covers_the_truth_at_every_look_while_a_naive_interval_does_not():
    """The anytime-valid box holds at all looks at once (rate ≤ δ); the fixed 1 − δ interval
    looked at after every block misses far more often — the check has the power to tell."""
    delta = 0.1
    nll, ntok, _ = _population(1, n=600)
    n = len(nll)
    truth = nll.sum() / ntok.sum()
    z_naive = float(norm.isf(delta / 2))
    miss_box, miss_naive, orders = 0, 0, 200
    for seed in range(orders):
        order = np.random.default_rng(1000 + seed).permutation(n)
        box_missed = naive_missed = False
        for k, end in enumerate(range(10, n, 10), start=1):
            est = ratio_estimate(nll[order[:end]], ntok[order[:end]], n)
            box = confidence_box(est, 0.0, k, delta)
            box_missed |= not box.lstar_lo <= truth <= box.lstar_hi
            naive_missed |= abs(est.ce - truth) > z_naive * est.se
        miss_box += box_missed
        miss_naive += naive_missed
    assert miss_box / orders <= delta
    assert miss_naive / orders > 2 * delta


def test_a_state_resting_on_a_partial_score_says_so_in_the_alert():
    from monitor.alerts.prediction_eval import partial_caveats
    from monitor.alerts.payload import task_annotations

    record = {"documents_scored": 22, "documents_total": 216, "tokens_scored": 28193, "tokens_total": 314327,
              "reason": "settled", "delta": 0.1, "bound": "normal-union"}
    assert partial_caveats(False, record) == []
    [caveat] = partial_caveats(True, json.dumps(record))
    assert caveat == ("rests on a partial score: 22 of 216 documents (28193 of 314327 tokens) scored; "
                      "stopped: settled at delta 0.1 (normal-union)")
    numbers = {"task": "arith", "lstar": 2.0, "se": 0.01, "p_hat": 0.4, "interval": [0.35, 0.45],
               "confidence": 0.9, "floor": 0.25, "margin": 0.05, "threshold": 0.3, "state": "emerged",
               "curve_id": "c" * 12, "caveats": [caveat]}
    annotations = task_annotations(numbers, repo="org/m", commit="a" * 40, state="emerged")
    assert annotations["caveats"] == caveat
    assert annotations["description"].endswith(f" Caveat: {caveat}.")
    del numbers["caveats"]
    assert "caveats" not in task_annotations(numbers, repo="org/m", commit="a" * 40, state="emerged")


# -- the plan of the daemon's sequential scoring ----------------------------------------------------
def _watching_policy(tmp_path, curve_text: str):
    from monitor.policy.load import load_policy

    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "curve.json").write_text(curve_text, encoding="utf-8")
    (tmp_path / "policy.yaml").write_text(
        "name: seq\nwatch:\n  - name: org\n    author: org\ntasks:\n  - name: arith\n    curve: curve.json\n"
        "route:\n  receiver: log\nreceivers:\n  - name: log\n    file: {path: log.jsonl}\n", encoding="utf-8")
    return load_policy(tmp_path / "policy.yaml")


def test_a_curve_the_stop_cannot_watch_makes_the_daemon_score_in_full_and_the_cli_refuse(tmp_path):
    """A broken curve file, or a curve on another axis than L*, cannot be settled by the L*
    stopping rule: the daemon's plan is empty (a full score, tasks evaluated as in full mode,
    the scoring job never failed for it); `lstar score --until-settled` refuses in one line."""
    from pathlib import Path

    from monitor.alerts.sequential_plan import plan_for_repo
    from monitor.curves.artifact import load_curve, save_curve
    from monitor.errors import CurveError

    fixture = Path(__file__).resolve().parent / "fixtures" / "policies" / "curves" / "arith.json"
    good = _watching_policy(tmp_path / "good", fixture.read_text(encoding="utf-8"))
    assert [t["task"] for t in plan_for_repo([good], "org/model", strict=False)["tasks"]] == ["arith"]

    # a curve file edited into garbage after the policy was loaded (policies are read at start
    # and on change; the plan reads the curve at each job)
    broken = _watching_policy(tmp_path / "broken", fixture.read_text(encoding="utf-8"))
    (tmp_path / "broken" / "curve.json").write_text("{ not json", encoding="utf-8")
    with pytest.raises(CurveError):
        plan_for_repo([broken], "org/model")
    assert plan_for_repo([broken, good], "org/model", strict=False)["tasks"] == []

    draft = load_curve(fixture).model_copy(update={"schema_": "lstar-curve/2", "axis": "bits_per_byte"})
    other = tmp_path / "bpb.json"
    save_curve(draft.model_copy(update={"curve_id": draft.content_id()}), other)
    on_bpb = _watching_policy(tmp_path / "bpb", other.read_text(encoding="utf-8"))
    with pytest.raises(CurveError, match="sequential stopping watches L\\* only"):
        plan_for_repo([on_bpb], "org/model")
    assert plan_for_repo([good, on_bpb], "org/model", strict=False)["tasks"] == []


def test_a_partial_score_is_never_reused_for_identical_weights(tmp_path):
    """Dedupe links a checkpoint to an earlier run of identical weights and options; a partial
    (sequential) run stopped for the tasks watching its own repo, so only a complete run is
    reused, however old."""
    from datetime import datetime, timedelta, timezone

    from monitor.store import Store
    from support.scores import CALIB_V0_SHA256, record_fake_score

    t0 = datetime(2025, 1, 1, tzinfo=timezone.utc)
    key = {"weights_digest": "w" * 64, "files_digest": "f" * 64, "request_digest": "r" * 64,
           "corpus_sha256": CALIB_V0_SHA256}
    with Store.open(tmp_path / "s.duckdb") as store:
        partial = record_fake_score(store, repo="org/a", sha="a" * 40, lstar=-1.0, se=0.01, finished_at=t0,
                                    columns={"partial": True, "sequential": {"reason": "settled"}})
        with store.transaction() as conn:
            store.insert_score_digest(conn, partial, None, key)
        assert store.scored_run_with(key) is None
        full = record_fake_score(store, repo="org/b", sha="b" * 40, lstar=-1.0, se=0.01,
                                 finished_at=t0 + timedelta(days=1))
        with store.transaction() as conn:
            store.insert_score_digest(conn, full, None, key)
        ref = store.scored_run_with(key)
        assert ref is not None and ref.run_id == full
