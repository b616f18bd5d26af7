"""The dispatch job: raise the operator alerts of Hub outages, then lease each pending
notification and deliver it to its receiver (`monitor.alerts.Dispatcher`); a delivery moves
`pending → sent` (or back to pending with a later attempt, or `failed` past its attempts).
"""

from __future__ import annotations

from typing import Any, Protocol

from monitor.jobs.context import JobContext
from monitor.store import utcnow


class DispatchStore(Protocol):
    """What delivery reads and writes (`monitor.alerts.Dispatcher`,
    `monitor.alerts.raise_hub_outage_alerts`)."""


def dispatch(store: DispatchStore, policies: list[Any], *, owner: str) -> dict[str, Any]:
    """Outage alerts raised, then one pass over the outbox; what was sent."""
    from monitor.alerts import Dispatcher, raise_hub_outage_alerts

    outages = raise_hub_outage_alerts(store, policies, now=utcnow())  # type: ignore[arg-type]
    report = Dispatcher(store, policies, owner=owner).run_once(utcnow()).as_dict()  # type: ignore[arg-type]
    return {"outage_alerts": outages, **report}


def run(ctx: JobContext) -> dict[str, Any]:
    with ctx.job_store() as store:
        report = dispatch(store, ctx.policies(), owner=ctx.owner)
    for sent in report["sent"]:
        ctx.metrics.notifications.labels(outcome=str(sent.get("outcome"))).inc()
    return report


__all__ = ["DispatchStore", "dispatch", "run"]
