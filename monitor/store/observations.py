"""Active evaluations (`observations`): the queue of evaluation jobs with its leases, the
observed labels, the curves' track records and their miscalibration episodes.

The queue works like the checkpoint queue (`monitor.hub.queue`): a job is claimed with a
compare-and-set (attempts + 1, lease owner, expiry), completed only by the owner that still
holds the lease, in the transaction that writes its result; a lease left by a dead daemon is
freed at the next start (`reclaim_observation_leases`) and the job runs again, at most
`max_attempts` times in all.

A job whose task file changed before it ran is superseded (`supersede_observations`): its row
is kept with status `superseded`, the reason and `superseded_by`, and a row of the next
`generation` checks the same prediction with the new file, within the same day's budget.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import date, datetime, timedelta
from typing import Any

import duckdb

from monitor.store.connection import StoreConnection
from monitor.store.rows import ReclaimedLease

_JSON = ("settings", "meta")
# The reason a superseded row shows in the summary (its own names the row that replaced it).
SUPERSEDED_SUMMARY = "task file changed before it ran; replaced by an evaluation of the new file"
# What a replacement row copies from the row it supersedes: the prediction it checks.
_SUPERSEDE_KEEPS = ("policy", "task", "run_id", "prediction_id", "checkpoint_id", "repo", "commit_sha", "lineage",
                    "curve_id", "predicted_state", "predicted_lo", "predicted_hi", "predicted_p", "level",
                    "confidence", "scheduled_day")


def _decode(row: dict[str, Any]) -> dict[str, Any]:
    for key in _JSON:
        if isinstance(row.get(key), str):
            row[key] = json.loads(row[key])
    return row


class ObservationRows(StoreConnection):
    """Evaluation jobs, their results, and the track record they make."""

    # -- scheduling ---------------------------------------------------------------------------
    def observation_candidates(self, policy: str, task: str, states: Sequence[str], *,
                               since: datetime, derivatives_only: bool = False) -> list[dict[str, Any]]:
        """Predictions of (policy, task) made since `since`, in one of `states`, with an
        interval, that have no observation row yet, oldest first (with the checkpoint id of
        their score run); `derivatives_only`: only those of checkpoints that declare a base."""
        if not states:
            return []
        marks = ", ".join("?" for _ in states)
        only = ("AND EXISTS (SELECT 1 FROM checkpoint_bases b JOIN checkpoints c ON c.id = b.checkpoint_id "
                "WHERE c.repo = p.repo AND c.sha = p.commit_sha) " if derivatives_only else "")
        rows = self.query(
            "SELECT p.id AS prediction_id, p.run_id, p.repo, p.commit_sha, p.lineage, p.curve_id, p.state, "
            "p.lo, p.hi, p.p_hat, p.threshold, p.detail, r.checkpoint_id FROM predictions p "
            "LEFT JOIN score_runs r ON r.run_id = p.run_id "
            "WHERE p.policy = ? AND p.task = ? AND p.state IN (" + marks + ") AND p.lo IS NOT NULL "
            "AND p.hi IS NOT NULL AND p.threshold IS NOT NULL AND p.curve_id IS NOT NULL AND p.evaluated_at >= ? "
            + only + "AND NOT EXISTS (SELECT 1 FROM observations o WHERE o.policy = p.policy AND o.task = p.task "
            "AND o.run_id = p.run_id) ORDER BY p.evaluated_at, p.id", [policy, task, *states, since])
        for r in rows:
            r["detail"] = json.loads(r["detail"]) if isinstance(r["detail"], str) else r["detail"]
        return rows

    def observations_started_on(self, policy: str, day: date) -> int:
        """Evaluations of `policy` that count against the budget of UTC day `day`."""
        # a superseded row's place in the budget goes to the row that replaced it
        return int(self.query("SELECT count(*) AS n FROM observations WHERE policy = ? AND scheduled_day = ? "
                              "AND status NOT IN ('skipped', 'superseded')", [policy, day])[0]["n"])

    def schedule_observation(self, row: Mapping[str, Any], *, now: datetime) -> bool:
        """Insert one observation row (pending, or skipped with its reason); False when one
        exists for its (policy, task, run)."""
        columns = ("policy", "task", "run_id", "prediction_id", "checkpoint_id", "repo", "commit_sha",
                   "lineage", "curve_id", "predicted_state", "predicted_lo", "predicted_hi", "predicted_p",
                   "level", "confidence", "settings", "status", "reason", "scheduled_day")
        values = [json.dumps(row[c], sort_keys=True) if c == "settings" else row.get(c) for c in columns]
        with self.transaction() as conn:
            got = conn.execute(
                f"INSERT INTO observations ({', '.join(columns)}, created_at, updated_at) VALUES "
                f"({', '.join('?' for _ in columns)}, ?, ?) ON CONFLICT (policy, task, run_id, generation) DO NOTHING "
                "RETURNING id", [*values, now, now]).fetchone()
        return got is not None

    def supersede_observations(self, policy: str, task: str, settings: Mapping[str, Any], *, file: str,
                               now: datetime) -> list[tuple[int, int]]:
        """Replace each evaluation of (policy, task) that has not run with a task file other than
        `settings["task_sha256"]` by a new pending row of the next generation with `settings`;
        returns [(superseded id, new id)].

        Replaced: pending rows not leased (a leased one is running; it is looked at again once
        its lease is given back), and nothing else: a failed row stays failed whatever its
        reason says (rows the code before supersession failed for a changed file were made
        pending once, by migration 0014). The new row keeps the prediction, the scheduled day
        (its place in that day's budget) and gets no attempt used.
        """
        sha = settings.get("task_sha256")
        out: list[tuple[int, int]] = []
        with self.transaction() as conn:
            rows = conn.execute(
                "SELECT * FROM observations WHERE policy = ? AND task = ? AND superseded_by IS NULL AND "
                "status = 'pending' AND (lease_owner IS NULL OR lease_expires_at < ?) ORDER BY id",
                [policy, task, now]).fetchall()
            names = [d[0] for d in conn.description]
            for values in rows:
                row = _decode(dict(zip(names, values)))
                before = row["settings"].get("task_sha256")
                if before == sha:
                    continue
                kept = {c: row[c] for c in _SUPERSEDE_KEEPS}
                columns = [*kept, "settings", "status", "generation", "meta", "created_at", "updated_at"]
                new_id = int(conn.execute(
                    f"INSERT INTO observations ({', '.join(columns)}) VALUES ({', '.join('?' for _ in columns)}) "
                    "RETURNING id", [*kept.values(), json.dumps(dict(settings), sort_keys=True), "pending",
                                     int(row["generation"]) + 1, json.dumps({"supersedes": row["id"]}), now,
                                     now]).fetchone()[0])
                reason = (f"task file {file} changed (sha256 {str(before)[:12]} -> {str(sha)[:12]}) before this "
                          f"evaluation ran; evaluation {new_id} runs the new file")
                conn.execute("UPDATE observations SET status = 'superseded', superseded_by = ?, reason = ?, "
                             "lease_owner = NULL, lease_expires_at = NULL, lease_started_at = NULL, "
                             "updated_at = ?, finished_at = ? WHERE id = ?", [new_id, reason, now, now, row["id"]])
                out.append((int(row["id"]), new_id))
        return out

    def superseded_observations(self, policy: str, *, since: datetime | None = None,
                                until: datetime | None = None) -> list[dict[str, Any]]:
        """The evaluations of `policy` superseded in (`since`, `until`] (a report's window; either
        end open when None), oldest first: which (id, task, checkpoint, the task file sha256 it
        was scheduled with), why (`reason`), and by which (`superseded_by`, its sha256 and status)."""
        where, params = "", []
        if since is not None:
            where, params = where + "AND o.finished_at > ? ", [*params, since]
        if until is not None:
            where, params = where + "AND o.finished_at <= ? ", [*params, until]
        rows = self.query(
            "SELECT o.id, o.task, o.repo, o.commit_sha, o.settings, o.reason, o.finished_at AS superseded_at, "
            "o.superseded_by, n.settings AS by_settings, n.status AS by_status FROM observations o "
            "LEFT JOIN observations n ON n.id = o.superseded_by WHERE o.policy = ? AND o.status = 'superseded' "
            f"{where}ORDER BY o.finished_at, o.id", [policy, *params])
        out = []
        for r in rows:
            old, new = (json.loads(r.pop(k)) if isinstance(r.get(k), str) else (r.pop(k) or {})
                        for k in ("settings", "by_settings"))
            out.append({**r, "task_sha256": old.get("task_sha256"), "by_task_sha256": new.get("task_sha256")})
        return out

    # -- the queue ----------------------------------------------------------------------------
    def claim_observation(self, owner: str, *, now: datetime, lease_s: float, max_attempts: int,
                          exclude: Sequence[int] = ()) -> dict[str, Any] | None:
        """Lease the oldest pending observation (unleased or its lease expired); rows that used
        `max_attempts` fail on the way with their last reason."""
        with self.transaction() as conn:
            while True:
                skip = f"AND id NOT IN ({', '.join(str(int(i)) for i in exclude)}) " if exclude else ""
                row = conn.execute(
                    "SELECT id, attempts, reason FROM observations WHERE status = 'pending' AND "
                    f"(lease_owner IS NULL OR lease_expires_at < ?) {skip}ORDER BY created_at, id LIMIT 1",
                    [now]).fetchone()
                if row is None:
                    return None
                obs_id, attempts, reason = row
                if attempts >= max_attempts:
                    conn.execute("UPDATE observations SET status = 'failed', reason = ?, lease_owner = NULL, "
                                 "lease_expires_at = NULL, lease_started_at = NULL, updated_at = ?, "
                                 "finished_at = ? WHERE id = ?",
                                 [f"gave up after {attempts} attempts: {reason or 'no reason recorded'}",
                                  now, now, obs_id])
                    continue
                conn.execute("UPDATE observations SET attempts = attempts + 1, lease_owner = ?, "
                             "lease_expires_at = ?, lease_started_at = ?, updated_at = ? WHERE id = ?",
                             [owner, now + timedelta(seconds=lease_s), now, now, obs_id])
                break
        return self.observation(obs_id)

    def observation(self, obs_id: int) -> dict[str, Any] | None:
        rows = self.query("SELECT * FROM observations WHERE id = ?", [obs_id])
        return _decode(rows[0]) if rows else None

    def set_observation_digest(self, obs_id: int, owner: str, digest: str, *, now: datetime) -> bool:
        """Record the job's content digest while it holds the lease (CAS on the owner)."""
        with self.transaction() as conn:
            n = conn.execute("UPDATE observations SET digest = ?, updated_at = ? WHERE id = ? AND lease_owner = ?",
                             [digest, now, obs_id, owner]).fetchone()[0]
        return n == 1

    def observation_with_digest(self, digest: str) -> dict[str, Any] | None:
        """A finished observation of the same content (weights, task file, evaluator settings)."""
        rows = self.query("SELECT * FROM observations WHERE digest = ? AND status = 'done' AND linked_from IS NULL "
                          "ORDER BY finished_at, id LIMIT 1", [digest])
        return _decode(rows[0]) if rows else None

    def complete_observation(self, obs_id: int, owner: str, *, status: str, now: datetime,
                             fields: Mapping[str, Any] | None = None, reason: str | None = None,
                             eval_run: Mapping[str, Any] | None = None,
                             alerts: Sequence[Mapping[str, Any]] = ()) -> bool:
        """Finish a job if `owner` still holds its lease: its result columns, the evaluation
        run holding the observed metrics and the alerts it raises (with their deliveries), in
        one transaction. False (nothing written) when the lease was lost."""
        fields = dict(fields or {})
        if "meta" in fields:
            fields["meta"] = json.dumps(fields["meta"], sort_keys=True, default=str)
        sets = "".join(f", {c} = ?" for c in fields)
        with self.transaction() as conn:
            n = conn.execute(
                f"UPDATE observations SET status = ?, reason = ?, lease_owner = NULL, lease_expires_at = NULL, "
                f"lease_started_at = NULL, updated_at = ?, finished_at = ?{sets} WHERE id = ? AND lease_owner = ?",
                [status, reason, now, now, *fields.values(), obs_id, owner]).fetchone()[0]
            if n != 1:   # the lease was lost: the UPDATE matched no row, nothing is written
                return False
            if eval_run is not None:
                _insert_eval_run(conn, eval_run, now)
            for alert in alerts:
                self._insert_alert(conn, alert, None, now)  # type: ignore[attr-defined] - AlertRows, in Store
        return True

    def release_observation(self, obs_id: int, owner: str, reason: str, *, now: datetime,
                            refund: bool = False) -> bool:
        """Give a lease back after a retryable failure (`refund`: the attempt too)."""
        with self.transaction() as conn:
            n = conn.execute(
                "UPDATE observations SET lease_owner = NULL, lease_expires_at = NULL, lease_started_at = NULL, "
                f"reason = ?, updated_at = ?{', attempts = attempts - 1' if refund else ''} "
                "WHERE id = ? AND lease_owner = ?", [reason, now, obs_id, owner]).fetchone()[0]
        return n == 1

    def reclaim_observation_leases(self, owner: str, *, now: datetime) -> list[ReclaimedLease]:
        """Free every observation lease not held by `owner` (the daemon at start; every other
        holder is dead). The dead attempt stays counted and is appended to `meta.interrupted`."""
        freed: list[ReclaimedLease] = []
        with self.transaction() as conn:
            rows = conn.execute("SELECT id, attempts, lease_owner, coalesce(lease_started_at, updated_at), meta "
                                "FROM observations WHERE lease_owner IS NOT NULL AND lease_owner != ? ORDER BY id",
                                [owner]).fetchall()
            for obs_id, attempts, previous, started_at, meta_text in rows:
                meta = json.loads(meta_text) if meta_text else {}
                meta["interrupted"] = [*meta.get("interrupted", []),
                                       {"attempt": attempts, "owner": previous, "started_at": started_at.isoformat(),
                                        "reclaimed_at": now.isoformat(), "reclaimed_by": owner}]
                conn.execute("UPDATE observations SET lease_owner = NULL, lease_expires_at = NULL, "
                             "lease_started_at = NULL, reason = ?, meta = ?, updated_at = ? WHERE id = ? "
                             "AND lease_owner = ?",
                             [f"{previous} died during attempt {attempts} (started {started_at.isoformat()}); "
                              f"its lease was reclaimed by {owner} at start",
                              json.dumps(meta, sort_keys=True), now, obs_id, previous])
                freed.append(ReclaimedLease("observations", str(obs_id), previous, attempts, started_at))
        return freed

    # -- reading ------------------------------------------------------------------------------
    def observations(self, *, policy: str | None = None, status: str | None = None,
                     limit: int = 1000) -> list[dict[str, Any]]:
        """Observation rows, newest first."""
        where, params = [], []
        if policy is not None:
            where.append("policy = ?")
            params.append(policy)
        if status is not None:
            where.append("status = ?")
            params.append(status)
        clause = f"WHERE {' AND '.join(where)} " if where else ""
        rows = self.query(f"SELECT * FROM observations {clause}ORDER BY created_at DESC, id DESC LIMIT ?",
                          [*params, int(limit)])
        return [_decode(r) for r in rows]

    def observed_states(self, pairs: Sequence[tuple[str, str]], *,
                        until: datetime | None = None) -> dict[tuple[str, str], list[dict[str, Any]]]:
        """{(repo, sha): [{policy, task, predicted_state, observed_state, verdict, observed,
        observed_lo, observed_hi}, ...]} of the finished observations of these checkpoints
        (those finished by `until` when given: a report of a past window reads the state then)."""
        bound, bound_params = ("WHERE o.finished_at <= ? ", [until]) if until is not None else ("", [])
        out: dict[tuple[str, str], list[dict[str, Any]]] = {}
        pairs = sorted(set(pairs))
        if not pairs:
            return out
        # one query whatever the number of pairs (two list parameters, joined, not a placeholder each)
        rows = self.query(
            "SELECT o.repo, o.commit_sha, o.policy, o.task, o.predicted_state, o.observed_state, o.verdict, o.observed, "
            "o.observed_lo, o.observed_hi, o.status, o.reason FROM observations o JOIN (SELECT unnest(?::VARCHAR[]) "
            "AS repo, unnest(?::VARCHAR[]) AS sha) k ON k.repo = o.repo AND k.sha = o.commit_sha "
            f"{bound}ORDER BY o.id",
            [[r for r, _ in pairs], [c for _, c in pairs], *bound_params])
        for r in rows:
            out.setdefault((r.pop("repo"), r.pop("commit_sha")), []).append(r)
        return out

    def observation_summary(self) -> list[dict[str, Any]]:
        """Observations grouped by (policy, task, status, observed state, verdict, reason): what
        `lstar status` shows. Superseded rows are grouped without their reason (each names its
        own replacement), so the summary does not grow with every supersession."""
        rows = self.query(
            "SELECT policy, task, status, observed_state, verdict, "
            f"CASE WHEN status = 'superseded' THEN '{SUPERSEDED_SUMMARY}' ELSE reason END AS reason, count(*) AS n "
            "FROM observations GROUP BY ALL ORDER BY policy, task, status, observed_state, verdict")
        return [{**r, "n": int(r["n"])} for r in rows]

    def track_record(self, policy: str | None = None) -> list[dict[str, Any]]:
        """Every checked prediction (a finished observation), oldest first: the curve, the
        predicted interval, the observation and its interval, inside or not, the verdict."""
        where, params = ("AND policy = ? ", [policy]) if policy else ("", [])
        # A derivative's observation measures its post-training residual, not the curve's error.
        not_derivative = ("AND NOT EXISTS (SELECT 1 FROM checkpoint_bases b JOIN checkpoints c ON "
                          "c.id = b.checkpoint_id WHERE c.repo = o.repo AND c.sha = o.commit_sha) ")
        return self.query(
            "SELECT id, policy, task, curve_id, repo, commit_sha, lineage, predicted_state, predicted_lo, "
            "predicted_hi, predicted_p, level, confidence, observed, n, k, observed_lo, observed_hi, "
            "interval_method, observed_state, verdict, inside, finished_at FROM observations o "
            f"WHERE status = 'done' {where}{not_derivative}ORDER BY finished_at, id", params)

    # -- miscalibration episodes --------------------------------------------------------------
    def open_miscalibration(self, policy: str, curve_id: str) -> dict[str, Any] | None:
        rows = self.query("SELECT * FROM curve_miscalibrations WHERE policy = ? AND curve_id = ? AND ended_at IS NULL "
                          "ORDER BY id DESC LIMIT 1", [policy, curve_id])
        return rows[0] if rows else None

    def start_miscalibration(self, policy: str, curve_id: str, detail: Mapping[str, Any], *, now: datetime) -> int:
        with self.transaction() as conn:
            return int(conn.execute("INSERT INTO curve_miscalibrations (policy, curve_id, detail, started_at) "
                                    "VALUES (?, ?, ?, ?) RETURNING id",
                                    [policy, curve_id, json.dumps(dict(detail), sort_keys=True, default=str),
                                     now]).fetchone()[0])

    def end_miscalibration(self, episode_id: int, *, now: datetime) -> None:
        with self.transaction() as conn:
            conn.execute("UPDATE curve_miscalibrations SET ended_at = ? WHERE id = ? AND ended_at IS NULL",
                         [now, episode_id])

    def miscalibrations(self, policy: str | None = None) -> list[dict[str, Any]]:
        where, params = ("WHERE policy = ? ", [policy]) if policy else ("", [])
        return self.query(f"SELECT * FROM curve_miscalibrations {where}ORDER BY id", params)


def _insert_eval_run(conn: duckdb.DuckDBPyConnection, run: Mapping[str, Any], now: datetime) -> None:
    conn.execute(
        "INSERT INTO eval_runs (run_id, model_repo, model_sha, model_source, task, task_sha256, n_items, item_limit, "
        "tokenizer_fingerprint, dtype, device, metrics, model, wall_s, finished_at) VALUES "
        "(?, ?, ?, ?, ?, ?, ?, NULL, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (run_id) DO NOTHING",
        [run["run_id"], run["model_repo"], run["model_sha"], "hub", run["task"], run["task_sha256"] or "",
         run["n_items"], run["tokenizer_fingerprint"], run["dtype"], run["device"],
         json.dumps(run["metrics"], sort_keys=True, default=str),
         json.dumps(run["model"], sort_keys=True, default=str), run["wall_s"], now])
