"""A fake Hugging Face Hub: a real HTTP server speaking the Hub API as huggingface_hub 2.4 uses it.

The server is stdlib only (`ThreadingHTTPServer` on 127.0.0.1, a daemon thread) and is
driven by the official client through `HF_ENDPOINT` / `HfApi(endpoint=hub.url)`. The
contract it implements is `docs/hub-api.md`; the behaviours that matter to the
client are reproduced exactly (error headers, absolute `Link` pagination, `X-Repo-Commit`,
ETags, Range reads, LFS metadata, 302s to a CDN host), the rest is left out.

State lives in `fakehub_state.HubState`, which `FakeHub` extends: repos hold commits (a
40-hex sha derived from the content -> files), branches, tags and pull-request refs.
Tests change the state while the server runs (`add_commit`, `set_gated`, ...), inject
faults (`fail_next`, `set_outage`, `latency`, `tamper`, and for files larger than anything
stored, `announce_size` and `serve_generated`), mark LFS files as stored on Xet
(`serve_xet`), and read the request log (`requests`,
`count_requests`).

Run as a process for the daemon and the demo::

    python -m monitor.demo.fakehub --port 8765 --scenario demo

It prints one JSON line `{"url": ..., "scenario": ..., "summary": ...}` and serves until
SIGTERM/SIGINT; point the commands at it with `export HF_ENDPOINT=URL`. A small control API under `/_fakehub/` (log, faults) serves other processes.
"""

from __future__ import annotations

import argparse
import base64
import bisect
import hashlib
import json
import signal
import socket
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, NamedTuple
from urllib.parse import parse_qs, quote, unquote, urlencode, urlsplit

from monitor.demo.fakehub_state import Commit, HubState, Repo, format_time, micros
from monitor.demo.hub_repos import SCENARIOS, add_filler_repos, load_scenario

DISABLED_MESSAGE = "Access to this resource is disabled."

# Fields of a listing item on the live Hub when neither `expand` nor `full` is asked for.
DEFAULT_LIST_FIELDS = ("_id", "id", "likes", "trendingScore", "private", "downloads", "tags",
                       "pipeline_tag", "library_name", "createdAt", "modelId")
FULL_LIST_FIELDS = DEFAULT_LIST_FIELDS + ("author", "sha", "lastModified", "gated", "disabled", "siblings")
MODEL_INFO_FIELDS = ("_id", "id", "modelId", "author", "sha", "lastModified", "private", "disabled",
                     "gated", "downloads", "likes", "library_name", "tags", "pipeline_tag", "createdAt",
                     "config", "siblings", "spaces", "safetensors", "usedStorage", "cardData")
# Every property huggingface_hub 2.4 may send as `expand=`; the live Hub answers 400 to others.
EXPAND_PROPERTIES = frozenset((
    "author", "baseModels", "cardData", "childrenModelCount", "config", "createdAt", "disabled",
    "downloads", "downloadsAllTime", "evalResults", "gated", "gguf", "inference",
    "inferenceProviderMapping", "lastModified", "library_name", "likes", "mask_token", "model-index",
    "pipeline_tag", "private", "resourceGroup", "safetensors", "sha", "siblings", "spaces", "tags",
    "transformersInfo", "trendingScore", "usedStorage", "widgetData"))
SORT_FIELDS = ("lastModified", "createdAt", "downloads", "likes", "trendingScore")
API_KEYWORDS = frozenset(("revision", "refs", "commits", "tree", "paths-info", "safetensors-metadata"))


# ----------------------------------------------------------------------------- requests and faults

class RequestRecord(NamedTuple):
    """One request the server answered (control requests under /_fakehub/ are not logged)."""

    method: str
    path: str                      # the decoded path, without the query
    query: dict[str, list[str]]
    headers: dict[str, str]        # lower-cased subset: authorization, range, host, user-agent
    time: float                    # arrival, on the hub's request clock (time.monotonic by default)
    status: int


LOGGED_HEADERS = ("authorization", "range", "host", "user-agent", "accept-encoding")


@dataclass
class _Fault:
    remaining: int
    status: int
    retry_after: float | None
    rate_limit_header: bool
    path_prefix: str | None


@dataclass
class _Response:
    status: int
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""
    content_length: int | None = None   # for HEAD: the length a GET would send
    stream: Iterator[bytes] | None = None  # a body produced while sending (content_length bytes)
    on_sent: Callable[[int], None] | None = None  # told how many stream bytes each write sent


class _HttpError(Exception):
    def __init__(self, status: int, message: str, code: str | None = None,
                 headers: list[tuple[str, str]] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.headers = status, message, code, headers or []

    def response(self) -> _Response:
        headers = [("Content-Type", "application/json"), ("X-Error-Message", self.message)]
        if self.code:
            headers.append(("X-Error-Code", self.code))
        return _Response(self.status, headers + self.headers, json.dumps({"error": self.message}).encode())


def _json(obj: Any, status: int = 200, headers: list[tuple[str, str]] | None = None) -> _Response:
    return _Response(status, [("Content-Type", "application/json")] + (headers or []),
                     json.dumps(obj).encode())


def _encode_cursor(value: Any) -> str:
    return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")


def _decode_cursor(token: str) -> Any:
    try:
        return json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    except ValueError as exc:
        raise _HttpError(400, f"Invalid cursor {token!r}") from exc


def _parse_count(text: str) -> int:
    text = text.strip().upper()
    scale = {"K": 10**3, "M": 10**6, "B": 10**9, "T": 10**12}.get(text[-1:], 1)
    number = text[:-1] if scale != 1 else text
    return int(float(number) * scale)


# ----------------------------------------------------------------------------- the hub

class FakeHub(HubState):
    """Hub state (see `HubState` for adding repos, commits, refs) plus the HTTP server that serves it.

    Use as a context manager (`with FakeHub() as hub:`) or call `start()`/`stop()`.
    All public methods are thread-safe; the server reads the same state under one lock.
    """

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0,
                 clock: Callable[[], datetime] | None = None,
                 request_clock: Callable[[], float] = time.monotonic,
                 page_size: int = 1000, tree_page_size: int = 1000, commits_page_size: int = 50,
                 cdn_redirect: bool = False, cdn_host: str = "localhost", latency: float = 0.0,
                 revision_last_modified: str = "commit") -> None:
        super().__init__(clock=clock)
        # What `lastModified` of /api/models/{repo}/revision/{rev} reports: the commit's date
        # ("commit"), or the repo's last change ("repo"); which one the live Hub sends is unconfirmed.
        self.revision_last_modified = revision_last_modified
        self.host, self._port = host, port
        self.request_clock = request_clock
        self.page_size, self.tree_page_size, self.commits_page_size = page_size, tree_page_size, commits_page_size
        self.cdn_redirect, self.cdn_host = cdn_redirect, cdn_host
        self.latency = latency
        self._sorted: dict[str, tuple[int, list[tuple[int, int]], list[Repo]]] = {}
        self._faults: list[_Fault] = []
        self._outage = False
        self._outage_retry_after: int | None = None
        self._log: list[RequestRecord] = []
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> "FakeHub":
        """Bind (port 0 picks a free port; a stopped hub rebinds its previous port) and serve in a daemon thread."""
        if self._server is not None:
            return self
        self._server = _Server((self.host, self._port), self)
        self._port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name=f"fakehub-{self._port}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and drop open keep-alive connections, so clients see the Hub as down."""
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.close_connections()
        server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> "FakeHub":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        """The endpoint to give the client (`HfApi(endpoint=hub.url)` or `HF_ENDPOINT`)."""
        return f"http://{self.host}:{self._port}"

    # -- faults ------------------------------------------------------------------------------

    def fail_next(self, n: int = 1, status: int = 503, *, retry_after: float | None = None,
                  rate_limit_header: bool = True, path_prefix: str | None = None) -> None:
        """Answer the next `n` requests (whose path starts with `path_prefix`, if given) with `status`.

        A 429 carries `RateLimit: "api";r=0;t=N` (bucket "resolvers" for /resolve/ paths) when
        `rate_limit_header`, and `Retry-After: N` when `retry_after` is given (any status).
        """
        with self._lock:
            self._faults.append(_Fault(n, status, retry_after, rate_limit_header, path_prefix))

    def set_outage(self, on: bool = True, *, retry_after: int | None = None) -> None:
        """While on, every request is answered 503, with `Retry-After: N` when `retry_after` is
        given (whole seconds: huggingface_hub reads only digits there, and then waits N + 1 s
        between its own retries of a listing page, instead of 1, 2, 4, 8 and 8 s)."""
        with self._lock:
            self._outage = on
            self._outage_retry_after = retry_after if on else None

    # -- request log -------------------------------------------------------------------------

    @property
    def requests(self) -> list[RequestRecord]:
        """A copy of the request log, in arrival order."""
        with self._lock:
            return sorted(self._log, key=lambda r: r.time)

    def count_requests(self, prefix: str | None = None, method: str | None = None) -> int:
        """How many logged requests have a path starting with `prefix` (and this method)."""
        with self._lock:
            return sum(1 for r in self._log
                       if (prefix is None or r.path.startswith(prefix)) and (method is None or r.method == method))

    def reset_log(self) -> None:
        """Forget the logged requests."""
        with self._lock:
            self._log.clear()

    # -- internals: HTTP ---------------------------------------------------------------------

    def _handle(self, method: str, target: str, headers: Mapping[str, str], body: bytes) -> _Response:
        """Answer one request (called from the server's handler threads)."""
        split = urlsplit(target)
        path = unquote(split.path)
        query = parse_qs(split.query, keep_blank_values=True)
        if split.path.startswith("/_fakehub/"):
            return self._control(method, split.path, body)
        arrived = self.request_clock()
        with self._lock:
            fault = self._take_fault(split.path)
            delay = self.latency
        if delay:
            time.sleep(delay)
        if fault is not None:
            response = fault
        else:
            try:
                with self._lock:
                    response = self._route(method, split.path, query, headers)
            except _HttpError as exc:
                response = exc.response()
        logged = {k: headers[k] for k in LOGGED_HEADERS if headers.get(k) is not None}
        with self._lock:
            self._log.append(RequestRecord(method, path, query, logged, arrived, response.status))
        return response

    def _take_fault(self, raw_path: str) -> _Response | None:
        if self._outage:
            headers = [] if self._outage_retry_after is None else [("Retry-After", str(self._outage_retry_after))]
            return _HttpError(503, "Service Unavailable (fake Hub outage)", headers=headers).response()
        for fault in self._faults:
            if fault.path_prefix is None or unquote(raw_path).startswith(fault.path_prefix):
                fault.remaining -= 1
                if fault.remaining <= 0:
                    self._faults.remove(fault)
                headers = []
                if fault.retry_after is not None:
                    headers.append(("Retry-After", f"{fault.retry_after:g}"))
                if fault.status == 429 and fault.rate_limit_header:
                    bucket = "resolvers" if "/resolve/" in raw_path else "api"
                    reset = int(fault.retry_after) if fault.retry_after is not None else 55
                    headers += [("RateLimit", f'"{bucket}";r=0;t={reset}'),
                                ("RateLimit-Policy", f'"fixed window";"{bucket}";q=500;w=300')]
                message = "Too Many Requests" if fault.status == 429 else f"Injected error {fault.status}"
                return _HttpError(fault.status, message, headers=headers).response()
        return None

    def _route(self, method: str, raw_path: str, query: dict, headers: Mapping[str, str]) -> _Response:
        token = None
        auth = headers.get("authorization") or ""
        if auth.lower().startswith("bearer "):
            token = auth[7:].strip()
        host = headers.get("host") or f"{self.host}:{self._port}"
        segments = raw_path.split("/")[1:]
        if raw_path == "/api/agent-harnesses":
            raise _HttpError(404, "Not Found")
        if raw_path in ("/api/models", "/api/models/"):
            if method != "GET":
                raise _HttpError(405, "Method Not Allowed")
            return self._list_models(query, token, host)
        if raw_path.startswith("/api/models/"):
            if method != "GET":
                raise _HttpError(405, "Method Not Allowed")
            return self._model_api(segments[2:], query, token, host)
        if len(segments) == 2 and segments[0] == "cdn":
            return self._cdn(method, unquote(segments[1]), query, headers)
        for repo_len in (2, 1):
            if len(segments) > repo_len + 2 and segments[repo_len] == "resolve":
                repo_id = "/".join(unquote(s) for s in segments[:repo_len])
                rev = unquote(segments[repo_len + 1])
                file_path = unquote("/".join(segments[repo_len + 2:]))
                return self._resolve_file(method, repo_id, rev, file_path, token, headers)
        raise _HttpError(404, f"Not Found: {unquote(raw_path)}")

    def _access(self, repo_id: str, token: str | None, *, files: bool) -> Repo:
        repo = self._repos.get(repo_id)
        if repo is None or (repo.private and token not in repo.member_tokens):
            raise _HttpError(401 if token is None else 404, "Repository not found", "RepoNotFound")
        if repo.disabled:
            raise _HttpError(403, DISABLED_MESSAGE)
        if files and repo.gated and token not in repo.approved_tokens:
            if token is None:
                raise _HttpError(401, f"Access to model {repo_id} is restricted. You must have access to it "
                                      "and be authenticated to access it. Please log in.", "GatedRepo")
            raise _HttpError(403, f"Access to model {repo_id} is restricted and you are not in the authorized "
                                  f"list. Visit {self.url}/{repo_id} to ask for access.", "GatedRepo")
        self._materialise(repo)
        return repo

    def _commit_at(self, repo: Repo, rev: str) -> Commit:
        try:
            return repo.commits[self._resolve(repo, rev)]
        except KeyError:
            raise _HttpError(404, f"Invalid rev id: {rev}", "RevisionNotFound") from None

    # -- /api/models listing

    def _sorted_repos(self, sort: str) -> tuple[list[tuple[int, int]], list[Repo]]:
        cached = self._sorted.get(sort)
        if cached is not None and cached[0] == self._version:
            return cached[1], cached[2]

        def value(repo: Repo) -> int:
            if sort == "lastModified":
                return micros(repo.last_modified)
            if sort == "createdAt":
                return micros(repo.created_at)
            if sort == "downloads":
                return repo.downloads
            if sort == "likes":
                return repo.likes
            return 0  # trendingScore: every fake repo trends equally; ties fall back to creation order

        pairs = sorted(((value(r), r.seq), r) for r in self._repos.values())
        keys, repos = [k for k, _ in pairs], [r for _, r in pairs]
        self._sorted[sort] = (self._version, keys, repos)
        return keys, repos

    def _list_models(self, query: dict, token: str | None, host: str) -> _Response:
        first = {k: v[0] for k, v in query.items() if v}
        sort = first.get("sort") or "trendingScore"
        if sort not in SORT_FIELDS:
            raise _HttpError(400, f"Invalid sort field {sort!r}")
        descending = first.get("direction", "-1") != "1"
        expand = query.get("expand", [])
        unknown = [e for e in expand if e not in EXPAND_PROPERTIES]
        if unknown:
            raise _HttpError(400, f"Invalid expand property {unknown[0]!r}")
        if expand:
            fields = ("_id", "id") + tuple(expand)
        elif first.get("full", "").lower() in ("true", "1"):
            fields = FULL_LIST_FIELDS
        else:
            fields = DEFAULT_LIST_FIELDS
        if first.get("config", "").lower() in ("true", "1") and "config" not in fields:
            fields = fields + ("config",)
        limit = first.get("limit")
        page_size = min(int(limit), self.page_size) if limit else self.page_size
        keep = self._listing_filter(query, first, token)

        keys, repos = self._sorted_repos(sort)
        if "cursor" in first:
            cursor = tuple(_decode_cursor(first["cursor"]))
            pos = bisect.bisect_left(keys, cursor) - 1 if descending else bisect.bisect_right(keys, cursor)
        else:
            pos = len(keys) - 1 if descending else 0
        step = -1 if descending else 1
        page: list[Repo] = []
        more = False
        last_key = None
        while 0 <= pos < len(keys):
            repo = repos[pos]
            if keep(repo):
                if len(page) == page_size:
                    more = True
                    break
                page.append(repo)
                last_key = keys[pos]
            pos += step
        items = [self._fields(r, None, fields, blobs=False) for r in page]
        headers = []
        if more:
            params = [(k, v) for k, vs in query.items() if k != "cursor" for v in vs]
            params.append(("cursor", _encode_cursor(list(last_key))))
            headers.append(("Link", f'<http://{host}/api/models?{urlencode(params)}>; rel="next"'))
        return _json(items, headers=headers)

    def _listing_filter(self, query: dict, first: dict, token: str | None) -> Callable[[Repo], bool]:
        author, search = first.get("author"), (first.get("search") or "").lower()
        pipeline_tag, gated = first.get("pipeline_tag"), first.get("gated")
        wanted = [f for f in query.get("filter", []) if f]
        low = high = None
        if first.get("num_parameters"):
            for part in first["num_parameters"].split(","):
                bound, _, amount = part.partition(":")
                if bound == "min":
                    low = _parse_count(amount)
                elif bound == "max":
                    high = _parse_count(amount)

        def keep(repo: Repo) -> bool:
            if repo.private and token not in repo.member_tokens:
                return False
            if author and repo.author != author:
                return False
            if search and search not in repo.repo_id.lower():
                return False
            if pipeline_tag and repo.pipeline_tag != pipeline_tag:
                return False
            if gated is not None and bool(repo.gated) != (gated.lower() == "true"):
                return False
            if wanted:
                labels = set(repo.tags) | {repo.library_name, repo.repo_id}
                if not all(f in labels for f in wanted):
                    return False
            if low is not None or high is not None:
                self._materialise(repo)
                info = repo.commits[repo.branches["main"]].safetensors_info()
                total = info["total"] if info else None
                if total is None or (low is not None and total < low) or (high is not None and total > high):
                    return False
            return True

        return keep

    def _fields(self, repo: Repo, commit: Commit | None, names: tuple[str, ...], *, blobs: bool) -> dict:
        """A model item with the requested fields (commit None: the head of main)."""
        needs_commit = {"sha", "siblings", "safetensors", "config", "usedStorage", "cardData"}
        if commit is None and needs_commit.intersection(names):
            self._materialise(repo)
            # A repo made only of other branches (e.g. step branches) has no main: use the
            # first branch by name so listings stay answerable and deterministic.
            branch = "main" if "main" in repo.branches else min(repo.branches)
            commit = repo.commits[repo.branches[branch]]
        item: dict[str, Any] = {}
        for name in names:
            if name == "_id":
                item[name] = hashlib.sha1(repo.repo_id.encode()).hexdigest()[:24]
            elif name in ("id", "modelId"):
                item[name] = repo.repo_id
            elif name == "author":
                item[name] = repo.author
            elif name == "sha":
                item[name] = commit.sha
            elif name == "lastModified":
                item[name] = format_time(repo.last_modified)
            elif name == "createdAt":
                item[name] = format_time(repo.created_at)
            elif name in ("private", "disabled", "gated", "downloads", "likes", "pipeline_tag", "library_name"):
                item[name] = getattr(repo, name)
            elif name == "downloadsAllTime":
                item[name] = repo.downloads
            elif name == "trendingScore":
                item[name] = 0
            elif name == "tags":
                item[name] = repo.tags
            elif name == "spaces":
                item[name] = []
            elif name == "siblings":
                item[name] = [self._sibling(repo.repo_id, commit, p, blobs) for p in sorted(commit.files)]
            elif name == "safetensors":
                info = commit.safetensors_info()
                if info is not None:
                    item[name] = info
            elif name == "config":
                cfg = commit.config()
                if cfg is not None:
                    item[name] = cfg
            elif name == "cardData":
                card = commit.card_data()
                if card is not None:
                    item[name] = card
            elif name == "usedStorage":
                item[name] = sum(len(d) for d in commit.files.values())
        return item

    def _sibling(self, repo_id: str, commit: Commit, path: str, blobs: bool) -> dict:
        if not blobs:
            return {"rfilename": path}
        meta = self.announced_meta(repo_id, commit, path)
        sibling: dict[str, Any] = {"rfilename": path, "size": meta.size, "blobId": meta.blob_id}
        if meta.sha256:
            sibling["lfs"] = {"size": meta.size, "sha256": meta.sha256, "pointerSize": meta.pointer_size}
        return sibling

    # -- /api/models/{repo}/...

    def _model_api(self, segments: list[str], query: dict, token: str | None, host: str) -> _Response:
        if not segments or not segments[0]:
            raise _HttpError(404, "Not Found")
        repo_len = 2 if len(segments) >= 2 and segments[1] not in API_KEYWORDS else 1
        repo_id = "/".join(unquote(s) for s in segments[:repo_len])
        rest = segments[repo_len:]
        repo = self._access(repo_id, token, files=False)
        first = {k: v[0] for k, v in query.items() if v}
        if not rest or rest[0] == "revision":
            rev = unquote("/".join(rest[1:])) if rest else "main"
            commit = self._commit_at(repo, rev or "main")
            blobs = first.get("blobs", "").lower() in ("true", "1")
            expand = query.get("expand", [])
            if blobs and expand:
                raise _HttpError(400, "`blobs` and `expand` cannot be combined")
            unknown = [e for e in expand if e not in EXPAND_PROPERTIES]
            if unknown:
                raise _HttpError(400, f"Invalid expand property {unknown[0]!r}")
            names = ("_id", "id") + tuple(expand) if expand else MODEL_INFO_FIELDS
            item = self._fields(repo, commit, names, blobs=blobs)
            if rest and "lastModified" in item and self.revision_last_modified == "commit":
                item["lastModified"] = format_time(commit.date)
            return _json(item)
        if rest == ["refs"]:
            return _json(self._refs(repo, include_prs=first.get("include_prs") in ("1", "true", "True")))
        if rest[0] == "commits":
            commit = self._commit_at(repo, unquote("/".join(rest[1:])) or "main")
            return self._commits(repo, commit, first, query, host)
        if rest[0] == "tree" and len(rest) >= 2:
            commit = self._commit_at(repo, unquote(rest[1]))
            sub = unquote("/".join(rest[2:])).strip("/")
            return self._tree(repo, commit, sub, first, query, host)
        raise _HttpError(404, f"Not Found: /api/models/{repo_id}/{'/'.join(rest)}")

    @staticmethod
    def _refs(repo: Repo, include_prs: bool) -> dict:
        def ref(name: str, full: str, sha: str) -> dict:
            return {"name": name, "ref": full, "targetCommit": sha}

        body = {"branches": [ref(n, f"refs/heads/{n}", s) for n, s in sorted(repo.branches.items())],
                "tags": [ref(n, f"refs/tags/{n}", s) for n, s in sorted(repo.git_tags.items())],
                "converts": []}
        if include_prs:
            body["pullRequests"] = [ref(f"refs/pr/{n}", f"refs/pr/{n}", s)
                                    for n, s in sorted(repo.pull_requests.items())]
        return body

    def _next_link(self, host: str, path: str, query: dict, key: str, value: Any) -> tuple[str, str]:
        params = [(k, v) for k, vs in query.items() if k != key for v in vs] + [(key, str(value))]
        return ("Link", f'<http://{host}{quote(path)}?{urlencode(params)}>; rel="next"')

    def _commits(self, repo: Repo, commit: Commit, first: dict, query: dict, host: str) -> _Response:
        history = []
        current: Commit | None = commit
        while current is not None:
            history.append(current)
            current = repo.commits.get(current.parent) if current.parent else None
        page = int(first.get("p", "0"))
        size = self.commits_page_size
        chunk = history[page * size:(page + 1) * size]
        items = [{"id": c.sha, "title": c.title, "message": "", "date": format_time(c.date),
                  "authors": [{"user": c.author, "avatar": None}]} for c in chunk]
        headers = []
        if (page + 1) * size < len(history):
            headers.append(self._next_link(host, f"/api/models/{repo.repo_id}/commits/{commit.sha}",
                                           query, "p", page + 1))
        return _json(items, headers=headers)

    def _tree(self, repo: Repo, commit: Commit, sub: str, first: dict, query: dict, host: str) -> _Response:
        recursive = first.get("recursive", "").lower() in ("true", "1")
        prefix = sub + "/" if sub else ""
        dirs: set[str] = set()
        files: list[str] = []
        for path in commit.files:
            if not path.startswith(prefix) or path == sub:
                continue
            parts = path[len(prefix):].split("/")
            if len(parts) == 1:
                files.append(path)
            elif recursive:
                dirs.update(prefix + "/".join(parts[:i]) for i in range(1, len(parts)))
                files.append(path)
            else:
                dirs.add(prefix + parts[0])
        dirs.discard(prefix)  # a leading "/" in a file name yields an empty component
        if sub and not files and not dirs:
            raise _HttpError(404, f"Entry not found: {sub}", "EntryNotFound",
                             [("X-Repo-Commit", commit.sha)])
        entries: list[dict] = []
        for d in sorted(d for d in dirs if d):
            entries.append({"type": "directory", "oid": hashlib.sha1(f"{commit.sha}:{d}".encode()).hexdigest(),
                            "size": 0, "path": d})
        for path in sorted(files):
            meta = self.announced_meta(repo.repo_id, commit, path)
            entry: dict[str, Any] = {"type": "file", "oid": meta.blob_id, "size": meta.size, "path": path}
            if meta.sha256:
                entry["lfs"] = {"oid": meta.sha256, "size": meta.size, "pointerSize": meta.pointer_size}
            entries.append(entry)
        offset = int(_decode_cursor(first["cursor"])) if "cursor" in first else 0
        chunk = entries[offset:offset + self.tree_page_size]
        headers = []
        if offset + self.tree_page_size < len(entries):
            path = f"/api/models/{repo.repo_id}/tree/{commit.sha}" + (f"/{sub}" if sub else "")
            headers.append(self._next_link(host, path, query, "cursor",
                                           _encode_cursor(offset + self.tree_page_size)))
        return _json(chunk, headers=headers)

    # -- files

    def _resolve_file(self, method: str, repo_id: str, rev: str, path: str, token: str | None,
                      headers: Mapping[str, str]) -> _Response:
        if method not in ("GET", "HEAD"):
            raise _HttpError(405, "Method Not Allowed")
        repo = self._access(repo_id, token, files=True)
        commit = self._commit_at(repo, rev)
        if path not in commit.files:
            raise _HttpError(404, f"Entry not found: {path}", "EntryNotFound", [("X-Repo-Commit", commit.sha)])
        meta = self.announced_meta(repo_id, commit, path)
        common = [("X-Repo-Commit", commit.sha), ("ETag", f'"{meta.etag}"'), ("Accept-Ranges", "bytes")]
        if (repo_id, commit.sha, path) in self._xet:
            host = headers.get("host") or f"{self.host}:{self._port}"
            common += [("X-Xet-Hash", str(meta.sha256)),
                       ("Link", f'<http://{host}/api/models/{repo_id}/xet-read-token/{commit.sha}>; rel="xet-auth"')]
        if meta.sha256 and self.cdn_redirect:
            location = (f"http://{self.cdn_host}:{self._port}/cdn/{meta.sha256}?"
                        + urlencode({"repo": repo_id, "rev": commit.sha, "path": path}))
            return _Response(302, common + [("X-Linked-Etag", f'"{meta.sha256}"'), ("X-Linked-Size", str(meta.size)),
                                            ("Location", location)])
        key = (repo_id, commit.sha, path)
        if key in self._generated and method == "GET":
            size = self._generated[key]
            return _Response(200, common + [("Content-Type", "application/octet-stream")],
                             content_length=size, stream=_generated_bytes(size),
                             on_sent=lambda n: self._count_sent(key, n))
        data = self._tampered.get(key, commit.files[path])
        return self._content(method, data, meta.size, common, headers)

    def _cdn(self, method: str, sha256: str, query: dict, headers: Mapping[str, str]) -> _Response:
        data = self._blobs.get(sha256)
        if data is None:
            raise _HttpError(404, "Not Found")
        first = {k: v[0] for k, v in query.items() if v}
        data = self._tampered.get((first.get("repo"), first.get("rev"), first.get("path")), data)
        return self._content(method, data, len(self._blobs[sha256]), [("ETag", f'"{sha256}"')], headers)

    @staticmethod
    def _content(method: str, data: bytes, announced: int, common: list, headers: Mapping[str, str]) -> _Response:
        common = common + [("Content-Type", "application/octet-stream")]
        spec = (headers.get("range") or "").strip()
        if method == "HEAD":
            return _Response(200, common, b"", content_length=announced)
        if spec.startswith("bytes=") and "," not in spec:
            start_s, _, end_s = spec[6:].partition("-")
            size = len(data)
            try:
                if start_s:
                    start, end = int(start_s), min(int(end_s) if end_s else size - 1, size - 1)
                else:
                    start, end = max(size - int(end_s), 0), size - 1
            except ValueError:
                return _Response(200, common, data)
            if start >= size or start > end:
                return _Response(416, common + [("Content-Range", f"bytes */{size}")], b"")
            return _Response(206, common + [("Content-Range", f"bytes {start}-{end}/{size}")], data[start:end + 1])
        return _Response(200, common, data)

    # -- control API for hubs run as a separate process

    def _control(self, method: str, raw_path: str, body: bytes) -> _Response:
        try:
            args = json.loads(body) if body else {}
        except ValueError:
            return _json({"error": "body must be JSON"}, 400)
        name = raw_path[len("/_fakehub/"):]
        if name == "requests" and method == "GET":
            return _json([r._asdict() for r in self.requests])
        if method != "POST":
            return _json({"error": f"unknown control {method} {raw_path}"}, 404)
        if name == "reset_log":
            self.reset_log()
        elif name == "fail_next":
            self.fail_next(**args)
        elif name == "outage":
            self.set_outage(bool(args.get("on", True)))
        elif name == "latency":
            self.latency = float(args.get("seconds", 0.0))
        else:
            return _json({"error": f"unknown control {raw_path}"}, 404)
        return _json({"ok": True})


def _generated_bytes(size: int, block: int = 1 << 20) -> Iterator[bytes]:
    """`size` bytes of a repeating pattern, one block at a time (never all in memory)."""
    pattern = (b"lstar fake hub generated bytes\n" * (block // 31 + 1))[:block]
    sent = 0
    while sent < size:
        chunk = pattern[:min(block, size - sent)]
        sent += len(chunk)
        yield chunk


# ----------------------------------------------------------------------------- server

class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "FakeHub/1.0"
    timeout = 30  # idle keep-alive connections are dropped after this many seconds
    # The status line and headers go out in one write and the body in the next: with Nagle's
    # algorithm the body then waits for the client's delayed ACK (about 40 ms on Linux) on
    # every keep-alive request. TCP_NODELAY sends it at once, as the live Hub's servers do.
    disable_nagle_algorithm = True

    def _serve(self, method: str) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        headers = {k.lower(): v for k, v in self.headers.items()}
        response = self.server.hub._handle(method, self.path, headers, body)
        self.send_response(response.status)
        for name, value in response.headers:
            self.send_header(name, value)
        length = response.content_length if response.content_length is not None else len(response.body)
        self.send_header("Content-Length", str(length))
        self.end_headers()
        if method != "HEAD" and response.body:
            self.wfile.write(response.body)
        if method != "HEAD" and response.stream is not None:
            for chunk in response.stream:  # a client that hangs up ends this with an OSError
                self.wfile.write(chunk)
                if response.on_sent is not None:
                    response.on_sent(len(chunk))

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        self._serve("GET")

    def do_HEAD(self) -> None:  # noqa: N802
        self._serve("HEAD")

    def do_POST(self) -> None:  # noqa: N802
        self._serve("POST")

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        return  # the hub keeps its own request log


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], hub: FakeHub) -> None:
        self.hub = hub
        self._open: set[socket.socket] = set()
        self._open_lock = threading.Lock()
        super().__init__(address, _Handler)

    def process_request(self, request, client_address) -> None:
        with self._open_lock:
            self._open.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request) -> None:
        with self._open_lock:
            self._open.discard(request)
        super().shutdown_request(request)

    def close_connections(self) -> None:
        with self._open_lock:
            sockets, self._open = list(self._open), set()
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def handle_error(self, request, client_address) -> None:
        # Clients hanging up mid-response (cancelled downloads, stop()) are normal here.
        import sys

        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)


# ----------------------------------------------------------------------------- process entry point

def main(argv: list[str] | None = None) -> int:
    """Serve a scenario until SIGTERM/SIGINT; prints one JSON line with the URL first."""
    parser = argparse.ArgumentParser(prog="python -m monitor.demo.fakehub", description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--scenario", default="empty",
                        help=f"a built-in scenario ({', '.join(SCENARIOS)}) or module:function(hub, workdir)")
    parser.add_argument("--workdir", type=Path, default=None, help="where built files and canaries go")
    parser.add_argument("--filler", type=int, default=0, help="add this many cheap filler repos")
    parser.add_argument("--cdn-redirect", action="store_true", help="serve LFS files as 302s to a CDN host")
    args = parser.parse_args(argv)

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="fakehub-"))
    workdir.mkdir(parents=True, exist_ok=True)
    hub = FakeHub(host=args.host, port=args.port, cdn_redirect=args.cdn_redirect)
    summary = load_scenario(args.scenario)(hub, workdir)
    if args.filler:
        add_filler_repos(hub, args.filler)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    with hub:
        print(json.dumps({"url": hub.url, "scenario": args.scenario, "workdir": str(workdir),
                          "summary": summary}, default=str), flush=True)
        while not stop.wait(0.5):
            pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
