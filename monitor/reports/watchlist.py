"""The watchlist: the current state of every watched lineage × task, closest to its level first.

It answers "which watched models are at risk right now?" for `lstar watchlist` and the
daemon's `/watchlist` from the predictions the outbox recorded, with no policy file needed:

- each (policy, task, lineage) is shown at its current checkpoint (the project's one rule,
  `monitor.training_order.current_checkpoint`: the last in training order), with that
  checkpoint's newest prediction (a score the policy could not evaluate is skipped, as the
  report skips it);
- its predicted value P̂ and interval, the level b + ε it was classified against, and the
  distance P̂ − level (negative: below the level);
- the observed state where an evaluation of the task checked that checkpoint (it supersedes
  the prediction, as in the report), and the state in force;
- the newest alert of the (policy, task, lineage), whichever checkpoint it was about.

Rows are sorted by |P̂ − level| (closest first; rows without P̂ last), then policy, task and
lineage, and paged like the other listings (`monitor.store.pages`): the cursor holds the
last row's sort key, so a page never repeats or skips a row of an unchanged state.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from monitor.policy.vocabulary import STATES
from monitor.reports.present import checkpoint_name
from monitor.store.evaluation_gaps import NOT_EVALUATED
from monitor.store.lineage_batch import decoded
from monitor.store.pages import Key, Page, check_limit
from monitor.store.placing import PLACEMENT_OBJECT
from monitor.training_order import Placement, current_checkpoint, place, string_refs

# The states a row can be in (the state in force: an observed state maps onto these).
STATUSES = STATES
OBSERVED_AS = {"observed_emerged": "emerged", "observed_unresolved": "at_risk", "observed_clear": "clear"}
WATCHLIST = Key("watchlist", ("missing", "closeness", "policy", "task", "lineage"),
                ("int", "float", "str", "str", "str"))
MAX_GLOB_CHARS = 200

# Only the columns shown, and those that place a checkpoint in its lineage (of the meta, the two
# values stored beside it: `monitor.store.placing`).
_CANDIDATES = (
    "SELECT p.id, p.policy, p.task, p.lineage, p.repo, p.commit_sha, p.state, p.lstar, p.se, p.p_hat, p.lo, "
    "p.hi, p.threshold, p.evaluated_at, r.finished_at, c.refs, c.discovered_at, "
    f"{PLACEMENT_OBJECT.format(placed='c.placing_values')} AS placing_meta "
    "FROM predictions p LEFT JOIN score_runs r ON r.run_id = p.run_id "
    "LEFT JOIN checkpoints c ON c.repo = p.repo AND c.sha = p.commit_sha ")


def _placement(row: dict[str, Any]) -> Placement:
    return place(row["refs"], decoded(row["placing_meta"], {}), row["discovered_at"], row["finished_at"] or row["evaluated_at"])


def _candidates(store: Any, *, policy: str | None, task: str | None, repo: str | None) -> list[dict[str, Any]]:
    """Each checkpoint's newest evaluable prediction, per (policy, task): the rows the current
    checkpoints are chosen from. A repo glob keeps the lineages that hold a matching repo (the
    current checkpoint's repo is matched afterwards)."""
    where, params = ["p.state != ?"], [NOT_EVALUATED]
    if policy is not None:
        where.append("p.policy = ?")
        params.append(policy)
    if task is not None:
        where.append("p.task = ?")
        params.append(task)
    if repo is not None:
        where.append("p.lineage IN (SELECT lineage FROM predictions WHERE repo GLOB ?)")
        params.append(repo)
    rows = store.query(f"{_CANDIDATES} WHERE {' AND '.join(where)} QUALIFY row_number() OVER (PARTITION BY "
                       "p.policy, p.task, p.lineage, p.repo, p.commit_sha ORDER BY p.evaluated_at DESC, p.id DESC) = 1",
                       params)
    for row in rows:
        row["refs"] = string_refs(json.loads(row["refs"]) if row["refs"] else [])
    return rows


def _current_rows(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    by_lineage: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for row in rows:
        by_lineage.setdefault((row["policy"], row["task"], row["lineage"]), []).append(row)
    picked = [current_checkpoint(group, _placement, lambda row: (row["commit_sha"], row["repo"]))
              for group in by_lineage.values()]
    return [row for row in picked if row is not None]


def with_states_in_force(store: Any, rows: list[dict[str, Any]], *, commit: str = "commit_sha") -> None:
    """Give each row (policy, task, repo, `commit`, predicted `state`) its `observed_state`
    (the newest finished evaluation of that task on that checkpoint, or None) and its
    `state_in_force` (the observed one mapped onto the prediction's states, else the
    prediction's): the one rule the watchlist and the status page show, as the report does."""
    found = store.observed_states([(r["repo"], r[commit]) for r in rows]) if rows else {}
    for r in rows:
        done = [o for o in found.get((r["repo"], r[commit]), [])
                if o["policy"] == r["policy"] and o["task"] == r["task"] and o["status"] == "done"]
        r["observed_state"] = done[-1]["observed_state"] if done else None
        r["state_in_force"] = OBSERVED_AS.get(r["observed_state"], r["state"]) if done else r["state"]


def _sort_key(row: dict[str, Any]) -> tuple[int, float, str, str, str]:
    distance = row["distance"]
    return (1 if distance is None else 0, 0.0 if distance is None else abs(distance),
            row["policy"], row["task"], row["lineage"])


def last_alerts(store: Any, rows: Sequence[dict[str, Any]]) -> dict[tuple[str, str, str], dict[str, Any]]:
    """The newest alert of each (policy, task, lineage) among `rows`, of any kind (an evaluation's
    observation alert too: its observed state is the state in force); the watchlist's and the
    status page's "last alert"."""
    keys = sorted({(r["policy"], r["task"], r["lineage"]) for r in rows})
    out: dict[tuple[str, str, str], dict[str, Any]] = {}
    for first in range(0, len(keys), 500):
        chunk = keys[first:first + 500]
        marks = ", ".join("(?, ?, ?)" for _ in chunk)
        for a in store.query(
                "SELECT policy, task, lineage, id, kind, state, status, repo, commit_sha, created_at FROM alerts "
                f"WHERE (policy, task, lineage) IN (SELECT * FROM (VALUES {marks})) "
                "QUALIFY row_number() OVER (PARTITION BY policy, task, lineage ORDER BY created_at DESC, id DESC) = 1",
                [v for key in chunk for v in key]):
            out[(a.pop("policy"), a.pop("task"), a.pop("lineage"))] = a
    return out


def _shown(row: dict[str, Any]) -> dict[str, Any]:
    return {"policy": row["policy"], "task": row["task"], "lineage": row["lineage"], "repo": row["repo"],
            "commit": row["commit_sha"], "checkpoint": checkpoint_name(row["repo"], row["commit_sha"], row["refs"]),
            "state": row["state_in_force"], "predicted_state": row["state"], "observed_state": row["observed_state"],
            "lstar": row["lstar"], "se": row["se"], "p_hat": row["p_hat"], "lo": row["lo"], "hi": row["hi"],
            "level": row["threshold"], "distance": row["distance"], "evaluated_at": row["evaluated_at"],
            "prediction_id": int(row["id"])}


def check_status(status: str | None) -> str | None:
    """`status` when it is one a row can have, else ValueError naming them."""
    if status is not None and status not in STATUSES:
        raise ValueError(f"{status[:40]!r} is not a state; give one of {', '.join(STATUSES)}")
    return status


def watchlist_page(store: Any, *, status: str | None = None, task: str | None = None, policy: str | None = None,
                   repo: str | None = None, limit: int | None = None, cursor: str | None = None) -> Page:
    """One page of the watchlist (module docstring), filtered by the state in force, task,
    policy (names) and a glob on the current checkpoint's repo (`org/*`)."""
    check_status(status)
    limit = check_limit(limit)
    if repo is not None and len(repo) > MAX_GLOB_CHARS:
        raise ValueError(f"the repo glob is {len(repo)} characters long; give at most {MAX_GLOB_CHARS}")
    after = tuple(WATCHLIST.decode(cursor)) if cursor is not None else None
    rows = _current_rows(_candidates(store, policy=policy, task=task, repo=repo))
    if repo is not None:   # DuckDB's GLOB decides, in the prefilter and here alike
        matched = {r["repo"] for r in store.query("SELECT DISTINCT repo FROM predictions WHERE repo GLOB ?", [repo])}
        rows = [r for r in rows if r["repo"] in matched]
    with_states_in_force(store, rows)
    if status is not None:
        rows = [r for r in rows if r["state_in_force"] == status]
    for r in rows:
        r["distance"] = None if r["p_hat"] is None or r["threshold"] is None else r["p_hat"] - r["threshold"]
    rows.sort(key=_sort_key)
    total = len(rows)
    if after is not None:
        rows = [r for r in rows if _sort_key(r) > after]
    page, more = rows[:limit], len(rows) > limit
    newest = last_alerts(store, page)
    items = [{**_shown(r), "last_alert": newest.get((r["policy"], r["task"], r["lineage"]))} for r in page]
    next_cursor = WATCHLIST.encode(list(_sort_key(page[-1]))) if more and page else None
    return Page(items, total, next_cursor, limit)


def describe_distance(distance: float | None) -> str:
    """`0.0123 below`, `0.0045 above` or `—`: the distance of P̂ to the level, in words."""
    if distance is None:
        return "—"
    return f"{abs(distance):.4f} {'below' if distance < 0 else 'above'}"


__all__ = ["STATUSES", "watchlist_page", "with_states_in_force", "last_alerts", "check_status", "describe_distance"]
