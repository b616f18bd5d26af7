"""Notification rows (the outbox's send side): grouped messages, their leases and attempts,
endpoint state, and silences."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

import duckdb

from monitor.errors import StoreError
from monitor.store.connection import StoreConnection
from monitor.store.rows import (DeliveryAttemptRow, DueNotificationRow, EndpointRow, NotificationRow,
                                ReclaimedLease, SilenceRow)


class _LostRace(Exception):
    """Raised inside a transaction to roll back a compare-and-set that lost the race."""


class NotificationRows(StoreConnection):
    """Notification rows (the outbox's send side): grouped messages, their leases and attempts,"""

    # -- notifications, their leases and attempts -------------------------------------------
    def last_notification_at(self, policy: str, receiver: str, group_key: str) -> datetime | None:
        """When the group's newest notification was created (group_interval counts from it)."""
        row = self.conn.execute("SELECT last_created_at FROM notification_groups WHERE policy = ? AND "
                                "receiver = ? AND group_key = ?", [policy, receiver, group_key]).fetchone()
        return row[0] if row else None

    def last_notification_times(self, groups: Sequence[tuple[str, str, str]]) -> dict[tuple[str, str, str], datetime]:
        """`last_notification_at` of many (policy, receiver, group_key) in one query: {group: when},
        groups without a notification absent. A dispatch pass reads its due groups at once: one
        lookup per group scanned the table each time (its compound key answers no point lookup)."""
        keys = sorted(set(groups))
        if not keys:
            return {}
        columns = [[k[i] for k in keys] for i in range(3)]
        rows = self.conn.execute(
            "SELECT g.policy, g.receiver, g.group_key, g.last_created_at FROM notification_groups g "
            "JOIN (SELECT unnest(?::VARCHAR[]) AS policy, unnest(?::VARCHAR[]) AS receiver, "
            "unnest(?::VARCHAR[]) AS group_key) k ON g.policy = k.policy AND g.receiver = k.receiver "
            "AND g.group_key = k.group_key", columns).fetchall()
        return {(r[0], r[1], r[2]): r[3] for r in rows}

    def create_notification(self, notification: Mapping[str, Any], delivery_ids: Sequence[int], *,
                            now: datetime) -> bool:
        """Freeze a group of pending deliveries into one notification (compare-and-set).

        False (nothing written) when any of the deliveries is no longer pending.
        """
        marks = ", ".join("?" for _ in delivery_ids)
        try:
            with self.transaction() as conn:
                self._freeze_notification(conn, notification, delivery_ids, marks, now)
        except _LostRace:
            return False
        return True

    def _freeze_notification(self, conn: duckdb.DuckDBPyConnection, notification: Mapping[str, Any],
                             delivery_ids: Sequence[int], marks: str, now: datetime) -> None:
        n = conn.execute(f"UPDATE deliveries SET status = 'queued', notification_id = ?, updated_at = ? "
                         f"WHERE id IN ({marks}) AND status = 'pending'",
                         [notification["id"], now, *delivery_ids]).fetchone()[0]
        if n != len(delivery_ids):
            raise _LostRace()
        conn.execute(
            "INSERT INTO notifications (id, policy, receiver, group_key, status, body, n_alerts, is_meta,"
            " next_attempt_at, created_at, updated_at) VALUES (?, ?, ?, ?, 'pending', ?, ?, ?, ?, ?, ?)",
            [notification["id"], notification["policy"], notification["receiver"],
             notification["group_key"], notification["body"], notification["n_alerts"],
             notification["is_meta"], now, now, now])
        conn.execute(
            "INSERT INTO notification_groups VALUES (?, ?, ?, ?) ON CONFLICT (policy, receiver, group_key) "
            "DO UPDATE SET last_created_at = greatest(last_created_at, excluded.last_created_at)",
            [notification["policy"], notification["receiver"], notification["group_key"], now])

    def due_notifications(self, now: datetime) -> list[DueNotificationRow]:
        """Pending notifications whose next attempt is due and that no live lease holds."""
        rows = self.query(
            "SELECT id, policy, receiver, attempts, next_attempt_at, created_at FROM notifications "
            "WHERE status = 'pending' AND next_attempt_at <= ? AND (lease_owner IS NULL OR "
            "lease_expires_at <= ?) ORDER BY next_attempt_at, created_at, id", [now, now])
        return [DueNotificationRow.from_row(r) for r in rows]

    def claim_notification(self, notification_id: str, owner: str, *, now: datetime,
                           lease_s: float) -> NotificationRow | None:
        """Lease one due notification (compare-and-set; attempts += 1) and return it.

        A lease left by a process that died is taken over once it expired, and the attempt it
        was making is recorded as `lease_expired`, stamped with the time that attempt started
        (a crash may have sent it: the receiver can de-duplicate on the webhook-id, which
        stays the same). A daemon frees such leases at once when it starts
        (`reclaim_notification_leases`).
        """
        try:
            with self.transaction() as conn:
                self._lease_notification(conn, notification_id, owner, now, lease_s)
        except _LostRace:
            return None
        return self.notification(notification_id)

    def _lease_notification(self, conn: duckdb.DuckDBPyConnection, notification_id: str, owner: str,
                            now: datetime, lease_s: float) -> None:
        # Before lease_started_at existed, a claim was the only write to a leased row, so its
        # updated_at is when the attempt started.
        row = conn.execute(
            "SELECT attempts, lease_owner, coalesce(lease_started_at, updated_at), policy, receiver "
            "FROM notifications WHERE id = ? AND status = 'pending' AND next_attempt_at <= ? AND "
            "(lease_owner IS NULL OR lease_expires_at <= ?)", [notification_id, now, now]).fetchone()
        if row is None:
            raise _LostRace()
        attempts, previous, started_at, policy, receiver = row
        if previous is not None:
            self._record_lost_attempt(conn, notification_id, policy, receiver, attempts, started_at,
                                      f"lease of {previous} expired during attempt {attempts} (the process "
                                      "died?); the message may have been sent")
        n = conn.execute(
            "UPDATE notifications SET attempts = attempts + 1, lease_owner = ?, lease_expires_at = ?, "
            "lease_started_at = ?, updated_at = ? WHERE id = ? AND attempts = ? AND status = 'pending'",
            [owner, now + timedelta(seconds=lease_s), now, now, notification_id, attempts]).fetchone()[0]
        if n != 1:
            raise _LostRace()

    @staticmethod
    def _record_lost_attempt(conn: duckdb.DuckDBPyConnection, notification_id: str, policy: str,
                             receiver: str, attempt: int, started_at: datetime, error: str) -> None:
        conn.execute(
            "INSERT INTO delivery_attempts (notification_id, policy, receiver, attempt, started_at,"
            " outcome, error) VALUES (?, ?, ?, ?, ?, 'lease_expired', ?)",
            [notification_id, policy, receiver, attempt, started_at, error])

    def reclaim_notification_leases(self, owner: str, *, now: datetime) -> list[ReclaimedLease]:
        """Free every notification lease not held by `owner`, in one transaction; the freed ones.

        Only for a caller that knows every other holder is dead (the daemon at start, see
        `Daemon._reclaim_leases`). Each freed lease's attempt is recorded as `lease_expired`
        with the time it started; `attempts` stays (it was counted when the lease was taken),
        and the notification keeps its id, so the re-send carries the same webhook-id. It is
        due again at once: its next attempt time is already past.
        """
        freed: list[ReclaimedLease] = []
        with self.transaction() as conn:
            rows = conn.execute(
                "SELECT id, attempts, lease_owner, coalesce(lease_started_at, updated_at), policy, receiver "
                "FROM notifications WHERE lease_owner IS NOT NULL AND lease_owner != ? ORDER BY id",
                [owner]).fetchall()
            for notification_id, attempts, previous, started_at, policy, receiver in rows:
                self._record_lost_attempt(
                    conn, notification_id, policy, receiver, attempts, started_at,
                    f"{previous} died during attempt {attempts} (its lease was reclaimed by {owner} at "
                    "start); the message may have been sent")
                conn.execute("UPDATE notifications SET lease_owner = NULL, lease_expires_at = NULL, "
                             "lease_started_at = NULL, updated_at = ? WHERE id = ? AND lease_owner = ?",
                             [now, notification_id, previous])
                freed.append(ReclaimedLease("notifications", str(notification_id), previous, attempts,
                                            started_at))
        return freed

    def finish_notification(self, notification_id: str, owner: str, *, status: str,
                            attempt: Mapping[str, Any], now: datetime,
                            next_attempt_at: datetime | None = None, error: str | None = None,
                            endpoint: Mapping[str, Any] | None = None,
                            meta_alert: Mapping[str, Any] | None = None) -> bool:
        """Record one attempt and its consequences in one transaction (only if `owner` holds the lease).

        status: pending (retry at `next_attempt_at`), delivered, or dead (`error` is the reason).
        endpoint: {disabled_reason} or {blocked_until} to store for the receiver.
        meta_alert: an alert (with deliveries) telling the operator, written atomically.
        """
        with self.transaction() as conn:
            row = conn.execute("SELECT policy, receiver, attempts FROM notifications WHERE id = ? AND "
                               "lease_owner = ?", [notification_id, owner]).fetchone()
            if row is None:
                return False
            policy, receiver, attempts = row
            conn.execute(
                "INSERT INTO delivery_attempts (notification_id, policy, receiver, attempt, started_at, "
                "outcome, status_code, error, retry_after_s, next_attempt_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [notification_id, policy, receiver, attempts, attempt["started_at"], attempt["outcome"],
                 attempt.get("status_code"), attempt.get("error"), attempt.get("retry_after_s"),
                 next_attempt_at])
            if status == "pending":
                conn.execute("UPDATE notifications SET status = 'pending', lease_owner = NULL, "
                             "lease_expires_at = NULL, lease_started_at = NULL, next_attempt_at = ?, "
                             "last_error = ?, updated_at = ? WHERE id = ?",
                             [next_attempt_at, error, now, notification_id])
            elif status == "delivered":
                conn.execute("UPDATE notifications SET status = 'delivered', lease_owner = NULL, "
                             "lease_expires_at = NULL, lease_started_at = NULL, delivered_at = ?, "
                             "updated_at = ? WHERE id = ?",
                             [now, now, notification_id])
                conn.execute("UPDATE deliveries SET status = 'delivered', updated_at = ? "
                             "WHERE notification_id = ?", [now, notification_id])
            elif status == "dead":
                conn.execute("UPDATE notifications SET status = 'dead', lease_owner = NULL, "
                             "lease_expires_at = NULL, lease_started_at = NULL, last_error = ?, "
                             "dead_reason = ?, updated_at = ? WHERE id = ?", [error, error, now, notification_id])
                conn.execute("UPDATE deliveries SET status = 'dead', reason = ?, updated_at = ? "
                             "WHERE notification_id = ?", [error, now, notification_id])
            else:
                raise StoreError(f"unknown notification status {status!r}")
            if endpoint is not None:
                self._put_endpoint(conn, policy, receiver, endpoint, now)
            if meta_alert is not None:
                self._insert_alert(conn, meta_alert, None, now)
        self.checkpoint()
        return True

    def kill_notifications(self, policy: str, receiver: str, *, reason: str, now: datetime,
                           meta_alert: Mapping[str, Any] | None = None) -> list[str]:
        """Dead-letter every pending notification of a receiver (e.g. it was disabled)."""
        with self.transaction() as conn:
            ids = [r[0] for r in conn.execute(
                "SELECT id FROM notifications WHERE policy = ? AND receiver = ? AND status = 'pending' "
                "AND (lease_owner IS NULL OR lease_expires_at <= ?)", [policy, receiver, now]).fetchall()]
            for nid in ids:
                conn.execute("UPDATE notifications SET status = 'dead', dead_reason = ?, last_error = ?, "
                             "lease_owner = NULL, lease_expires_at = NULL, lease_started_at = NULL, "
                             "updated_at = ? WHERE id = ?",
                             [reason, reason, now, nid])
                conn.execute("UPDATE deliveries SET status = 'dead', reason = ?, updated_at = ? "
                             "WHERE notification_id = ?", [reason, now, nid])
            if meta_alert is not None and ids:
                self._insert_alert(conn, meta_alert, None, now)
        return ids

    def silence_notification(self, notification_id: str, *, silence_id: str, now: datetime) -> bool:
        """A pending notification all of whose alerts are silenced now is never sent."""
        with self.transaction() as conn:
            n = conn.execute("UPDATE notifications SET status = 'silenced', updated_at = ?, last_error = ? "
                             "WHERE id = ? AND status = 'pending' AND (lease_owner IS NULL OR "
                             "lease_expires_at <= ?)", [now, f"silenced by {silence_id}", notification_id,
                                                        now]).fetchone()[0]
            if n == 1:
                conn.execute("UPDATE deliveries SET status = 'silenced', silence_id = ?, updated_at = ? "
                             "WHERE notification_id = ?", [silence_id, now, notification_id])
        return n == 1

    def outbox_depth(self) -> dict[str, int]:
        """Counts for the daemon's metrics: deliveries not yet grouped, notifications waiting to
        be sent, and open dead letters (dead notifications nobody has retried)."""
        row = self.query(
            "SELECT (SELECT count(*) FROM deliveries WHERE status = 'pending') AS deliveries_pending,"
            " count(*) FILTER (WHERE status = 'pending') AS notifications_pending,"
            " count(*) FILTER (WHERE status = 'dead') AS dead_letters FROM notifications")[0]
        return {k: int(v or 0) for k, v in row.items()}

    def outbox_due_times(self) -> list[datetime]:
        """When each group of pending deliveries may be sent and each pending notification is
        next tried: what `lstar run --once` waits for. A group is due as the dispatcher's
        `group_throttle` says: group_wait after its first pending alert, and no sooner than
        group_interval after the group's previous notification (a resolve that follows a sent
        alert waits group_interval, not group_wait)."""
        rows = self.query(
            "SELECT greatest(min(d.created_at) + to_microseconds(CAST(min(d.group_wait_s) * 1e6 AS BIGINT)),"
            " coalesce(any_value(g.last_created_at) + to_microseconds(CAST(min(d.group_interval_s) * 1e6 AS BIGINT)),"
            " min(d.created_at))) AS due"
            " FROM deliveries d LEFT JOIN notification_groups g"
            " ON g.policy = d.policy AND g.receiver = d.receiver AND g.group_key = d.group_key"
            " WHERE d.status = 'pending' GROUP BY d.policy, d.receiver, d.group_key"
            " UNION ALL SELECT next_attempt_at AS due FROM notifications WHERE status = 'pending'")
        return [r["due"] for r in rows]

    def notification(self, notification_id: str) -> NotificationRow | None:
        """One notification row, or None."""
        rows = self.query("SELECT * FROM notifications WHERE id = ?", [notification_id])
        return NotificationRow.from_row(rows[0]) if rows else None

    def notifications(self, *, status: str | None = None) -> list[NotificationRow]:
        """Notification rows, oldest first."""
        where, params = ("WHERE status = ?", [status]) if status else ("", [])
        rows = self.query(f"SELECT * FROM notifications {where} ORDER BY created_at, id", params)
        return [NotificationRow.from_row(r) for r in rows]

    def attempt_times(self, policy: str, receiver: str, *, since: datetime) -> list[datetime]:
        """Start times of sends through a receiver since `since` (the rate limit counts these)."""
        rows = self.conn.execute(
            "SELECT started_at FROM delivery_attempts WHERE policy = ? AND receiver = ? AND started_at > ? "
            "AND outcome != 'lease_expired' ORDER BY started_at", [policy, receiver, since]).fetchall()
        return [r[0] for r in rows]

    def delivery_attempts(self, notification_id: str | None = None) -> list[DeliveryAttemptRow]:
        """Every recorded attempt (of one notification), oldest first."""
        where, params = ("WHERE notification_id = ?", [notification_id]) if notification_id else ("", [])
        rows = self.query(f"SELECT * FROM delivery_attempts {where} ORDER BY id", params)
        return [DeliveryAttemptRow.from_row(r) for r in rows]

    # endpoints (per policy receiver): disabled on 410, blocked while throttled
    def _put_endpoint(self, conn: duckdb.DuckDBPyConnection, policy: str, receiver: str,
                      change: Mapping[str, Any], now: datetime) -> None:
        conn.execute("INSERT INTO endpoints (policy, receiver, updated_at) VALUES (?, ?, ?) "
                     "ON CONFLICT (policy, receiver) DO NOTHING", [policy, receiver, now])
        if "disabled_reason" in change:
            reason = change["disabled_reason"]
            conn.execute("UPDATE endpoints SET disabled_at = ?, disabled_reason = ?, updated_at = ? "
                         "WHERE policy = ? AND receiver = ?",
                         [now if reason is not None else None, reason, now, policy, receiver])
        if "blocked_until" in change:
            conn.execute("UPDATE endpoints SET blocked_until = ?, updated_at = ? WHERE policy = ? AND "
                         "receiver = ?", [change["blocked_until"], now, policy, receiver])

    def endpoint(self, policy: str, receiver: str) -> EndpointRow | None:
        """Disabled/blocked state of a receiver, or None when nothing was ever recorded."""
        rows = self.query("SELECT * FROM endpoints WHERE policy = ? AND receiver = ?", [policy, receiver])
        return EndpointRow.from_row(rows[0]) if rows else None

    def enable_endpoint(self, policy: str, receiver: str, *, now: datetime) -> bool:
        """Clear a receiver's disabled mark (after the operator fixed it); True if it was disabled."""
        with self.transaction() as conn:
            n = conn.execute("UPDATE endpoints SET disabled_at = NULL, disabled_reason = NULL, "
                             "blocked_until = NULL, updated_at = ? WHERE policy = ? AND receiver = ? "
                             "AND disabled_at IS NOT NULL", [now, policy, receiver]).fetchone()[0]
        return n == 1

    # silences
    def add_silence(self, silence: Mapping[str, Any]) -> str:
        """Store a silence (matchers as strings) and return its id."""
        with self.transaction() as conn:
            conn.execute("INSERT INTO silences (id, matchers, starts_at, ends_at, comment, created_by, "
                         "created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                         [silence["id"], json.dumps(list(silence["matchers"])), silence["starts_at"],
                          silence["ends_at"], silence["comment"], silence["created_by"],
                          silence["created_at"]])
        return str(silence["id"])

    def silences(self, *, active_at: datetime | None = None) -> list[SilenceRow]:
        """Silences (matchers decoded), newest first; `active_at` keeps those active then."""
        where, params = "", []
        if active_at is not None:
            where = ("WHERE starts_at <= ? AND ends_at > ? AND (expired_at IS NULL OR expired_at > ?)")
            params = [active_at, active_at, active_at]
        rows = self.query_json(f"SELECT * FROM silences {where} ORDER BY created_at DESC, id", params,
                               ("matchers",))
        return [SilenceRow.from_row(r) for r in rows]

    def expire_silence(self, silence_id: str, *, now: datetime) -> bool:
        """End a silence now; False when no unexpired silence has that id."""
        with self.transaction() as conn:
            n = conn.execute("UPDATE silences SET expired_at = ? WHERE id = ? AND expired_at IS NULL "
                             "AND ends_at > ?", [now, silence_id, now]).fetchone()[0]
        return n == 1

    def requeue_notifications(self, notification_ids: Sequence[str], *, now: datetime) -> list[str]:
        """Give dead notifications a fresh retry budget (`lstar alerts retry`); returns those changed."""
        done = []
        with self.transaction() as conn:
            for nid in notification_ids:
                n = conn.execute("UPDATE notifications SET status = 'pending', attempts = 0, next_attempt_at = ?,"
                                 " dead_reason = NULL, updated_at = ? WHERE id = ? AND status = 'dead'",
                                 [now, now, nid]).fetchone()[0]
                if n == 1:
                    conn.execute("UPDATE deliveries SET status = 'queued', reason = NULL, updated_at = ? "
                                 "WHERE notification_id = ?", [now, nid])
                    done.append(nid)
        return done
