"""Alert rules as pure functions: no I/O, no clock (`now` is always passed in).

From the previous state of the same (policy, task, repo lineage) to a notification
decision; from alert labels to receivers (Alertmanager's routing tree), groups and
silences; and the calibration-gaming rule that compares a public and a private corpus.
The state itself comes from `monitor.alerts.predict`.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

from monitor.backoff import backoff_seconds
from monitor.policy import Matcher, matches_all
# The closed sets of label values live beside the matchers, which routes and silences check against them.
from monitor.policy.vocabulary import GAMING_ALERTNAME, META_ALERTNAME, STATES, TASK_ALERTNAME  # noqa: F401 - re-exported

FIRING_STATES = frozenset({"at_risk", "emerged", "flagged"})
Decision = Literal["fire", "repeat", "resolve", "none"]
SEVERITY = {"at_risk": "warning", "emerged": "critical", "flagged": "warning"}


# -- decisions ---------------------------------------------------------------------------------
def decide(previous: str | None, current: str, *, now: datetime,
           last_firing_sent_at: datetime | None, repeat_interval: timedelta,
           episode_notified: bool = True, send_resolved: bool = True) -> Decision:
    """Whether a receiver hears about a new evaluation of one (policy, task, lineage).

    previous:  the state of the lineage's last evaluation (None: never evaluated)
    last_firing_sent_at: when this receiver was last sent a firing alert of this lineage
    episode_notified: whether this receiver was told about the episode now ending (no
        resolved message for an alert nobody saw, e.g. one that was silenced)

    A change into a firing state fires at once; an unchanged firing state repeats only once
    `repeat_interval` has passed since the last firing notification; a change to clear
    resolves.
    """
    if current not in STATES or (previous is not None and previous not in STATES):
        raise ValueError(f"unknown state: {previous!r} -> {current!r}")
    if current == "clear":
        if previous in FIRING_STATES and episode_notified and send_resolved:
            return "resolve"
        return "none"
    if previous != current:
        return "fire"
    if last_firing_sent_at is None or now - last_firing_sent_at >= repeat_interval:
        return "repeat"
    return "none"


# -- labels, fingerprints, keys ----------------------------------------------------------------
def fingerprint(labels: Mapping[str, str]) -> str:
    """A stable 16-hex id of a label set (what Alertmanager calls the alert's fingerprint)."""
    blob = json.dumps(sorted(labels.items()), separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def alert_key(policy: str, task: str, repo: str, commit: str, state: str) -> str:
    """The outbox's unique key: one alert per (policy, task, repo, commit, state)."""
    return "|".join((policy, task, repo, commit, state))


def task_labels(*, policy: str, task: str, repo: str, lineage: str, commit: str, state: str,
                extra: Mapping[str, str] = {}, axis: str = "lstar") -> dict[str, str]:
    """The labels of a task alert (routing, grouping and silences match on these); `axis` is
    the progress axis of the task's curve (monitor.curves.axes)."""
    labels = {**extra, "alertname": TASK_ALERTNAME, "policy": policy, "task": task, "repo": repo,
              "lineage": lineage, "commit": commit, "state": state, "axis": axis}
    labels.setdefault("severity", SEVERITY.get(state, "info"))
    return labels


@dataclass(frozen=True)
class Silence:
    """Runtime state: alerts whose labels match every matcher are not sent while active."""

    id: str
    matchers: tuple[Matcher, ...]
    starts_at: datetime
    ends_at: datetime
    comment: str = ""
    created_by: str = ""
    expired_at: datetime | None = None

    def active(self, now: datetime) -> bool:
        end = self.ends_at if self.expired_at is None else min(self.ends_at, self.expired_at)
        return self.starts_at <= now < end

    def silences(self, labels: Mapping[str, str], now: datetime) -> bool:
        return self.active(now) and matches_all(self.matchers, labels)


def silenced_by(silences: Iterable[Silence], labels: Mapping[str, str],
                now: datetime) -> Silence | None:
    """The first active silence matching `labels`, or None."""
    for silence in silences:
        if silence.silences(labels, now):
            return silence
    return None


# -- routing and grouping ----------------------------------------------------------------------
@dataclass(frozen=True)
class RouteTarget:
    """Where (and with which timers) one alert goes after routing."""

    receiver: str
    group_by: tuple[str, ...]
    group_wait: timedelta
    group_interval: timedelta
    repeat_interval: timedelta
    # The node that handles the alert, as a key path of the policy file (`route.routes[0]`).
    path: str = "route"


def route_alert(root: Any, labels: Mapping[str, str]) -> list[RouteTarget]:
    """Walk Alertmanager's routing tree: the receivers (with their timers) an alert reaches.

    `root` is a `monitor.policy.schema.RootRoute`. Children are tried in order; the first that
    matches takes the alert and the search stops unless that child says `continue: true`;
    a node no child took handles the alert itself. Settings not set on a node are
    inherited from its parent. A receiver reached twice is listed once (first wins).
    """
    inherited = RouteTarget(root.receiver, tuple(root.group_by), root.group_wait,
                            root.group_interval, root.repeat_interval)
    found: list[RouteTarget] = []
    _walk(root, labels, inherited, found)
    out: list[RouteTarget] = []
    for target in found:
        if all(t.receiver != target.receiver for t in out):
            out.append(target)
    return out


def _walk(node: Any, labels: Mapping[str, str], parent: RouteTarget, out: list[RouteTarget],
          path: str = "route") -> None:
    here = RouteTarget(
        node.receiver or parent.receiver,
        tuple(node.group_by) if node.group_by is not None else parent.group_by,
        node.group_wait if node.group_wait is not None else parent.group_wait,
        node.group_interval if node.group_interval is not None else parent.group_interval,
        node.repeat_interval if node.repeat_interval is not None else parent.repeat_interval,
        path)
    taken = False
    for i, child in enumerate(node.routes):
        if matches_all(child.matchers, labels):
            _walk(child, labels, here, out, f"{path}.routes[{i}]")
            taken = True
            if not child.continue_:
                break
    if not taken:
        out.append(here)


def group_labels(labels: Mapping[str, str], group_by: Sequence[str]) -> dict[str, str]:
    """The labels an alert is grouped by (`...` groups by every label)."""
    if "..." in group_by:
        return dict(sorted(labels.items()))
    return {name: labels.get(name, "") for name in sorted(group_by)}


def group_key(policy: str, receiver: str, grouped: Mapping[str, str]) -> str:
    """A readable group key in Alertmanager's style: `{}/{policy="p"}:{repo="r", ...}`."""
    inner = ", ".join(f"{k}={json.dumps(v)}" for k, v in sorted(grouped.items()))
    return f'{{}}/{{policy={json.dumps(policy)},receiver={json.dumps(receiver)}}}:{{{inner}}}'


def group_due_at(first_pending_at: datetime, last_sent_at: datetime | None, *,
                 group_wait: timedelta, group_interval: timedelta) -> datetime:
    """When a group's pending alerts may be flushed: after group_wait for a new group, and
    no sooner than group_interval after the group's previous notification."""
    due = first_pending_at + group_wait
    if last_sent_at is not None:
        due = max(due, last_sent_at + group_interval)
    return due


# -- retries and rate limits -------------------------------------------------------------------
def backoff_delay(attempt: int, *, initial: timedelta, cap: timedelta, uniform: float) -> timedelta:
    """Full-jitter exponential backoff: U(0, min(cap, initial · 2^(attempt−1))).

    `uniform` is a draw from U[0, 1) supplied by the caller (an injected RNG).
    """
    return timedelta(seconds=backoff_seconds(attempt, base_s=initial.total_seconds(), cap_s=cap.total_seconds(),
                                             uniform=uniform, jitter="full"))


def next_attempt_at(now: datetime, attempt: int, *, initial: timedelta, cap: timedelta,
                    uniform: float, retry_after: timedelta | None) -> datetime:
    """When to try again: the jittered backoff, but never before the server's Retry-After."""
    delay = backoff_delay(attempt, initial=initial, cap=cap, uniform=uniform)
    if retry_after is not None:
        delay = max(delay, retry_after)
    return now + delay


def rate_limit_free_at(sent_times: Sequence[datetime], *, now: datetime, max_count: int,
                       per: timedelta) -> datetime | None:
    """None when another send fits the window [now − per, now]; else when a slot frees."""
    recent = sorted(t for t in sent_times if t > now - per)
    if len(recent) < max_count:
        return None
    return recent[len(recent) - max_count] + per


# -- calibration gaming -----------------------------------------------------------------------
@dataclass(frozen=True)
class GamingVerdict:
    """The calibration-gaming test for one checkpoint.

    diff = L*_public − L*_private; expected = the mean of that difference over reference
    checkpoints; se_diff = sqrt(se_public² + se_private²); z = (expected − diff) / se_diff.
    Flagged when z > k: the public L* is better (lower) than the private one by more than
    k standard errors beyond the usual offset.
    """

    diff: float
    expected_offset: float
    se_diff: float
    z: float
    k: float
    flagged: bool
    n_references: int

    def as_dict(self) -> dict[str, Any]:
        return {"diff": self.diff, "expected_offset": self.expected_offset,
                "se_diff": self.se_diff, "z": self.z, "k": self.k, "flagged": self.flagged,
                "n_references": self.n_references}


def calibration_gaming(public_lstar: float, public_se: float, private_lstar: float,
                       private_se: float, *, reference_offsets: Sequence[float],
                       k: float) -> GamingVerdict:
    """Is this checkpoint's public L* suspiciously better than its private L*?

    `reference_offsets` are L*_public − L*_private of reference checkpoints (models trusted
    not to have trained on either corpus); the corpora differ, so some offset is normal.
    """
    if not reference_offsets:
        raise ValueError("calibration_gaming needs at least one reference checkpoint offset")
    if public_se < 0 or private_se < 0:
        raise ValueError("standard errors cannot be negative")
    diff = public_lstar - private_lstar
    expected = math.fsum(reference_offsets) / len(reference_offsets)
    se_diff = math.sqrt(public_se ** 2 + private_se ** 2)
    gap = expected - diff
    if se_diff == 0.0:
        z = math.inf if gap > 0 else (-math.inf if gap < 0 else 0.0)
    else:
        z = gap / se_diff
    return GamingVerdict(diff=diff, expected_offset=expected, se_diff=se_diff, z=z, k=k,
                         flagged=z > k, n_references=len(reference_offsets))


@dataclass(frozen=True)
class ScoreView:
    """The parts of a score run that evaluation needs."""

    run_id: str
    repo: str
    commit: str
    lineage: str
    lstar: float
    se: float
    corpus_sha256: str
    finished_at: datetime
    rule: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
