"""Governance-report rows, and the score runs and predictions a report reads."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

import duckdb

from monitor.errors import StoreError
from monitor.store.connection import StoreConnection
from monitor.store.lineage_batch import PLACEMENT_EXTRACT, PLACEMENT_OBJECT
from monitor.store.rows import CheckpointRow, PredictionRow, ReportCarriedRow, ReportRow, ReportScoreRow


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_BATCH_ROWS = 4096   # rows fetched at a time by `_query_in_batches`
# what a report's score run reads of its checkpoint (`ReportRows._RUN_SELECT`)
_CHECKPOINT_KEYS = (f"(SELECT id, repo, sha, lineage, rule, discovered_at, refs, "
                    f"{PLACEMENT_EXTRACT.format(meta='meta')} AS placed FROM checkpoints)")


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
        # Each joins the checkpoints' key columns with the meta's two placing values extracted
        # first: a hash table of whole ~2 KB metas was most of a 10^5 report's peak memory.
        f"FROM score_runs r LEFT JOIN {_CHECKPOINT_KEYS} c1 ON c1.id = r.checkpoint_id "
        f"LEFT JOIN {_CHECKPOINT_KEYS} c2 ON r.checkpoint_id IS NULL AND c2.repo = r.model_repo "
        "AND c2.sha = r.model_sha ")

    @staticmethod
    def _report_score_row(row: dict[str, Any]) -> ReportScoreRow:
        tcb, refs, meta = json.loads(row.pop("json_columns"))
        row["finished_at"] = _EPOCH + timedelta(microseconds=row["finished_at"])
        if row["discovered_at"] is not None:
            row["discovered_at"] = _EPOCH + timedelta(microseconds=row["discovered_at"])
        row["tcb"], row["refs"], row["meta"] = tcb, refs if refs is not None else [], meta or {}
        return ReportScoreRow.from_row(row)

    def report_score_runs(self, corpus_sha256: str | None, *, start: datetime, end: datetime) -> list[ReportScoreRow]:
        """The score runs that finished in (start, end] (on one corpus, or all), oldest first, with
        their checkpoint's lineage, rule, refs, discovery time and meta (JSON columns decoded)."""
        where, params = ("AND r.corpus_sha256 = ?", [corpus_sha256]) if corpus_sha256 else ("", [])
        rows = self.query(f"{self._RUN_SELECT} WHERE r.finished_at > ? AND r.finished_at <= ? {where} "
                          "ORDER BY r.finished_at, r.run_id", [start, end, *params])
        return [self._report_score_row(row) for row in rows]

    def report_carried_runs(self, corpus_sha256: str | None, *, start: datetime) -> Iterator[ReportCarriedRow]:
        """Each checkpoint scored by `start`: its newest score run finished by then, with 1 (the
        checkpoint, for counts) and its best L* (one row per (lineage, repo, commit): an aggregate
        over the history's key columns, then only the chosen runs are read whole). Which of them
        is a lineage's current checkpoint is decided by `monitor.reports.current`, in training
        order, not here by time scored. Yielded as they are fetched (on a cursor of their own,
        `_query_in_batches`): a report keeps what it makes of each, not a second copy of the history."""
        where, params = ("AND r.corpus_sha256 = ?", [corpus_sha256]) if corpus_sha256 else ("", [])
        rows = self._query_in_batches(
            "WITH history AS (SELECT r.run_id, r.model_sha, r.lstar, r.finished_at, r.model_repo AS repo, "
            "coalesce(c1.lineage, c2.lineage, r.model_repo) AS lineage FROM score_runs r "
            "LEFT JOIN checkpoints c1 ON c1.id = r.checkpoint_id LEFT JOIN checkpoints c2 ON r.checkpoint_id IS NULL "
            f"AND c2.repo = r.model_repo AND c2.sha = r.model_sha WHERE r.finished_at <= ? {where}), "
            "state AS (SELECT lineage, repo, arg_max(run_id, (finished_at, run_id)) AS newest, "
            "count(DISTINCT model_sha) AS checkpoints_before, min(lstar) AS best_lstar_before "
            "FROM history GROUP BY lineage, repo, model_sha) "
            f"SELECT s.checkpoints_before, s.best_lstar_before, run.* FROM state s JOIN ({self._RUN_SELECT}) run "
            "ON run.run_id = s.newest ORDER BY run.lineage, run.repo, run.commit_sha", [start, *params])
        for row in rows:
            counted, best = int(row.pop("checkpoints_before")), float(row.pop("best_lstar_before"))
            yield ReportCarriedRow(self._report_score_row(row), counted, best)

    def _query_in_batches(self, sql: str, params: Sequence[Any]) -> Iterator[dict[str, Any]]:
        """`query`'s rows, fetched a batch at a time: a caller that turns each into a smaller
        object holds one copy of a 10^5-row history, not three (DuckDB's, the dicts, its own).

        The query runs on a cursor of its own (a second DuckDB connection to the same file),
        taken under the store's lock and closed with the walk: the lock is not held while the
        caller works on the rows (other threads' reads wait for a report's whole walk
        otherwise), and a query the caller runs between two rows cannot replace the pending
        result set the next batch is fetched from."""
        closed = StoreError(f"{self.path} was closed while a query on it ran",
                            hint="the daemon is stopping; the job runs again on the next start")
        with self._lock:
            cur = self.conn.cursor()
        try:
            cur.execute(sql, params)
            if cur.description is None:
                raise closed
            columns = [d[0] for d in cur.description]
            while True:
                try:
                    batch = cur.fetchmany(_BATCH_ROWS)
                except duckdb.Error as exc:   # the store closed its cursors with it
                    if self._conn is None:
                        raise closed from exc
                    raise
                if not batch:
                    return
                for values in batch:
                    yield dict(zip(columns, values))
        finally:
            with contextlib.suppress(duckdb.Error):
                cur.close()

    def report_predictions(self, policy: str, *, start: datetime, end: datetime) -> list[PredictionRow]:
        """The policy's predictions evaluated in (start, end], oldest first (detail decoded)."""
        rows = self.query_json("SELECT * FROM predictions WHERE policy = ? AND evaluated_at > ? AND evaluated_at <= ? "
                               "ORDER BY evaluated_at, id", [policy, start, end], ("detail",))
        return [PredictionRow.from_row(row) for row in rows]

    def report_carried_keys(self, policy: str, *, start: datetime,
                            skip_state: str) -> list[tuple[int, str, str, str, str, int]]:
        """Each (task, lineage, checkpoint)'s state at `start` as (id, task, lineage, repo,
        commit_sha, evaluated_at in microseconds since the epoch): the policy's newest prediction of it evaluated by then whose
        state is not `skip_state` (one row each; a window function), ordered by task, lineage,
        evaluated_at, id. Only keys: a report chooses the few it reads whole (`predictions_by_id`)
        in training order; building a row of each of the history's 10^5 states was most of its time."""
        with self._lock:
            return [tuple(row) for row in self.conn.execute(
                # the time as microseconds since the epoch: compared only, and a 10^5-row history's
                # conversions to zoned datetimes cost more than the rest of the read
                "SELECT id, task, lineage, repo, commit_sha, epoch_us(evaluated_at) FROM (SELECT id, task, lineage, repo, "
                "commit_sha, evaluated_at, row_number() OVER (PARTITION BY task, lineage, repo, commit_sha "
                "ORDER BY evaluated_at DESC, id DESC) AS newest FROM predictions "
                "WHERE policy = ? AND evaluated_at <= ? AND state != ?) WHERE newest = 1 "
                "ORDER BY task, lineage, evaluated_at, id", [policy, start, skip_state]).fetchall()]

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
        return [self._decode_checkpoint(row) for row in rows]

    def checkpoint_refs(self, pairs: Sequence[tuple[str, str]]) -> dict[tuple[str, str], list[str]]:
        """The refs of each known (repo, sha) among `pairs` (one query, whatever their number)."""
        pairs = sorted(set(pairs))
        if not pairs:
            return {}
        rows = self.query("SELECT c.repo, c.sha, c.refs FROM checkpoints c JOIN (SELECT unnest(?::VARCHAR[]) AS repo, "
                          "unnest(?::VARCHAR[]) AS sha) k ON k.repo = c.repo AND k.sha = c.sha",
                          [[repo for repo, _ in pairs], [sha for _, sha in pairs]])
        return {(row["repo"], row["sha"]): json.loads(row["refs"]) if row["refs"] else [] for row in rows}

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
