"""Active evaluation without a daemon: the binomial arithmetic (checked against hand-worked
values and a naive computation), the policy's `evaluate:` keys, the daily budget, the
observation alert's verdicts, the miscalibration episode, and refitting a curve with
observations (`lstar curves refit`, `lstar policy check`'s warning)."""

from __future__ import annotations

import json
import math
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from monitor.alerts.observations import (check_calibration, observation_alert, observation_fields,
                                         schedule_observations)
from monitor.cli import main
from monitor.curves import load_curve
from monitor.curves.observe import clopper_pearson, coverage, observed_state, verdict
from monitor.errors import PolicyError
from monitor.policy import load_policy
from monitor.store import Store
from tests.test_daemon_events import fit_arith_curve

NOW = datetime(2026, 3, 2, 12, 0, tzinfo=timezone.utc)


# -- the arithmetic -------------------------------------------------------------------------------
def _binom_cdf(k: int, n: int, p: float) -> float:
    return sum(math.comb(n, i) * p ** i * (1 - p) ** (n - i) for i in range(k + 1))


def _solve(f, lo=0.0, hi=1.0) -> float:
    """Bisection on an increasing-then-sign-changing f (a naive stand-in for the Beta quantile)."""
    for _ in range(200):
        mid = (lo + hi) / 2
        if f(mid) > 0:
            hi = mid
        else:
            lo = mid
    return (lo + hi) / 2


@pytest.mark.parametrize("k,n", [(7, 20), (1, 10), (13, 17)])
def test_clopper_pearson_inverts_the_binomial_tails(k, n):
    conf = 0.9
    lo, hi = clopper_pearson(k, n, conf)
    # the lower end is where P(X >= k | p) = 0.05, the upper where P(X <= k | p) = 0.05
    naive_lo = _solve(lambda p: (1 - _binom_cdf(k - 1, n, p)) - 0.05)
    naive_hi = _solve(lambda p: 0.05 - _binom_cdf(k, n, p))
    assert lo == pytest.approx(naive_lo, abs=1e-9) and hi == pytest.approx(naive_hi, abs=1e-9)


def test_clopper_pearson_at_the_ends_is_the_closed_form():
    assert clopper_pearson(20, 20, 0.9) == (pytest.approx(0.05 ** (1 / 20)), 1.0)
    assert clopper_pearson(0, 20, 0.9) == (0.0, pytest.approx(1 - 0.05 ** (1 / 20)))


def test_observed_state_and_verdict():
    level = 0.3
    assert observed_state(0.31, 0.5, level) == "observed_emerged"
    assert observed_state(0.1, 0.29, level) == "observed_clear"
    assert observed_state(0.2, 0.4, level) == "observed_unresolved"
    # predicted emerged [0.35, 0.5]: contradicted only by an interval wholly below the level
    assert verdict(0.35, 0.5, 0.0, 0.29, level) == "contradicted"
    assert verdict(0.35, 0.5, 0.2, 0.4, level) == "confirmed"
    # predicted clear [0.1, 0.2]: contradicted only by one wholly above
    assert verdict(0.1, 0.2, 0.31, 0.6, level) == "contradicted"
    assert verdict(0.1, 0.2, 0.0, 0.25, level) == "confirmed"
    # predicted at_risk [0.28, 0.32]: contradicted by one wholly on one side, beyond the interval
    assert verdict(0.28, 0.32, 0.86, 1.0, level) == "contradicted"
    assert verdict(0.28, 0.32, 0.0, 0.139, level) == "contradicted"
    assert verdict(0.28, 0.32, 0.1, 0.35, level) == "confirmed"


def test_coverage_test_is_one_sided_binomial_with_a_minimum_count():
    bad = coverage(5, 0, 5, 0.9)
    assert bad.p_value == pytest.approx(0.1 ** 5) and bad.miscalibrated
    # 8 of 10 inside at nominal 0.9: P(X <= 8) = 1 - P(9) - P(10) = 0.2639..., not significant
    fine = coverage(10, 8, 0, 0.9)
    assert fine.p_value == pytest.approx(_binom_cdf(8, 10, 0.9)) and not fine.miscalibrated
    assert coverage(4, 0, 4, 0.9).p_value is None   # too few to test
    assert not coverage(4, 0, 4, 0.9).miscalibrated


# -- the policy ------------------------------------------------------------------------------------
def _policy(folder: Path, curve: Path, evaluate: str, *, per_day: int = 20, extra: str = "") -> Path:
    path = folder / "p.yaml"
    path.write_text(f"""\
name: p
evaluations: {{per_day: {per_day}}}
tasks:
  - name: arith
    curve: {curve}
    evaluate: {evaluate}
route: {{receiver: log, group_wait: 0s}}
receivers:
  - name: log
    file: {{path: alerts.jsonl}}
{extra}""")
    return path


def _mc(path: Path) -> Path:
    path.write_text(json.dumps({"id": "a", "context": "Q?", "choices": [" yes", " no"], "answer": 0}) + "\n")
    return path


@pytest.fixture(scope="module")
def curve(tmp_path_factory) -> Path:
    return fit_arith_curve("c" * 64, tmp_path_factory.mktemp("curve") / "arith.json")


def test_evaluate_keys_load_with_their_defaults(tmp_path, curve):
    _mc(tmp_path / "mc.jsonl")
    policy = load_policy(_policy(tmp_path, curve, "{file: mc.jsonl}"))
    ev = policy.tasks[0].evaluate
    assert (ev.kind, ev.metric, ev.on, policy.evaluations.per_day) == \
        ("multiple_choice", "acc", ["at_risk", "emerged"], 20)
    # the bare YAML key `on` (a boolean in YAML 1.1) means `on`
    policy = load_policy(_policy(tmp_path, curve, "{file: mc.jsonl, on: [emerged]}"))
    assert policy.tasks[0].evaluate.on == ["emerged"]


@pytest.mark.parametrize("evaluate,message", [
    ("{file: missing.jsonl}", "tasks[0].evaluate.file: task file 'missing.jsonl' does not exist"),
    ("{kind: multiple_choice}", "kind multiple_choice needs file"),
    ("{file: mc.jsonl, on: [flagged]}", "tasks[0].evaluate.on[0]: value 'flagged' is not one of"),
    ("{file: mc.jsonl, metric: brier}", "the multiple-choice evaluator observes acc"),
    ("{file: mc.jsonl, bogus: 1}", "bogus"),
])
def test_bad_evaluate_keys_are_one_clear_error(tmp_path, curve, evaluate, message):
    _mc(tmp_path / "mc.jsonl")
    with pytest.raises(PolicyError) as info:
        load_policy(_policy(tmp_path, curve, evaluate))
    assert message in str(info.value)


def test_lm_eval_without_the_bench_extra_is_refused_at_load(tmp_path, curve):
    import importlib.util

    if importlib.util.find_spec("lm_eval") is not None:
        pytest.skip("lm-evaluation-harness is installed here")
    with pytest.raises(PolicyError) as info:
        load_policy(_policy(tmp_path, curve, "{kind: lm_eval, task: arc_easy}"))
    assert "kind lm_eval needs lm-evaluation-harness, which is not installed" in str(info.value)


# -- the budget, the verdicts, the episode ---------------------------------------------------------
def _prediction(store: Store, run: str, *, lo: float, hi: float, state: str, curve_id: str, at: datetime) -> None:
    store.write_outbox([{"policy": "p", "task": "arith", "run_id": run, "repo": "org/m", "commit_sha": run * 8,
                         "lineage": "org/m", "corpus_sha256": "c" * 64, "lstar": 5.0, "se": 0.1,
                         "p_hat": (lo + hi) / 2, "lo": lo, "hi": hi, "threshold": 0.3, "state": state,
                         "curve_id": curve_id, "detail": {"confidence": 0.9, "value": 5.0},
                         "evaluated_at": at}], now=at)


def test_the_daily_budget_skips_with_the_reason_and_resets_the_next_utc_day(tmp_path, curve):
    _mc(tmp_path / "mc.jsonl")
    policy = load_policy(_policy(tmp_path, curve, "{file: mc.jsonl}", per_day=2))
    with Store.open(tmp_path / "s.duckdb") as store:
        for i, run in enumerate("abcd"):
            _prediction(store, run, lo=0.28, hi=0.32, state="at_risk", curve_id="cid", at=NOW + timedelta(minutes=i))
        _prediction(store, "e", lo=0.1, hi=0.2, state="clear", curve_id="cid", at=NOW)   # not in `on`
        assert schedule_observations(store, [policy], now=NOW) == {"scheduled": 2, "skipped_budget": 2, "superseded": 0}
        assert schedule_observations(store, [policy], now=NOW) == {"scheduled": 0, "skipped_budget": 0, "superseded": 0}
        rows = sorted(store.observations(), key=lambda r: r["run_id"])
        assert [(r["run_id"], r["status"], r["reason"]) for r in rows] == [
            ("a", "pending", None), ("b", "pending", None), ("c", "skipped", "budget"), ("d", "skipped", "budget")]
        _prediction(store, "f", lo=0.28, hi=0.32, state="at_risk", curve_id="cid", at=NOW + timedelta(days=1))
        assert schedule_observations(store, [policy], now=NOW + timedelta(days=1)) == \
            {"scheduled": 1, "skipped_budget": 0, "superseded": 0}


def test_an_observation_alert_carries_both_states(tmp_path, curve):
    _mc(tmp_path / "mc.jsonl")
    policy = load_policy(_policy(tmp_path, curve, "{file: mc.jsonl}"))
    job = {"policy": "p", "task": "arith", "repo": "org/m", "commit_sha": "f" * 40, "lineage": "org/m",
           "curve_id": "cid", "predicted_state": "at_risk", "predicted_lo": 0.28, "predicted_hi": 0.32,
           "predicted_p": 0.3, "level": 0.3, "confidence": 0.9}
    fields = observation_fields(job, 0.3, 20, 6)   # 6/20: [0.140, 0.508] holds the level
    assert (fields["observed_state"], fields["verdict"], fields["inside"]) == ("observed_unresolved", "confirmed", True)
    alert = observation_alert(policy, job, fields, now=NOW)
    assert alert.labels["alertname"] == "LstarPredictionConfirmed" and alert.kind == "observe"
    assert (alert.labels["predicted_state"], alert.labels["observed_state"]) == ("at_risk", "observed_unresolved")
    wrong = observation_fields(job, 0.0, 20, 0)
    assert observation_alert(policy, job, wrong, now=NOW).labels["alertname"] == "LstarPredictionContradicted"


def _observe(store: Store, run: str, value: float, n: int, *, curve_id: str, at: datetime) -> None:
    job = store.claim_observation("me", now=at, lease_s=60, max_attempts=3)
    assert job is not None and job["run_id"] == run
    assert store.complete_observation(job["id"], "me", status="done", now=at,
                                      fields=observation_fields(job, value, n, round(value * n)))


def test_a_miscalibrated_curve_alerts_once_per_episode(tmp_path, curve):
    _mc(tmp_path / "mc.jsonl")
    policy = load_policy(_policy(tmp_path, curve, "{file: mc.jsonl}"))
    with Store.open(tmp_path / "s.duckdb") as store:
        for i, run in enumerate("abcdef"):
            at = NOW + timedelta(minutes=i)
            _prediction(store, run, lo=0.28, hi=0.32, state="at_risk", curve_id="cid", at=at)
            schedule_observations(store, [policy], now=at)
            _observe(store, run, 0.0, 20, curve_id="cid", at=at)
            check_calibration(store, [policy], now=at)
            check_calibration(store, [policy], now=at)   # a second pass adds nothing
        alerts = store.query("SELECT labels FROM alerts WHERE kind = 'meta'")
        episodes = store.miscalibrations()
    # no test below 5 checks; from the 5th on one episode, one alert
    assert len(episodes) == 1 and episodes[0]["started_at"] == NOW + timedelta(minutes=4)
    assert [json.loads(a["labels"])["alertname"] for a in alerts] == ["LstarCurveMiscalibrated"]


def test_a_lost_lease_completes_nothing(tmp_path, curve):
    _mc(tmp_path / "mc.jsonl")
    policy = load_policy(_policy(tmp_path, curve, "{file: mc.jsonl}"))
    with Store.open(tmp_path / "s.duckdb") as store:
        _prediction(store, "a", lo=0.28, hi=0.32, state="at_risk", curve_id="cid", at=NOW)
        schedule_observations(store, [policy], now=NOW)
        job = store.claim_observation("dead", now=NOW, lease_s=60, max_attempts=3)
        freed = store.reclaim_observation_leases("me", now=NOW)
        assert [(f.table, f.owner, f.attempt) for f in freed] == [("observations", "dead", 1)]
        assert not store.complete_observation(job["id"], "dead", status="done", now=NOW,
                                              fields=observation_fields(job, 1.0, 20, 20))
        again = store.claim_observation("me", now=NOW, lease_s=60, max_attempts=3)
        assert again["attempts"] == 2 and again["status"] == "pending"
        assert len(again["meta"]["interrupted"]) == 1
        for owner in ("x", "y"):   # two more dead attempts: the third claim fails the row
            store.reclaim_observation_leases(owner, now=NOW)
            store.claim_observation(owner, now=NOW, lease_s=60, max_attempts=3)
        store.reclaim_observation_leases("z", now=NOW)
        assert store.claim_observation("z", now=NOW, lease_s=60, max_attempts=3) is None
        assert store.observation(job["id"])["status"] == "failed"


# -- refit -----------------------------------------------------------------------------------------
def test_refit_adds_the_observed_checkpoints_and_policy_check_warns(tmp_path, curve, capsys):
    _mc(tmp_path / "mc.jsonl")
    parent = load_curve(curve)
    local = tmp_path / "arith.json"
    local.write_bytes(Path(curve).read_bytes())
    path = _policy(tmp_path, local, "{file: mc.jsonl}")
    policy = load_policy(path)
    state = tmp_path / "state"
    state.mkdir()
    with Store.open(state / "lstar.duckdb") as store:
        for i, run in enumerate("ab"):
            at = NOW + timedelta(minutes=i)
            _prediction(store, run, lo=0.28, hi=0.32, state="at_risk", curve_id=parent.curve_id, at=at)
            schedule_observations(store, [policy], now=at)
            _observe(store, run, 0.9, 20, curve_id=parent.curve_id, at=at)
    assert main(["policy", "check", str(path)]) == 0
    assert "WARNING" not in capsys.readouterr().out
    out = tmp_path / "arith-refit.json"
    assert main(["curves", "refit", str(local), "--add-observed", "--state", str(state), "--out", str(out)]) == 0
    new = load_curve(out)
    assert new.curve_id != parent.curve_id
    assert new.provenance["parent_curve_id"] == parent.curve_id
    assert new.provenance["observed_checkpoints"] == ["org/m@" + "a" * 8, "org/m@" + "b" * 8]
    assert len(new.points) == len(parent.points) + 2
    assert Path(local).read_bytes() == Path(curve).read_bytes()   # the reviewed file is untouched
    assert load_policy(path).tasks[0].curve == str(local)          # and the policy still points at it
    capsys.readouterr()
    assert main(["policy", "check", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"SUCCESS {path}"
    assert lines[1].startswith(f"WARNING {path}: tasks[0].curve: ") and "arith-refit.json" in lines[1]


def test_a_later_alert_for_an_observed_checkpoint_carries_both_states(tmp_path, curve):
    from monitor.alerts.alert_planning import task_prediction_row
    from monitor.alerts.predict import TaskPrediction
    from monitor.alerts.rules import ScoreView

    _mc(tmp_path / "mc.jsonl")
    policy = load_policy(_policy(tmp_path, curve, "{file: mc.jsonl}"))
    with Store.open(tmp_path / "s.duckdb") as store:
        _prediction(store, "a", lo=0.28, hi=0.32, state="at_risk", curve_id="cid", at=NOW)
        schedule_observations(store, [policy], now=NOW)
        _observe(store, "a", 1.0, 20, curve_id="cid", at=NOW)
        # the same checkpoint scored again, predicted emerged this time
        score = ScoreView(run_id="a2", repo="org/m", commit="a" * 8, lineage="org/m", lstar=4.0, se=0.1,
                          corpus_sha256="c" * 64, finished_at=NOW)
        prediction = TaskPrediction(task="arith", lstar=4.0, se=0.1, p_hat=0.4, lo=0.35, hi=0.45, floor=0.25,
                                    margin=0.05, confidence=0.9, state="emerged", curve_id="cid",
                                    corpus_sha256="c" * 64)
        row = task_prediction_row(store, policy, policy.tasks[0], score, prediction, now=NOW)
        other = ScoreView(run_id="b1", repo="org/m", commit="b" * 8, lineage="org/m", lstar=4.0, se=0.1,
                          corpus_sha256="c" * 64, finished_at=NOW)
        plain = task_prediction_row(store, policy, policy.tasks[0], other, prediction, now=NOW)
    labels = row["alerts"][0]["labels"]
    assert (labels["state"], labels["predicted_state"], labels["observed_state"]) == \
        ("emerged", "emerged", "observed_emerged")
    assert "observed_state" not in plain["alerts"][0]["labels"]   # a checkpoint nobody observed


def test_predictions_older_than_the_lookback_are_not_scheduled(tmp_path, curve):
    _mc(tmp_path / "mc.jsonl")
    policy = load_policy(_policy(tmp_path, curve, "{file: mc.jsonl}"))
    with Store.open(tmp_path / "s.duckdb") as store:
        _prediction(store, "a", lo=0.28, hi=0.32, state="at_risk", curve_id="cid", at=NOW - timedelta(days=8))
        _prediction(store, "b", lo=0.28, hi=0.32, state="at_risk", curve_id="cid", at=NOW - timedelta(days=6))
        assert schedule_observations(store, [policy], now=NOW) == {"scheduled": 1, "skipped_budget": 0, "superseded": 0}
        assert [r["run_id"] for r in store.observations()] == ["b"]


@pytest.mark.slow   # one evaluation child (torch) on a tiny model from the fake Hub
def test_identical_weights_are_evaluated_once_and_each_prediction_judged(tmp_path, curve):
    from monitor.hub.client import HubClient
    from monitor.demo.fakehub import FakeHub
    from monitor.demo.hub_repos import tiny_model_files
    from monitor.jobs.observe import run_observations
    from tests.test_daemon_observe import mc_task

    mc_task(tmp_path / "mc.jsonl", right=True, items=6)
    policy = load_policy(_policy(tmp_path, curve, "{file: mc.jsonl}"))
    with FakeHub() as hub, Store.open(tmp_path / "s.duckdb") as store:
        files = tiny_model_files("gpt2", arch="llama", seed=3)
        first = hub.add_repo("org/m", files)
        # the same weights again in a commit of its own (a model card edited)
        second = hub.add_commit("org/m", {"README.md": b"edited card\n"}, title="card")
        for i, sha in enumerate((first, second)):
            store.write_outbox([{"policy": "p", "task": "arith", "run_id": f"r{i}", "repo": "org/m",
                                 "commit_sha": sha, "lineage": "org/m", "corpus_sha256": "c" * 64, "lstar": 5.0,
                                 "se": 0.1, "p_hat": 0.3, "lo": 0.28 if i == 0 else 0.9, "hi": 0.32 if i == 0 else 1.0,
                                 "threshold": 0.3, "state": "at_risk" if i == 0 else "emerged", "curve_id": "cid",
                                 "detail": {"confidence": 0.9}, "evaluated_at": NOW + timedelta(minutes=i)}],
                               now=NOW)
        schedule_observations(store, [policy], now=NOW + timedelta(minutes=2))
        ran = run_observations(store, [policy], owner="me", state_dir=tmp_path / "state",
                               client=HubClient(hub.url, store=store), cache_dir=tmp_path / "cache",
                               timeout_s=300, device="cpu", dtype="float32")
        rows = sorted(store.observations(), key=lambda r: r["run_id"])
        eval_runs = store.query("SELECT run_id FROM eval_runs")
    assert [r["status"] for r in ran] == ["done", "done"]
    assert rows[0]["digest"] == rows[1]["digest"] is not None
    assert rows[1]["linked_from"] == rows[0]["id"] and len(eval_runs) == 1   # one evaluation, copied
    assert rows[0]["eval_run_id"] == rows[1]["eval_run_id"] == eval_runs[0]["run_id"]
    # the same observation judged against each prediction: outside [0.28, 0.32], inside [0.9, 1]
    assert (rows[0]["observed"], rows[0]["verdict"], rows[0]["inside"]) == (1.0, "contradicted", False)
    assert (rows[1]["observed"], rows[1]["verdict"], rows[1]["inside"]) == (1.0, "confirmed", True)


def test_a_curve_right_about_the_true_mean_covers_its_observations_at_the_nominal_level() -> None:
    """The predicted interval is for the task's true mean; an n-item observation scatters around
    that mean, so coverage counts it inside the interval widened by its binomial noise. A curve
    whose interval [0.27, 0.33] holds the true p = 0.30 must not look miscalibrated at n = 200."""
    import numpy as np
    from scipy.stats import norm

    from monitor.curves.observe import coverage, predictive_interval

    job = {"predicted_lo": 0.27, "predicted_hi": 0.33, "predicted_p": 0.30, "level": 0.5, "confidence": 0.9}
    rng = np.random.default_rng(11)
    ks = rng.binomial(200, 0.30, size=400)
    covered = sum(observation_fields(job, k / 200, 200, int(k))["inside"] for k in ks)
    # Independent check of the widened interval: the half-widths 0.03 and z·sqrt(.3·.7/200) in quadrature.
    half = float(np.hypot(0.03, norm.ppf(0.95) * np.sqrt(0.3 * 0.7 / 200)))
    lo, hi = predictive_interval(0.30, 0.27, 0.33, 200, 0.9)
    assert (lo, hi) == pytest.approx((0.30 - half, 0.30 + half), abs=1e-12)
    assert covered / len(ks) >= 0.9                       # at least the nominal share
    assert not coverage(20, int(round(20 * covered / len(ks))), 0, 0.9).miscalibrated
    # The raw interval alone would have covered far fewer: the bug this guards against.
    raw = sum(0.27 <= k / 200 <= 0.33 for k in ks) / len(ks)
    assert raw < 0.75
