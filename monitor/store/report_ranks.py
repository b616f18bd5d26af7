"""Every scored checkpoint's rank in its lineage, kept in DuckDB while a report reads it.

A report needs the training-order rank of every scored checkpoint of every lineage it covers
(its current checkpoint, the order of its table, which carried-in prediction is a lineage's
state), but shows only a few rows per lineage. Ranking 10^5 checkpoints in Python, or carrying
one Python object per checkpoint, was most of a report's time and memory at 10^5. So the ranks
are computed by DuckDB into a temporary table of the report's own cursor (`ReportRanks`), and
the report asks it for what it shows: the window's rows and each lineage's carried-in current
checkpoint, the carried-in predictions that can decide a state, and the history of the few
lineages its figure draws.

The rank is `monitor.training_order`'s rule (`order_by_keys`: by step when every checkpoint of the
lineage names one, else by release time; ties by commit, then repo) over the placement
`monitor.store.placement_sql` computes. A lineage holding a checkpoint DuckDB cannot place
exactly is re-ranked by the caller with Python's own placement (`set_ranks`), before anything
is read from the table.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

import duckdb

from monitor.errors import StoreError
from monitor.store.placement_sql import canonical_sql, placed_time_sql, refs_list_sql, step_sql

_NAMES = itertools.count()


def _ranks_sql(table: str, corpus_sha256: str | None, watched: Sequence[tuple[str, str | None]] | None) -> str:
    where = "AND r.corpus_sha256 = $corpus" if corpus_sha256 else ""
    # the policy's watch rules, decided per (repo, rule) by `monitor.alerts.watches` beforehand
    watch = ("SEMI JOIN (SELECT unnest($watched_repos::VARCHAR[]) AS repo, unnest($watched_rules::VARCHAR[]) AS rule) w "
             "ON w.repo = n.repo AND w.rule IS NOT DISTINCT FROM n.rule" if watched is not None else "")
    refs_list = refs_list_sql("c.refs")
    return (
        f"CREATE TEMP TABLE {table} AS "
        "WITH runs AS (SELECT r.run_id, r.model_repo AS repo, r.model_sha AS commit_sha, r.lstar, r.finished_at, "
        "coalesce(c1.lineage, c2.lineage, r.model_repo) AS lineage, coalesce(c1.rule, c2.rule) AS rule, "
        "coalesce(c1.id, c2.id) AS checkpoint_id FROM score_runs r "
        "LEFT JOIN (SELECT id, lineage, rule FROM checkpoints) c1 ON c1.id = r.checkpoint_id "
        "LEFT JOIN (SELECT id, repo, sha, lineage, rule FROM checkpoints) c2 ON r.checkpoint_id IS NULL "
        f"AND c2.repo = r.model_repo AND c2.sha = r.model_sha WHERE r.finished_at <= $end {where}), "
        # each checkpoint's newest run (by finish time, then id: what the report's rows show)
        "newest AS (SELECT lineage, repo, commit_sha, arg_max(rule, (finished_at, run_id)) AS rule, "
        "arg_max(run_id, (finished_at, run_id)) AS run_id, max(finished_at) AS scored_at, "
        "arg_max(checkpoint_id, (finished_at, run_id)) AS checkpoint_id, "
        "min(lstar) FILTER (WHERE finished_at <= $start) AS best_before FROM runs "
        "GROUP BY lineage, repo, commit_sha), "
        f"watched AS (SELECT n.* FROM newest n {watch}), "
        "placed AS (SELECT n.lineage, n.repo, n.commit_sha, n.run_id, n.scored_at > $start AS in_window, "
        f"n.best_before, {step_sql(refs_list)} AS step, "
        f"epoch_us({placed_time_sql(refs_list, 'c.placed', 'c.discovered_at', 'n.scored_at')}) AS time_us, "
        f"coalesce({canonical_sql('c.refs', 'c.placed')}, true) AS canonical "
        "FROM watched n LEFT JOIN (SELECT id, refs, discovered_at, "
        "placing_values AS placed FROM checkpoints) c ON c.id = n.checkpoint_id), "
        "lineages AS (SELECT lineage, bool_and(step IS NOT NULL) AS by_step, bool_and(canonical) AS exact "
        "FROM placed GROUP BY lineage) "
        "SELECT p.lineage, p.repo, p.commit_sha, p.run_id, p.in_window, p.best_before, l.by_step, l.exact, "
        # training_order.order_by_keys: step (when every checkpoint names one), time, commit, repo
        "row_number() OVER (PARTITION BY p.lineage ORDER BY CASE WHEN l.by_step THEN p.step ELSE 0 END, "
        "p.time_us NULLS FIRST, p.commit_sha, p.repo) - 1 AS rank "
        "FROM placed p JOIN lineages l USING (lineage)")


class ReportRanks:
    """The ranks of a report's scored checkpoints, in a temporary table of a cursor of its own
    (so the store's lock is not held while the report works, and two reports never share a
    table). Use as a context manager: the table goes with the cursor."""

    def __init__(self, conn: duckdb.DuckDBPyConnection, corpus_sha256: str | None, *, start: datetime,
                 end: datetime, watched: Sequence[tuple[str, str | None]] | None,
                 closed: Callable[[], StoreError | None] = lambda: None,
                 on_close: Callable[[], None] = lambda: None) -> None:
        self._cur = conn
        self._closed = closed
        self._on_close = on_close
        self._table = f"report_ranks_{next(_NAMES)}"
        params: dict[str, Any] = {"start": start, "end": end}
        if corpus_sha256:
            params["corpus"] = corpus_sha256
        if watched is not None:
            params["watched_repos"] = [repo for repo, _ in watched]
            params["watched_rules"] = [rule for _, rule in watched]
        self._execute(_ranks_sql(self._table, corpus_sha256, watched), params)

    def _execute(self, sql: str, params: Sequence[Any] | dict[str, Any], *,
                 fetch: bool = False) -> list[tuple[Any, ...]]:
        """Run a statement (and fetch its rows): the store closing its cursors with it (a daemon
        stopping), before the statement or between it and its rows, is the store's error."""
        try:
            cur = self._cur.execute(sql, params)
            return [tuple(row) for row in cur.fetchall()] if fetch else []
        except duckdb.Error as exc:
            error = self._closed()
            if error is not None:
                raise error from exc
            raise

    def close(self) -> None:
        self._on_close()
        with contextlib.suppress(duckdb.Error):
            self._cur.close()

    def __enter__(self) -> ReportRanks:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _rows(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> list[tuple[Any, ...]]:
        return self._execute(sql.format(t=self._table), params, fetch=True)

    def inexact(self) -> list[tuple[str, str]]:
        """(lineage, run id) of every checkpoint of the lineages DuckDB could not place exactly."""
        return [(lineage, run) for lineage, run in self._rows("SELECT lineage, run_id FROM {t} WHERE NOT exact "
                                                              "ORDER BY lineage, run_id")]

    def set_ranks(self, ranks: Sequence[tuple[str, int, bool]]) -> None:
        """Replace ranks (run id, rank, whether its lineage is ordered by step) computed by the caller."""
        if ranks:
            self._execute("UPDATE {t} SET rank = r.rank, by_step = r.by_step FROM (SELECT unnest(?::VARCHAR[]) "
                          "AS run_id, unnest(?::BIGINT[]) AS rank, unnest(?::BOOLEAN[]) AS by_step) r "
                          "WHERE {t}.run_id = r.run_id".format(t=self._table),
                          [[r for r, _, _ in ranks], [k for _, k, _ in ranks], [s for _, _, s in ranks]])

    def shown(self) -> list[tuple[str, str, str, str, int, bool]]:
        """(lineage, repo, commit, run id, rank, new) of the rows a report's table shows: every
        checkpoint scored in the window (new), and each lineage's latest in training order of
        those scored before it and not again in it (its current checkpoint at the start)."""
        return self._rows(
            "SELECT lineage, repo, commit_sha, run_id, rank, true FROM {t} WHERE in_window UNION ALL "
            "SELECT lineage, arg_max(repo, rank), arg_max(commit_sha, rank), arg_max(run_id, rank), max(rank), false "
            "FROM {t} WHERE NOT in_window GROUP BY lineage ORDER BY 1, 5")

    def lineages(self) -> list[tuple[str, bool, int, float | None]]:
        """(lineage, ordered by step, checkpoints scored before the window, best L* then) of each lineage."""
        return self._rows("SELECT lineage, bool_and(by_step), count(best_before), min(best_before) FROM {t} "
                          "GROUP BY lineage ORDER BY lineage")

    def ranks_of(self, pairs: Sequence[tuple[str, str]]) -> dict[tuple[str, str], int]:
        """The rank of each (repo, commit) among `pairs` that is scored (a checkpoint in two
        lineages: its rank in the last by name)."""
        pairs = sorted(set(pairs))
        if not pairs:
            return {}
        rows = self._rows("SELECT t.repo, t.commit_sha, arg_max(t.rank, t.lineage) FROM {t} t SEMI JOIN "
                          "(SELECT unnest(?::VARCHAR[]) AS repo, unnest(?::VARCHAR[]) AS commit_sha) k "
                          "ON k.repo = t.repo AND k.commit_sha = t.commit_sha GROUP BY t.repo, t.commit_sha",
                          [[repo for repo, _ in pairs], [commit for _, commit in pairs]])
        return {(repo, commit): int(rank) for repo, commit, rank in rows}

    def carried_predictions(self, policy: str, *, start: datetime, tasks: Sequence[str], skip_state: str,
                            again: Sequence[tuple[str, str, str, str]]) -> list[tuple[int, int]]:
        """(prediction id, rank of its checkpoint, -1 when unscored) of the carried-in predictions
        a report reads whole. Each (task, lineage, checkpoint)'s state at `start` is the policy's
        newest prediction of it by then whose state is not `skip_state`; of those, per (task,
        lineage), the latest by (training order, evaluation time), all of them on a tie (one is
        the state carried in, and a lineage's current state when the window predicted nothing
        newer), and those of a checkpoint the window predicted again (`again`: task, lineage,
        repo, commit; the window's prediction replaces them). The others can decide nothing."""
        if not tasks:
            return []
        return self._rows(
            "WITH state AS (SELECT id, task, lineage, repo, commit_sha, evaluated_at FROM (SELECT id, task, lineage, "
            "repo, commit_sha, evaluated_at, row_number() OVER (PARTITION BY task, lineage, repo, commit_sha "
            "ORDER BY evaluated_at DESC, id DESC) AS newest FROM predictions WHERE policy = $policy "
            "AND evaluated_at <= $start AND state != $skip AND task IN (SELECT unnest($tasks::VARCHAR[]))) "
            "WHERE newest = 1), "
            "ranks AS (SELECT repo, commit_sha, arg_max(rank, lineage) AS rank FROM {t} GROUP BY repo, commit_sha), "
            "ranked AS (SELECT s.*, coalesce(r.rank, -1) AS rank, rank() OVER (PARTITION BY s.task, s.lineage "
            "ORDER BY coalesce(r.rank, -1) DESC, s.evaluated_at DESC) AS latest FROM state s "
            "LEFT JOIN ranks r ON r.repo = s.repo AND r.commit_sha = s.commit_sha), "
            "again AS (SELECT DISTINCT unnest($a_task::VARCHAR[]) AS task, unnest($a_lineage::VARCHAR[]) AS lineage, "
            "unnest($a_repo::VARCHAR[]) AS repo, unnest($a_commit::VARCHAR[]) AS commit_sha) "
            "SELECT r.id, r.rank FROM ranked r LEFT JOIN again g ON g.task = r.task AND g.lineage = r.lineage "
            "AND g.repo = r.repo AND g.commit_sha = r.commit_sha WHERE r.latest = 1 OR g.task IS NOT NULL ORDER BY r.id",
            {"policy": policy, "start": start, "skip": skip_state, "tasks": sorted(set(tasks)),
             "a_task": [a[0] for a in again], "a_lineage": [a[1] for a in again],
             "a_repo": [a[2] for a in again], "a_commit": [a[3] for a in again]})

    def history(self, lineages: Sequence[str]) -> list[tuple[str, str, bool]]:
        """(lineage, run id, new) of every scored checkpoint of `lineages`, lineage by lineage
        in name order, each in training order."""
        if not lineages:
            return []
        return self._rows("SELECT lineage, run_id, in_window FROM {t} WHERE lineage IN "
                          "(SELECT unnest(?::VARCHAR[])) ORDER BY lineage, rank", [sorted(set(lineages))])


__all__ = ["ReportRanks"]
