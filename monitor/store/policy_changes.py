"""What a policy change re-evaluates, the re-evaluated predictions written over the old ones,
and the record of each change (`policy_changes`), which reports list."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from monitor.store.alerts import placed_predictions
from monitor.store.connection import StoreConnection
from monitor.store.evaluation_queue import _CANDIDATE_SELECT
from monitor.store.rows import EvaluationCandidateRow

# The candidate columns of a run, without the evaluation queue's "not predicted yet" filter: a
# re-evaluation reads runs that already have a prediction.
_RUN_SELECT = _CANDIDATE_SELECT.split(" WHERE r.corpus_sha256 = ?")[0]


class PolicyChangeRows(StoreConnection):
    """Re-evaluation after a policy change, and the change records (alerts are written with
    `AlertRows._insert_alert`, a sibling mixin of `Store`)."""

    def predicted_checkpoints(self, policy: str, task: str) -> list[dict[str, Any]]:
        """Each checkpoint (policy, task) has judged: its newest prediction (not `not_evaluated`),
        with what places it in its lineage (refs, meta, discovery and scoring time)."""
        return placed_predictions(self, policy, task)

    def newest_judgement(self, policy: str, task: str) -> dict[str, Any] | None:
        """The detail (floor, margin, curve_id, confidence, ...) of the newest judged prediction
        of (policy, task), or None: the settings it was last judged by."""
        rows = self.query_json("SELECT detail FROM predictions WHERE policy = ? AND task = ? AND state != "
                               "'not_evaluated' ORDER BY evaluated_at DESC, id DESC LIMIT 1", [policy, task],
                               ("detail",))
        return rows[0]["detail"] if rows and isinstance(rows[0]["detail"], dict) else None

    def run_candidates(self, run_ids: Sequence[str]) -> list[EvaluationCandidateRow]:
        """The runs `run_ids` as evaluation reads them, whether predicted already or not."""
        if not run_ids:
            return []
        marks = ", ".join("?" for _ in run_ids)
        runs = f"(SELECT * FROM score_runs WHERE run_id IN ({marks}))"
        rows = self.query(_RUN_SELECT.format(runs=runs) + " ORDER BY r.finished_at, r.run_id", list(run_ids))
        return [EvaluationCandidateRow.from_row(r) for r in rows]

    def replace_prediction(self, prediction: Mapping[str, Any], *, now: datetime) -> dict[str, int]:
        """Write a re-evaluation over the prediction of its (policy, task, run): the row keeps its
        id (alerts and evaluations point at it) and takes the new numbers, state and time; its
        alerts (a resolve, a new fire) and their deliveries are written in the same transaction."""
        counts = {"predictions": 0, "alerts": 0, "deliveries": 0}
        columns = ("lstar", "se", "p_hat", "lo", "hi", "threshold", "state", "curve_id", "detail", "evaluated_at")
        values = [json.dumps(prediction[c], sort_keys=True, default=str) if c == "detail" else prediction[c]
                  for c in columns]
        with self.transaction() as conn:
            row = conn.execute(
                f"UPDATE predictions SET {', '.join(f'{c} = ?' for c in columns)} WHERE policy = ? AND task = ? "
                "AND run_id = ? RETURNING id",
                [*values, prediction["policy"], prediction["task"], prediction["run_id"]]).fetchone()
            if row is None:
                return counts
            counts["predictions"] = 1
            for alert in prediction.get("alerts", ()):
                written = self._insert_alert(conn, alert, row[0], now)  # type: ignore[attr-defined]
                counts["alerts"] += 1 if written else 0
                counts["deliveries"] += written
        return counts

    def record_policy_change(self, change: Mapping[str, Any]) -> None:
        """Record what one task's change did (`monitor.service.policy_change.TaskChange.as_row`)."""
        with self.transaction() as conn:
            conn.execute(
                "INSERT INTO policy_changes (policy, task, before, after, reevaluated, resolved, fired, summary, "
                "changed_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [change["policy"], change["task"], json.dumps(change["before"], sort_keys=True),
                 json.dumps(change["after"], sort_keys=True), change["reevaluated"], change["resolved"],
                 change["fired"], change["summary"], change["changed_at"]])

    def policy_changes(self, policy: str, *, start: datetime, end: datetime) -> list[dict[str, Any]]:
        """The policy's recorded changes in (start, end], oldest first (before/after decoded)."""
        return self.query_json("SELECT policy, task, before, after, reevaluated, resolved, fired, summary, changed_at "
                               "FROM policy_changes WHERE policy = ? AND changed_at > ? AND changed_at <= ? "
                               "ORDER BY changed_at, id", [policy, start, end], ("before", "after"))
