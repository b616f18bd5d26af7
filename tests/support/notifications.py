"""A notification sent for one pending delivery, written through the store's own outbox call:
the grouping and throttle tests build a history of them per (receiver, group key)."""

from __future__ import annotations

from datetime import datetime

from monitor.store import Store


def notify_one(store: Store, i: int, receiver: str, group_key: str, now: datetime, *, policy: str = "p") -> None:
    """Insert delivery `i` for (policy, receiver, group_key) at `now` and send it as notification `n{i}`."""
    store.conn.execute(
        "INSERT INTO deliveries (alert_id, policy, receiver, group_key, group_labels, group_wait_s, "
        "group_interval_s, status, created_at, updated_at) VALUES (?, ?, ?, ?, '{}', 0, 0, 'pending', ?, ?)",
        [i, policy, receiver, group_key, now, now])
    did = store.query("SELECT max(id) AS id FROM deliveries")[0]["id"]
    assert store.create_notification({"id": f"n{i}", "policy": policy, "receiver": receiver, "group_key": group_key,
                                      "body": "{}", "n_alerts": 1, "is_meta": False}, [did], now=now)
