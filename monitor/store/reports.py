"""Governance-report rows, and the score runs and predictions a report reads."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from monitor.store.connection import StoreConnection
from monitor.store.rows import PredictionRow, ReportRow, ReportScoreRow


class ReportRows(StoreConnection):
    """Governance-report rows, and the score runs and predictions a report reads."""

    # -- governance reports ---------------------------------------------------------------------
    def report_score_runs(self, corpus_sha256: str | None) -> list[ReportScoreRow]:
        """Score runs (on one corpus, or all), oldest first, with their checkpoint's lineage,
        rule, refs and discovery time (JSON columns decoded)."""
        where, params = ("WHERE r.corpus_sha256 = ?", [corpus_sha256]) if corpus_sha256 else ("", [])
        rows = self.query(
            "SELECT r.run_id, r.model_repo AS repo, r.model_sha AS commit_sha, r.tokenizer_fingerprint, "
            "r.corpus_sha256, r.n_tokens, r.ce, r.ce_unigram, r.lstar, r.se_ce, r.bits_per_byte, r.tcb, "
            "r.finished_at, coalesce(c.lineage, r.model_repo) AS lineage, c.rule, c.refs, c.discovered_at "
            "FROM score_runs r LEFT JOIN checkpoints c ON (c.id = r.checkpoint_id) OR "
            "(r.checkpoint_id IS NULL AND c.repo = r.model_repo AND c.sha = r.model_sha) "
            f"{where} ORDER BY r.finished_at, r.run_id", params)
        for row in rows:
            row["tcb"] = json.loads(row["tcb"]) if row["tcb"] else None
            row["refs"] = json.loads(row["refs"]) if row["refs"] else []
        return [ReportScoreRow.from_row(row) for row in rows]

    def report_predictions(self, policy: str) -> list[PredictionRow]:
        """Every prediction of a policy, oldest first (detail decoded)."""
        rows = self.query_json("SELECT * FROM predictions WHERE policy = ? ORDER BY evaluated_at, id", [policy],
                               ("detail",))
        return [PredictionRow.from_row(row) for row in rows]

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
