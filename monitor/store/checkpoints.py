"""Checkpoint rows and their leases: the queue the daemon works through."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

import duckdb

from monitor.store.connection import StoreConnection
from monitor.store.placing import META_SET
from monitor.store.rows import CheckpointRow, ReclaimedLease


class CheckpointRows(StoreConnection):
    """Checkpoint rows and their leases: the queue the daemon works through."""

    # -- checkpoints and their leases --------------------------------------------------------
    _CHECKPOINT_COLUMNS = ("id", "repo", "sha", "source", "refs", "lineage", "rule", "discovered_at",
                           "updated_at", "status", "reason", "attempts", "lease_owner",
                           "lease_expires_at", "meta")

    @staticmethod
    def _decode_checkpoint(row: Mapping[str, Any]) -> CheckpointRow:
        out = dict(row)
        out["refs"] = json.loads(out["refs"]) if out.get("refs") else []
        out["meta"] = json.loads(out["meta"]) if out.get("meta") else {}
        return CheckpointRow.from_row(out)

    def list_checkpoints(self, *, status: str | None = None, repo: str | None = None,
                         limit: int | None = None) -> list[CheckpointRow]:
        """Checkpoint rows (refs and meta decoded), oldest discovery first."""
        clauses, params = [], []
        if status is not None:
            clauses.append("status = ?")
            params.append(status)
        if repo is not None:
            clauses.append("repo = ?")
            params.append(repo)
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        tail = f"LIMIT {int(limit)}" if limit is not None else ""
        rows = self.query(f"SELECT {', '.join(self._CHECKPOINT_COLUMNS)} FROM checkpoints {where} "
                          f"ORDER BY discovered_at, id {tail}", params)
        return [self._decode_checkpoint(r) for r in rows]

    def hub_checkpoints_at(self, shas: Sequence[str]) -> list[CheckpointRow]:
        """The Hub checkpoint rows at any of the commits `shas` (what a cache holds), oldest
        discovery first: a lookup by the few commits asked for, not a read of the table."""
        if not shas:
            return []
        marks = ", ".join("?" for _ in shas)
        rows = self.query(f"SELECT {', '.join(self._CHECKPOINT_COLUMNS)} FROM checkpoints WHERE source = 'hub' "
                          f"AND sha IN ({marks}) ORDER BY discovered_at, id", list(shas))
        return [self._decode_checkpoint(r) for r in rows]

    def get_checkpoint(self, checkpoint_id: int) -> CheckpointRow | None:
        """One checkpoint row by id (refs and meta decoded), or None."""
        rows = self.query(f"SELECT {', '.join(self._CHECKPOINT_COLUMNS)} FROM checkpoints "
                          "WHERE id = ?", [checkpoint_id])
        return self._decode_checkpoint(rows[0]) if rows else None

    @staticmethod
    def _merged_meta(conn: duckdb.DuckDBPyConnection, checkpoint_id: int,
                     meta: Mapping[str, Any] | None) -> str:
        old = conn.execute("SELECT meta FROM checkpoints WHERE id = ?", [checkpoint_id]).fetchone()
        merged = {**(json.loads(old[0]) if old and old[0] else {}), **(meta or {})}
        return json.dumps(merged, sort_keys=True, default=str)

    def set_checkpoint_verdict(self, checkpoint_id: int, *, expect_status: str, status: str,
                               reason: str | None, meta: Mapping[str, Any] | None,
                               now: datetime, base: Mapping[str, Any] | None = None) -> bool:
        """Move an unleased row from `expect_status` to `status` (compare-and-set); with `base`
        (a `monitor.hub.lineage.Lineage` as a dict) record what it derives from in the same
        transaction."""
        with self.transaction() as conn:
            merged = self._merged_meta(conn, checkpoint_id, meta)
            n = conn.execute(
                f"UPDATE checkpoints SET status = ?, reason = ?, {META_SET}, updated_at = ? "
                "WHERE id = ? AND status = ? AND lease_owner IS NULL",
                [status, reason, merged, merged, now, checkpoint_id, expect_status]).fetchone()[0]
            if n == 1 and base is not None:
                conn.execute(
                    "INSERT OR REPLACE INTO checkpoint_bases (checkpoint_id, base_repo, base_sha, relation, "
                    "relation_source, bases, problem, recorded_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    [checkpoint_id, base.get("base_repo"), base.get("base_sha"), base["relation"],
                     base["relation_source"], json.dumps(list(base.get("bases") or [])), base.get("problem"),
                     now])
        return n == 1

    def checkpoint_base(self, checkpoint_id: int) -> dict[str, Any] | None:
        """What a checkpoint derives from (`checkpoint_bases`), with the id of the base's own
        checkpoint row when the store has the pinned base; None when it declares no base."""
        rows = self.query(
            "SELECT b.*, (SELECT min(c.id) FROM checkpoints c WHERE c.repo = b.base_repo "
            "AND c.sha = b.base_sha) AS base_checkpoint_id FROM checkpoint_bases b "
            "WHERE b.checkpoint_id = ?", [checkpoint_id])
        if not rows:
            return None
        out = dict(rows[0])
        out["bases"] = json.loads(out["bases"]) if isinstance(out["bases"], str) else out["bases"]
        return out

    def derivatives_of(self, base_repo: str, base_sha: str | None = None) -> list[dict[str, Any]]:
        """The checkpoints that declare `base_repo` (at `base_sha` when given) as their base."""
        sql = ("SELECT b.checkpoint_id, c.repo, c.sha, b.relation, b.relation_source, b.base_sha "
               "FROM checkpoint_bases b JOIN checkpoints c ON c.id = b.checkpoint_id WHERE b.base_repo = ?")
        args: list[Any] = [base_repo]
        if base_sha is not None:
            sql += " AND b.base_sha = ?"
            args.append(base_sha)
        return [dict(r) for r in self.query(sql + " ORDER BY b.checkpoint_id", args)]

    def claim_checkpoint(self, owner: str, *, now: datetime, lease_s: float,
                         statuses: Sequence[str], max_attempts: int,
                         exclude: Sequence[int] = ()) -> CheckpointRow | None:
        """Lease the oldest row in `statuses` that is unleased or whose lease expired.

        Compare-and-set in one transaction: attempts += 1, lease_owner, lease_expires_at.
        A row that already used `max_attempts` is marked failed instead ("gave up after N
        attempts: <last reason>") and the next one is tried. Rows whose id is in `exclude`
        are passed over. Returns the claimed row or None.
        """
        if not statuses:
            return None
        marks = ", ".join("?" for _ in statuses)
        skip = f"AND id NOT IN ({', '.join(str(int(i)) for i in exclude)})" if exclude else ""
        expires = now + timedelta(seconds=lease_s)
        while True:
            with self.transaction() as conn:
                row = conn.execute(
                    f"SELECT id, attempts, lease_owner, reason FROM checkpoints "
                    f"WHERE status IN ({marks}) AND (lease_owner IS NULL OR lease_expires_at <= ?) "
                    f"{skip} ORDER BY discovered_at, id LIMIT 1", [*statuses, now]).fetchone()
                if row is None:
                    return None
                checkpoint_id, attempts, previous_owner, reason = row
                if previous_owner is not None:
                    reason = f"lease of {previous_owner} expired during attempt {attempts}"
                if attempts >= max_attempts:
                    conn.execute(
                        "UPDATE checkpoints SET status = 'failed', reason = ?, lease_owner = NULL, "
                        "lease_expires_at = NULL, lease_started_at = NULL, updated_at = ? "
                        "WHERE id = ? AND attempts = ?",
                        [f"gave up after {attempts} attempts: {reason or 'no reason recorded'}", now,
                         checkpoint_id, attempts])
                    continue
                n = conn.execute(
                    "UPDATE checkpoints SET attempts = attempts + 1, lease_owner = ?, "
                    "lease_expires_at = ?, lease_started_at = ?, reason = ?, updated_at = ? WHERE id = ? "
                    "AND attempts = ? AND (lease_owner IS NULL OR lease_expires_at <= ?)",
                    [owner, expires, now, reason, now, checkpoint_id, attempts, now]).fetchone()[0]
            if n == 1:
                return self.get_checkpoint(checkpoint_id)

    def reclaim_checkpoint_leases(self, owner: str, *, now: datetime) -> list[ReclaimedLease]:
        """Free every checkpoint lease not held by `owner`, in one transaction; the freed ones.

        Only for a caller that knows every other holder is dead (the daemon at start, see
        `Daemon._reclaim_leases`). Each row keeps its status and its `attempts` (the dead
        attempt was counted when its lease was taken), so the next claim is one attempt more
        and the third dead attempt still fails the row. The dead attempt is recorded in the
        row's reason and appended to `meta.interrupted` with the time it started.
        """
        freed: list[ReclaimedLease] = []
        with self.transaction() as conn:
            # Before lease_started_at existed, updated_at is the nearest stored time.
            rows = conn.execute(
                "SELECT id, attempts, lease_owner, coalesce(lease_started_at, updated_at), meta "
                "FROM checkpoints WHERE lease_owner IS NOT NULL AND lease_owner != ? ORDER BY id",
                [owner]).fetchall()
            for checkpoint_id, attempts, previous, started_at, meta_text in rows:
                meta = json.loads(meta_text) if meta_text else {}
                lost = {"attempt": attempts, "owner": previous, "started_at": started_at.isoformat(),
                        "reclaimed_at": now.isoformat(), "reclaimed_by": owner}
                meta["interrupted"] = [*meta.get("interrupted", []), lost]
                reason = (f"{previous} died during attempt {attempts} (started {started_at.isoformat()}); "
                          f"its lease was reclaimed by {owner} at start")
                text = json.dumps(meta, sort_keys=True, default=str)
                conn.execute("UPDATE checkpoints SET lease_owner = NULL, lease_expires_at = NULL, "
                             f"lease_started_at = NULL, reason = ?, {META_SET}, updated_at = ? "
                             "WHERE id = ? AND lease_owner = ?",
                             [reason, text, text, now, checkpoint_id, previous])
                freed.append(ReclaimedLease("checkpoints", str(checkpoint_id), previous, attempts,
                                            started_at))
        return freed

    def advance_checkpoint(self, checkpoint_id: int, owner: str, *, status: str,
                           meta: Mapping[str, Any] | None, now: datetime) -> bool:
        """Record progress (e.g. gated -> fetched) while keeping the lease; CAS on the owner."""
        with self.transaction() as conn:
            merged = self._merged_meta(conn, checkpoint_id, meta)
            n = conn.execute(f"UPDATE checkpoints SET status = ?, {META_SET}, updated_at = ? "
                             "WHERE id = ? AND lease_owner = ?",
                             [status, merged, merged, now, checkpoint_id, owner]).fetchone()[0]
        return n == 1

    def complete_checkpoint(self, checkpoint_id: int, owner: str, *, status: str,
                            reason: str | None, meta: Mapping[str, Any] | None, now: datetime,
                            write: Any = None) -> bool:
        """Finish a leased job: set status, drop the lease, and run `write(conn)` atomically.

        Only if `owner` still holds the lease (compare-and-set); otherwise nothing is written
        and False is returned. `write` adds the job's own rows (e.g. the score run) to the
        same transaction, so a job completes exactly once.
        """
        with self.transaction() as conn:
            held = conn.execute("SELECT 1 FROM checkpoints WHERE id = ? AND lease_owner = ?",
                                [checkpoint_id, owner]).fetchone()
            if held is None:
                return False
            merged = self._merged_meta(conn, checkpoint_id, meta)
            conn.execute(f"UPDATE checkpoints SET status = ?, reason = ?, {META_SET}, lease_owner = NULL,"
                         " lease_expires_at = NULL, lease_started_at = NULL, updated_at = ? "
                         "WHERE id = ? AND lease_owner = ?",
                         [status, reason, merged, merged, now, checkpoint_id, owner])
            if write is not None:
                write(conn)
        self.checkpoint()
        return True

    def release_checkpoint(self, checkpoint_id: int, owner: str, *, reason: str, now: datetime,
                           max_attempts: int, refund: bool = False) -> str | None:
        """Give a lease back after a retryable failure; fail the row once attempts are used up.

        `refund` gives the attempt back (the failure was not the job's, e.g. a Hub outage).
        Returns the row's new status, or None when `owner` no longer held the lease.
        """
        with self.transaction() as conn:
            row = conn.execute("SELECT attempts, status FROM checkpoints WHERE id = ? AND lease_owner = ?",
                               [checkpoint_id, owner]).fetchone()
            if row is None:
                return None
            attempts, status = row
            if refund:
                attempts = max(0, attempts - 1)
            elif attempts >= max_attempts:
                status, reason = "failed", f"gave up after {attempts} attempts: {reason}"
            conn.execute("UPDATE checkpoints SET status = ?, reason = ?, attempts = ?, lease_owner = NULL, "
                         "lease_expires_at = NULL, lease_started_at = NULL, updated_at = ? "
                         "WHERE id = ? AND lease_owner = ?",
                         [status, reason, attempts, now, checkpoint_id, owner])
        return status

    def checkpoint_counts(self) -> dict[str, int]:
        """How many checkpoint rows are in each status."""
        rows = self.query("SELECT status, count(*) AS n FROM checkpoints GROUP BY status ORDER BY status")
        return {r["status"]: int(r["n"]) for r in rows}
