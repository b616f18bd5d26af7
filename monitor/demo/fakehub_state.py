"""The fake Hub's state: repos, commits, refs and the metadata the Hub announces for files.

No HTTP here: `monitor.demo.fakehub.FakeHub` extends `HubState` with the server. Commit
ids, git blob ids, LFS pointers and safetensors parameter counts are computed the way the
Hub computes them, so tests can check the client's view against an independent calculation.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import struct
import threading
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Mapping

from monitor.hub.model_card import card_front_matter

# Files the Hub stores through LFS: the default .gitattributes patterns, or anything over 10 MiB.
LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".onnx", ".gguf",
                ".model", ".tflite", ".ot", ".npy", ".npz", ".pkl", ".pickle", ".zip", ".tar", ".gz")
LFS_MIN_SIZE = 10 * 1024 * 1024

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


# ----------------------------------------------------------------------------- time

def utc(dt: datetime) -> datetime:
    """`dt` as an aware UTC datetime truncated to milliseconds (the Hub's resolution)."""
    if dt.tzinfo is timezone.utc and dt.microsecond % 1000 == 0:
        return dt
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    dt = dt.astimezone(timezone.utc)
    return dt.replace(microsecond=dt.microsecond // 1000 * 1000)


def format_time(dt: datetime) -> str:
    """The Hub's datetime format, e.g. `2024-01-01T00:00:00.000Z` (the client rejects `+00:00`)."""
    dt = utc(dt)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{dt.microsecond // 1000:03d}Z"


def micros(dt: datetime) -> int:
    """Microseconds since the epoch of an aware UTC datetime (a sort key)."""
    return (dt - EPOCH) // timedelta(microseconds=1)


# ----------------------------------------------------------------------------- content

def git_blob_sha1(data: bytes) -> str:
    """Git's object id of a blob: sha1 over `blob <size>\\0` + content."""
    return hashlib.sha1(b"blob %d\x00" % len(data) + data).hexdigest()


def lfs_pointer(sha256: str, size: int) -> bytes:
    """The git-lfs pointer file that git stores in place of an LFS file."""
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


def is_lfs_path(path: str, size: int) -> bool:
    """Whether the Hub would store `path` through LFS."""
    return path.lower().endswith(LFS_SUFFIXES) or size >= LFS_MIN_SIZE


@dataclass(frozen=True)
class FileMeta:
    """What the Hub announces about one file: size, git blob id and, for LFS files, sha256."""

    size: int
    blob_id: str
    sha256: str | None = None
    pointer_size: int | None = None

    @property
    def etag(self) -> str:
        """The ETag of `/resolve/`: the sha256 for LFS files, the git blob id otherwise."""
        return self.sha256 or self.blob_id


def describe_file(path: str, data: bytes) -> FileMeta:
    """Compute the metadata the Hub would announce for `data` stored at `path`."""
    if is_lfs_path(path, len(data)):
        sha256 = hashlib.sha256(data).hexdigest()
        pointer = lfs_pointer(sha256, len(data))
        return FileMeta(len(data), git_blob_sha1(pointer), sha256, len(pointer))
    return FileMeta(len(data), git_blob_sha1(data))


def safetensors_parameters(data: bytes) -> dict[str, int] | None:
    """`{dtype: n_parameters}` from a safetensors header, or None if the header is unreadable.

    Only the header is read, so a header-only file declaring huge shapes is counted as declared.
    """
    if len(data) < 8:
        return None
    (n,) = struct.unpack("<Q", data[:8])
    if n > len(data) - 8:
        return None
    try:
        header = json.loads(data[8:8 + n])
        counts: dict[str, int] = {}
        for name, info in header.items():
            if name == "__metadata__":
                continue
            numel = 1
            for dim in info["shape"]:
                numel *= int(dim)
            counts[info["dtype"]] = counts.get(info["dtype"], 0) + numel
        return counts
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


@dataclass(eq=False)
class Commit:
    """One commit: its sha, parent, date and the full tree as {path: bytes}."""

    sha: str
    parent: str | None
    title: str
    date: datetime
    author: str
    files: dict[str, bytes]
    _meta: dict[str, FileMeta] = field(default_factory=dict, repr=False)
    _safetensors: Any = field(default=False, repr=False)

    def meta(self, path: str) -> FileMeta:
        """Announced metadata of `path` (cached; content never changes under a sha)."""
        if path not in self._meta:
            self._meta[path] = describe_file(path, self.files[path])
        return self._meta[path]

    def safetensors_info(self) -> dict | None:
        """`{"parameters": {dtype: n}, "total": n}` over the commit's .safetensors files, as the Hub computes it."""
        if self._safetensors is False:
            totals: dict[str, int] = {}
            found = False
            for path, data in self.files.items():
                if not path.endswith(".safetensors"):
                    continue
                counts = safetensors_parameters(data)
                if counts is None:
                    totals = {}
                    found = False
                    break
                found = True
                for dtype, n in counts.items():
                    totals[dtype] = totals.get(dtype, 0) + n
            self._safetensors = {"parameters": totals, "total": sum(totals.values())} if found else None
        return self._safetensors

    def card_data(self) -> dict | None:
        """The YAML front matter of README.md, as the Hub reports it under `cardData` (None
        without a README or front matter, or when it is not a mapping)."""
        raw = self.files.get("README.md")
        # The package's one bounded YAML loader (through monitor.hub.model_card): aliases that
        # would expand a few hundred bytes to gigabytes of JSON, deep nesting and tags are
        # refused (no metadata then).
        return None if raw is None else card_front_matter(raw)[0]

    def config(self) -> dict | None:
        """The subset of config.json the Hub reports under `config`."""
        raw = self.files.get("config.json")
        if raw is None:
            return None
        try:
            cfg = json.loads(raw)
        except ValueError:
            return None
        if not isinstance(cfg, dict):
            return None
        return {k: cfg[k] for k in ("architectures", "model_type", "auto_map") if k in cfg}


def commit_sha(repo_id: str, parent: str | None, title: str, files: Mapping[str, bytes]) -> str:
    """Deterministic 40-hex commit id from the repo, the parent and the tree content."""
    h = hashlib.sha1()
    h.update(f"repo {repo_id}\nparent {parent or ''}\ntitle {title}\n".encode())
    for path in sorted(files):
        h.update(f"{git_blob_sha1(files[path])} {path}\n".encode("utf-8", "surrogatepass"))
    return h.hexdigest()


def auto_tags(files: Mapping[str, bytes]) -> list[str]:
    tags = []
    if "config.json" in files:
        tags.append("transformers")
    if any(p.endswith(".safetensors") for p in files):
        tags.append("safetensors")
    if any(p.endswith(".bin") for p in files):
        tags.append("pytorch")
    try:
        model_type = json.loads(files["config.json"]).get("model_type")
        if isinstance(model_type, str):
            tags.append(model_type)
    except (KeyError, ValueError, AttributeError):
        pass
    return tags + base_model_tags(files)


def base_model_tags(files: Mapping[str, bytes]) -> list[str]:
    """The tags the Hub derives from a card's `base_model` (what `?filter=base_model:...` finds):
    `base_model:ORG/NAME` and `base_model:RELATION:ORG/NAME` for each declared base, the relation
    declared or inferred from the files as `monitor.hub.lineage` infers it."""
    from monitor.hub.lineage import declared_base

    raw = files.get("README.md")
    card = card_front_matter(raw)[0] if raw is not None else None
    try:
        config = json.loads(files["config.json"]) if "config.json" in files else None
    except ValueError:
        config = None
    declared = declared_base(card, set(files), config if isinstance(config, dict) else None)
    if declared is None:
        return []
    return [tag for base in declared.bases for tag in (f"base_model:{base}", f"base_model:{declared.relation}:{base}")]


@dataclass(eq=False, slots=True)
class Repo:
    """A model repo: Hub-level metadata plus its git refs and commits."""

    repo_id: str
    seq: int
    created_at: datetime
    last_modified: datetime
    pipeline_tag: str | None = None
    user_tags: list[str] = field(default_factory=list)
    auto_tags: list[str] = field(default_factory=list)
    library_name: str | None = None
    gated: bool | str = False
    private: bool = False
    disabled: bool = False
    downloads: int = 0
    likes: int = 0
    branches: dict[str, str] = field(default_factory=dict)
    git_tags: dict[str, str] = field(default_factory=dict)
    pull_requests: dict[int, str] = field(default_factory=dict)
    commits: dict[str, Commit] = field(default_factory=dict)
    approved_tokens: frozenset[str] = frozenset()
    member_tokens: frozenset[str] = frozenset()
    pending: Callable[[], dict[str, bytes]] | None = None
    lazy: bool = False  # listing fields come from the registration, not from the content

    @property
    def author(self) -> str:
        return self.repo_id.split("/")[0] if "/" in self.repo_id else self.repo_id

    @property
    def name(self) -> str:
        return self.repo_id.split("/")[-1]

    @property
    def tags(self) -> list[str]:
        extra = [t for t in self.auto_tags if t not in self.user_tags]
        tags = self.user_tags + extra
        if self.pipeline_tag and self.pipeline_tag not in tags:
            tags.append(self.pipeline_tag)
        return tags


# ----------------------------------------------------------------------------- the state

class HubState:
    """Repos, commits and refs of a fake Hub, changed through thread-safe methods.

    `FakeHub` serves this state over HTTP; every method takes the same re-entrant lock the
    server holds while answering, so a test can change the Hub while a client talks to it.
    """

    def __init__(self, *, clock: Callable[[], datetime] | None = None) -> None:
        self.clock = clock or (lambda: datetime.now(timezone.utc))
        self._lock = threading.RLock()
        self._repos: dict[str, Repo] = {}
        self._seq = 0
        self._version = 0  # bumped on every change that can reorder or filter listings
        self._blobs: dict[str, bytes] = {}  # sha256 -> content of every LFS file (the CDN's store)
        self._tampered: dict[tuple[str, str, str], bytes] = {}  # (repo, sha, path) -> bytes served instead
        self._announced_size: dict[tuple[str, str, str], int] = {}  # (repo, sha, path) -> size announced
        self._generated: dict[tuple[str, str, str], int] = {}  # (repo, sha, path) -> bytes streamed
        self._generated_sent: dict[tuple[str, str, str], int] = {}  # ... and how many went out
        self._xet: set[tuple[str, str, str]] = set()  # (repo, sha, path) announced as stored on Xet

    # -- repos and commits -------------------------------------------------------------------

    def add_repo(self, repo_id: str, files: Mapping[str, bytes], *, branch: str = "main",
                 last_modified: datetime | None = None, created_at: datetime | None = None,
                 title: str = "Initial commit", pipeline_tag: str | None = None, tags: tuple[str, ...] | list[str] = (),
                 library_name: str | None = None, gated: bool | str = False, private: bool = False,
                 disabled: bool = False, downloads: int = 0, likes: int = 0) -> str:
        """Create a repo whose first commit holds `files` on `branch`; returns the commit sha."""
        when = utc(last_modified or self.clock())
        with self._lock:
            repo = self._new_repo(repo_id, when, created_at, pipeline_tag, tags, library_name, gated, private,
                                  disabled, downloads, likes)
            sha = self._commit(repo, dict(files), branch=branch, replace=True, title=title, date=when)
            self._repos[repo_id] = repo
            self._version += 1
            return sha

    def add_lazy_repo(self, repo_id: str, files_factory: Callable[[], dict[str, bytes]], *,
                      last_modified: datetime, created_at: datetime | None = None, pipeline_tag: str | None = None,
                      tags: tuple[str, ...] | list[str] = (), library_name: str | None = None,
                      downloads: int = 0, likes: int = 0) -> None:
        """Register a repo whose content is built only when first needed (cheap listings of many repos)."""
        with self._lock:
            repo = self._new_repo(repo_id, utc(last_modified), created_at, pipeline_tag, tags, library_name,
                                  False, False, False, downloads, likes)
            repo.pending, repo.lazy = files_factory, True
            self._repos[repo_id] = repo
            self._version += 1

    def add_commit(self, repo_id: str, files: Mapping[str, bytes | None], *, branch: str = "main",
                   replace: bool = False, title: str | None = None, date: datetime | None = None) -> str:
        """Commit `files` on `branch` (created as an orphan branch if absent) and move the branch.

        Files are added on top of the branch's tree (a value of None deletes a path) unless
        `replace=True`. The repo's lastModified becomes the commit date (default: the clock).
        """
        when = utc(date or self.clock())
        with self._lock:
            repo = self._repo(repo_id)
            sha = self._commit(repo, dict(files), branch=branch, replace=replace,
                               title=title or f"Update {branch}", date=when)
            repo.last_modified = max(repo.last_modified, when)
            self._version += 1
            return sha

    def add_branch(self, repo_id: str, name: str, revision: str = "main") -> str:
        """Create or move branch `name` to the commit `revision` resolves to; returns its sha."""
        return self._point_ref(repo_id, "branches", name, revision)

    def add_tag(self, repo_id: str, name: str, revision: str = "main") -> str:
        """Create tag `name` at `revision`; returns its sha."""
        return self._point_ref(repo_id, "git_tags", name, revision)

    def _point_ref(self, repo_id: str, kind: str, name: str, revision: str) -> str:
        """Point the ref `name` of `kind` (branches or git_tags) at what `revision` resolves to."""
        with self._lock:
            repo = self._repo(repo_id)
            sha = self._resolve(repo, revision)
            getattr(repo, kind)[name] = sha
            self._version += 1
            return sha

    def add_pull_request(self, repo_id: str, files: Mapping[str, bytes | None], *, base: str = "main",
                         title: str = "Pull request") -> int:
        """Open a pull request `refs/pr/N` whose head commits `files` on top of `base`; returns N."""
        with self._lock:
            repo = self._repo(repo_id)
            number = max(repo.pull_requests, default=0) + 1
            parent = repo.commits[self._resolve(repo, base)]
            tree = {**parent.files, **files}
            tree = {p: d for p, d in tree.items() if d is not None}
            sha = commit_sha(repo_id, parent.sha, title, tree)
            repo.commits[sha] = Commit(sha, parent.sha, title, utc(self.clock()), repo.author, tree)
            repo.pull_requests[number] = sha
            self._version += 1
            return number

    def delete_branch(self, repo_id: str, name: str) -> None:
        """Delete a branch (its commits stay reachable by sha)."""
        with self._lock:
            self._repo(repo_id).branches.pop(name)
            self._version += 1

    def remove_repo(self, repo_id: str) -> None:
        """Delete a repo entirely."""
        with self._lock:
            self._repos.pop(repo_id)
            self._version += 1

    def set_gated(self, repo_id: str, gated: bool | str = "manual", approved_tokens: tuple[str, ...] = ()) -> None:
        """Gate a repo ("auto", "manual" or False); `approved_tokens` may download its files."""
        if gated not in (False, "auto", "manual"):
            raise ValueError(f"gated must be False, 'auto' or 'manual', not {gated!r}")
        with self._lock:
            repo = self._repo(repo_id)
            repo.gated, repo.approved_tokens = gated, frozenset(approved_tokens)
            self._version += 1

    def set_private(self, repo_id: str, private: bool = True, member_tokens: tuple[str, ...] = ()) -> None:
        """Make a repo private: only `member_tokens` see it; everyone else gets RepoNotFound."""
        with self._lock:
            repo = self._repo(repo_id)
            repo.private, repo.member_tokens = private, frozenset(member_tokens)
            self._version += 1

    def set_disabled(self, repo_id: str, disabled: bool = True) -> None:
        """Disable a repo: every call about it answers 403 "Access to this resource is disabled."."""
        with self._lock:
            self._repo(repo_id).disabled = disabled
            self._version += 1

    def set_last_modified(self, repo_id: str, when: datetime) -> None:
        """Overwrite a repo's lastModified (e.g. a metadata-only change on the live Hub)."""
        with self._lock:
            self._repo(repo_id).last_modified = utc(when)
            self._version += 1

    def tamper(self, repo_id: str, path: str, data: bytes, revision: str = "main") -> None:
        """Serve `data` for `path` at `revision` while announcing the original size, sha256 and ETag.

        With the same length as the original, the client downloads it without complaint and only
        a sha256 check can notice; with another length the client's size check fails.
        """
        with self._lock:
            repo = self._repo(repo_id)
            sha = self._resolve(repo, revision)
            if path not in repo.commits[sha].files:
                raise KeyError(f"{repo_id}@{revision} has no file {path!r}")
            self._tampered[(repo_id, sha, path)] = bytes(data)

    def announce_size(self, repo_id: str, path: str, size: int, revision: str = "main") -> None:
        """Announce `path` at `revision` as `size` bytes (listing, tree and HEAD) while serving its real content.

        A file the Hub lists as huge costs nothing here: nothing of that size exists.
        """
        with self._lock:
            key = self._file_key(repo_id, path, revision)
            self._announced_size[key] = int(size)

    def serve_generated(self, repo_id: str, path: str, size: int, revision: str = "main") -> None:
        """Stream `size` generated bytes for `path` at `revision` while announcing its real size.

        The bytes are produced while sending, so a server lying by 150 MB holds one small
        block in memory; `bytes_sent` says how much a client actually took before hanging up.
        """
        with self._lock:
            key = self._file_key(repo_id, path, revision)
            self._generated[key] = int(size)
            self._generated_sent[key] = 0

    def serve_xet(self, repo_id: str, path: str, revision: str = "main") -> None:
        """Announce the LFS file `path` as stored on Xet: its HEAD and GET carry `X-Xet-Hash` and
        a `Link rel="xet-auth"`, which turn huggingface_hub to `file_download.xet_get`.

        The Xet transfer itself (a CAS server spoken to by hf_xet) is not served: a test
        replaces `xet_get`, the seam where the client hands the file to hf_xet.
        """
        with self._lock:
            key = self._file_key(repo_id, path, revision)
            if self.announced_meta(repo_id, self._repo(repo_id).commits[key[1]], path).sha256 is None:
                raise ValueError(f"{repo_id}@{revision}: {path} is not an LFS file; only those are on Xet")
            self._xet.add(key)

    def bytes_sent(self, repo_id: str, path: str, revision: str = "main") -> int:
        """How many generated bytes of `path` were written to clients so far."""
        with self._lock:
            return self._generated_sent.get(self._file_key(repo_id, path, revision), 0)

    def _file_key(self, repo_id: str, path: str, revision: str) -> tuple[str, str, str]:
        repo = self._repo(repo_id)
        sha = self._resolve(repo, revision)
        if path not in repo.commits[sha].files:
            raise KeyError(f"{repo_id}@{revision} has no file {path!r}")
        return (repo_id, sha, path)

    def _count_sent(self, key: tuple[str, str, str], n: int) -> None:
        with self._lock:
            self._generated_sent[key] = self._generated_sent.get(key, 0) + n

    def announced_meta(self, repo_id: str, commit: Commit, path: str) -> FileMeta:
        """What the Hub announces for `path` in `commit`: its metadata, with any announced size override."""
        meta = commit.meta(path)
        size = self._announced_size.get((repo_id, commit.sha, path))
        return meta if size is None else dataclasses.replace(meta, size=size)

    # -- reading state ---------------------------------------------------------------------

    def repo(self, repo_id: str) -> Repo:
        """The Repo object (materialised if lazy). Treat it as read-only; use the setters to change it."""
        with self._lock:
            return self._repo(repo_id)

    @property
    def repo_ids(self) -> list[str]:
        with self._lock:
            return list(self._repos)

    def resolve(self, repo_id: str, revision: str = "main") -> str:
        """The commit sha a branch, tag, `refs/...` name or sha points to."""
        with self._lock:
            return self._resolve(self._repo(repo_id), revision)

    def files(self, repo_id: str, revision: str = "main") -> dict[str, bytes]:
        """The tree at `revision` as {path: bytes} (the announced content, not a tampered one)."""
        with self._lock:
            repo = self._repo(repo_id)
            return dict(repo.commits[self._resolve(repo, revision)].files)

    def file_meta(self, repo_id: str, path: str, revision: str = "main") -> FileMeta:
        """Announced size / blob id / sha256 of one file."""
        with self._lock:
            repo = self._repo(repo_id)
            return repo.commits[self._resolve(repo, revision)].meta(path)

    # -- internals: state --------------------------------------------------------------------

    def _new_repo(self, repo_id, when, created_at, pipeline_tag, tags, library_name, gated, private, disabled,
                  downloads, likes) -> Repo:
        if repo_id in self._repos:
            raise ValueError(f"repo {repo_id!r} already exists on the fake Hub")
        if gated not in (False, "auto", "manual"):
            raise ValueError(f"gated must be False, 'auto' or 'manual', not {gated!r}")
        self._seq += 1
        return Repo(repo_id=repo_id, seq=self._seq, created_at=utc(created_at or when), last_modified=when,
                    pipeline_tag=pipeline_tag, user_tags=list(tags), library_name=library_name, gated=gated,
                    private=private, disabled=disabled, downloads=downloads, likes=likes)

    def _repo(self, repo_id: str) -> Repo:
        try:
            repo = self._repos[repo_id]
        except KeyError:
            raise KeyError(f"no repo {repo_id!r} on the fake Hub") from None
        self._materialise(repo)
        return repo

    def _materialise(self, repo: Repo) -> None:
        if repo.pending is not None:
            factory, repo.pending = repo.pending, None
            self._commit(repo, factory(), branch="main", replace=True, title="Initial commit",
                         date=repo.last_modified)

    def _commit(self, repo: Repo, files: dict, *, branch: str, replace: bool, title: str, date: datetime) -> str:
        parent_sha = repo.branches.get(branch)
        tree = {} if replace or parent_sha is None else dict(repo.commits[parent_sha].files)
        tree.update(files)
        tree = {p: bytes(d) for p, d in tree.items() if d is not None}
        sha = commit_sha(repo.repo_id, parent_sha, title, tree)
        commit = Commit(sha, parent_sha, title, date, repo.author, tree)
        for path in tree:
            meta = commit.meta(path)
            if meta.sha256:
                self._blobs[meta.sha256] = tree[path]
        repo.commits[sha] = commit
        repo.branches[branch] = sha
        if branch == "main" and not repo.lazy:
            repo.auto_tags = auto_tags(tree)
            if repo.library_name is None and "config.json" in tree:
                repo.library_name = "transformers"
        return sha

    @staticmethod
    def _resolve(repo: Repo, revision: str) -> str:
        for table, prefix in ((repo.branches, "refs/heads/"), (repo.git_tags, "refs/tags/")):
            name = revision[len(prefix):] if revision.startswith(prefix) else revision
            if name in table:
                return table[name]
        if revision.startswith("refs/pr/") and revision[8:].isdigit() and int(revision[8:]) in repo.pull_requests:
            return repo.pull_requests[int(revision[8:])]
        if revision in repo.commits:
            return revision
        raise KeyError(f"{repo.repo_id} has no revision {revision!r}")
