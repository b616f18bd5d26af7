"""Operator alerts the daemon raises itself: a long Hub outage, a disk that was full.

They go through the outbox like any alert (grouping, retries, dead letters), to each
policy's first meta receiver (else its first receiver), with no group wait.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from monitor.alerts.rules import META_ALERTNAME, fingerprint
from monitor.store import Store

META_GROUP = "meta"


def operator_alerts(policies: Sequence[Any], *, kind: str, key: str, summary: str, description: str,
                    now: datetime) -> list[dict[str, Any]]:
    """One alert per policy telling its operator about `kind` (alert key unique per `key`)."""
    alerts = []
    for policy in policies:
        target = policy.meta_receivers[0] if policy.meta_receivers else policy.receivers[0].name
        labels = {"alertname": META_ALERTNAME, "policy": policy.name, "severity": "critical", "state": kind}
        alerts.append({
            "alert_key": f"meta|{policy.name}|{kind}|{key}", "kind": "meta", "policy": policy.name,
            "task": "", "repo": "", "commit_sha": "", "lineage": kind, "state": kind, "status": "firing",
            "labels": labels, "annotations": {"summary": summary, "description": description},
            "numbers": {"kind": kind, "key": key}, "fingerprint": fingerprint(labels), "starts_at": now,
            "ends_at": None, "created_at": now,
            "deliveries": [{"receiver": target, "group_key": f"{META_GROUP}/{policy.name}/{kind}",
                            "group_labels": {"alertname": META_ALERTNAME, "policy": policy.name},
                            "group_wait_s": 0.0, "group_interval_s": 0.0}]})
    return alerts


def raise_hub_outage_alerts(store: Store, policies: Sequence[Any], *, now: datetime) -> int:
    """One meta-alert per Hub outage (the circuit opened), however many polls failed.

    An outage is marked alerted in the same transaction as its alerts; with no policy in
    force it stays unalerted until there is one to tell.
    """
    if not policies:
        return 0
    written = 0
    for outage in store.hub_outages(unalerted_only=True):
        started = outage["started_at"].isoformat() if isinstance(outage["started_at"], datetime) \
            else str(outage["started_at"])
        alerts = operator_alerts(
            policies, kind="hub-outage", key=str(outage["id"]),
            summary=f"the Hub at {outage['endpoint']} has been failing since {started} "
                    f"({outage['failures']} consecutive failures); polling backs off until it answers",
            description=str(outage.get("last_error") or ""), now=now)
        written += store.raise_operator_alerts(alerts, now=now, hub_outage_id=outage["id"])
    return written
