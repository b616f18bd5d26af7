"""The outbox proper: writing planned predictions, their alerts and one delivery row per
receiver, atomically, and telling what was written.

The last stage of an evaluation tick (predictions -> alerts -> notifications): the rows
`monitor.alerts.alert_planning` planned are written in ONE transaction per batch
(`OutboxBatch`), each table with one bulk insert (`Store.write_outbox_rows`), under the unique
keys (policy, task, run_id) and (policy, task, repo, commit, state). A crash before the commit
leaves nothing, so the runs are evaluated again; after it, the prediction rows mark the runs as
done and the alert keys stop a second alert: exactly one delivery per receiver either way. The
dispatcher (`monitor.alerts.dispatcher`) then groups the deliveries into notifications.

Fail points (crash tests, `LSTAR_FAILPOINT`): `after_score_before_outbox` (the decisions are
made, nothing written) and `mid_outbox_write` (inside the transaction, before COMMIT).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any, TypeVar

from monitor.events import event
from monitor.failpoints import failpoint
from monitor.store import Store

T = TypeVar("T")

# Runs evaluated per write transaction: one commit for a tick's new scores, while a full scan
# (after a curve or rule change) still commits as it goes.
BATCH_RUNS = 500

Counts = dict[str, int]


class OutboxBatch:
    """The writes of up to BATCH_RUNS evaluated runs in ONE transaction of the store.

    The batch's plans read the lineages' histories once, inside the transaction, and carry
    what each planned row changes to the next (`monitor.store.lineage_batch`), so each sees
    the rows planned before it, exactly as when each run committed alone. The events that
    tell what was written are logged after the commit (a rolled-back batch told nothing). A
    crash before the commit leaves the batch's runs on the queue (it is drained only after
    the tick's writes), and the predictions' unique key makes the next tick's writes of the
    runs already committed a no-op."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.written = False

    @classmethod
    @contextlib.contextmanager
    def open(cls, store: Store) -> Iterator[OutboxBatch]:
        batch = cls(store)
        with store.transaction():
            yield batch
        for name, fields in batch.events:
            event(name, **fields)


def chunks(rows: Sequence[T]) -> Iterator[Sequence[T]]:
    """`rows` in slices of BATCH_RUNS: one write transaction each."""
    for start in range(0, len(rows), BATCH_RUNS):
        yield rows[start:start + BATCH_RUNS]


def write_planned(store: Store, rows: Sequence[dict[str, Any]], now: datetime,
                  batch: OutboxBatch | None = None) -> list[Counts]:
    """Write planned prediction rows (with their alerts and deliveries) in one bulk write, and
    log what was written: each task's state, and the alert it raised. Returns what each row
    wrote, in the rows' order. In `batch`, the rows join its transaction and the lines wait
    for its commit."""
    failpoint("after_score_before_outbox")
    if not rows:
        return []
    written = store.write_outbox_rows(rows, now=now, before_commit=lambda conn: failpoint("mid_outbox_write"))
    counts = [written[(row["policy"], row["task"], row["run_id"])] for row in rows]
    events: list[tuple[str, dict[str, Any]]] = []
    for row, count in zip(rows, counts):
        if count["predictions"]:   # 0: evaluated meanwhile, nothing new to tell
            events.extend(_events(row, count))
    if batch is None:
        for name, fields in events:
            event(name, **fields)
    else:
        batch.events.extend(events)
        batch.written = True
    return counts


def _events(row: dict[str, Any], count: Counts) -> list[tuple[str, dict[str, Any]]]:
    ids = {"policy": row["policy"], "task": row["task"], "repo": row["repo"], "commit": row["commit_sha"],
           "run": row["run_id"]}
    previous = row.get("previous_state")
    behind = row.get("behind_current")
    # An earlier checkpoint scored late leaves the lineage's state as it was: said so.
    late = {"late": True, "current": str(behind)[:12]} if behind else {}
    events = [("state", dict(**ids, state=row["state"], previous=previous or "none",
                             changed=not behind and previous != row["state"], p_hat=row["p_hat"],
                             lo=row["lo"], hi=row["hi"], threshold=row["threshold"], **late))]
    if count["alerts"]:
        for alert in row.get("alerts", ()):
            events.append(("alert_raised", dict(
                **ids, alert=alert["alert_key"], kind=alert["kind"], state=alert["state"],
                receivers=",".join(d["receiver"] for d in alert["deliveries"]))))
    return events


__all__ = ["BATCH_RUNS", "OutboxBatch", "chunks", "write_planned"]
