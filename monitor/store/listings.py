"""Read-only listings shared by the commands and the daemon's API, so both print the same rows.

Each listing answers one bounded page (`monitor.store.pages`): at most `limit` rows after
`cursor` in the listing's order, the total with the same filters, and the next page's cursor.
"""

from __future__ import annotations

import json
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
# The meta keys a checkpoint listing shows: its score (run, L*, SE) and what `lstar
# checkpoints`' reason column says of it (a score linked to an earlier one of the same
# weights, a reference base's reason). A listing row's `meta`
# holds only these; the whole meta (~2 KB a row: gate, fetch and score facts) is read for one
# checkpoint (`checkpoint_detail`, GET /checkpoints/ID) or asked for (`with_meta`).
LISTING_META_KEYS = ("run_id", "lstar", "se", "linked_from_run_id", "linked_from_checkpoint_id", "reference_base")

CHECKPOINTS = Key("checkpoints", ("discovered_at", "id"), ("time", "int"))          # oldest first
RUNS = Key("runs", ("r.finished_at", "r.run_id"), ("time", "str"), descending=True)    # newest first
ALERTS = Key("alerts", ("a.created_at", "a.id"), ("time", "int"), descending=True)     # newest first
SILENCES = Key("silences", ("created_at", "id"), ("time", "str"), descending=True)     # newest first


def checkpoints_page(store: Store, *, status: str | None = None, repo: str | None = None,
                     limit: int | None = None, cursor: str | None = None, with_meta: bool = False) -> Page:
    """Checkpoint rows oldest discovery first, as `lstar checkpoints --json` prints them (refs
    decoded, with the `not_evaluated` notes of each, its `observations` (each active
    evaluation's predicted and observed state), the `base` it derives from and its `coordinates`
    (L*(base), L*(θ)) once both are scored: `Store.with_base_coordinates`).

    Each row's `meta` holds only the `LISTING_META_KEYS` it has, unless `with_meta`: then the
    whole meta, decoded."""
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
    rows = store.query(f"SELECT {', '.join(_listing_columns(with_meta))} FROM checkpoints WHERE id IN "
                       "(SELECT unnest(?::BIGINT[])) ORDER BY discovered_at, id",
                       [[int(k["id"]) for k in keys]]) if keys else []
    decoded = [store._decode_checkpoint(r if with_meta else _with_listing_meta(r)).as_dict() for r in rows]
    items = store.with_not_evaluated(decoded)
    observed = store.observed_states([(c["repo"], c["sha"]) for c in items])
    items = [{**c, "observations": observed.get((c["repo"], c["sha"]), [])} for c in items]
    # what each derives from and, once both are scored, its pair (L*(base), L*(θ))
    return Page(store.with_base_coordinates(items), total, after, limit)


def _listing_columns(with_meta: bool) -> tuple[str, ...]:
    """The checkpoint columns a page reads: the meta whole, or only the keys a listing shows
    (extracted by DuckDB, so the ~2 KB text never reaches Python)."""
    if with_meta:
        return CHECKPOINT_COLUMNS
    return (*CHECKPOINT_COLUMNS[:-1],
            *(f"json_extract(meta, '$.{key}') AS \"meta.{key}\"" for key in LISTING_META_KEYS))


def _with_listing_meta(row: dict[str, Any]) -> dict[str, Any]:
    """A row read by `_listing_columns(False)` with its extracted keys folded into `meta` (JSON text)."""
    out = {k: v for k, v in row.items() if not k.startswith("meta.")}
    kept = {key: json.loads(row[f"meta.{key}"]) for key in LISTING_META_KEYS if row.get(f"meta.{key}") is not None}
    out["meta"] = json.dumps(kept) if kept else None
    return out


def checkpoint_detail(store: Store, checkpoint_id: int) -> dict[str, Any] | None:
    """One checkpoint as a listing row with its whole meta (GET /checkpoints/ID), or None."""
    row = store.get_checkpoint(checkpoint_id)
    if row is None:
        return None
    [item] = store.with_not_evaluated([row.as_dict()])
    observed = store.observed_states([(item["repo"], item["sha"])])
    [item] = store.with_base_coordinates([{**item, "observations": observed.get((item["repo"], item["sha"]), [])}])
    return item


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


__all__ = ["RUN_COLUMNS", "LISTING_META_KEYS", "checkpoints_page", "checkpoint_detail", "runs_page", "alerts_page", "silences_page", "list_score_runs"]
