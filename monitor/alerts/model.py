"""The alert: one model for every alert the outbox holds (task, calibration gaming, operator).

An alert is written with its deliveries (one per receiver it routes to) in the transaction
that records its prediction, or alone for an operator alert; `as_row` is the shape
`Store.write_outbox`, `Store.raise_operator_alerts` and `Store.finish_notification` store.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from monitor.alerts.rules import META_ALERTNAME, fingerprint

META_GROUP = "meta"   # group keys of operator alerts: meta/<policy>/<subject>


@dataclass(frozen=True)
class Delivery:
    """One receiver an alert goes to, and the group (and timers) it joins there."""

    receiver: str
    group_key: str
    group_labels: Mapping[str, str]
    group_wait_s: float
    group_interval_s: float

    def as_row(self) -> dict[str, Any]:
        return {"receiver": self.receiver, "group_key": self.group_key,
                "group_labels": dict(self.group_labels), "group_wait_s": self.group_wait_s,
                "group_interval_s": self.group_interval_s}


@dataclass(frozen=True)
class Alert:
    """A firing or resolved alert with the deliveries it calls for.

    `kind` is what happened (fire, repeat, resolve, or meta for an operator alert);
    `alert_key` is unique per (policy, task, repo, commit, state), so evaluating the same
    score twice writes it once.
    """

    alert_key: str
    kind: str
    policy: str
    state: str
    status: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    numbers: Mapping[str, Any]
    starts_at: datetime
    created_at: datetime
    deliveries: Sequence[Delivery]
    task: str = ""
    repo: str = ""
    commit_sha: str = ""
    lineage: str = ""
    ends_at: datetime | None = None
    fingerprint: str = field(default="")

    def __post_init__(self) -> None:
        if not self.fingerprint:
            object.__setattr__(self, "fingerprint", fingerprint(self.labels))

    def as_row(self) -> dict[str, Any]:
        """The alert as the store writes it, deliveries included."""
        return {"alert_key": self.alert_key, "kind": self.kind, "policy": self.policy, "task": self.task,
                "repo": self.repo, "commit_sha": self.commit_sha, "lineage": self.lineage,
                "state": self.state, "status": self.status, "labels": dict(self.labels),
                "annotations": dict(self.annotations), "numbers": dict(self.numbers),
                "fingerprint": self.fingerprint, "starts_at": self.starts_at, "ends_at": self.ends_at,
                "created_at": self.created_at, "deliveries": [d.as_row() for d in self.deliveries]}


def operator_alert(policy: str, *, subject: str, key: Sequence[str], state: str, receiver: str,
                   summary: str, description: str, numbers: Mapping[str, Any], now: datetime,
                   labels: Mapping[str, str] | None = None) -> Alert:
    """An alert to a policy's operator about `subject` (a failed receiver, a Hub outage, a full disk).

    It goes to `receiver` alone, in the group `meta/<policy>/<subject>` with no group wait,
    and fires once per `key` (its alert key is `meta|<policy>|<key...>`).
    """
    all_labels = {"alertname": META_ALERTNAME, "policy": policy, **(labels or {}), "severity": "critical",
                  "state": state}
    return Alert(alert_key="|".join(("meta", policy, *key)), kind="meta", policy=policy, lineage=subject,
                 state=state, status="firing", labels=all_labels,
                 annotations={"summary": summary, "description": description}, numbers=dict(numbers),
                 starts_at=now, created_at=now,
                 deliveries=(Delivery(receiver=receiver, group_key=f"{META_GROUP}/{policy}/{subject}",
                                      group_labels={"alertname": META_ALERTNAME, "policy": policy},
                                      group_wait_s=0.0, group_interval_s=0.0),))
