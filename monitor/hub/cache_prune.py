"""Keep the Hub download cache bounded: prune the checkpoints the watcher is done with.

The daemon downloads every gated checkpoint into the Hub cache and needs it only until it
is scored (or skipped, or failed); over months the snapshots would fill the disk. After a
scoring run, `prune_cache` keeps the snapshots of the newest `keep_last` finished
checkpoints that fit in `max_bytes` (together with the pending ones) and deletes the rest.

What it never deletes:

- the snapshot of a checkpoint still queued (discovered, gated, fetched) or leased: a
  pending or running job needs it;
- anything the database does not record as a finished Hub checkpoint: the cache may be
  the user's shared Hugging Face cache, holding other projects' models;
- a blob another snapshot still links to (lineage steps share their tokenizer files),
  checked again just before each delete since the poll job may be downloading meanwhile;
- any path outside the cache folder: links are removed, never followed out of it.

Sizes count each snapshot's files once per snapshot, so blobs shared between snapshots are
counted more than once: the budget errs towards pruning more.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from monitor.constants import DEFAULT_KEEP_LAST, DEFAULT_MAX_BYTES  # noqa: F401  (re-exported by monitor.hub)
from monitor.store import Store
from monitor.store.rows import CheckpointRow

PENDING = ("discovered", "gated", "fetched")
FINISHED = ("scored", "skipped", "failed")
_SHA = re.compile(r"[0-9a-f]{40}")


@dataclass
class PruneReport:
    """What one pruning pass kept, removed and left alone (as `repo@sha`)."""

    kept: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    protected: list[str] = field(default_factory=list)   # pending or running jobs need them
    freed_bytes: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _repo_dir(root: Path, repo: str) -> Path | None:
    """The cache folder of a Hub model repo, if it is a real folder directly under `root`."""
    from huggingface_hub.file_download import repo_folder_name

    path = root / repo_folder_name(repo_id=repo, repo_type="model")
    if path.parent != root or path.is_symlink() or not path.is_dir():
        return None
    return path


def _snapshot(root: Path, repo: str, sha: str) -> Path | None:
    repo_dir = _repo_dir(root, repo)
    if repo_dir is None or not _SHA.fullmatch(sha):
        return None
    path = repo_dir / "snapshots" / sha
    return path if path.is_dir() and not path.is_symlink() and not (repo_dir / "snapshots").is_symlink() \
        else None


def _cached_shas(root: Path) -> set[str]:
    """The commit shas of the snapshot folders under the cache (any repo)."""
    found: set[str] = set()
    for repo_dir in root.glob("models--*"):
        snapshots = repo_dir / "snapshots"
        if repo_dir.is_dir() and not repo_dir.is_symlink() and snapshots.is_dir() and not snapshots.is_symlink():
            found.update(p.name for p in snapshots.iterdir() if _SHA.fullmatch(p.name))
    return found


def _targets(snapshot: Path, root: Path) -> dict[Path, int]:
    """The files a snapshot's entries resolve to inside the cache, with their sizes."""
    found: dict[Path, int] = {}
    for entry in snapshot.rglob("*"):
        try:
            real = entry.resolve()
        except (OSError, RuntimeError):  # a link loop: nothing of ours behind it
            continue
        if real.is_file() and real.is_relative_to(root):
            found[real] = real.stat().st_size
    return found


def _remove_snapshot(repo_dir: Path, sha: str) -> None:
    """Delete `snapshots/<sha>`, huggingface_hub's notes about it (`.no_exist/<sha>`,
    `trees/<sha>.json`) and the refs that point at `sha`."""
    for folder in (repo_dir / "snapshots" / sha, repo_dir / ".no_exist" / sha):
        if folder.is_dir() and not folder.is_symlink():
            shutil.rmtree(folder)  # unlinks the links inside; never follows them
    tree = repo_dir / "trees" / f"{sha}.json"
    if tree.is_file() and not tree.is_symlink() and not (repo_dir / "trees").is_symlink():
        tree.unlink()
    refs = repo_dir / "refs"
    if refs.is_dir() and not refs.is_symlink():
        for ref in refs.rglob("*"):
            if ref.is_file() and not ref.is_symlink() and ref.stat().st_size <= 64 \
                    and ref.read_text(errors="replace").strip() == sha:
                ref.unlink()


def _remove_unreferenced(repo_dir: Path, root: Path, candidates: set[Path]) -> int:
    """Delete the candidate blobs no remaining snapshot of the repo links to; bytes freed."""
    blobs = (repo_dir / "blobs").resolve()
    still_used: set[Path] = set()
    snapshots = repo_dir / "snapshots"
    if snapshots.is_dir():
        for snap in snapshots.iterdir():
            if snap.is_dir() and not snap.is_symlink():
                still_used.update(_targets(snap, root))
    freed = 0
    for blob in sorted(candidates - still_used):
        if blob.parent == blobs and blob.is_file() and not blob.is_symlink():
            freed += blob.stat().st_size
            blob.unlink()
    return freed


def _drop_if_empty(repo_dir: Path) -> None:
    """Remove a repo folder that holds nothing but empty folders."""
    if all(p.is_dir() and not p.is_symlink() for p in repo_dir.rglob("*")):
        shutil.rmtree(repo_dir)


def prune_cache(store: Store, cache_dir: str | Path, *, keep_last: int = DEFAULT_KEEP_LAST,
                max_bytes: int | None = DEFAULT_MAX_BYTES) -> PruneReport:
    """Delete the cached snapshots of finished checkpoints beyond the policy.

    Finished checkpoints (scored, skipped, failed) are taken newest first by when they
    finished; the first `keep_last` whose sizes, added to the pending checkpoints', stay
    within `max_bytes` (None: no byte limit) are kept, every older one is deleted.
    """
    report = PruneReport()
    root = Path(cache_dir).resolve()
    if not root.is_dir():
        return report
    # The commits the cache holds decide which rows are read: its size, not the table's.
    rows = store.hub_checkpoints_at(sorted(_cached_shas(root)))
    pending_bytes = 0
    finished: list[tuple[CheckpointRow, Path, dict[Path, int]]] = []
    for row in rows:
        snap = _snapshot(root, row.repo, row.sha)
        if snap is None:
            continue
        targets = _targets(snap, root)
        if row.status in PENDING or row.lease_owner is not None or row.status not in FINISHED:
            report.protected.append(f"{row.repo}@{row.sha}")
            pending_bytes += sum(targets.values())
        else:
            finished.append((row, snap, targets))
    finished.sort(key=lambda item: (item[0].updated_at, item[0].id), reverse=True)

    used = pending_bytes
    dropping = False
    doomed: list[tuple[CheckpointRow, Path, dict[Path, int]]] = []
    for row, snap, targets in finished:
        size = sum(targets.values())
        dropping = dropping or len(report.kept) >= keep_last or \
            (max_bytes is not None and used + size > max_bytes)
        if dropping:
            doomed.append((row, snap, targets))
        else:
            report.kept.append(f"{row.repo}@{row.sha}")
            used += size

    by_repo: dict[Path, set[Path]] = {}
    for row, snap, targets in doomed:
        repo_dir = snap.parent.parent
        _remove_snapshot(repo_dir, row.sha)
        report.removed.append(f"{row.repo}@{row.sha}")
        by_repo.setdefault(repo_dir, set()).update(targets)
    for repo_dir, candidates in by_repo.items():
        report.freed_bytes += _remove_unreferenced(repo_dir, root, candidates)
        _drop_if_empty(repo_dir)
    return report
