"""Read-only listings shared by the commands and the daemon's API, so both print the same rows."""

from __future__ import annotations

from typing import Any

from monitor.store import Store

# What `lstar runs` shows of a score run: enough to tell runs apart and defend a number
# (which model and commit, on which corpus selection, with what L* and SE, how fast, when).
RUN_COLUMNS = ("r.run_id", "r.model_repo", "r.model_sha", "r.model_source", "r.corpus_sha256",
               "c.name AS corpus_name", "c.version AS corpus_version", "c.selection AS corpus_selection",
               "r.lstar", "r.se_ce", "r.n_tokens", "r.tokens_per_s", "r.wall_s", "r.finished_at",
               "json_extract_string(r.model, '$.revision') AS revision",
               # a run copied from an earlier run of the same weights names that run
               "l.linked_from_run_id", "l.linked_from_checkpoint_id")


def list_score_runs(store: Store, *, limit: int | None = 50) -> list[dict[str, Any]]:
    """Score runs newest first (ties by run id), each with its corpus's name, version and
    selection; at most `limit` rows (None: all)."""
    sql = (f"SELECT {', '.join(RUN_COLUMNS)} FROM score_runs r "
           "LEFT JOIN corpora c ON c.sha256 = r.corpus_sha256 "
           "LEFT JOIN score_digests l ON l.run_id = r.run_id "
           "ORDER BY r.finished_at DESC, r.run_id DESC")
    if limit is None:
        return store.query(sql)
    return store.query(sql + " LIMIT ?", [limit])
