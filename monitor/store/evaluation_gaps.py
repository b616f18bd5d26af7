"""Scores a policy could not evaluate: the `not_evaluated` predictions and the episodes
(`evaluation_gaps`) in which the current checkpoint of some (task, lineage) has one of them as
its newest prediction."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from monitor.store.alerts import current_rows, placed_predictions
from monitor.store.connection import StoreConnection
from monitor.store.rows import EvaluationGapRow, NotEvaluatedRow

NOT_EVALUATED = "not_evaluated"
_COLUMNS = ("p.policy, p.task, p.run_id, p.repo, p.commit_sha, p.lineage, p.curve_id, "
            "coalesce(json_extract_string(p.detail, '$.reason'), '') AS reason, p.evaluated_at")


_OPEN_COLUMNS = ("policy", "task", "run_id", "repo", "commit_sha", "lineage", "curve_id", "reason", "evaluated_at")


class EvaluationGapRows(StoreConnection):
    """The `not_evaluated` records and the episodes they make, with their one operator alert."""

    def not_evaluated(self, policy: str | None = None) -> list[NotEvaluatedRow]:
        """Every (score run, policy, task) recorded `not_evaluated`, oldest first."""
        where, params = ("AND p.policy = ?", [policy]) if policy else ("", [])
        rows = self.query(f"SELECT {_COLUMNS} FROM predictions p WHERE p.state = '{NOT_EVALUATED}' {where} "
                          "ORDER BY p.evaluated_at, p.id", params)
        return [NotEvaluatedRow.from_row(r) for r in rows]

    def not_evaluated_summary(self) -> list[dict[str, Any]]:
        """The `not_evaluated` records grouped by (policy, task, reason), with the checkpoints
        they cover: what `lstar status` shows."""
        rows = self.query(
            "SELECT policy, task, coalesce(json_extract_string(detail, '$.reason'), '') AS reason, "
            "count(DISTINCT repo || '@' || commit_sha) AS checkpoints, max(evaluated_at) AS last_at "
            f"FROM predictions WHERE state = '{NOT_EVALUATED}' GROUP BY ALL ORDER BY policy, task, reason")
        return [{**r, "checkpoints": int(r["checkpoints"])} for r in rows]

    def with_not_evaluated(self, checkpoints: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Checkpoint dicts (`CheckpointRow.as_dict`) with `not_evaluated`: ["policy/task: reason", ...].

        Reads the records of these checkpoints only, so a page of a listing costs a page."""
        notes: dict[tuple[str, str], list[str]] = {}
        pairs = sorted({(c["repo"], c["sha"]) for c in checkpoints})
        rows = self.query(
            f"SELECT {_COLUMNS} FROM predictions p JOIN (SELECT unnest(?::VARCHAR[]) AS repo, unnest(?::VARCHAR[]) "
            f"AS sha) k ON k.repo = p.repo AND k.sha = p.commit_sha WHERE p.state = '{NOT_EVALUATED}' "
            "ORDER BY p.evaluated_at, p.id", [[r for r, _ in pairs], [c for _, c in pairs]]) if pairs else []
        for r in map(NotEvaluatedRow.from_row, rows):
            note = f"{r.policy}/{r.task}: {r.reason}"
            kept = notes.setdefault((r.repo, r.commit_sha), [])
            if note not in kept:
                kept.append(note)
        return [{**c, "not_evaluated": notes.get((c["repo"], c["sha"]), [])} for c in checkpoints]

    def open_not_evaluated(self, policy: str, tasks: Sequence[str]) -> list[NotEvaluatedRow]:
        """The `not_evaluated` records that are the newest prediction of their (task, lineage)'s
        current checkpoint (the latest in training order, `monitor.training_order`): while there
        is one, the policy cannot tell that lineage's state."""
        tasks = list(tasks)
        if not tasks:
            return []
        # Only a lineage with a `not_evaluated` record can have one as its current checkpoint's
        # newest prediction: placing those lineages alone (their checkpoints' refs and meta) keeps
        # the tick that follows new scores from reading every lineage's history.
        marks = ", ".join("?" for _ in tasks)
        lineages = [r["lineage"] for r in self.query(
            f"SELECT DISTINCT lineage FROM predictions WHERE state = '{NOT_EVALUATED}' AND policy = ? "
            f"AND task IN ({marks})", [policy, *tasks])]
        if not lineages:
            return []
        current = current_rows(placed_predictions(self, policy, tasks, judged_only=False, lineages=lineages))
        rows = sorted((r for r in current if r["state"] == NOT_EVALUATED),
                      key=lambda r: (r["evaluated_at"], r["task"], r["lineage"]))
        return [NotEvaluatedRow.from_row({k: r[k] for k in _OPEN_COLUMNS}) for r in rows]

    def open_evaluation_gap(self, policy: str) -> EvaluationGapRow | None:
        """The policy's episode still open, or None."""
        rows = self.query("SELECT * FROM evaluation_gaps WHERE policy = ? AND ended_at IS NULL "
                          "ORDER BY id DESC LIMIT 1", [policy])
        return EvaluationGapRow.from_row(rows[0]) if rows else None

    def start_evaluation_gap(self, policy: str, *, reason: str, now: datetime) -> EvaluationGapRow:
        """Open an episode for `policy` (the open one when there is one already)."""
        with self.transaction() as conn:
            found = conn.execute("SELECT id FROM evaluation_gaps WHERE policy = ? AND ended_at IS NULL",
                                 [policy]).fetchone()
            if found is None:
                conn.execute("INSERT INTO evaluation_gaps (policy, reason, started_at) VALUES (?, ?, ?)",
                             [policy, reason, now])
        gap = self.open_evaluation_gap(policy)
        assert gap is not None
        return gap

    def end_evaluation_gap(self, gap_id: int, *, now: datetime) -> bool:
        """Close an episode; False when it was closed already."""
        with self.transaction() as conn:
            n = conn.execute("UPDATE evaluation_gaps SET ended_at = ? WHERE id = ? AND ended_at IS NULL",
                             [now, gap_id]).fetchone()[0]
        return n == 1
