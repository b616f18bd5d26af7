"""Operator alerts the daemon raises itself: a long Hub outage, a disk that was full.

They go through the outbox like any alert (grouping, retries, dead letters), to each
policy's first meta receiver (else its first receiver), with no group wait.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from monitor.alerts.model import Alert, operator_alert
from monitor.store import Store


def operator_alerts(policies: Sequence[Any], *, kind: str, key: str, summary: str, description: str,
                    now: datetime) -> list[Alert]:
    """One alert per policy telling its operator about `kind` (alert key unique per `key`)."""
    alerts = []
    for policy in policies:
        target = policy.meta_receivers[0] if policy.meta_receivers else policy.receivers[0].name
        alerts.append(operator_alert(policy.name, subject=kind, key=(kind, key), state=kind, receiver=target,
                                     summary=summary, description=description,
                                     numbers={"kind": kind, "key": key}, now=now))
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
        started = outage.started_at.isoformat() if isinstance(outage.started_at, datetime) \
            else str(outage.started_at)
        alerts = operator_alerts(
            policies, kind="hub-outage", key=str(outage.id),
            summary=f"the Hub at {outage.endpoint} has been failing since {started} "
                    f"({outage.failures} consecutive failures); polling backs off until it answers",
            description=str(outage.last_error or ""), now=now)
        written += store.raise_operator_alerts([a.as_row() for a in alerts], now=now,
                                               hub_outage_id=outage.id)
    return written
