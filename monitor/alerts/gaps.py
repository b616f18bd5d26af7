"""Scores a policy cannot evaluate: one operator alert per episode.

A score whose corpus matches but whose curve refuses it (another scoring spec) or whose curve
cannot be loaded is recorded `not_evaluated` with the reason. An episode of a policy runs from
the first such record that is the newest score of its (task, lineage) until no lineage's newest
score is one; it raises one meta-alert, however many checkpoints it covers and however often the
daemon restarts.
"""

from __future__ import annotations

from datetime import datetime

from monitor.alerts.operator import operator_alerts
from monitor.policy import Policy
from monitor.store import Store

GAP_KIND = "not-evaluated"
_LISTED = 20   # checkpoints named in the alert's description


def track_evaluation_gap(store: Store, policy: Policy, *, now: datetime) -> int:
    """Open, alert or close the policy's episode from its records; returns deliveries written."""
    open_rows = store.open_not_evaluated(policy.name, [t.name for t in policy.tasks])
    gap = store.open_evaluation_gap(policy.name)
    if not open_rows:
        if gap is not None:
            store.end_evaluation_gap(gap.id, now=now)
        return 0
    if gap is None:
        first = open_rows[0]
        gap = store.start_evaluation_gap(policy.name, reason=f"task {first.task}: {first.reason}", now=now)
    if gap.alerted_at is not None or not policy.receivers:
        return 0
    tasks = sorted({r.task for r in open_rows})
    lines = [f"task {r.task}, {r.repo}@{r.commit_sha[:12]}: {r.reason}" for r in open_rows[:_LISTED]]
    if len(open_rows) > _LISTED:
        lines.append(f"... and {len(open_rows) - _LISTED} more (lstar checkpoints)")
    alerts = operator_alerts(
        [policy], kind=GAP_KIND, key=str(gap.id),
        summary=f"policy {policy.name} cannot evaluate {len(open_rows)} checkpoint(s) for task(s) "
                f"{', '.join(tasks)}: {gap.reason}",
        description="\n".join(lines), now=now)
    return store.raise_operator_alerts([a.as_row() for a in alerts], now=now, evaluation_gap_id=gap.id)
