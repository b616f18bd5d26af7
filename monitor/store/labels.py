"""Task-label rows and evaluation runs."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from monitor.store.connection import StoreConnection, utcnow
from monitor.store.rows import EvalRunRow, LabelRow


class LabelRows(StoreConnection):
    """Task-label rows and evaluation runs."""

    # -- task labels and evaluation runs -------------------------------------------------------
    LABEL_COLUMNS = ("repo", "sha", "checkpoint", "family", "task", "metric", "value", "stderr", "n",
                     "source", "source_ref", "eval_run_id", "score_run_id", "details", "created_at")

    def record_labels(self, labels: Sequence[Mapping[str, Any]], *,
                      eval_run: Mapping[str, Any] | None = None, now: datetime | None = None) -> int:
        """Insert label rows (and the evaluation run they came from) in one transaction.

        A row whose (repo, sha, task, metric, source_ref) is already stored is skipped, so
        importing the same file twice adds nothing. Returns the number of rows inserted.
        """
        return self._write_labels(labels, eval_run=eval_run, now=now)

    def replace_imported_labels(self, sources: Sequence[str], labels: Sequence[Mapping[str, Any]], *,
                                now: datetime | None = None) -> int:
        """Imported labels as their files say now: in one transaction, drop what earlier
        imports of `sources` (a results file, or everything under a results folder) left,
        then insert `labels`. A value edited in the file replaces the old one, and a row
        removed from the file is gone. Returns the number of rows inserted."""
        return self._write_labels(labels, replace_sources=sources, now=now)

    def _write_labels(self, labels: Sequence[Mapping[str, Any]], *, eval_run: Mapping[str, Any] | None = None,
                      replace_sources: Sequence[str] = (), now: datetime | None = None) -> int:
        now = now or utcnow()
        inserted = 0
        with self.transaction() as conn:
            for source in replace_sources:
                folder = source.rstrip("/") + "/"
                conn.execute("DELETE FROM labels WHERE eval_run_id IS NULL AND (source_ref = ? OR "
                             "starts_with(source_ref, ?))", [source, folder])
            if eval_run is not None:
                conn.execute(
                    "INSERT INTO eval_runs (run_id, model_repo, model_sha, model_source, task, task_sha256, "
                    "n_items, item_limit, tokenizer_fingerprint, dtype, device, metrics, model, wall_s, "
                    "finished_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    [eval_run["run_id"], eval_run["model_repo"], eval_run["model_sha"],
                     eval_run["model_source"], eval_run["task"], eval_run["task_sha256"],
                     eval_run["n_items"], eval_run.get("item_limit"), eval_run["tokenizer_fingerprint"],
                     eval_run["dtype"], eval_run["device"], json.dumps(eval_run["metrics"], sort_keys=True),
                     json.dumps(eval_run["model"], sort_keys=True, default=str), eval_run["wall_s"],
                     eval_run.get("finished_at") or now])
            for row in labels:
                values = [row.get("sha") or "" if c == "sha" else
                          json.dumps(row.get("details") or {}, sort_keys=True, default=str) if c == "details" else
                          row.get("created_at") or now if c == "created_at" else row.get(c)
                          for c in self.LABEL_COLUMNS]
                inserted += conn.execute(
                    f"INSERT INTO labels ({', '.join(self.LABEL_COLUMNS)}) VALUES "
                    f"({', '.join('?' for _ in self.LABEL_COLUMNS)}) ON CONFLICT DO NOTHING", values).fetchone()[0]
        self.checkpoint()
        return inserted

    def labels(self, *, task: str | None = None, metric: str | None = None,
               repo: str | None = None) -> list[LabelRow]:
        """Stored labels, oldest first, optionally of one task, metric or repo."""
        where, params = [], []
        for column, value in (("task", task), ("metric", metric), ("repo", repo)):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        sql = "SELECT * FROM labels" + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY id"
        return [LabelRow.from_row(row) for row in self.query_json(sql, params, ("details",))]

    def eval_runs(self, *, model_repo: str | None = None, limit: int = 100) -> list[EvalRunRow]:
        """Recent evaluation runs, newest first (metrics and model decoded)."""
        where, params = ("WHERE model_repo = ?", [model_repo]) if model_repo else ("", [])
        rows = self.query_json(f"SELECT * FROM eval_runs {where} ORDER BY finished_at DESC LIMIT ?",
                               [*params, limit], ("metrics", "model"))
        return [EvalRunRow.from_row(row) for row in rows]
