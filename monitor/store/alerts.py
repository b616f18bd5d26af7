"""Alert rows: the latest scores evaluation reads, predictions, alerts and their deliveries (the outbox's write side),
and operator alerts."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import duckdb

from monitor.store.connection import StoreConnection
from monitor.store.rows import (AlertDetailRow, AlertRow, AlertSummaryRow, DeliveryRow, DeliverySummaryRow,
                                FiringAlertRow, LatestScoreRow, LineageHistory,
                                NotificationAttemptsRow, PendingDeliveryRow, PredictionRow, ReceiverSends)
from monitor.store.lineage_batch import LineageBatch, decoded, placement_of, tiebreak_of
from monitor.store.placing import PLACEMENT_OBJECT
from monitor.training_order import current_checkpoint, lineage_order


# What places the checkpoint of each run of a CTE `runs` (checkpoint_id, model_repo, model_sha) in
# its lineage: refs, discovery time and, of the ~2 KB meta, only the two values training order
# reads, as stored beside it (`monitor.store.placing`; reading and decoding whole metas was most of
# an evaluation tick's time). The checkpoints are
# read for those runs only (a semi-join each), not joined whole: a run names its checkpoint by id,
# or (recorded before ids) by repo and commit.
_PLACE_COLUMNS = ("coalesce(c1.refs, c2.refs) AS refs, "
                  f"{PLACEMENT_OBJECT.format(placed='coalesce(c1.placing_values, c2.placing_values)')} AS meta, "
                  "coalesce(c1.discovered_at, c2.discovered_at) AS discovered_at")
_RUN_CHECKPOINTS = (
    "LEFT JOIN (SELECT id, refs, placing_values, discovered_at FROM checkpoints WHERE id IN "
    "(SELECT checkpoint_id FROM runs)) c1 ON c1.id = runs.checkpoint_id "
    "LEFT JOIN (SELECT repo, sha, refs, placing_values, discovered_at FROM checkpoints WHERE (repo, sha) IN "
    "(SELECT model_repo, model_sha FROM runs WHERE checkpoint_id IS NULL)) c2 "
    "ON runs.checkpoint_id IS NULL AND c2.repo = runs.model_repo AND c2.sha = runs.model_sha")


def placed_predictions(store: StoreConnection, policy: str, task: str | Sequence[str], lineage: str | None = None,
                       *, judged_only: bool = True, lineages: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Each checkpoint (policy, task) has judged (of `lineage`, or of every lineage; `task`
    may name several): its newest prediction (not `not_evaluated` while `judged_only`), with
    what places it in its lineage (refs, meta, discovery and scoring time) for
    `monitor.training_order`. `lineages`: of these lineages only."""
    tasks = [task] if isinstance(task, str) else list(task)
    if not tasks:
        return []
    where = f"policy = ? AND task IN ({', '.join('?' for _ in tasks)})"
    params: list[Any] = [policy, *tasks]
    if lineage is not None:
        where += " AND lineage = ?"
        params.append(lineage)
    if lineages is not None:   # several lineages at once (an evaluation tick's batch)
        where += " AND lineage IN (SELECT unnest(?::VARCHAR[]))"
        params.append(sorted(set(lineages)))
    if judged_only:
        where += " AND state != 'not_evaluated'"
    rows = store.query(
        # the newest prediction of each checkpoint (only the columns used: a materialized CTE keeps
        # what it is given) with its run, then the checkpoints of those runs only
        "WITH runs AS MATERIALIZED (SELECT p.*, r.finished_at, r.checkpoint_id, r.model_repo, r.model_sha FROM "
        "(SELECT id, policy, task, run_id, repo, commit_sha, lineage, state, threshold, curve_id, detail, evaluated_at, "
        "row_number() OVER (PARTITION BY task, lineage, repo, commit_sha ORDER BY evaluated_at DESC, id DESC) AS n "
        f"FROM predictions WHERE {where}) p JOIN score_runs r ON r.run_id = p.run_id WHERE p.n = 1) "
        "SELECT runs.id, runs.policy, runs.task, runs.run_id, runs.repo, runs.commit_sha, runs.lineage, runs.state, "
        "runs.threshold, runs.curve_id, coalesce(json_extract_string(runs.detail, '$.reason'), '') AS reason, "
        "runs.evaluated_at, runs.finished_at, "
        f"{_PLACE_COLUMNS} FROM runs {_RUN_CHECKPOINTS} "
        "ORDER BY runs.task, runs.lineage, runs.repo, runs.commit_sha", params)
    for row in rows:
        row["refs"] = decoded(row["refs"], [])
        row["meta"] = decoded(row["meta"], {})
    return rows


def current_rows(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Of `placed_predictions` rows, the current checkpoint's of each (task, lineage): the
    latest in training order (`monitor.training_order`)."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row["task"], row["lineage"]), []).append(row)
    picked = [current_checkpoint(group, placement_of, tiebreak_of) for group in groups.values()]
    return [row for row in picked if row is not None]


# The column types of the bulk inserts' lists (`write_outbox_rows`).
_PREDICTION_TYPES = {"policy": "VARCHAR", "task": "VARCHAR", "run_id": "VARCHAR", "repo": "VARCHAR",
                     "commit_sha": "VARCHAR", "lineage": "VARCHAR", "corpus_sha256": "VARCHAR", "lstar": "DOUBLE",
                     "se": "DOUBLE", "p_hat": "DOUBLE", "lo": "DOUBLE", "hi": "DOUBLE", "threshold": "DOUBLE",
                     "state": "VARCHAR", "curve_id": "VARCHAR", "detail": "VARCHAR", "evaluated_at": "TIMESTAMPTZ"}
_ALERT_TYPES = {"starts_at": "TIMESTAMPTZ", "ends_at": "TIMESTAMPTZ", "created_at": "TIMESTAMPTZ"}


class AlertRows(StoreConnection):
    """Alert rows: the latest scores evaluation reads, predictions, alerts and their deliveries (the outbox's write side),"""

    def latest_score(self, repo: str, commit_sha: str, corpus_sha256: str) -> LatestScoreRow | None:
        """The newest score run of (repo, commit) on a corpus, or None."""
        rows = self.query("SELECT run_id, lstar, se_ce AS se, finished_at FROM score_runs WHERE "
                          "model_repo = ? AND model_sha = ? AND corpus_sha256 = ? "
                          "ORDER BY finished_at DESC, run_id DESC LIMIT 1", [repo, commit_sha, corpus_sha256])
        return LatestScoreRow.from_row(rows[0]) if rows else None

    def latest_scores(self, pairs: Sequence[tuple[str, str]], corpus_sha256: str) -> dict[tuple[str, str], LatestScoreRow]:
        """`latest_score` of many (repo, commit) at once: {(repo, commit): newest run on the corpus}."""
        if not pairs:
            return {}
        keys = sorted(set(pairs))
        rows = self.query(
            "SELECT r.model_repo, r.model_sha, r.run_id, r.lstar, r.se_ce AS se, r.finished_at FROM score_runs r "
            "JOIN (SELECT unnest(?::VARCHAR[]) AS repo, unnest(?::VARCHAR[]) AS sha) k "
            "ON r.model_repo = k.repo AND r.model_sha = k.sha WHERE r.corpus_sha256 = ? "
            "QUALIFY row_number() OVER (PARTITION BY r.model_repo, r.model_sha "
            "ORDER BY r.finished_at DESC, r.run_id DESC) = 1", [[k[0] for k in keys], [k[1] for k in keys], corpus_sha256])
        return {(r.pop("model_repo"), r.pop("model_sha")): LatestScoreRow.from_row(r) for r in rows}

    def lineage_history(self, policy: str, task: str, lineage: str,
                        checkpoint: tuple[str, str, datetime | None] | None = None) -> LineageHistory:
        """What alert decisions for (policy, task, lineage) depend on.

        state: the state of the lineage's current checkpoint (`monitor.training_order`: the
        latest in training order of the checkpoints with an evaluated prediction, its newest
        one), never simply the newest prediction: scoring order does not decide. With
        `checkpoint` (repo, commit, scored_at: the one being evaluated), it takes its place in
        that order too, and `behind_current` says whether it is earlier than the current one.
        last_firing: the newest firing alert (labels decoded) or None; receivers: {receiver:
        {last_firing_at, last_resolved_at}} over deliveries that were not silenced.
        """
        state, current, behind = self._lineage_position(policy, task, lineage, checkpoint)
        firing = self.query("SELECT id, labels, starts_at, state, commit_sha FROM alerts WHERE policy = ? "
                            "AND task = ? AND lineage = ? AND status = 'firing' AND kind NOT IN ('meta', 'observe') "
                            "ORDER BY created_at DESC, id DESC LIMIT 1", [policy, task, lineage])
        rows = self.query(
            "SELECT d.receiver, max(CASE WHEN a.status = 'firing' THEN d.created_at END) AS last_firing_at, "
            "max(CASE WHEN a.status = 'resolved' THEN d.created_at END) AS last_resolved_at "
            "FROM deliveries d JOIN alerts a ON a.id = d.alert_id WHERE a.policy = ? AND a.task = ? "
            "AND a.lineage = ? AND d.status != 'silenced' AND a.kind != 'observe' GROUP BY d.receiver", [policy, task, lineage])
        last = None
        if firing:
            last = FiringAlertRow.from_row({**firing[0], "labels": json.loads(firing[0]["labels"])})
        return LineageHistory(state=state, last_firing=last,
                              receivers={r.pop("receiver"): ReceiverSends.from_row(r) for r in rows},
                              current=current, behind_current=behind)

    def _lineage_position(self, policy: str, task: str, lineage: str,
                          checkpoint: tuple[str, str, datetime | None] | None
                          ) -> tuple[str | None, str | None, bool]:
        """(the current checkpoint's state, its commit, whether `checkpoint` is behind it)."""
        rows = placed_predictions(self, policy, task, lineage)
        key = None
        if checkpoint is not None:
            repo, commit, scored_at = checkpoint
            key = (repo, commit)
            if not any((r["repo"], r["commit_sha"]) == key for r in rows):
                rows.append({**self._checkpoint_place(repo, commit), "repo": repo, "commit_sha": commit,
                             "finished_at": scored_at, "state": None, "candidate": True})
        ordered = lineage_order(rows, placement_of, tiebreak_of)
        judged = [r for r in ordered if not r.get("candidate")]
        if not judged:
            return None, None, False
        current = judged[-1]
        behind = key is not None and (ordered[-1]["repo"], ordered[-1]["commit_sha"]) != key
        return current["state"], current["commit_sha"], behind

    def _checkpoint_place(self, repo: str, commit: str) -> dict[str, Any]:
        """What places a checkpoint no prediction names yet in its lineage (refs, meta, discovery)."""
        found = self.query(f"SELECT refs, {PLACEMENT_OBJECT.format(placed='placing_values')} AS meta, discovered_at "
                           "FROM checkpoints WHERE repo = ? AND sha = ? "
                           "ORDER BY id DESC LIMIT 1", [repo, commit])
        row = found[0] if found else {"refs": None, "meta": None, "discovered_at": None}
        return {"refs": decoded(row["refs"], []), "meta": decoded(row["meta"], {}),
                "discovered_at": row["discovered_at"]}

    _PREDICTION_COLUMNS = ("policy", "task", "run_id", "repo", "commit_sha", "lineage", "corpus_sha256",
                           "lstar", "se", "p_hat", "lo", "hi", "threshold", "state", "curve_id",
                           "detail", "evaluated_at")
    _ALERT_COLUMNS = ("alert_key", "kind", "policy", "task", "repo", "commit_sha", "lineage", "state",
                      "status", "labels", "annotations", "numbers", "fingerprint", "starts_at",
                      "ends_at", "created_at")

    def _insert_alert(self, conn: duckdb.DuckDBPyConnection, alert: Mapping[str, Any],
                      prediction_id: int | None, now: datetime) -> int:
        """Insert an alert and its deliveries unless its key exists; returns deliveries written."""
        values = [json.dumps(alert[c], sort_keys=True) if c in ("labels", "annotations", "numbers")
                  else alert[c] for c in self._ALERT_COLUMNS]
        row = conn.execute(
            f"INSERT INTO alerts ({', '.join(self._ALERT_COLUMNS)}, prediction_id) VALUES "
            f"({', '.join('?' for _ in self._ALERT_COLUMNS)}, ?) ON CONFLICT (alert_key) DO NOTHING "
            "RETURNING id", [*values, prediction_id]).fetchone()
        if row is None:
            return 0
        for d in alert["deliveries"]:
            conn.execute(
                "INSERT INTO deliveries (alert_id, policy, receiver, group_key, group_labels, group_wait_s,"
                " group_interval_s, status, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, "
                "'pending', ?, ?)",
                [row[0], alert["policy"], d["receiver"], d["group_key"],
                 json.dumps(d["group_labels"], sort_keys=True), d["group_wait_s"],
                 d["group_interval_s"], now, now])
        return len(alert["deliveries"])

    def write_outbox(self, predictions: Sequence[Mapping[str, Any]], *, now: datetime,
                     before_commit: Any = None) -> dict[str, int]:
        """Write predictions, their alerts and one delivery row per receiver in ONE transaction.

        Each prediction may carry `alerts` (dicts with the alert columns and `deliveries`).
        A prediction already recorded for (policy, task, run_id), or an alert whose key
        exists, writes nothing, so evaluating the same score twice sends nothing twice; a
        `not_evaluated` record is replaced by the new evaluation.
        `before_commit(conn)` runs last inside the transaction (crash tests kill there).
        Called inside a `transaction()` of the store, it joins it and does not checkpoint.
        """
        counts = {"predictions": 0, "alerts": 0, "deliveries": 0}
        joined = self.in_transaction
        with self.transaction() as conn:
            for p in predictions:
                values = [json.dumps(p[c], sort_keys=True, default=str) if c == "detail" else p[c]
                          for c in self._PREDICTION_COLUMNS]
                insert = (f"INSERT INTO predictions ({', '.join(self._PREDICTION_COLUMNS)}) VALUES "
                          f"({', '.join('?' for _ in self._PREDICTION_COLUMNS)}) "
                          "ON CONFLICT (policy, task, run_id) DO NOTHING RETURNING id")
                # The unique key's index answers the insert; only a run already recorded (rare:
                # a not_evaluated record, or a second evaluation) pays for the DELETE, which
                # DuckDB answers with a scan of the table.
                row = conn.execute(insert, values).fetchone()
                if row is None:
                    gone = conn.execute(
                        "DELETE FROM predictions WHERE policy = ? AND task = ? AND run_id = ? AND "
                        "state = 'not_evaluated'", [p["policy"], p["task"], p["run_id"]]).fetchone()[0]
                    row = conn.execute(insert, values).fetchone() if gone else None
                if row is None:
                    continue
                counts["predictions"] += 1
                for alert in p.get("alerts", ()):
                    written = self._insert_alert(conn, alert, row[0], now)
                    if written or not alert["deliveries"]:
                        counts["alerts"] += 1 if written else 0
                    counts["deliveries"] += written
            if before_commit is not None:
                before_commit(conn)
        if not joined:   # a caller's batch checkpoints (at most) once, after its commits
            self.checkpoint()
        return counts

    def lineage_batch(self, policy: str, task: str,
                      runs: Sequence[tuple[str, str, str, str]]) -> LineageBatch:
        """The lineage histories a batch of runs of (policy, task) reads, with a fixed number of
        queries whatever the batch's size: `runs` are (lineage, repo, commit, run_id)."""
        lineages = sorted({r[0] for r in runs})
        pairs = sorted({(r[1], r[2]) for r in runs})
        run_ids = sorted({r[3] for r in runs})
        repos, commits = [p[0] for p in pairs], [p[1] for p in pairs]
        placed = placed_predictions(self, policy, task, lineages=lineages) if runs else []
        keys = "(SELECT unnest(?::VARCHAR[]) AS repo, unnest(?::VARCHAR[]) AS sha)"
        checkpoints = {(r["repo"], r["sha"]): {"refs": decoded(r["refs"], []), "meta": decoded(r["meta"], {}),
                                               "discovered_at": r["discovered_at"]} for r in self.query(
            f"SELECT c.repo, c.sha, c.refs, {PLACEMENT_OBJECT.format(placed='c.placing_values')} AS meta, c.discovered_at "
            f"FROM checkpoints c JOIN {keys} k "
            "ON c.repo = k.repo AND c.sha = k.sha "
            "QUALIFY row_number() OVER (PARTITION BY c.repo, c.sha ORDER BY c.id DESC) = 1",
            [repos, commits])} if runs else {}
        # where each run's prediction, once written, is placed (as `placed_predictions` joins it)
        run_places = {r["run_id"]: {"refs": decoded(r["refs"], []), "meta": decoded(r["meta"], {}),
                                    "discovered_at": r["discovered_at"], "finished_at": r["finished_at"]}
                      for r in self.query(
            "WITH runs AS MATERIALIZED (SELECT r.run_id, r.finished_at, r.checkpoint_id, r.model_repo, r.model_sha "
            "FROM score_runs r WHERE r.run_id IN (SELECT unnest(?::VARCHAR[]))) "
            f"SELECT runs.run_id, runs.finished_at, {_PLACE_COLUMNS} FROM runs {_RUN_CHECKPOINTS}",
            [run_ids])} if runs else {}
        scope = "policy = ? AND task = ? AND lineage IN (SELECT unnest(?::VARCHAR[]))"
        firing = self.query(
            f"SELECT id, lineage, labels, starts_at, state, commit_sha, created_at FROM alerts WHERE {scope} "
            "AND status = 'firing' AND kind NOT IN ('meta', 'observe') "
            "QUALIFY row_number() OVER (PARTITION BY lineage ORDER BY created_at DESC, id DESC) = 1",
            [policy, task, lineages]) if runs else []
        for row in firing:
            row["labels"] = json.loads(row["labels"])
        sends = self.query(
            "SELECT a.lineage, d.receiver, max(CASE WHEN a.status = 'firing' THEN d.created_at END) AS last_firing_at, "
            "max(CASE WHEN a.status = 'resolved' THEN d.created_at END) AS last_resolved_at "
            "FROM deliveries d JOIN alerts a ON a.id = d.alert_id WHERE a.policy = ? AND a.task = ? "
            "AND a.lineage IN (SELECT unnest(?::VARCHAR[])) AND d.status != 'silenced' AND a.kind != 'observe' "
            "GROUP BY a.lineage, d.receiver", [policy, task, lineages]) if runs else []
        alert_keys = {r["alert_key"] for r in self.query(
            f"SELECT a.alert_key FROM alerts a JOIN {keys} k ON a.repo = k.repo AND a.commit_sha = k.sha "
            "WHERE a.policy = ? AND a.task = ?", [repos, commits, policy, task])} if runs else set()
        return LineageBatch(policy, task, placed, checkpoints, run_places, firing, sends, alert_keys)

    def write_outbox_rows(self, predictions: Sequence[Mapping[str, Any]], *, now: datetime,
                          before_commit: Any = None) -> dict[tuple[str, str, str], dict[str, int]]:
        """`write_outbox` for a whole batch with a fixed number of statements: the predictions,
        then their alerts, then the alerts' deliveries, each one bulk insert (in the rows'
        order, so ids follow it as they would one insert at a time). Same rules: a prediction
        already recorded for (policy, task, run_id) writes nothing (a `not_evaluated` one is
        replaced), nor does an alert whose key exists. Returns what each prediction wrote,
        by (policy, task, run_id)."""
        written: dict[tuple[str, str, str], dict[str, int]] = {
            (p["policy"], p["task"], p["run_id"]): {"predictions": 0, "alerts": 0, "deliveries": 0}
            for p in predictions}
        joined = self.in_transaction
        with self.transaction() as conn:
            if predictions:
                ids = self._insert_predictions(conn, predictions)
                alerts = [(a, ids[(p["policy"], p["task"], p["run_id"])], (p["policy"], p["task"], p["run_id"]))
                          for p in predictions if (p["policy"], p["task"], p["run_id"]) in ids
                          for a in p.get("alerts", ())]
                for key in ids:
                    written[key]["predictions"] = 1
                alert_ids = self._insert_alerts(conn, [(a, pid) for a, pid, _ in alerts])
                deliveries = [(alert_ids[a["alert_key"]], a, d) for a, _, _ in alerts if a["alert_key"] in alert_ids
                              for d in a["deliveries"]]
                self._insert_deliveries(conn, deliveries, now)
                for alert, _, key in alerts:
                    if alert["alert_key"] in alert_ids and alert["deliveries"]:
                        written[key]["alerts"] += 1
                        written[key]["deliveries"] += len(alert["deliveries"])
            if before_commit is not None:
                before_commit(conn)
        if not joined:
            self.checkpoint()
        return written

    def _insert_predictions(self, conn: duckdb.DuckDBPyConnection,
                            predictions: Sequence[Mapping[str, Any]]) -> dict[tuple[str, str, str], int]:
        keys = [[p[c] for p in predictions] for c in ("policy", "task", "run_id")]
        # a `not_evaluated` record of the same run is replaced (the unique key would refuse the insert)
        conn.execute("DELETE FROM predictions WHERE state = 'not_evaluated' AND (policy, task, run_id) IN "
                     "(SELECT unnest(?::VARCHAR[]), unnest(?::VARCHAR[]), unnest(?::VARCHAR[]))", keys)
        columns = [[json.dumps(p[c], sort_keys=True, default=str) if c == "detail" else p[c] for p in predictions]
                   for c in self._PREDICTION_COLUMNS]
        rows = conn.execute(
            f"INSERT INTO predictions ({', '.join(self._PREDICTION_COLUMNS)}) SELECT "
            f"{', '.join(self._PREDICTION_COLUMNS)} FROM (SELECT "
            + ", ".join(f"unnest(?::{_PREDICTION_TYPES[c]}[]) AS {c}" for c in self._PREDICTION_COLUMNS)
            + ", unnest(range(?)) AS ord) ORDER BY ord ON CONFLICT (policy, task, run_id) DO NOTHING "
            "RETURNING id, policy, task, run_id", [*columns, len(predictions)]).fetchall()
        return {(r[1], r[2], r[3]): int(r[0]) for r in rows}

    def _insert_alerts(self, conn: duckdb.DuckDBPyConnection,
                       alerts: Sequence[tuple[Mapping[str, Any], int | None]]) -> dict[str, int]:
        """Insert alerts (each with its prediction's id) unless their key exists; {key: id} of those written."""
        fresh: dict[str, tuple[Mapping[str, Any], int | None]] = {}
        for alert, prediction_id in alerts:   # one statement may not write a key twice
            fresh.setdefault(alert["alert_key"], (alert, prediction_id))
        if not fresh:
            return {}
        chosen = list(fresh.values())
        columns = [[json.dumps(a[c], sort_keys=True) if c in ("labels", "annotations", "numbers") else a[c]
                    for a, _ in chosen] for c in self._ALERT_COLUMNS]
        rows = conn.execute(
            f"INSERT INTO alerts ({', '.join(self._ALERT_COLUMNS)}, prediction_id) SELECT "
            f"{', '.join(self._ALERT_COLUMNS)}, prediction_id FROM (SELECT "
            + ", ".join(f"unnest(?::{_ALERT_TYPES.get(c, 'VARCHAR')}[]) AS {c}" for c in self._ALERT_COLUMNS)
            + ", unnest(?::BIGINT[]) AS prediction_id, unnest(range(?)) AS ord) ORDER BY ord "
            "ON CONFLICT (alert_key) DO NOTHING RETURNING id, alert_key",
            [*columns, [pid for _, pid in chosen], len(chosen)]).fetchall()
        return {r[1]: int(r[0]) for r in rows}

    @staticmethod
    def _insert_deliveries(conn: duckdb.DuckDBPyConnection,
                           deliveries: Sequence[tuple[int, Mapping[str, Any], Mapping[str, Any]]], now: datetime) -> None:
        if not deliveries:
            return
        conn.execute(
            "INSERT INTO deliveries (alert_id, policy, receiver, group_key, group_labels, group_wait_s, "
            "group_interval_s, status, created_at, updated_at) SELECT alert_id, policy, receiver, group_key, "
            "group_labels, group_wait_s, group_interval_s, 'pending', ?, ? FROM (SELECT "
            "unnest(?::BIGINT[]) AS alert_id, unnest(?::VARCHAR[]) AS policy, unnest(?::VARCHAR[]) AS receiver, "
            "unnest(?::VARCHAR[]) AS group_key, unnest(?::VARCHAR[]) AS group_labels, "
            "unnest(?::DOUBLE[]) AS group_wait_s, unnest(?::DOUBLE[]) AS group_interval_s, "
            "unnest(range(?)) AS ord) ORDER BY ord",
            [now, now, [i for i, _, _ in deliveries], [a["policy"] for _, a, _ in deliveries],
             [d["receiver"] for _, _, d in deliveries], [d["group_key"] for _, _, d in deliveries],
             [json.dumps(d["group_labels"], sort_keys=True) for _, _, d in deliveries],
             [d["group_wait_s"] for _, _, d in deliveries], [d["group_interval_s"] for _, _, d in deliveries],
             len(deliveries)])

    def pending_deliveries(self) -> list[PendingDeliveryRow]:
        """Deliveries not yet put into a notification, with their alert's labels, oldest first."""
        rows = self.query(
            "SELECT d.id, d.alert_id, d.policy, d.receiver, d.group_key, d.group_labels, d.group_wait_s,"
            " d.group_interval_s, d.created_at, a.labels, a.kind FROM deliveries d JOIN alerts a "
            "ON a.id = d.alert_id WHERE d.status = 'pending' ORDER BY d.created_at, d.id")
        for r in rows:
            r["labels"] = json.loads(r["labels"])
            r["group_labels"] = json.loads(r["group_labels"])
        return [PendingDeliveryRow.from_row(r) for r in rows]

    def set_deliveries_status(self, delivery_ids: Sequence[int], status: str, *, now: datetime,
                              reason: str | None = None, silence_id: str | None = None) -> int:
        """Move pending deliveries to `status` (silenced, dead); returns rows changed."""
        if not delivery_ids:
            return 0
        marks = ", ".join("?" for _ in delivery_ids)
        with self.transaction() as conn:
            return int(conn.execute(
                f"UPDATE deliveries SET status = ?, reason = ?, silence_id = ?, updated_at = ? "
                f"WHERE id IN ({marks}) AND status = 'pending'",
                [status, reason, silence_id, now, *delivery_ids]).fetchone()[0])

    def alerts_by_id(self, alert_ids: Sequence[int]) -> list[AlertRow]:
        """Alert rows (JSON decoded) in the order of `alert_ids`."""
        return [AlertRow.from_row(r) for r in self._alert_columns(alert_ids)]

    def _alert_columns(self, alert_ids: Sequence[int]) -> list[dict[str, Any]]:
        if not alert_ids:
            return []
        marks = ", ".join("?" for _ in alert_ids)
        rows = {r["id"]: r for r in self.query_json(f"SELECT * FROM alerts WHERE id IN ({marks})", list(alert_ids),
                                                    ("labels", "annotations", "numbers"))}
        return [rows[i] for i in alert_ids]

    # reading alerts back (lstar alerts list|show|retry)
    def list_alerts(self, *, limit: int = 50, policy: str | None = None) -> list[AlertSummaryRow]:
        """Newest alerts first, each with a `deliveries` summary [{receiver, status, reason}]."""
        where, params = ("WHERE a.policy = ?", [policy]) if policy else ("", [])
        rows = self.query(f"SELECT a.id, a.created_at, a.kind, a.policy, a.task, a.repo, a.commit_sha, "
                          f"a.state, a.status FROM alerts a {where} ORDER BY a.created_at DESC, a.id DESC "
                          f"LIMIT ?", [*params, limit])
        ids = [r["id"] for r in rows]
        per: dict[int, list[DeliverySummaryRow]] = {}
        if ids:
            marks = ", ".join("?" for _ in ids)
            for d in self.query(f"SELECT alert_id, receiver, status, reason, notification_id FROM deliveries "
                                f"WHERE alert_id IN ({marks}) ORDER BY id", ids):
                per.setdefault(d.pop("alert_id"), []).append(DeliverySummaryRow.from_row(d))
        return [AlertSummaryRow.from_row({**r, "deliveries": per.get(r["id"], [])}) for r in rows]

    def current_alert_labels(self) -> list[dict[str, str]]:
        """The labels of the alerts in force: the newest alert of each (policy, task, lineage)
        when it is firing (a later resolved alert ends it). An operator alert's lineage is its
        subject, so the newest one per subject counts."""
        rows = self.query_json(
            "SELECT labels FROM (SELECT labels, status, row_number() OVER (PARTITION BY policy, task, lineage, "
            "kind = 'meta' ORDER BY created_at DESC, id DESC) AS n FROM alerts) WHERE n = 1 AND status = 'firing'",
            [], ("labels",))
        return [dict(r["labels"]) for r in rows]

    def alert_detail(self, alert_id: int) -> AlertDetailRow | None:
        """One alert with its prediction, deliveries, notifications and every attempt."""
        if not self.query("SELECT id FROM alerts WHERE id = ?", [alert_id]):
            return None
        alert = self._alert_columns([alert_id])[0]
        deliveries = [DeliveryRow.from_row(d) for d in
                      self.query("SELECT * FROM deliveries WHERE alert_id = ? ORDER BY id", [alert_id])]
        notifications = []
        for nid in sorted({d.notification_id for d in deliveries if d.notification_id}):
            n = self.query("SELECT id, receiver, status, attempts, next_attempt_at, last_error, dead_reason, "
                           "created_at, delivered_at FROM notifications WHERE id = ?", [nid])[0]
            notifications.append(NotificationAttemptsRow.from_row({**n, "attempts_log": self.delivery_attempts(nid)}))
        pred = self.query_json("SELECT * FROM predictions WHERE id = ?", [alert["prediction_id"]], ("detail",)) \
            if alert["prediction_id"] is not None else []
        return AlertDetailRow.from_row({**alert, "deliveries": deliveries, "notifications": notifications,
                                        "prediction": PredictionRow.from_row(pred[0]) if pred else None})

    # -- operator alerts (raised by the daemon itself) ------------------------------------------
    def raise_operator_alerts(self, alerts: Sequence[Mapping[str, Any]], *, now: datetime,
                              hub_outage_id: int | None = None, evaluation_gap_id: int | None = None,
                              miscalibration_id: int | None = None) -> int:
        """Insert operator alerts (meta-alerts with deliveries) in one transaction.

        With `hub_outage_id` (or `evaluation_gap_id`), that episode is marked alerted in the
        same transaction (compare-and-set), and nothing is written if it already was: one
        meta-alert per episode however often the daemon restarts. Returns the deliveries written.
        """
        episodes = [(table, episode_id) for table, episode_id in
                    (("hub_outages", hub_outage_id), ("evaluation_gaps", evaluation_gap_id),
                     ("curve_miscalibrations", miscalibration_id)) if episode_id is not None]
        written = 0
        with self.transaction() as conn:
            for table, episode_id in episodes:   # table: one of the two names above, never input
                n = conn.execute(f"UPDATE {table} SET alerted_at = ? WHERE id = ? AND alerted_at IS NULL",
                                 [now, episode_id]).fetchone()[0]
                if n != 1:
                    return 0
            for alert in alerts:
                written += self._insert_alert(conn, alert, None, now)
        return written
