"""A report's L* table and its lineages' training order, read from ranks DuckDB holds.

A report shows, per lineage, the checkpoints scored in its window and the lineage's current
checkpoint at the window's start; it needs the rank of every scored checkpoint (the carried-in
current one, the table's order, which prediction is a lineage's state) but shows only those
rows. The ranks of the whole history stay in DuckDB (`monitor.store.report_ranks`: placed by
`monitor.store.placement_sql`, ordered by `training_order`'s rule, ties by commit and repo), and
only the runs the report shows are read whole: its cost at 10^5 checkpoints is a few queries,
not 10^5 Python rows.

A lineage holding a checkpoint DuckDB cannot place exactly (hostile refs or times) is read
whole and ranked again from `training_order.place`, so its order is Python's.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import groupby
from typing import Any

from monitor.policy import Policy
from monitor.reports.present import checkpoint_name
from monitor.store import Store
from monitor.store.report_ranks import ReportRanks
from monitor.store.rows import ReportScoreRow
from monitor.training_order import order_by_keys, place, time_key


@dataclass
class LineageRows:
    """What a report knows of the scored checkpoints of the lineages it reports on."""

    table: dict[str, list[dict[str, Any]]] = field(default_factory=dict)   # lineage: its table rows
    order: dict[tuple[str, str], int] = field(default_factory=dict)       # (repo, commit): rank in its lineage
    by_step: dict[str, bool] = field(default_factory=dict)                 # lineage: ordered by training step
    before: dict[str, dict[str, Any]] = field(default_factory=dict)        # lineage: checkpoints, best L* by the start


def table_row(r: ReportScoreRow, *, new: bool) -> dict[str, Any]:
    """One row of the L* table: a checkpoint's newest run, placed in its lineage."""
    tcb = r.tcb or {}
    where = place(r.refs, r.meta, r.discovered_at, r.finished_at)
    return {
        "lineage": r.lineage, "repo": r.repo, "commit": r.commit_sha, "refs": r.refs,
        "checkpoint": checkpoint_name(r.repo, r.commit_sha, r.refs),
        "step": where.step, "released_at": where.time, "time_source": where.time_source,
        "run_id": r.run_id, "tokenizer": r.tokenizer_fingerprint, "lstar": r.lstar,
        "se": r.se_ce, "ce": r.ce, "ce_unigram": r.ce_unigram,
        "bits_per_byte": r.bits_per_byte, "n_tokens": int(r.n_tokens),
        "finished_at": r.finished_at, "new": new,
        "stability": {k: tcb.get(k) for k in ("mean", "median", "p10", "v_eff_mean", "margin_mean",
                                               "n_positions")} if tcb else None}


def watched_pairs(store: Store, policy: Policy, corpus: str | None, *, end: Any) -> list[tuple[str, str | None]] | None:
    """The (repo, rule) pairs scored by `end` whose checkpoints `policy` watches (None: a policy
    without watch rules watches every one)."""
    from monitor.alerts import watches

    if not policy.watch:
        return None
    return [(repo, rule) for repo, rule in store.report_repo_rules(corpus, end=end) if watches(policy, repo, rule)]


def _rerank_inexact(store: Store, ranks: ReportRanks) -> None:
    """Rank again, from `training_order.place`, every lineage holding a checkpoint DuckDB could
    not place exactly (`monitor.store.placement_sql`): the order is then Python's, as before."""
    inexact = ranks.inexact()
    if not inexact:
        return
    runs = {r.run_id: r for r in store.report_runs_by_id([run for _, run in inexact])}
    ranked_runs: list[tuple[str, int, bool]] = []
    for _, grouped in groupby(inexact, key=lambda pair: pair[0]):   # ordered by lineage
        group = [runs[run] for _, run in grouped if run in runs]
        placed = [place(r.refs, r.meta, r.discovered_at, r.finished_at) for r in group]
        by_step = all(where.step is not None for where in placed)
        ordered = order_by_keys([(where.step, time_key(where.time), (r.commit_sha, r.repo))
                                 for where, r in zip(placed, group)])
        ranked_runs += [(group[i].run_id, rank, by_step) for rank, i in enumerate(ordered)]
    ranks.set_ranks(ranked_runs)


def lineage_rows(store: Store, ranks: ReportRanks) -> LineageRows:
    """The L* table's rows by lineage, their ranks in their lineages, and what a report says of
    each lineage before its window, from the ranks of every scored checkpoint (`ranks`).

    The table holds each checkpoint scored in the window (its newest run) and each lineage's
    current checkpoint at the window's start (the latest in training order of those scored
    before it and not again in it; `new` false)."""
    _rerank_inexact(store, ranks)
    out = LineageRows()
    for lineage, by_step, counted, best in ranks.lineages():
        out.by_step[lineage] = bool(by_step)
        if counted:
            out.before[lineage] = {"checkpoints": int(counted), "best_lstar": best}
    shown = ranks.shown()
    runs = {r.run_id: r for r in store.report_runs_by_id([run for _, _, _, run, _, _ in shown])}
    for lineage, repo, commit, run, rank, new in shown:
        out.order[(repo, commit)] = int(rank)
        out.table.setdefault(lineage, []).append(table_row(runs[run], new=bool(new)))
    return out


def history_rows(store: Store, ranks: ReportRanks, names: Iterable[str]) -> list[dict[str, Any]]:
    """Every scored checkpoint of each of the lineages `names` (its newest run), in training
    order, lineage by lineage in name order: the L*-over-time figure's lines."""
    rows = ranks.history(list(names))
    runs = {r.run_id: r for r in store.report_runs_by_id([run for _, run, _ in rows])}
    return [table_row(runs[run], new=bool(new)) for _, run, new in rows if run in runs]


def table_and_families(lineages: LineageRows) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """The L* table (lineage by lineage in name order, each in training order) and, by
    lineage, its family row: its current checkpoint, counts and best L*."""
    table: list[dict[str, Any]] = []
    families: dict[str, dict[str, Any]] = {}
    for lineage in sorted(lineages.table):
        # One training order over every scored checkpoint of the lineage (training_order): the
        # table's rows, the current checkpoint and each task's current state all follow it.
        rows = sorted(lineages.table[lineage], key=lambda row: lineages.order[(row["repo"], row["commit"])])
        table += rows
        # the definition (`monitor.training_order`): the latest in training order is the
        # window's latest or, when the window scored none later, the one carried in
        current = rows[-1]
        earlier = lineages.before.get(lineage, {"checkpoints": 0, "best_lstar": None})
        best = min([row["lstar"] for row in rows] + ([earlier["best_lstar"]] if earlier["best_lstar"] is not None
                                                      else []))
        families[lineage] = {
            "lineage": lineage, "checkpoints": len(rows), "checkpoints_before": earlier["checkpoints"],
            "new_scores": sum(row["new"] for row in rows),
            "order": "training step" if lineages.by_step[lineage] else "release time",
            "current": current["checkpoint"], "latest_lstar": current["lstar"], "latest_se": current["se"],
            "best_lstar": best}
    return table, families


__all__ = ["LineageRows", "history_rows", "lineage_rows", "table_and_families", "table_row", "watched_pairs"]
