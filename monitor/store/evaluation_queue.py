"""What evaluation reads: the score runs a (policy, task) has not evaluated, found from the
queue of new runs (`evaluation_queue`) while the (policy, task)'s scope is unchanged, and by
one scan of every run when it changed (`evaluation_scopes`).

An idle tick therefore reads the queue (empty) and one scope row per (policy, task), whatever
the number of score runs and predictions.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import duckdb

from monitor.store.connection import StoreConnection
from monitor.store.rows import EVALUATION_AXIS_COLUMNS, EvaluationCandidateRow

# Each checkpoint is joined once by id and once by (repo, sha) for runs without an id: two
# equality joins the planner hashes, where one join on `id = ? OR (repo = ? AND sha = ?)`
# compares every run with every checkpoint.
_CANDIDATE_SELECT = (
    "SELECT r.run_id, r.model_repo AS repo, r.model_sha AS commit_sha, r.lstar, r.se_ce AS se, "
    "r.corpus_sha256, r.finished_at, coalesce(c1.lineage, c2.lineage, r.model_repo) AS lineage, "
    "coalesce(c1.rule, c2.rule) AS rule, r.spec_version, r.window_len, r.stride, r.prefix_policy, "
    "r.partial, r.sequential, "
    # every axis a curve may read (monitor.curves.axes)
    + ", ".join(f"r.{c}" for c in EVALUATION_AXIS_COLUMNS)
    + " FROM {runs} r LEFT JOIN checkpoints c1 ON c1.id = r.checkpoint_id "
    "LEFT JOIN checkpoints c2 ON r.checkpoint_id IS NULL AND c2.repo = r.model_repo AND c2.sha = r.model_sha "
    "WHERE r.corpus_sha256 = ? AND NOT EXISTS (SELECT 1 FROM predictions p WHERE p.policy = ? AND p.task = ? "
    "AND p.run_id = r.run_id AND (p.state != 'not_evaluated' OR p.curve_id IS NOT DISTINCT FROM ?)) "
    "ORDER BY r.finished_at, r.run_id")


def enqueue_evaluation(conn: duckdb.DuckDBPyConnection, run_id: str, corpus_sha256: str, now: datetime) -> None:
    """Queue a score run for evaluation, inside the transaction that writes the run."""
    conn.execute("INSERT INTO evaluation_queue VALUES (?, ?, ?) ON CONFLICT (run_id) DO NOTHING",
                 [run_id, corpus_sha256, now])


class EvaluationQueueRows(StoreConnection):
    """The evaluation queue, the scopes it is valid for, and the candidates read from them."""

    def evaluation_candidates(self, policy: str, task: str, corpus_sha256: str,
                              curve_id: str | None = None) -> list[EvaluationCandidateRow]:
        """Every score run on `corpus_sha256` that (policy, task) has not evaluated, oldest first
        (a scan of all runs: what a tick does once after its scope changed).

        A run recorded `not_evaluated` is handled while the curve is the one it was recorded
        with (`curve_id`); another curve evaluates it again.

        Each row has run_id, repo, commit_sha, lstar, se, corpus_sha256, finished_at, lineage
        (the checkpoint's, else the repo) and rule (the watch rule that found it, if any).
        """
        rows = self.query(_CANDIDATE_SELECT.format(runs="score_runs"), [corpus_sha256, policy, task, curve_id])
        return [EvaluationCandidateRow.from_row(r) for r in rows]

    def queued_candidates(self, policy: str, task: str, corpus_sha256: str, curve_id: str | None,
                          run_ids: Sequence[str]) -> list[EvaluationCandidateRow]:
        """`evaluation_candidates` limited to `run_ids` (the queue's): reads those runs only."""
        if not run_ids:
            return []
        marks = ", ".join("?" for _ in run_ids)
        runs = f"(SELECT * FROM score_runs WHERE run_id IN ({marks}))"
        rows = self.query(_CANDIDATE_SELECT.format(runs=runs), [*run_ids, corpus_sha256, policy, task, curve_id])
        return [EvaluationCandidateRow.from_row(r) for r in rows]

    def evaluation_queue(self) -> dict[str, str]:
        """The queued runs: {run_id: corpus_sha256}, oldest first."""
        rows = self.query("SELECT run_id, corpus_sha256 FROM evaluation_queue ORDER BY queued_at, run_id")
        return {r["run_id"]: r["corpus_sha256"] for r in rows}

    def requeue_evaluation(self, run_ids: Sequence[str], corpus_sha256: str, *, now: datetime) -> None:
        """Put runs back on the queue (runs a full scan found but could not finish yet)."""
        if run_ids:
            with self.transaction() as conn:
                for run_id in run_ids:
                    enqueue_evaluation(conn, run_id, corpus_sha256, now)

    def drain_evaluation_queue(self, run_ids: Sequence[str]) -> int:
        """Delete handled runs from the queue; returns rows deleted."""
        if not run_ids:
            return 0
        marks = ", ".join("?" for _ in run_ids)
        with self.transaction() as conn:
            return int(conn.execute(f"DELETE FROM evaluation_queue WHERE run_id IN ({marks})",
                                    list(run_ids)).fetchone()[0])

    def evaluation_scopes(self, policy: str) -> dict[tuple[str, str], str]:
        """The policy's recorded scopes: {(task, corpus_sha256): scope}."""
        rows = self.query("SELECT task, corpus_sha256, scope FROM evaluation_scopes WHERE policy = ?", [policy])
        return {(r["task"], r["corpus_sha256"]): r["scope"] for r in rows}

    def record_evaluation_scope(self, policy: str, task: str, corpus_sha256: str, scope: str, *,
                                now: datetime) -> None:
        """Record that every run on the corpus was looked at under `scope` (after a full scan)."""
        with self.transaction() as conn:
            conn.execute("DELETE FROM evaluation_scopes WHERE policy = ? AND task = ? AND corpus_sha256 = ?",
                         [policy, task, corpus_sha256])
            conn.execute("INSERT INTO evaluation_scopes VALUES (?, ?, ?, ?, ?)",
                         [policy, task, corpus_sha256, scope, now])

    def evaluation_consumers(self) -> list[tuple[str, str, str]]:
        """Every (policy, task, corpus_sha256) with a recorded scope: who reads the queue."""
        rows = self.query("SELECT policy, task, corpus_sha256 FROM evaluation_scopes")
        return [(r["policy"], r["task"], r["corpus_sha256"]) for r in rows]

    def forget_evaluation_scopes(self, policy: str | None = None, *,
                                 consumers: Sequence[tuple[str, str, str]] = ()) -> int:
        """Drop the scopes of `policy`, or of the (policy, task, corpus_sha256) `consumers`: each
        scans every run once when it is evaluated again. Returns rows deleted."""
        if policy is not None:
            if not self.query("SELECT 1 FROM evaluation_scopes WHERE policy = ? LIMIT 1", [policy]):
                return 0   # the common case writes nothing
            with self.transaction() as conn:
                return int(conn.execute("DELETE FROM evaluation_scopes WHERE policy = ?", [policy]).fetchone()[0])
        deleted = 0
        if consumers:
            with self.transaction() as conn:
                for key in consumers:
                    deleted += int(conn.execute("DELETE FROM evaluation_scopes WHERE policy = ? AND task = ? "
                                                "AND corpus_sha256 = ?", list(key)).fetchone()[0])
        return deleted
