"""The pinned, verified download of a checkpoint that passed the gate.

`fetch_pinned` downloads exactly the files the model needs at the commit sha, each stopped
as soon as it passes the size the Hub announced (a lying server cannot fill the disk),
then checks every one itself (existence, announced size, LFS sha256 or git blob id, path
inside the cache): `snapshot_download` can return a partial folder without raising, so
its return value is never trusted. A mismatch raises `IntegrityError` and the bad file is
removed.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from monitor.errors import GateRefusedError, HubError, IntegrityError
from monitor.failpoints import failpoint
from monitor.hub.adapter import ADAPTER_CONFIG, ADAPTER_WEIGHTS
from monitor.hub.client import HubClient, describe_error, refusal_reason
from monitor.hub.gate import (COMMIT_RE, CONFIG_FILE, FILE_BYTE_LIMITS, OPTIONAL_FILES, TOKENIZER_FILE,
                              WEIGHTS_INDEX, ExpectedFile, _announced, _index_shards, _siblings,
                              check_file_budgets, check_file_names, resolve_cache_dir, weight_files)
from monitor.hub.rules import Budgets
from monitor.store import Store, utcnow
from monitor.store.rows import CheckpointRow


# -- pinned download ------------------------------------------------------------------------
def snapshot_dir(cache_dir: Path, repo: str, sha: str) -> Path:
    """Where huggingface_hub keeps the files of `repo` at commit `sha`."""
    from huggingface_hub.file_download import repo_folder_name

    return cache_dir / repo_folder_name(repo_id=repo, repo_type="model") / "snapshots" / sha


def plan_files(client: HubClient, repo: str, sha: str, info: Any, cache_dir: Path,
               budgets: Budgets | None = None) -> list[ExpectedFile]:
    """The files to fetch at `sha` (weights, config, tokenizer), with what the Hub announced.

    Refuses a plan whose files the Hub announces over their byte limits (the weights
    together over `budgets.max_bytes`), before anything but a shard index is downloaded.
    """
    budgets = budgets or Budgets()
    siblings = _siblings(info)
    check_file_names(list(siblings), cache_dir)
    if ADAPTER_CONFIG in siblings:
        return _adapter_plan(repo, sha, siblings, budgets)
    weights = weight_files(info)
    if weights == [WEIGHTS_INDEX]:
        weights = [WEIGHTS_INDEX, *_index_shards(client, repo, sha, siblings, cache_dir)]
    wanted = [*weights, CONFIG_FILE, TOKENIZER_FILE, *OPTIONAL_FILES]
    files = [_announced(n, siblings[n]) for n in dict.fromkeys(wanted) if n in siblings]
    if not any(f.name == TOKENIZER_FILE for f in files) or not any(f.name == CONFIG_FILE for f in files):
        raise GateRefusedError(f"{repo}@{sha} lacks {CONFIG_FILE} or {TOKENIZER_FILE}")
    check_file_budgets(files)
    weight_bytes = sum(f.size for f in files if f.name not in FILE_BYTE_LIMITS)
    if weight_bytes > budgets.max_bytes:
        raise GateRefusedError(f"over budget: {weight_bytes:,} bytes of weights > max_bytes "
                               f"{budgets.max_bytes:,}")
    return files


def _adapter_plan(repo: str, sha: str, siblings: dict[str, Any], budgets: Budgets) -> list[ExpectedFile]:
    """An adapter repo's own files (config, safetensors weights, a tokenizer if it has one);
    its base is fetched as a checkpoint of its own (`fetch_job`)."""
    if ADAPTER_WEIGHTS not in siblings:
        raise GateRefusedError(f"{repo}@{sha} is an adapter without {ADAPTER_WEIGHTS}")
    wanted = [ADAPTER_CONFIG, ADAPTER_WEIGHTS, TOKENIZER_FILE, *OPTIONAL_FILES]
    files = [_announced(n, siblings[n]) for n in wanted if n in siblings]
    check_file_budgets(files)
    weight_bytes = sum(f.size for f in files if f.name == ADAPTER_WEIGHTS)
    if weight_bytes > budgets.max_bytes:
        raise GateRefusedError(f"over budget: {weight_bytes:,} bytes of adapter weights > max_bytes "
                               f"{budgets.max_bytes:,}")
    return files


def _digest(path: Path, algorithm: str, prefix: bytes = b"") -> str:
    h = hashlib.new(algorithm)
    h.update(prefix)
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _discard(link: Path) -> None:
    """Remove a bad file (its snapshot link and the blob behind it) so nothing loads it."""
    target = link.resolve()
    for p in (link, target):
        try:
            p.unlink()
        except OSError:
            pass


def verify_snapshot(cache_dir: Path, repo: str, sha: str, files: Sequence[ExpectedFile]) -> Path:
    """Check each expected file: present, inside the cache, announced size and hash.

    A missing file raises HubError (an interrupted download; retryable); a wrong size or
    hash, or a path leaving the cache, raises IntegrityError and the bad file is removed.
    """
    root = cache_dir.resolve()
    snap = snapshot_dir(cache_dir, repo, sha)
    where = f"{repo}@{sha}"
    if not snap.is_dir():
        raise HubError(f"{where}: no snapshot folder after the download", hint="retried later")
    for entry in snap.rglob("*"):
        if not entry.resolve().is_relative_to(root):
            raise IntegrityError(f"{where}: {entry.relative_to(snap)} resolves outside the cache")
    for f in files:
        path = snap / f.name
        if not path.is_file():
            # snapshot_download hands back a partial folder when the Hub fails mid-way: the
            # Hub's fault, so retryable rather than an integrity failure.
            raise HubError(f"{where}: {f.name} is missing after the download (incomplete snapshot)",
                           hint="retried later")
        size = path.stat().st_size
        if size != f.size:
            _discard(path)
            raise IntegrityError(f"{where}: {f.name} is {size:,} bytes, the Hub announced {f.size:,}")
        if f.sha256 is not None:
            actual = _digest(path, "sha256")
            expected = f.sha256.lower()
        elif f.blob_id is not None:
            actual = _digest(path, "sha1", b"blob %d\0" % size)
            expected = f.blob_id.lower()
        else:
            # The gate refuses such a file, but the fetch asks the Hub again: a file that cannot
            # be checked against the commit is never scored.
            _discard(path)
            raise IntegrityError(f"{where}: the Hub gave neither a sha256 nor a git blob id for {f.name}; "
                                 "it cannot be checked against the commit")
        if actual != expected:
            _discard(path)
            kind = "sha256" if f.sha256 is not None else "git blob id"
            raise IntegrityError(f"{where}: {f.name} {kind} is {actual}, the Hub announced {expected}")
    return snap


def _require_present(cache_dir: Path, repo: str, sha: str, files: Sequence[ExpectedFile]) -> None:
    snap = snapshot_dir(cache_dir, repo, sha)
    for f in files:
        if not (snap / f.name).is_file():
            # snapshot_download hands back a partial folder when the Hub fails mid-way.
            raise HubError(f"{repo}@{sha}: {f.name} is missing after the download (incomplete snapshot)",
                           hint="retried later")


def snapshot_digests(files: Sequence[ExpectedFile], snapshot: Path) -> dict[str, str | None]:
    """Identities of a verified snapshot: sha256 of every file's bytes.

    `weights_digest`: sha256 over the weight files' names and contents' sha256 (the shard
    index included); two repos or commits with the same value hold the same weights.
    `files_digest`: the same over every other file scoring reads (config, tokenizer): the
    same weights under another config or tokenizer compute other numbers.

    An LFS file's sha256 is the one the Hub announced, which the fetch checked against the
    bytes. A small file is checked by its git blob id, a SHA-1, against which collisions can
    be made: its sha256 is computed here from the verified bytes, so a second file made to
    share a first's blob id cannot inherit the first's score.
    """
    def digest(chosen: list[ExpectedFile]) -> str:
        ids = sorted([f.name, (f.sha256 or _digest(snapshot / f.name, "sha256")).lower()] for f in chosen)
        return hashlib.sha256(json.dumps(ids).encode()).hexdigest()

    weights = [f for f in files if f.name not in FILE_BYTE_LIMITS or f.name == WEIGHTS_INDEX]
    others = [f for f in files if f not in weights]
    return {"weights_digest": digest(weights), "files_digest": digest(others)}  # type: ignore[dict-item]


def fetch_pinned(repo: str, sha: str, *, cache_dir: str | Path | None = None, info: Any = None,
                 client: HubClient | None = None, budgets: Budgets | None = None) -> Path:
    """Download the model files of `repo` at commit `sha` into the cache and verify them
    (see `_fetch`)."""
    return _fetch(repo, sha, cache_dir=cache_dir, info=info, client=client, budgets=budgets)


def _fetch(repo: str, sha: str, *, cache_dir: str | Path | None = None, info: Any = None,
           client: HubClient | None = None, budgets: Budgets | None = None,
           verify: Callable[[Path, str, str, Sequence[ExpectedFile]], Path] = verify_snapshot) -> Path:
    """Download the model files of `repo` at commit `sha` into the cache and verify them.

    `sha` may also be a branch or tag name; it is resolved to its commit first, and the
    returned folder is always `snapshots/<commit sha>`. Every file is refused before the
    download when the Hub announces it over its byte limit, and stopped while downloading
    once it passes the size announced. Raises GateRefusedError for a repo that is not safe
    to fetch (or no longer available), IntegrityError when a file does not match what the
    Hub announced, HubError when the Hub cannot be reached.
    """
    client = client or HubClient()
    cache_dir = resolve_cache_dir(cache_dir)
    try:
        if info is None or not COMMIT_RE.fullmatch(sha):
            info = client.model_info(repo, sha, files_metadata=True)
        if not info.sha or not COMMIT_RE.fullmatch(info.sha):
            raise GateRefusedError(f"the Hub gave no commit sha for {repo}@{sha}")
        if COMMIT_RE.fullmatch(sha) and info.sha != sha:
            raise GateRefusedError(f"the Hub answered for commit {info.sha} instead of {sha}")
        sha = info.sha
        files = plan_files(client, repo, sha, info, cache_dir, budgets)
        weights = [f for f in files if f.name not in FILE_BYTE_LIMITS]
        others = [f for f in files if f.name in FILE_BYTE_LIMITS]
        # The weights in one snapshot call, stopped once they pass their announced total;
        # the small files one by one, each stopped past its own announced size.
        client.snapshot(repo, sha, allow_patterns=[f.name for f in weights], cache_dir=cache_dir,
                        max_bytes=sum(f.size for f in weights))
        failpoint("mid_download")
        _require_present(cache_dir, repo, sha, weights)
        for f in others:
            client.download(repo, f.name, sha, cache_dir=cache_dir, max_bytes=f.size)
    except (GateRefusedError, HubError, IntegrityError):
        raise
    except OSError as exc:
        reason = refusal_reason(exc)
        if reason is not None:
            raise GateRefusedError(f"{repo}@{sha}: {reason}") from exc
        if "Consistency check failed" in str(exc):
            raise IntegrityError(f"{repo}@{sha}: {describe_error(exc)}") from exc
        raise HubError(f"downloading {repo}@{sha} failed: {describe_error(exc)}") from exc
    return verify(cache_dir, repo, sha, files)


def fetch_verified(repo: str, sha: str, **options: Any) -> tuple[Path, dict[str, str | None]]:
    """`fetch_pinned`, and the snapshot's digests (`snapshot_digests`) of the files it verified."""
    captured: list[Sequence[ExpectedFile]] = []

    def verify(cache_dir: Path, repo: str, sha: str, files: Sequence[ExpectedFile]) -> Path:
        captured.append(files)
        return verify_snapshot(cache_dir, repo, sha, files)

    path = _fetch(repo, sha, verify=verify, **options)
    return path, snapshot_digests(captured[-1], path)


def fetch_job(store: Store, job: CheckpointRow, *, owner: str, client: HubClient | None = None,
              cache_dir: str | Path | None = None, now_fn: Callable[[], datetime] = utcnow) -> Path:
    """Queue step: fetch a leased `gated`/`fetched` row and record it as `fetched`, with its
    snapshot's digests (`snapshot_digests`) in the row's meta.

    Re-running it on a `fetched` row re-verifies the cached files without downloading.
    """
    path, digests = fetch_verified(job.repo, job.sha, cache_dir=cache_dir, client=client)
    extra: dict[str, Any] = {}
    adapter = adapter_facts(job)
    if adapter is not None:
        # The model an adapter makes is its pinned base with the update merged in: fetch and
        # verify the base too, and let both decide the score's identity (dedupe digests).
        base_path, base_digests = fetch_verified(adapter["base_repo"], adapter["base_sha"], cache_dir=cache_dir,
                                                 client=client)
        extra["base_snapshot_dir"] = str(base_path)
        digests = {key: hashlib.sha256(f"adapter:{digests[key]}+base:{base_digests[key]}".encode()).hexdigest()
                   for key in digests}
    store.advance_checkpoint(job.id, owner, status="fetched",
                             meta={"snapshot_dir": str(path), "fetched_at": now_fn().isoformat(), **digests,
                                   **extra},
                             now=now_fn())
    return path


def adapter_facts(job: CheckpointRow) -> dict[str, Any] | None:
    """The gate's adapter facts of a checkpoint row (base repo and pinned commit, rank, ...),
    or None for a model."""
    gate = (job.meta or {}).get("gate") or {}
    adapter = gate.get("adapter")
    return adapter if isinstance(adapter, dict) and adapter.get("base_sha") else None
