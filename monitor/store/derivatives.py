"""Derivatives and their bases, read for judging and showing them: reference-base rows, the
pair of coordinates (L*(base), L*(θ)) and the labelled base/derivative pairs of a relation.

The lineage itself is written by the gate (`checkpoint_bases`, `CheckpointRows`); everything
here is read from it, the score runs and the labels, so nothing is stored twice.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from monitor.store.connection import StoreConnection
from monitor.store.placing import META_COLUMNS, META_VALUES
from monitor.store.rows import EVALUATION_AXIS_COLUMNS

# What a complete score run carries to be read on any curve axis and checked against a curve's
# corpus and scoring spec.
_RUN_COLUMNS = ("run_id", "model_repo", "model_sha", "corpus_sha256", "spec_version", "window_len", "stride",
                "prefix_policy", "lstar", "se_ce", *EVALUATION_AXIS_COLUMNS, "finished_at")
_SPEC_KEYS = ("spec_version", "window_len", "stride", "prefix_policy")
# Checkpoint statuses from which a score may still come.
PENDING_STATUSES = ("discovered", "gated", "fetched")


# derivative_keys's answers: {database path: (marker, keys)} (see there).
_DERIVATIVE_KEYS: dict[str, tuple[tuple[Any, ...], frozenset[tuple[str, str]]]] = {}


class DerivativeRows(StoreConnection):
    """Derivatives, their bases and what judging them reads."""

    # -- reference bases ---------------------------------------------------------------------
    def unqueued_bases(self) -> list[dict[str, Any]]:
        """Pinned bases that have no checkpoint row, each with the derivatives declaring it
        (checkpoint id, repo, sha, rule, relation), oldest derivative first."""
        rows = self.query(
            "SELECT b.base_repo, b.base_sha, b.checkpoint_id, c.repo, c.sha, c.rule, b.relation "
            "FROM checkpoint_bases b JOIN checkpoints c ON c.id = b.checkpoint_id "
            "WHERE b.base_repo IS NOT NULL AND b.base_sha IS NOT NULL AND NOT EXISTS "
            "(SELECT 1 FROM checkpoints x WHERE x.repo = b.base_repo AND x.sha = b.base_sha) "
            "ORDER BY b.base_repo, b.base_sha, b.checkpoint_id")
        out: dict[tuple[str, str], dict[str, Any]] = {}
        for r in rows:
            entry = out.setdefault((r["base_repo"], r["base_sha"]),
                                   {"repo": r["base_repo"], "sha": r["base_sha"], "derivatives": []})
            entry["derivatives"].append({"checkpoint": int(r["checkpoint_id"]), "repo": r["repo"], "sha": r["sha"],
                                         "rule": r["rule"], "relation": r["relation"]})
        return list(out.values())

    def add_reference_base(self, repo: str, sha: str, *, why: Mapping[str, Any], now: datetime,
                           rule: str | None = None) -> int | None:
        """Queue (repo, sha) as a Hub checkpoint of its own (status `discovered`, no refs, `rule`
        a marker no watch rule is named), with `why` in its meta under `reference_base`; the new
        row's id, or None when the store already has that commit (never twice)."""
        meta = json.dumps({"reference_base": dict(why)}, sort_keys=True, default=str)
        with self.transaction() as conn:
            got = conn.execute(
                f"INSERT INTO checkpoints (repo, sha, source, refs, lineage, rule, discovered_at, updated_at, "
                f"status, reason, {META_COLUMNS}) VALUES (?, ?, 'hub', '[]', ?, ?, ?, ?, 'discovered', NULL, "
                f"{META_VALUES}) ON CONFLICT DO NOTHING RETURNING id", [repo, sha, repo, rule, now, now, meta, meta]).fetchone()
        return int(got[0]) if got else None

    # -- the two coordinates -----------------------------------------------------------------
    def hub_checkpoint_base(self, repo: str, sha: str) -> dict[str, Any] | None:
        """The lineage of the checkpoint (repo, sha) (as `checkpoint_base`), with the id, status
        and reason of the base's own row (None when the store has none); None for a checkpoint
        that declares no base. One lookup by the checkpoint's unique key."""
        rows = self.query(
            "SELECT b.*, x.id AS base_checkpoint_id, x.status AS base_status, x.reason AS base_reason "
            "FROM checkpoints c JOIN checkpoint_bases b ON b.checkpoint_id = c.id "
            "LEFT JOIN checkpoints x ON x.repo = b.base_repo AND x.sha = b.base_sha "
            "WHERE c.repo = ? AND c.sha = ? LIMIT 1", [repo, sha])
        if not rows:
            return None
        out = dict(rows[0])
        out["bases"] = json.loads(out["bases"]) if isinstance(out["bases"], str) else out["bases"]
        return out

    def hub_checkpoint_bases(self, pairs: Sequence[tuple[str, str]]) -> dict[tuple[str, str], dict[str, Any]]:
        """`hub_checkpoint_base` of many checkpoints at once: {(repo, sha): its lineage} for
        each of `pairs` that declares a base, in one query whatever their number (the pairs
        travel as two list parameters, not as one placeholder each)."""
        keys = sorted(set(pairs))
        if not keys:
            return {}
        rows = self.query(
            "SELECT c.repo AS c_repo, c.sha AS c_sha, b.*, x.id AS base_checkpoint_id, x.status AS base_status, "
            "x.reason AS base_reason FROM (SELECT unnest(?::VARCHAR[]) AS repo, unnest(?::VARCHAR[]) AS sha) k "
            "JOIN checkpoints c ON c.repo = k.repo AND c.sha = k.sha "
            "JOIN checkpoint_bases b ON b.checkpoint_id = c.id "
            "LEFT JOIN checkpoints x ON x.repo = b.base_repo AND x.sha = b.base_sha "
            "QUALIFY row_number() OVER (PARTITION BY c.repo, c.sha ORDER BY c.id, x.id) = 1",
            [[k[0] for k in keys], [k[1] for k in keys]])
        out = {}
        for r in rows:
            row = dict(r)
            key = (row.pop("c_repo"), row.pop("c_sha"))
            row["bases"] = json.loads(row["bases"]) if isinstance(row["bases"], str) else row["bases"]
            out[key] = row
        return out

    def complete_scores(self, pairs: Sequence[tuple[str, str]], corpus_sha256: str | None = None
                        ) -> dict[tuple[str, str], list[dict[str, Any]]]:
        """The candidates `complete_score` chooses from, for many checkpoints in one query:
        {(repo, sha): the newest complete run per corpus and scoring spec (on `corpus_sha256`
        only, when given), newest first}; `pick_complete_score` then applies a corpus and a
        spec as `complete_score` does."""
        keys = sorted(set(pairs))
        if not keys:
            return {}
        corpus_clause = "AND r.corpus_sha256 = ? " if corpus_sha256 is not None else ""
        params: list[Any] = [[k[0] for k in keys], [k[1] for k in keys]]
        if corpus_sha256 is not None:
            params.append(corpus_sha256)
        rows = self.query(
            f"SELECT {', '.join('r.' + c for c in _RUN_COLUMNS)} FROM "
            "(SELECT unnest(?::VARCHAR[]) AS repo, unnest(?::VARCHAR[]) AS sha) k "
            "JOIN score_runs r ON r.model_repo = k.repo AND r.model_sha = k.sha "
            f"WHERE NOT r.partial {corpus_clause}"
            "QUALIFY row_number() OVER (PARTITION BY r.model_repo, r.model_sha, r.corpus_sha256, r.spec_version, "
            "r.window_len, r.stride, r.prefix_policy ORDER BY r.finished_at DESC, r.run_id DESC) = 1 "
            "ORDER BY r.model_repo, r.model_sha, r.finished_at DESC, r.run_id DESC", params)
        out: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for r in rows:
            out.setdefault((r["model_repo"], r["model_sha"]), []).append(dict(r))
        return out

    def derivative_keys(self) -> set[tuple[str, str]]:
        """(repo, sha) of every checkpoint that declares a base.

        Every evaluation tick asks, idle ones included; the join reads every base pair. The
        answer is kept per database file with a marker that changes whenever a base row or a
        checkpoint row is added or removed (the file's inode, their counts, the bases' newest rowid
        and the sum of their checkpoint ids), so an idle tick reads the marker only."""
        marker_row = self.query(
            "SELECT count(*) AS n, max(rowid) AS last, sum(checkpoint_id) AS ids, "
            "(SELECT count(*) FROM checkpoints) AS checkpoints FROM checkpoint_bases")[0]
        try:   # the file's identity too: a database made again at the same path is another one
            inode = os.stat(self.path).st_ino
        except (OSError, TypeError, ValueError):
            inode = None   # not a file (in memory): not kept
        marker = (inode, marker_row["n"], marker_row["last"], marker_row["ids"], marker_row["checkpoints"])
        where = str(self.path)
        cached = _DERIVATIVE_KEYS.get(where) if inode is not None else None
        if cached is not None and cached[0] == marker:
            return set(cached[1])
        keys = frozenset((r["repo"], r["sha"]) for r in self.query(
            "SELECT c.repo, c.sha FROM checkpoint_bases b JOIN checkpoints c ON c.id = b.checkpoint_id"))
        if inode is not None:
            _DERIVATIVE_KEYS[where] = (marker, keys)
        return set(keys)

    def complete_score(self, repo: str, sha: str, corpus_sha256: str | None = None,
                       spec: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
        """The newest complete (not partial) score run of (repo, sha), on `corpus_sha256` and with
        the scoring spec `spec` (spec_version, window_len, stride, prefix_policy) when given."""
        where, params = ["model_repo = ?", "model_sha = ?", "NOT partial"], [repo, sha]
        if corpus_sha256 is not None:
            where.append("corpus_sha256 = ?")
            params.append(corpus_sha256)
        for key in _SPEC_KEYS:
            if spec is not None and spec.get(key) is not None:
                where.append(f"{key} = ?")
                params.append(spec[key])
        rows = self.query(f"SELECT {', '.join(_RUN_COLUMNS)} FROM score_runs WHERE {' AND '.join(where)} "
                          "ORDER BY finished_at DESC, run_id DESC LIMIT 1", params)
        return dict(rows[0]) if rows else None

    def with_base_coordinates(self, checkpoints: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Checkpoint dicts with `base` (what each derives from, or None) and, for one whose
        base is scored, `coordinates`: its newest complete score and the base's newest complete
        score on the same corpus and spec, (L*(base), L*(θ)) with their SEs."""
        ids = sorted({int(c["id"]) for c in checkpoints if c.get("id") is not None})
        bases: dict[int, dict[str, Any]] = {}
        if ids:   # one read for the page; the score runs only for its derivatives
            marks = ", ".join("?" for _ in ids)
            for r in self.query(
                    "SELECT b.*, (SELECT min(c.id) FROM checkpoints c WHERE c.repo = b.base_repo AND c.sha = "
                    f"b.base_sha) AS base_checkpoint_id FROM checkpoint_bases b WHERE b.checkpoint_id IN ({marks})",
                    ids):
                r = dict(r)
                r["bases"] = json.loads(r["bases"]) if isinstance(r["bases"], str) else r["bases"]
                bases[int(r["checkpoint_id"])] = r
        # the score runs of the page's derivatives and of their bases: two batch reads
        pinned = [c for c in checkpoints if c.get("id") is not None
                  and (bases.get(int(c["id"])) or {}).get("base_sha")]
        owns = self.complete_scores([(c["repo"], c["sha"]) for c in pinned])
        theirs_all = self.complete_scores([(bases[int(c["id"])]["base_repo"], bases[int(c["id"])]["base_sha"])
                                           for c in pinned])
        out = []
        for c in checkpoints:
            base = bases.get(int(c["id"])) if c.get("id") is not None else None
            coordinates = None
            if base is not None and base.get("base_sha"):
                own = pick_complete_score(owns.get((c["repo"], c["sha"])))
                theirs = (pick_complete_score(theirs_all.get((base["base_repo"], base["base_sha"])), own,
                                              corpus_sha256=own["corpus_sha256"])
                          if own is not None else None)
                if own is not None and theirs is not None:
                    coordinates = pair_of_coordinates(theirs, own)
            shown = None if base is None else {
                "repo": base["base_repo"], "sha": base["base_sha"], "relation": base["relation"],
                "relation_source": base["relation_source"], "bases": base["bases"], "problem": base["problem"],
                "checkpoint_id": base["base_checkpoint_id"]}
            out.append({**c, "base": shown, "coordinates": coordinates})
        return out

    # -- labelled pairs ----------------------------------------------------------------------
    def observed_label(self, repo: str, sha: str, task: str, metric: str) -> dict[str, Any] | None:
        """The newest stored label of (repo, sha) for (task, metric): value, stderr, n, source."""
        rows = self.query("SELECT value, stderr, n, source, source_ref FROM labels WHERE repo = ? AND sha = ? "
                          "AND task = ? AND metric = ? ORDER BY created_at DESC, id DESC LIMIT 1",
                          [repo, sha, task, metric])
        return dict(rows[0]) if rows else None

    def labelled_derivatives(self, relation: str, task: str, metric: str) -> list[dict[str, Any]]:
        """Derivatives of `relation` with a pinned base and a label for (task, metric): repo,
        sha, base_repo, base_sha and the newest label's value, stderr and n."""
        rows = self.query(
            "SELECT c.repo, c.sha, b.base_repo, b.base_sha, l.value, l.stderr, l.n FROM checkpoint_bases b "
            "JOIN checkpoints c ON c.id = b.checkpoint_id "
            "JOIN labels l ON l.repo = c.repo AND l.sha = c.sha AND l.task = ? AND l.metric = ? "
            "WHERE b.relation = ? AND b.base_repo IS NOT NULL AND b.base_sha IS NOT NULL "
            "QUALIFY row_number() OVER (PARTITION BY c.repo, c.sha ORDER BY l.created_at DESC, l.id DESC) = 1 "
            "ORDER BY c.repo, c.sha", [task, metric, relation])
        return [dict(r) for r in rows]


    def labelled_pair_counts(self, task: str, metric: str) -> dict[str, int]:
        """{relation: derivatives with a pinned base and a label for (task, metric)}, the pairs
        `labelled_derivatives` returns, counted (a relation with none is absent)."""
        rows = self.query(
            "SELECT b.relation, count(DISTINCT (c.repo, c.sha)) AS n FROM checkpoint_bases b "
            "JOIN checkpoints c ON c.id = b.checkpoint_id "
            "JOIN labels l ON l.repo = c.repo AND l.sha = c.sha AND l.task = ? AND l.metric = ? "
            "WHERE b.base_repo IS NOT NULL AND b.base_sha IS NOT NULL GROUP BY b.relation", [task, metric])
        return {r["relation"]: int(r["n"]) for r in rows}


def pick_complete_score(candidates: Sequence[Mapping[str, Any]] | None,
                        spec: Mapping[str, Any] | None = None, *,
                        corpus_sha256: str | None = None) -> dict[str, Any] | None:
    """Of `complete_scores`' candidates for one checkpoint (newest first), what
    `complete_score` returns: the newest on `corpus_sha256` (any, when None) whose scoring
    spec matches `spec`'s given keys."""
    for run in candidates or ():
        if corpus_sha256 is not None and run["corpus_sha256"] != corpus_sha256:
            continue
        if spec is None or all(spec.get(k) is None or run[k] == spec[k] for k in _SPEC_KEYS):
            return dict(run)
    return None


def pair_of_coordinates(base_run: Mapping[str, Any], own_run: Mapping[str, Any]) -> dict[str, Any]:
    """(L*(base), L*(θ)) of two complete score runs on one corpus and spec, as shown."""
    return {"corpus_sha256": own_run["corpus_sha256"],
            "lstar_base": float(base_run["lstar"]), "lstar_base_se": float(base_run["se_ce"]),
            "base_run_id": base_run["run_id"],
            "lstar": float(own_run["lstar"]), "lstar_se": float(own_run["se_ce"]), "run_id": own_run["run_id"]}
