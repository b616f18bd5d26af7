"""The dispatch job: raise the operator alerts of Hub outages, then lease each pending
notification and deliver it to its receiver (`monitor.alerts.Dispatcher`); a delivery moves
`pending → sent` (or back to pending with a later attempt, or `failed` past its attempts).
"""

from __future__ import annotations

from typing import Any, Protocol, TYPE_CHECKING

from monitor.jobs.context import JobContext
from monitor.store import utcnow

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from datetime import datetime

    from monitor.store.rows import (AlertRow, DueNotificationRow, EndpointRow, HubOutageRow,
        NotificationRow, PendingDeliveryRow, SilenceRow)


class DispatchStore(Protocol):
    """What delivery reads and writes (`monitor.alerts.Dispatcher`,
    `monitor.alerts.raise_hub_outage_alerts`)."""

    def alerts_by_id(self, alert_ids: Sequence[int]) -> list[AlertRow]: ...
    def attempt_times(self, policy: str, receiver: str, *, since: datetime) -> list[datetime]: ...
    def claim_notification(self, notification_id: str, owner: str, *, now: datetime,
                           lease_s: float) -> NotificationRow | None: ...
    def create_notification(self, notification: Mapping[str, Any], delivery_ids: Sequence[int], *,
                            now: datetime) -> bool: ...
    def due_notifications(self, now: datetime) -> list[DueNotificationRow]: ...
    def endpoint(self, policy: str, receiver: str) -> EndpointRow | None: ...
    def finish_notification(self, notification_id: str, owner: str, *, status: str,
                            attempt: Mapping[str, Any], now: datetime,
                            next_attempt_at: datetime | None = None, error: str | None = None,
                            endpoint: Mapping[str, Any] | None = None,
                            meta_alert: Mapping[str, Any] | None = None) -> bool: ...
    def hub_outages(self, *, unalerted_only: bool = False) -> list[HubOutageRow]: ...
    def kill_notifications(self, policy: str, receiver: str, *, reason: str, now: datetime,
                           meta_alert: Mapping[str, Any] | None = None) -> list[str]: ...
    def last_notification_times(self, groups: Sequence[tuple[str, str, str]]) -> dict[tuple[str, str, str], datetime]: ...
    def notification(self, notification_id: str) -> NotificationRow | None: ...
    def pending_deliveries(self) -> list[PendingDeliveryRow]: ...
    def raise_operator_alerts(self, alerts: Sequence[Mapping[str, Any]], *, now: datetime,
                              hub_outage_id: int | None = None, evaluation_gap_id: int | None = None,
                              miscalibration_id: int | None = None) -> int: ...
    def set_deliveries_status(self, delivery_ids: Sequence[int], status: str, *, now: datetime,
                              reason: str | None = None, silence_id: str | None = None) -> int: ...
    def silence_notification(self, notification_id: str, *, silence_id: str, now: datetime) -> bool: ...
    def silences(self, *, active_at: datetime | None = None) -> list[SilenceRow]: ...


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
