"""Pure evaluation functions: states, decisions, routing, grouping, silences, backoff, rate
limits and the calibration-gaming rule, each against a hand-worked or naive computation."""

from __future__ import annotations

import math
import random
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from monitor.alerts.predict import classify_state, predict_task
from monitor.alerts.rules import (Silence, backoff_delay, calibration_gaming, decide, fingerprint,
                                  group_due_at, group_labels, next_attempt_at, rate_limit_free_at,
                                  route_alert, silenced_by)
from monitor.policy.load import load_policy, parse_policy
from monitor.policy.matchers import Matcher, parse_matcher

T0 = datetime(2025, 6, 1, 12, 0, tzinfo=timezone.utc)
H = timedelta(hours=1)
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "policies"


# -- states --------------------------------------------------------------------------------------
@pytest.mark.parametrize("lo,hi,state", [
    (0.10, 0.29, "clear"), (0.10, 0.30, "at_risk"), (0.29, 0.31, "at_risk"), (0.30, 0.40, "emerged"),
    (0.31, 0.31, "emerged"), (0.0, 0.0, "clear")])
def test_classify_state_at_threshold_030(lo: float, hi: float, state: str) -> None:
    assert classify_state(lo, hi, 0.30) == state


def test_classify_state_rejects_a_reversed_interval() -> None:
    with pytest.raises(ValueError):
        classify_state(0.5, 0.4, 0.3)


def test_predict_task_uses_the_curve_band_and_the_policy_margin() -> None:
    from monitor.curves.artifact import load_curve, predict

    policy = load_policy(FIXTURES / "good-full.yaml")
    curve = load_curve(FIXTURES / "curves" / "arith.json")
    task = policy.task("arith").model_copy(update={"margin": 0.1})
    for lstar in (-1.2, -1.8, -2.0, -2.3, -2.6, -3.2):
        out = predict_task(curve, task, lstar=lstar, se=0.03)
        ref = predict(curve, lstar, 0.03)
        assert (out.p_hat, out.lo, out.hi) == (ref.p_hat, ref.lower, ref.upper)
        threshold = 0.25 + 0.1  # b_t of the curve + the task's own margin
        assert out.threshold == pytest.approx(threshold)
        expected = "emerged" if ref.lower >= threshold else "at_risk" if ref.upper >= threshold else "clear"
        assert out.state == expected
    states = {predict_task(curve, task, lstar=x, se=0.03).state for x in (-1.2, -2.2, -3.2)}
    assert states == {"clear", "at_risk", "emerged"}


# -- decisions -----------------------------------------------------------------------------------
def _decide(prev: str | None, cur: str, last: datetime | None, **kw: object) -> str:
    return decide(prev, cur, now=T0, last_firing_sent_at=last, repeat_interval=4 * H, **kw)  # type: ignore[arg-type]


def test_decision_table() -> None:
    assert _decide(None, "clear", None) == "none"
    assert _decide(None, "at_risk", None) == "fire"
    assert _decide("clear", "at_risk", None) == "fire"
    assert _decide("at_risk", "emerged", T0 - timedelta(minutes=1)) == "fire"   # change beats repeat
    assert _decide("emerged", "at_risk", T0 - timedelta(minutes=1)) == "fire"
    assert _decide("at_risk", "at_risk", T0 - timedelta(hours=3, minutes=59)) == "none"
    assert _decide("at_risk", "at_risk", T0 - 4 * H) == "repeat"
    assert _decide("at_risk", "at_risk", None) == "repeat"  # never told (e.g. silenced): tell now
    assert _decide("at_risk", "clear", T0 - H) == "resolve"
    assert _decide("at_risk", "clear", T0 - H, episode_notified=False) == "none"
    assert _decide("emerged", "clear", T0 - H, send_resolved=False) == "none"
    assert _decide("clear", "clear", None) == "none"
    assert _decide("flagged", "clear", T0 - H) == "resolve"
    with pytest.raises(ValueError):
        _decide("maybe", "clear", None)


# -- matchers, silences --------------------------------------------------------------------------
@pytest.mark.parametrize("text,name,op,value", [
    ("task=arith", "task", "=", "arith"), ('state="emerged"', "state", "=", "emerged"),
    ("repo=~EleutherAI/.*", "repo", "=~", "EleutherAI/.*"), ("policy != x", "policy", "!=", "x"),
    ('task!~"ari.*"', "task", "!~", "ari.*"), ("a=", "a", "=", "")])
def test_parse_matcher(text: str, name: str, op: str, value: str) -> None:
    assert parse_matcher(text) == Matcher(name, op, value)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", ["task", "=x", "9a=b", "task=~(", "a=b=c=~"])
def test_bad_matchers(bad: str) -> None:
    if bad == "a=b=c=~":  # a value may contain '=': this one is valid
        assert parse_matcher(bad) == Matcher("a", "=", "b=c=~")
        return
    with pytest.raises(ValueError):
        parse_matcher(bad)


def test_matchers_are_anchored_and_absent_labels_are_empty() -> None:
    labels = {"repo": "EleutherAI/pythia-160m", "task": "arith"}
    assert parse_matcher("repo=~EleutherAI/.*").matches(labels)
    assert not parse_matcher("repo=~pythia").matches(labels)  # anchored: must match the whole value
    assert parse_matcher("repo=~.*pythia.*").matches(labels)
    assert parse_matcher("missing=").matches(labels)
    assert parse_matcher("missing!~.+").matches(labels)
    assert not parse_matcher("task!=arith").matches(labels)


def test_silences_match_all_matchers_while_active() -> None:
    s = Silence("s1", (parse_matcher("policy=p"), parse_matcher("task=~ari.*")), T0, T0 + 2 * H)
    hit = {"policy": "p", "task": "arith"}
    assert silenced_by([s], hit, T0) is s
    assert silenced_by([s], hit, T0 + 2 * H - timedelta(seconds=1)) is s
    assert silenced_by([s], hit, T0 + 2 * H) is None          # ends_at is exclusive
    assert silenced_by([s], hit, T0 - timedelta(seconds=1)) is None
    assert silenced_by([s], {"policy": "p", "task": "cloze"}, T0) is None
    expired = Silence("s2", s.matchers, T0, T0 + 2 * H, expired_at=T0 + H)
    assert silenced_by([expired], hit, T0 + H) is None


# -- routing and grouping ------------------------------------------------------------------------
ROUTED = """\
name: r
route:
  receiver: default
  group_by: [policy]
  repeat_interval: 4h
  routes:
    - matchers: ['state="emerged"']
      receiver: gov
      repeat_interval: 1d
      continue: true
    - matchers: ['task=~"ari.*"']
      receiver: math
      group_wait: 1m
      routes:
        - matchers: ['severity="critical"']
          receiver: pager
    - matchers: ['state="emerged"']
      receiver: never
receivers:
  - {name: default, file: {path: a}}
  - {name: gov, file: {path: b}}
  - {name: math, file: {path: c}}
  - {name: pager, file: {path: d}}
  - {name: never, file: {path: e}}
"""


@pytest.fixture(scope="module")
def routed_policy():  # type: ignore[no-untyped-def]
    return parse_policy(ROUTED, "routed.yaml").policy


@pytest.mark.parametrize("labels,expected", [
    ({"state": "at_risk", "task": "cloze"}, ["default"]),
    ({"state": "at_risk", "task": "arith"}, ["math"]),
    ({"state": "emerged", "task": "cloze"}, ["gov", "never"]),
    ({"state": "emerged", "task": "arith", "severity": "critical"}, ["gov", "pager"]),
    ({"state": "emerged", "task": "arith", "severity": "warning"}, ["gov", "math"]),
])
def test_routing_tree_as_alertmanager(routed_policy, labels: dict[str, str], expected: list[str]) -> None:  # type: ignore[no-untyped-def]
    assert [t.receiver for t in route_alert(routed_policy.route, labels)] == expected


def test_routes_inherit_unset_settings(routed_policy) -> None:  # type: ignore[no-untyped-def]
    gov, pager = route_alert(routed_policy.route, {"state": "emerged", "task": "arith", "severity": "critical"})
    assert gov.repeat_interval == timedelta(days=1) and gov.group_by == ("policy",)
    assert gov.group_wait == timedelta(seconds=30)  # root default
    assert pager.group_wait == timedelta(minutes=1)  # from its parent `math`
    assert pager.repeat_interval == timedelta(hours=4)


def test_group_labels_and_fingerprints() -> None:
    labels = {"policy": "p", "repo": "r", "commit": "c", "task": "t"}
    assert group_labels(labels, ["repo", "policy"]) == {"policy": "p", "repo": "r"}
    assert group_labels(labels, ["..."]) == dict(sorted(labels.items()))
    assert group_labels(labels, ["missing"]) == {"missing": ""}
    assert fingerprint(labels) == fingerprint(dict(reversed(list(labels.items()))))
    assert fingerprint(labels) != fingerprint({**labels, "task": "u"})
    assert len(fingerprint(labels)) == 16


def test_group_due_at() -> None:
    wait, interval = timedelta(seconds=30), timedelta(minutes=5)
    assert group_due_at(T0, None, group_wait=wait, group_interval=interval) == T0 + wait
    assert group_due_at(T0, T0 - H, group_wait=wait, group_interval=interval) == T0 + wait
    assert group_due_at(T0, T0 - timedelta(minutes=1), group_wait=wait,
                        group_interval=interval) == T0 + timedelta(minutes=4)


# -- backoff and rate limits -----------------------------------------------------------------------
def test_full_jitter_backoff_bounds() -> None:
    initial, cap = timedelta(seconds=30), timedelta(hours=6)
    for attempt in range(1, 20):
        ceiling = min(cap.total_seconds(), 30 * 2 ** (attempt - 1))
        assert backoff_delay(attempt, initial=initial, cap=cap, uniform=0.0) == timedelta(0)
        assert backoff_delay(attempt, initial=initial, cap=cap, uniform=0.5).total_seconds() == \
            pytest.approx(ceiling / 2)
    rng = random.Random(7)
    draws = [backoff_delay(5, initial=initial, cap=cap, uniform=rng.random()).total_seconds() for _ in range(2000)]
    assert max(draws) < 480 and min(draws) >= 0
    assert sum(draws) / len(draws) == pytest.approx(240, rel=0.05)  # mean of U(0, 480)
    with pytest.raises(ValueError):
        backoff_delay(0, initial=initial, cap=cap, uniform=0.5)


def test_retry_after_is_a_floor() -> None:
    kw = dict(initial=timedelta(seconds=30), cap=timedelta(hours=6), uniform=0.5)
    assert next_attempt_at(T0, 1, retry_after=None, **kw) == T0 + timedelta(seconds=15)  # type: ignore[arg-type]
    assert next_attempt_at(T0, 1, retry_after=timedelta(seconds=120), **kw) == T0 + timedelta(seconds=120)  # type: ignore[arg-type]
    assert next_attempt_at(T0, 8, retry_after=timedelta(seconds=1), **kw) == T0 + timedelta(seconds=1920)  # type: ignore[arg-type]


def test_rate_limit_against_a_naive_count() -> None:
    rng = random.Random(3)
    per = timedelta(minutes=10)
    for _ in range(200):
        times = sorted(T0 - timedelta(seconds=rng.randint(0, 1200)) for _ in range(rng.randint(0, 8)))
        max_count = rng.randint(1, 5)
        free = rate_limit_free_at(times, now=T0, max_count=max_count, per=per)
        in_window = [t for t in times if t > T0 - per]
        if len(in_window) < max_count:
            assert free is None
        else:
            assert free is not None and free > T0
            # naive: the earliest moment at which fewer than max_count sends lie in the window
            later = T0 + timedelta(seconds=1)
            while len([t for t in times if t > later - per]) >= max_count:
                later += timedelta(seconds=1)
            assert free <= later and free > later - timedelta(seconds=1)


# -- calibration gaming ----------------------------------------------------------------------------
def test_calibration_gaming_hand_worked() -> None:
    # Public L* -2.50 ± 0.03, private -2.20 ± 0.04: diff -0.30. References: -0.10, -0.06,
    # -0.08 → mean offset -0.08. SE of the difference sqrt(0.03² + 0.04²) = 0.05.
    # z = (-0.08 - (-0.30)) / 0.05 = 4.4 > 3 → flagged.
    v = calibration_gaming(-2.50, 0.03, -2.20, 0.04, reference_offsets=[-0.10, -0.06, -0.08], k=3.0)
    assert v.diff == pytest.approx(-0.30)
    assert v.expected_offset == pytest.approx(-0.08)
    assert v.se_diff == pytest.approx(0.05)
    assert v.z == pytest.approx(4.4)
    assert v.flagged and v.n_references == 3
    # Same numbers with k = 5 are not flagged; a checkpoint at the usual offset is not either.
    assert not calibration_gaming(-2.50, 0.03, -2.20, 0.04, reference_offsets=[-0.10, -0.06, -0.08], k=5).flagged
    usual = calibration_gaming(-2.28, 0.03, -2.20, 0.04, reference_offsets=[-0.08], k=3)
    assert usual.z == pytest.approx(0.0, abs=1e-12) and not usual.flagged
    # Better on the private corpus than usual is not gaming (z negative).
    assert calibration_gaming(-2.0, 0.03, -2.5, 0.04, reference_offsets=[-0.08], k=3).z < 0


def test_calibration_gaming_against_a_simulation() -> None:
    # Honest checkpoints: public and private L* differ by the reference offset plus noise of
    # the stated SEs; with k = 2 about 2.3 % are flagged (one-sided normal tail).
    rng = random.Random(11)
    flagged = 0
    n = 4000
    for _ in range(n):
        priv = -2.0 + rng.gauss(0, 0.04)
        pub = -2.0 - 0.08 + rng.gauss(0, 0.03)
        flagged += calibration_gaming(pub, 0.03, priv, 0.04, reference_offsets=[-0.08], k=2.0).flagged
    tail = 0.5 * math.erfc(2.0 / math.sqrt(2))
    assert flagged / n == pytest.approx(tail, abs=0.01)


def test_calibration_gaming_needs_references() -> None:
    with pytest.raises(ValueError):
        calibration_gaming(-2, 0.1, -2, 0.1, reference_offsets=[], k=3)
