"""Read-only listings shared by the commands and the daemon's API, so both print the same rows.

Each listing answers one bounded page (`monitor.store.pages`): at most `limit` rows after
`cursor` in the listing's order, the total with the same filters, and the next page's cursor.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from monitor.store import Store
from monitor.store.pages import Key, Page, page_query
from monitor.store.rows import AlertSummaryRow, DeliverySummaryRow, SilenceRow

# What `lstar runs` shows of a score run: enough to tell runs apart and defend a number
# (which model and commit, on which corpus selection, with what L* and SE, how fast, when).
RUN_COLUMNS = ("r.run_id", "r.model_repo", "r.model_sha", "r.model_source", "r.corpus_sha256",
               "c.name AS corpus_name", "c.version AS corpus_version", "c.selection AS corpus_selection",
               "r.lstar", "r.se_ce", "r.n_tokens", "r.tokens_per_s", "r.wall_s", "r.finished_at",
               "json_extract_string(r.model, '$.revision') AS revision",
               # a run copied from an earlier run of the same weights names that run
               "l.linked_from_run_id", "l.linked_from_checkpoint_id")
CHECKPOINT_COLUMNS = ("id", "repo", "sha", "source", "refs", "lineage", "rule", "discovered_at", "updated_at",
                      "status", "reason", "attempts", "lease_owner", "lease_expires_at", "meta")

CHECKPOINTS = Key("checkpoints", ("discovered_at", "id"), ("time", "int"))          # oldest first
RUNS = Key("runs", ("r.finished_at", "r.run_id"), ("time", "str"), descending=True)    # newest first
ALERTS = Key("alerts", ("a.created_at", "a.id"), ("time", "int"), descending=True)     # newest first
SILENCES = Key("silences", ("created_at", "id"), ("time", "str"), descending=True)     # newest first


def checkpoints_page(store: Store, *, status: str | None = None, repo: str | None = None,
                     limit: int | None = None, cursor: str | None = None) -> Page:
    """Checkpoint rows oldest discovery first, as `lstar checkpoints --json` prints them (refs
    and meta decoded, with the `not_evaluated` notes of each, its `observations` (each active
    evaluation's predicted and observed state), the `base` it derives from and its `coordinates`
    (L*(base), L*(θ)) once both are scored: `Store.with_base_coordinates`)."""
    where, params = [], []
    if status is not None:
        where.append("status = ?")
        params.append(status)
    if repo is not None:
        where.append("repo = ?")
        params.append(repo)
    # The page is chosen on its key alone; the wide columns (a ~2 KB meta a row) are then read
    # for the page's rows only, not sorted and read for the whole table.
    keys, total, after, limit = page_query(
        store, CHECKPOINTS, select="SELECT discovered_at, id FROM checkpoints", where=where,
        params=params, limit=limit, cursor=cursor)
    rows = store.query(f"SELECT {', '.join(CHECKPOINT_COLUMNS)} FROM checkpoints WHERE id IN "
                       "(SELECT unnest(?::BIGINT[])) ORDER BY discovered_at, id",
                       [[int(k["id"]) for k in keys]]) if keys else []
    items = store.with_not_evaluated([store._decode_checkpoint(r).as_dict() for r in rows])
    observed = store.observed_states([(c["repo"], c["sha"]) for c in items])
    items = [{**c, "observations": observed.get((c["repo"], c["sha"]), [])} for c in items]
    # what each derives from and, once both are scored, its pair (L*(base), L*(θ))
    return Page(store.with_base_coordinates(items), total, after, limit)


def runs_page(store: Store, *, limit: int | None = None, cursor: str | None = None) -> Page:
    """Score runs newest first (ties by run id), each with its corpus's name, version and selection."""
    rows, total, after, limit = page_query(
        store, RUNS, select=(f"SELECT {', '.join(RUN_COLUMNS)} FROM score_runs r "
                             "LEFT JOIN corpora c ON c.sha256 = r.corpus_sha256 "
                             "LEFT JOIN score_digests l ON l.run_id = r.run_id"),
        where=[], params=[], limit=limit, cursor=cursor)
    return Page(rows, total, after, limit)


def list_score_runs(store: Store, *, limit: int | None = 50) -> list[dict[str, Any]]:
    """The first page of `runs_page` (its rows only)."""
    return runs_page(store, limit=limit).items


def alerts_page(store: Store, *, policy: str | None = None, state: str | None = None, limit: int | None = None,
                cursor: str | None = None) -> Page:
    """Newest alerts first (of one policy, in one state), each with a `deliveries` summary
    [{receiver, status, reason}]."""
    where, params = (["a.policy = ?"], [policy]) if policy else ([], [])
    if state is not None:
        where.append("a.state = ?")
        params.append(state)
    rows, total, after, limit = page_query(
        store, ALERTS, select=("SELECT a.id, a.created_at, a.kind, a.policy, a.task, a.repo, a.commit_sha, "
                               "a.state, a.status FROM alerts a"),
        where=where, params=params, limit=limit, cursor=cursor)
    per: dict[int, list[DeliverySummaryRow]] = {}
    if rows:
        marks = ", ".join("?" for _ in rows)
        for d in store.query(f"SELECT alert_id, receiver, status, reason, notification_id FROM deliveries "
                             f"WHERE alert_id IN ({marks}) ORDER BY id", [r["id"] for r in rows]):
            per.setdefault(d.pop("alert_id"), []).append(DeliverySummaryRow.from_row(d))
    items = [AlertSummaryRow.from_row({**r, "deliveries": per.get(r["id"], [])}).as_dict() for r in rows]
    return Page(items, total, after, limit)


def silences_page(store: Store, *, now: datetime, include_expired: bool = False, limit: int | None = None,
                  cursor: str | None = None) -> Page:
    """Silences newest first with a `state` of active / pending / expired (expired ones only
    with `include_expired`)."""
    import json

    where, params = ([], []) if include_expired else (
        ["least(ends_at, coalesce(expired_at, ends_at)) > ?"], [now])
    rows, total, after, limit = page_query(
        store, SILENCES, select="SELECT * FROM silences", where=where, params=params, limit=limit, cursor=cursor)
    items = []
    for r in rows:
        row = SilenceRow.from_row({**r, "matchers": json.loads(r["matchers"]) if r["matchers"] else []})
        end = row.ends_at if row.expired_at is None else min(row.ends_at, row.expired_at)
        state = "expired" if end <= now else ("pending" if row.starts_at > now else "active")
        items.append({**row.as_dict(), "state": state})
    return Page(items, total, after, limit)


__all__ = ["RUN_COLUMNS", "checkpoints_page", "runs_page", "alerts_page", "silences_page", "list_score_runs"]
