"""Governance-report rows, and the score runs and predictions a report reads."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any

import duckdb

from monitor.errors import StoreError
from monitor.store.connection import StoreConnection
from monitor.training_order import string_refs
from monitor.store.placing import PLACEMENT_OBJECT
from monitor.store.report_ranks import ReportRanks
from monitor.store.rows import CheckpointRow, PredictionRow, ReportRow, ReportScoreRow


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
# what a report's score run reads of its checkpoint (`ReportRows._RUN_SELECT`)
_CHECKPOINT_KEYS = (f"(SELECT id, repo, sha, lineage, rule, discovered_at, refs, "
                    "placing_values AS placed FROM checkpoints)")


class ReportRows(StoreConnection):
    """Governance-report rows, and the score runs and predictions a report reads."""

    # -- governance reports ---------------------------------------------------------------------
    # A report reads its window (start, end] and, for each lineage, one row of its state at the
    # window's start: its cost follows the window's activity, not the history.
    _RUN_SELECT = (
        "SELECT r.run_id, r.model_repo AS repo, r.model_sha AS commit_sha, r.tokenizer_fingerprint, "
        "r.corpus_sha256, r.n_tokens, r.ce, r.ce_unigram, r.lstar, r.se_ce, r.bits_per_byte, "
        # times as microseconds since the epoch, made datetimes in `_report_score_row`: DuckDB's
        # zoned conversion of a 10^5-row history's times cost more than the query
        "epoch_us(r.finished_at) AS finished_at, coalesce(c1.lineage, c2.lineage, r.model_repo) AS lineage, "
        "coalesce(c1.rule, c2.rule) AS rule, epoch_us(coalesce(c1.discovered_at, c2.discovered_at)) AS discovered_at, "
        # The JSON columns as one array, decoded by one call per row (a 10^5-row history):
        # the tcb, the refs and, of the ~2 KB meta, only what places a checkpoint in training
        # order (`training_order.place`): decoding whole metas was most of a report's time.
        "json_array(r.tcb, coalesce(c1.refs, c2.refs), "
        f"{PLACEMENT_OBJECT.format(placed='coalesce(c1.placed, c2.placed)')}) AS json_columns "
        # A run names its checkpoint by id, or (recorded before ids) by repo and commit: two
        # equi-joins, which DuckDB hashes, where one OR condition would compare every pair.
        # Each joins the checkpoints' key columns with the two placing values stored beside the
        # meta (`monitor.store.placing`): a hash table of whole ~2 KB metas was most of a 10^5
        # report's peak memory.
        f"FROM score_runs r LEFT JOIN {_CHECKPOINT_KEYS} c1 ON c1.id = r.checkpoint_id "
        f"LEFT JOIN {_CHECKPOINT_KEYS} c2 ON r.checkpoint_id IS NULL AND c2.repo = r.model_repo "
        "AND c2.sha = r.model_sha ")

    @staticmethod
    def _report_score_row(row: dict[str, Any]) -> ReportScoreRow:
        tcb, refs, meta = json.loads(row.pop("json_columns"))
        row["finished_at"] = _EPOCH + timedelta(microseconds=row["finished_at"])
        if row["discovered_at"] is not None:
            row["discovered_at"] = _EPOCH + timedelta(microseconds=row["discovered_at"])
        row["tcb"], row["refs"], row["meta"] = tcb, string_refs(refs), meta or {}
        return ReportScoreRow.from_row(row)

    def report_repo_rules(self, corpus_sha256: str | None, *, end: datetime) -> list[tuple[str, str | None]]:
        """Each (repo, rule) of the checkpoints scored by `end` (on one corpus, or all): what a
        policy's watch rules decide on (`monitor.alerts.watches`) before a report ranks them."""
        where, params = ("AND r.corpus_sha256 = ?", [corpus_sha256]) if corpus_sha256 else ("", [])
        with self._lock:
            return [tuple(row) for row in self.conn.execute(
                "SELECT DISTINCT r.model_repo, coalesce(c1.rule, c2.rule) FROM score_runs r "
                "LEFT JOIN (SELECT id, rule FROM checkpoints) c1 ON c1.id = r.checkpoint_id "
                "LEFT JOIN (SELECT repo, sha, rule FROM checkpoints) c2 ON r.checkpoint_id IS NULL "
                f"AND c2.repo = r.model_repo AND c2.sha = r.model_sha WHERE r.finished_at <= ? {where}",
                [end, *params]).fetchall()]

    def report_ranks(self, corpus_sha256: str | None, *, start: datetime, end: datetime,
                     watched: Sequence[tuple[str, str | None]] | None) -> ReportRanks:
        """The training-order rank of every checkpoint scored by `end` whose (repo, rule) is
        among `watched` (None: all), held by DuckDB for a report of the window (start, end]
        (`monitor.store.report_ranks`); close it (or use `with`) when the report is built."""
        with self._lock:
            cur = self.conn.cursor()
        closed = StoreError(f"{self.path} was closed while a query on it ran",
                            hint="the daemon is stopping; the job runs again on the next start")

        def is_closed() -> StoreError | None:
            # Asked of the ranks' own cursor: DuckDB closes it with the connection it came from,
            # which may be this store's, or the daemon's store whose cursor this store is (a job
            # or an API request), even while the closing store has not yet marked itself closed.
            try:
                cur.execute("SELECT 1").fetchall()
            except duckdb.Error:
                return closed
            return None

        forget = self.track_cursor(cur)   # so that a daemon stopping can interrupt its statements
        try:
            return ReportRanks(cur, corpus_sha256, start=start, end=end, watched=watched, closed=is_closed,
                               on_close=forget)
        except BaseException:
            forget()
            cur.close()
            raise

    def report_runs_by_id(self, run_ids: Sequence[str]) -> list[ReportScoreRow]:
        """The score runs among `run_ids` as a report reads them (each with its checkpoint's
        lineage, rule, refs, discovery time and placing values), ordered by run id: one query
        whatever their number, which reads only their checkpoints."""
        if not run_ids:
            return []
        # the runs first, then only their checkpoints (by id, or by repo and commit for runs
        # recorded before ids), not a join of the whole table
        picked = ("WITH picked AS MATERIALIZED (SELECT * FROM score_runs WHERE run_id IN "
                  "(SELECT unnest(?::VARCHAR[]))), "
                  "near AS MATERIALIZED (SELECT id, repo, sha, lineage, rule, discovered_at, refs, "
                  "placing_values AS placed FROM checkpoints c WHERE c.id IN "
                  "(SELECT checkpoint_id FROM picked) OR EXISTS (SELECT 1 FROM picked p WHERE p.checkpoint_id IS NULL "
                  "AND p.model_repo = c.repo AND p.model_sha = c.sha)) ")
        select = self._RUN_SELECT.replace("FROM score_runs r", "FROM picked r").replace(_CHECKPOINT_KEYS, "near")
        rows = self.query(f"{picked}{select} ORDER BY r.run_id", [sorted(set(run_ids))])
        return [self._report_score_row(row) for row in rows]

    def report_predictions(self, policy: str, *, start: datetime, end: datetime) -> list[PredictionRow]:
        """The policy's predictions evaluated in (start, end], oldest first (detail decoded)."""
        rows = self.query_json("SELECT * FROM predictions WHERE policy = ? AND evaluated_at > ? AND evaluated_at <= ? "
                               "ORDER BY evaluated_at, id", [policy, start, end], ("detail",))
        return [PredictionRow.from_row(row) for row in rows]

    def predictions_by_id(self, ids: Sequence[int]) -> list[PredictionRow]:
        """The predictions among `ids` (detail decoded), ordered by task, lineage, evaluated_at,
        id (one query, whatever their number)."""
        if not ids:
            return []
        rows = self.query_json("SELECT * FROM predictions WHERE id IN (SELECT unnest(?::BIGINT[])) "
                               "ORDER BY task, lineage, evaluated_at, id", [sorted(set(int(i) for i in ids))],
                               ("detail",))
        return [PredictionRow.from_row(row) for row in rows]

    def prediction_details(self, ids: Sequence[int]) -> dict[int, dict[str, Any]]:
        """The decoded detail of each prediction among `ids`, by id (one query)."""
        if not ids:
            return {}
        rows = self.query("SELECT id, detail FROM predictions WHERE id IN (SELECT unnest(?::BIGINT[]))",
                          [sorted(set(int(i) for i in ids))])
        return {int(row["id"]): json.loads(row["detail"]) for row in rows}

    def report_new_checkpoints(self, *, start: datetime, end: datetime) -> list[CheckpointRow]:
        """The checkpoints discovered in (start, end], oldest first (refs and meta decoded)."""
        rows = self.query("SELECT id, repo, sha, source, refs, lineage, rule, discovered_at, updated_at, status, "
                          "reason, attempts, lease_owner, lease_expires_at, meta FROM checkpoints "
                          "WHERE discovered_at > ? AND discovered_at <= ? ORDER BY discovered_at, id", [start, end])
        return [replace(c, refs=string_refs(c.refs)) for c in map(self._decode_checkpoint, rows)]

    def checkpoint_refs(self, pairs: Sequence[tuple[str, str]]) -> dict[tuple[str, str], list[str]]:
        """The refs of each known (repo, sha) among `pairs` (one query, whatever their number)."""
        pairs = sorted(set(pairs))
        if not pairs:
            return {}
        rows = self.query("SELECT c.repo, c.sha, c.refs FROM checkpoints c JOIN (SELECT unnest(?::VARCHAR[]) AS repo, "
                          "unnest(?::VARCHAR[]) AS sha) k ON k.repo = c.repo AND k.sha = c.sha",
                          [[repo for repo, _ in pairs], [sha for _, sha in pairs]])
        return {(row["repo"], row["sha"]): string_refs(json.loads(row["refs"]) if row["refs"] else []) for row in rows}

    def last_report(self, policy: str, name: str) -> ReportRow | None:
        """The newest recorded report of (policy, report name), or None."""
        rows = self.query_json("SELECT * FROM reports WHERE policy = ? AND name = ? "
                               "ORDER BY period_end DESC, id DESC LIMIT 1", [policy, name],
                               ("summary", "deliveries"))
        return ReportRow.from_row(rows[0]) if rows else None

    def record_report(self, report: Mapping[str, Any]) -> int | None:
        """Record a written report; None when (policy, name, period_end) is already recorded."""
        with self.transaction() as conn:
            row = conn.execute(
                "INSERT INTO reports (policy, name, period_start, period_end, folder, summary, deliveries, "
                "created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING RETURNING id",
                [report["policy"], report["name"], report["period_start"], report["period_end"],
                 report["folder"], json.dumps(report["summary"], sort_keys=True, default=str),
                 json.dumps(report["deliveries"], sort_keys=True, default=str),
                 report["created_at"]]).fetchone()
        return int(row[0]) if row else None

    def set_report_deliveries(self, report_id: int, deliveries: Sequence[Mapping[str, Any]]) -> None:
        """Store how the delivery of a recorded report went."""
        with self.transaction() as conn:
            conn.execute("UPDATE reports SET deliveries = ? WHERE id = ?",
                         [json.dumps(list(deliveries), sort_keys=True, default=str), report_id])

    def reports(self, *, policy: str | None = None, limit: int = 50) -> list[ReportRow]:
        """Recorded reports, newest first (summary and deliveries decoded)."""
        where, params = ("WHERE policy = ?", [policy]) if policy else ("", [])
        rows = self.query_json(f"SELECT * FROM reports {where} ORDER BY period_end DESC, id DESC LIMIT ?",
                               [*params, limit], ("summary", "deliveries"))
        return [ReportRow.from_row(row) for row in rows]
