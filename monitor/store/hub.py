"""Hub rows: watermarks, the poll log, the client's circuit state, and outages."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import duckdb

from monitor.store.connection import StoreConnection
from monitor.store.placing import META_COLUMNS, META_VALUES
from monitor.store.rows import HubOutageRow, HubPollRow, HubStateRow, WatermarkRow


class HubRows(StoreConnection):
    """Hub rows: watermarks, the poll log, the client's circuit state, and outages."""

    # -- hub: watermarks, poll log, circuit state, outages ---------------------------------
    def get_watermark(self, rule_key: str) -> WatermarkRow | None:
        """The watermark of a watch rule (last_modified, boundary: [repo ids]), or None."""
        rows = self.query_json("SELECT last_modified, boundary FROM hub_watermarks WHERE rule_key = ?",
                               [rule_key], ("boundary",))
        return WatermarkRow.from_row(rows[0]) if rows else None

    def _insert_hub_poll(self, conn: duckdb.DuckDBPyConnection, rule_key: str, rule_name: str, *,
                         now: datetime, ok: bool, listed: int, new: int, requests: int,
                         error: str | None) -> None:
        conn.execute("INSERT INTO hub_polls (rule_key, rule_name, polled_at, ok, listed, new_rows, "
                     "requests, error) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                     [rule_key, rule_name, now, ok, listed, new, requests, error])

    def record_hub_poll(self, rule_key: str, rule_name: str, *, now: datetime, ok: bool,
                        listed: int, new: int, requests: int, error: str | None = None) -> None:
        """Log one rule poll (failed polls write only this row)."""
        with self.transaction() as conn:
            self._insert_hub_poll(conn, rule_key, rule_name, now=now, ok=ok, listed=listed, new=new,
                                  requests=requests, error=error)

    def record_discoveries(self, rule_key: str, rule_name: str, endpoint: str,
                           candidates: Sequence[Any], *, watermark: datetime | None,
                           boundary: Sequence[str], now: datetime, requests: int,
                           listed: int, inserted_ids: list[tuple[int, Any]] | None = None) -> int:
        """Upsert candidate checkpoints, advance the rule's watermark and log the poll, atomically.

        `candidates` have repo, sha, refs, status, reason, meta. An existing (repo, sha) keeps
        its row and gains any new refs. Returns the number of rows inserted; `inserted_ids`,
        when given, receives (row id, candidate) of each, once committed.
        """
        inserted = 0
        new_rows: list[tuple[int, Any]] = []
        with self.transaction() as conn:
            known = self._known_checkpoints(conn, {(c.repo, c.sha) for c in candidates})
            for c in candidates:
                row = known.get((c.repo, c.sha))
                if row is None:
                    meta = json.dumps(c.meta, sort_keys=True)
                    new_id = conn.execute(
                        f"INSERT INTO checkpoints (repo, sha, source, refs, lineage, rule, discovered_at,"
                        f" updated_at, status, reason, {META_COLUMNS}) VALUES (?, ?, 'hub', ?, ?, ?, ?, ?, ?, ?, "
                        f"{META_VALUES}) RETURNING id",
                        [c.repo, c.sha, json.dumps(sorted(c.refs)), c.repo, rule_name, now, now,
                         c.status, c.reason, meta, meta]).fetchone()[0]
                    new_rows.append((int(new_id), c))
                    known[(c.repo, c.sha)] = (int(new_id), json.dumps(sorted(c.refs)))
                    inserted += 1
                    continue
                old = json.loads(row[1])
                merged = sorted(set(old) | set(c.refs))
                if merged != sorted(old):
                    conn.execute("UPDATE checkpoints SET refs = ?, updated_at = ? WHERE id = ?",
                                 [json.dumps(merged), now, row[0]])
                    known[(c.repo, c.sha)] = (row[0], json.dumps(merged))
            if watermark is not None:
                conn.execute(
                    "INSERT INTO hub_watermarks VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (rule_key) DO "
                    "UPDATE SET last_modified = excluded.last_modified, boundary = excluded.boundary,"
                    " updated_at = excluded.updated_at",
                    [rule_key, rule_name, endpoint, watermark, json.dumps(list(boundary)), now])
            self._insert_hub_poll(conn, rule_key, rule_name, now=now, ok=True, listed=listed,
                                  new=inserted, requests=requests, error=None)
        self.checkpoint()
        if inserted_ids is not None:
            inserted_ids.extend(new_rows)
        return inserted

    _LOOKUP_CHUNK = 500   # (repo, sha) pairs per lookup: two parameters each

    @classmethod
    def _known_checkpoints(cls, conn: duckdb.DuckDBPyConnection,
                           keys: set[tuple[str, str]]) -> dict[tuple[str, str], tuple[int, str]]:
        """{(repo, sha): (id, refs JSON)} of the rows that exist among `keys`: one query per
        chunk of a poll's candidates, not one per candidate."""
        found: dict[tuple[str, str], tuple[int, str]] = {}
        pairs = sorted(keys)
        for start in range(0, len(pairs), cls._LOOKUP_CHUNK):
            chunk = pairs[start:start + cls._LOOKUP_CHUNK]
            values = ", ".join("(?, ?)" for _ in chunk)
            rows = conn.execute(
                f"SELECT c.repo, c.sha, c.id, c.refs FROM checkpoints c JOIN (VALUES {values}) AS k(repo, sha) "
                "ON c.repo = k.repo AND c.sha = k.sha", [v for pair in chunk for v in pair]).fetchall()
            found.update({(r[0], r[1]): (int(r[2]), r[3]) for r in rows})
        return found

    def last_successful_polls(self) -> dict[str, datetime]:
        """Each watch rule's last successful poll (from the poll log, within its retention)."""
        rows = self.query("SELECT rule_name, max(polled_at) AS at FROM hub_polls WHERE ok GROUP BY rule_name")
        return {r["rule_name"]: r["at"] for r in rows}

    def hub_polls(self, *, limit: int = 100) -> list[HubPollRow]:
        """Recent rule polls, newest first."""
        return [HubPollRow.from_row(r) for r in self.query("SELECT * FROM hub_polls ORDER BY id DESC LIMIT ?",
                                                            [limit])]

    _HUB_STATE_FIELDS = ("consecutive_failures", "circuit_open_until", "blocked_until",
                         "last_error", "last_success_at")

    def get_hub_state(self, endpoint: str) -> HubStateRow | None:
        """Circuit and rate-limit state of a Hub endpoint, or None if never recorded."""
        rows = self.query(f"SELECT {', '.join(self._HUB_STATE_FIELDS)} FROM hub_state "
                          "WHERE endpoint = ?", [endpoint])
        return HubStateRow.from_row(rows[0]) if rows else None

    def put_hub_state(self, endpoint: str, state: Mapping[str, Any], *, now: datetime) -> None:
        """Save the circuit and rate-limit state of a Hub endpoint."""
        values = [state[f] for f in self._HUB_STATE_FIELDS]
        updates = ", ".join(f"{f} = excluded.{f}" for f in (*self._HUB_STATE_FIELDS, "updated_at"))
        with self.transaction() as conn:
            conn.execute(f"INSERT INTO hub_state (endpoint, {', '.join(self._HUB_STATE_FIELDS)}, "
                         f"updated_at) VALUES (?, ?, ?, ?, ?, ?, ?) "
                         f"ON CONFLICT (endpoint) DO UPDATE SET {updates}", [endpoint, *values, now])

    def open_hub_outage(self, endpoint: str, *, now: datetime, failures: int,
                        error: str | None) -> int:
        """Record that the circuit opened: one row per outage (an open one is updated)."""
        with self.transaction() as conn:
            row = conn.execute("SELECT id FROM hub_outages WHERE endpoint = ? AND ended_at IS NULL",
                               [endpoint]).fetchone()
            if row is not None:
                conn.execute("UPDATE hub_outages SET failures = ?, last_error = ? WHERE id = ?",
                             [failures, error, row[0]])
                return int(row[0])
            return int(conn.execute(
                "INSERT INTO hub_outages (endpoint, started_at, failures, last_error) "
                "VALUES (?, ?, ?, ?) RETURNING id", [endpoint, now, failures, error]).fetchone()[0])

    def close_hub_outage(self, endpoint: str, *, now: datetime) -> None:
        """Mark the open outage of `endpoint` (if any) as ended."""
        with self.transaction() as conn:
            conn.execute("UPDATE hub_outages SET ended_at = ? WHERE endpoint = ? AND ended_at IS NULL",
                         [now, endpoint])

    def hub_outages(self, *, unalerted_only: bool = False) -> list[HubOutageRow]:
        """Outage rows, oldest first; `unalerted_only` gives those awaiting the meta-alert."""
        where = "WHERE alerted_at IS NULL" if unalerted_only else ""
        return [HubOutageRow.from_row(r) for r in self.query(f"SELECT * FROM hub_outages {where} ORDER BY id")]

    def mark_hub_outage_alerted(self, outage_id: int, *, now: datetime) -> bool:
        """Compare-and-set alerted_at, so one outage yields one meta-alert."""
        with self.transaction() as conn:
            n = conn.execute("UPDATE hub_outages SET alerted_at = ? WHERE id = ? AND alerted_at IS NULL",
                             [now, outage_id]).fetchone()[0]
        return n == 1
