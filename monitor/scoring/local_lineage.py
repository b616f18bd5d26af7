"""The base a local checkpoint folder derives from, recorded as the Hub path records it.

`lstar score ./ft-model` of a folder whose model card (`README.md` front matter) names a
`base_model` gets a checkpoint row of its own (source `local`, status `scored`, the folder's
path and content hash as repo and commit) linked to its base in `checkpoint_bases`, so that
`lstar checkpoints`, the report's derivatives section and the derivative judgements see it
as they see a fine-tune the gate found on the Hub (`monitor.hub.gate.pin_base`).

Offline there is no Hub to ask which commit `main` of the base is, so the base is pinned to
the commit the card names (`base_model: org/base@<sha>`), else to the store's checkpoint of
the base whose refs include `main` (what a poll saw), else left unpinned with the reason.
A folder whose card names no base (and holds no adapter) is recorded as before: a score run
with no checkpoint row.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from monitor.hub.lineage import Lineage, declared_base
from monitor.hub.model_card import read_folder_card

# A checkpoint folder is a few files; more than this is not listed to infer the relation.
MAX_LISTED_FILES = 10_000


def _folder_files(folder: Path) -> set[str]:
    names: set[str] = set()
    for i, path in enumerate(folder.iterdir()):
        if i >= MAX_LISTED_FILES:
            break
        names.add(path.name)
    return names


def _config(folder: Path) -> dict[str, Any] | None:
    try:
        with (folder / "config.json").open("rb") as handle:
            value = json.loads(handle.read(1 << 20))
    except (OSError, ValueError):
        return None   # the loader has read and checked it already; nothing to infer from here
    return value if isinstance(value, dict) else None


def local_lineage(conn: Any, folder: Path) -> Lineage | None:
    """The base `folder`'s card declares, pinned as the module docstring says (None: no base)."""
    card, card_problem = read_folder_card(folder)
    declared = declared_base(card, _folder_files(folder), _config(folder))
    if declared is None:
        return None
    problems = [p for p in (card_problem, *declared.problems) if p]
    repo, sha = declared.base_repo, declared.pinned_sha
    if repo is not None and sha is None:
        row = conn.execute("SELECT sha FROM checkpoints WHERE repo = ? AND source = 'hub' AND "
                           "list_contains(CAST(refs AS VARCHAR[]), 'main') ORDER BY discovered_at DESC, id DESC "
                           "LIMIT 1", [repo]).fetchone()
        if row:
            sha = row[0]
        else:
            problems.append(f"base {repo} not pinned: the card names no commit and the store has no `main` "
                            f"of it (write base_model: {repo}@<commit sha> in README.md)")
    if repo is None and len(declared.bases) > 1:
        problems.append(f"a merge of {len(declared.bases)} bases has no single base to compare with")
    return Lineage(base_repo=repo, base_sha=sha, relation=declared.relation,
                   relation_source=declared.relation_source, bases=list(declared.bases),
                   problem="; ".join(problems) or None)


def record_local_derivative(conn: Any, run_row: Mapping[str, Any], *, now: datetime) -> int | None:
    """Inside the caller's transaction: for a local score whose folder declares a base, the
    folder's checkpoint row (created or refreshed), its base, and the run linked to it; the
    row's id, or None when the run is not a local one or the folder declares no base."""
    model = run_row.get("model") or {}
    if run_row.get("model_source") != "local" or run_row.get("checkpoint_id") is not None or not model.get("path"):
        return None
    lineage = local_lineage(conn, Path(model["path"]))
    if lineage is None:
        return None
    repo, sha = run_row["model_repo"], run_row["model_sha"]
    row = conn.execute(
        # no meta: the column's default, '{}', which places nothing (nor does `placing_values`'s)
        "INSERT INTO checkpoints (repo, sha, source, refs, lineage, rule, discovered_at, updated_at, status, reason) "
        "VALUES (?, ?, 'local', '[]', ?, NULL, ?, ?, 'scored', NULL) "
        "ON CONFLICT (repo, sha) DO UPDATE SET updated_at = excluded.updated_at RETURNING id",
        [repo, sha, repo, now, now]).fetchone()
    checkpoint_id = int(row[0])
    conn.execute(
        "INSERT OR REPLACE INTO checkpoint_bases (checkpoint_id, base_repo, base_sha, relation, relation_source, "
        "bases, problem, recorded_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        [checkpoint_id, lineage.base_repo, lineage.base_sha, lineage.relation, lineage.relation_source,
         json.dumps(lineage.bases), lineage.problem, now])
    conn.execute("UPDATE score_runs SET checkpoint_id = ? WHERE run_id = ?", [checkpoint_id, run_row["run_id"]])
    return checkpoint_id
