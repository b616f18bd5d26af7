"""Watching the Hub: watch rules, a rate-limit-aware client, and incremental polling.

A watch rule selects repos (author, name glob, search text, pipeline tag, parameter range)
and which revisions count (`main`, or branches/tags matching a regex). `poll_rule` lists
the rule's repos newest-modified first and stops at the rule's watermark, so a poll costs
requests in proportion to what changed; each new (repo, commit) becomes a `discovered`
checkpoint row, committed in one transaction together with the advanced watermark.

`HubClient` wraps huggingface_hub's `HfApi`: calls the client does not retry itself
(`model_info`, `list_repo_refs`, the safetensors range GETs, downloads) get jittered
exponential backoff honouring `Retry-After` and `RateLimit`, and every call passes a
circuit breaker persisted in the store, so a down Hub is not hammered and one outage row is
recorded for the daemon's meta-alert. The gate and the pinned download live in
`monitor.gate`.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import random
import re
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from monitor.errors import HubError, PolicyError
from monitor.store import Store, utcnow

T = TypeVar("T")

# What a listing asks the Hub to return per repo (the rest is fetched per candidate).
LIST_EXPAND = ["sha", "lastModified", "createdAt", "gated", "private", "pipeline_tag", "tags",
               "safetensors"]


# -- watch rules ---------------------------------------------------------------------------
class RevisionPattern(BaseModel):
    """Which refs of a repo count as checkpoints: branch and/or tag names (full-match regex).

    Pythia-style training runs keep steps as branches: `{branches: "step\\d+"}`.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    branches: str | None = None
    tags: str | None = None

    @field_validator("branches", "tags")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"not a valid regular expression: {exc}") from exc
        return value

    @model_validator(mode="after")
    def _one_needed(self) -> "RevisionPattern":
        if self.branches is None and self.tags is None:
            raise ValueError("give `branches` and/or `tags` (a regex), or use revisions: main")
        return self

    def matches(self, kind: Literal["branch", "tag"], name: str) -> bool:
        pattern = self.branches if kind == "branch" else self.tags
        return pattern is not None and re.fullmatch(pattern, name) is not None


class Budgets(BaseModel):
    """Safety limits checked by the gate before any weight byte is downloaded.

    Parameters and bytes come from the safetensors headers (bytes: the larger of the
    declared tensor data and the Hub's file sizes); every config.json field that sizes an
    allocation (layers, hidden size, intermediate size, heads, experts, vocabulary, context
    length) has its own limit, and the parameters the config implies must fit both
    `max_params` and the weights (see `monitor.config_budget`). Defaults admit mainstream
    open models up to ~15B parameters in bf16 and refuse absurd values (a vocabulary of
    10^9, a million layers).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_params: int = Field(15_000_000_000, gt=0)
    max_bytes: int = Field(32 * 1024**3, gt=0)
    max_vocab: int = Field(1_048_576, gt=0)
    max_context: int = Field(16_777_216, gt=0)
    max_layers: int = Field(1024, gt=0)
    max_hidden: int = Field(65_536, gt=0)
    max_intermediate: int = Field(262_144, gt=0)
    max_heads: int = Field(1024, gt=0)
    max_experts: int = Field(1024, gt=0)


class WatchRule(BaseModel):
    """One watch rule: which Hub repos to follow and which of their commits to score.

    Fields:
      name         unique name of the rule (checkpoint rows and watermarks refer to it)
      author       Hub user or organisation (server-side filter)
      name_glob    shell glob on the repo id; without a '/' it matches the part after the
                   owner (`pythia-*`), with one the whole id (`EleutherAI/pythia-*`)
      search       substring of the repo id (server-side filter)
      pipeline_tag e.g. `text-generation` (server-side filter)
      min_params / max_params  parameter range; checked from the listing when the Hub
                   reports safetensors totals, else from the safetensors header at the gate
      revisions    `main`, or `{branches: REGEX, tags: REGEX}` (full match on ref names)
      budgets      safety limits of the gate (see `Budgets`)
      scan_limit   the most repos one poll looks at (bounds a rule's first poll)
    At least one of author, search, name_glob or pipeline_tag is required, so a rule
    never lists the whole Hub.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
    author: str | None = None
    name_glob: str | None = None
    search: str | None = None
    pipeline_tag: str | None = None
    min_params: int | None = Field(None, ge=0)
    max_params: int | None = Field(None, gt=0)
    revisions: Literal["main"] | RevisionPattern = "main"
    budgets: Budgets = Budgets()
    scan_limit: int = Field(1000, ge=1, le=100_000)

    @model_validator(mode="after")
    def _consistent(self) -> "WatchRule":
        if not (self.author or self.search or self.name_glob or self.pipeline_tag):
            raise ValueError("give at least one of author, search, name_glob, pipeline_tag")
        if self.min_params is not None and self.max_params is not None \
                and self.min_params > self.max_params:
            raise ValueError(f"min_params {self.min_params} is above max_params {self.max_params}")
        return self

    def list_params(self) -> dict[str, Any]:
        """Server-side filters for `HfApi.list_models`."""
        params = {"author": self.author, "search": self.search, "pipeline_tag": self.pipeline_tag}
        return {k: v for k, v in params.items() if v}

    def matches_name(self, repo_id: str) -> bool:
        if not self.name_glob:
            return True
        target = repo_id if "/" in self.name_glob else repo_id.split("/", 1)[-1]
        return fnmatch.fnmatchcase(target, self.name_glob)

    def params_in_range(self, n_params: int | None) -> bool:
        """True when `n_params` is inside [min_params, max_params] or unknown."""
        if n_params is None:
            return True
        if self.min_params is not None and n_params < self.min_params:
            return False
        return self.max_params is None or n_params <= self.max_params

    def key(self, endpoint: str) -> str:
        """Watermark key: the name plus a hash of what the rule selects and where.

        Changing what a rule selects (or the Hub it asks) starts it from scratch.
        """
        selection = self.model_dump(mode="json", exclude={"name", "budgets", "scan_limit"})
        blob = json.dumps({"endpoint": endpoint.rstrip("/"), **selection}, sort_keys=True)
        return f"{self.name}:{hashlib.sha256(blob.encode()).hexdigest()[:16]}"


def _error_path(loc: Sequence[Any]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def load_watch_rules(path: str | Path) -> list[WatchRule]:
    """Read a YAML file whose top-level `watch:` is a list of `WatchRule` mappings.

    Read with the policy files' checks (size, UTF-8, no tags, no alias bombs), then strict
    validation; errors name the file, the key path and the offending value.
    """
    from monitor.policy_yaml import load_yaml_file

    path = Path(path)
    try:
        data = load_yaml_file(path)
    except PolicyError as exc:
        raise PolicyError(f"not valid YAML: {exc.message}", hint=exc.hint) from None
    if not isinstance(data, dict) or "watch" not in data:
        raise PolicyError(f"{path}: expected a mapping with a top-level `watch:` list",
                          hint="see WatchRule in monitor/hub.py for the fields")
    unknown = sorted(set(data) - {"watch"})
    if unknown:
        raise PolicyError(f"{path}: unknown top-level key(s): {', '.join(unknown)}")
    if not isinstance(data["watch"], list):
        raise PolicyError(f"{path}: watch: expected a list of rules, got {type(data['watch']).__name__}")
    rules: list[WatchRule] = []
    for i, item in enumerate(data["watch"]):
        try:
            rules.append(WatchRule.model_validate(item))
        except ValidationError as exc:
            err = exc.errors()[0]
            key = _error_path(["watch", i, *err["loc"]])
            raise PolicyError(f"{path}: {key}: {err['msg']} (got {err.get('input')!r})") from exc
    names = [r.name for r in rules]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise PolicyError(f"{path}: duplicate rule name(s): {', '.join(dupes)}")
    return rules


# -- the client ----------------------------------------------------------------------------
@dataclass(frozen=True)
class RetryPolicy:
    """How hard one call tries, and when the circuit opens.

    attempts: tries per call; base_s/cap_s: exponential backoff bounds (jittered);
    max_wait_s: a rate-limit wait longer than this ends the call (state keeps the Hub
    blocked until then) instead of sleeping; circuit_threshold: consecutive failed
    requests that open the circuit; circuit_cooldown_s: how long it stays open.
    """

    attempts: int = 4
    base_s: float = 1.0
    cap_s: float = 60.0
    max_wait_s: float = 120.0
    circuit_threshold: int = 5
    circuit_cooldown_s: float = 300.0


@dataclass
class HubState:
    """Circuit-breaker and rate-limit state of one endpoint (persisted in `hub_state`)."""

    consecutive_failures: int = 0
    circuit_open_until: datetime | None = None
    blocked_until: datetime | None = None
    last_error: str | None = None
    last_success_at: datetime | None = None


def rate_limit_wait(headers: Any) -> float | None:
    """Seconds a 429 asks us to wait: `RateLimit: "api";r=0;t=N`, else integer `Retry-After`."""
    ratelimit = headers.get("ratelimit") if headers is not None else None
    if ratelimit:
        fields = dict(part.strip().split("=", 1) for part in ratelimit.split(";") if "=" in part)
        if fields.get("r", "").strip() == "0" and fields.get("t", "").strip().isdigit():
            return float(fields["t"].strip())
    retry_after = (headers.get("retry-after") or "").strip() if headers is not None else ""
    return float(retry_after) if retry_after.isdigit() else None


def _status_of(exc: BaseException) -> int | None:
    response = getattr(exc, "response", None)
    return getattr(response, "status_code", None)


def describe_error(exc: BaseException) -> str:
    """One readable line for a Hub exception (first line of the client's message)."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def refusal_reason(exc: BaseException) -> str | None:
    """The skip reason for a Hub answer that means 'you cannot have this repo', else None."""
    from huggingface_hub.errors import (DisabledRepoError, GatedRepoError, RepositoryNotFoundError,
                                        RevisionNotFoundError)

    lines = str(exc).strip().splitlines()
    message = (getattr(exc, "server_message", None) or (lines[0] if lines else type(exc).__name__)).strip()
    if isinstance(exc, GatedRepoError):  # before RepositoryNotFoundError: it is a subclass
        return f"gated: {message}"
    if isinstance(exc, DisabledRepoError):
        return f"disabled: {message}"
    if isinstance(exc, RevisionNotFoundError):
        return f"revision not found: {message}"
    if isinstance(exc, RepositoryNotFoundError):
        return f"not found or private: {message}"
    return None


class HubClient:
    """`HfApi(endpoint=...)` behind retries, rate-limit waits and a persisted circuit breaker.

    `clock` returns an aware datetime and `sleep(seconds)` waits: both are injectable so
    tests can run a long outage without sleeping. With a `store`, the circuit and rate-limit
    state survive restarts and an outage row is written when the circuit opens.
    """

    def __init__(self, endpoint: str | None = None, *, token: str | bool | None = None,
                 store: Store | None = None, policy: RetryPolicy | None = None,
                 clock: Callable[[], datetime] = utcnow, sleep: Callable[[float], None] = time.sleep,
                 rng: random.Random | None = None) -> None:
        from huggingface_hub import HfApi, constants

        self.endpoint = (endpoint or constants.ENDPOINT).rstrip("/")
        self.token = token
        self.api = HfApi(endpoint=self.endpoint, token=token)
        self.store = store if store is not None and not store.read_only else None
        self.policy = policy or RetryPolicy()
        self.clock = clock
        self.sleep = sleep
        self.rng = rng or random.Random()
        self.requests = 0  # requests this client let through (pages of a listing count once)
        loaded = self.store.get_hub_state(self.endpoint) if self.store else None
        self.state = HubState(**loaded) if loaded else HubState()

    # -- state ---------------------------------------------------------------------------
    def _save(self) -> None:
        if self.store is not None:
            self.store.put_hub_state(self.endpoint, asdict(self.state), now=self.clock())

    def _admit(self, what: str) -> None:
        """Wait out a rate limit, or refuse while the circuit is open (no request made)."""
        now = self.clock()
        st = self.state
        if st.circuit_open_until is not None and now < st.circuit_open_until:
            raise HubError(
                f"not calling the Hub for {what}: circuit open until "
                f"{st.circuit_open_until.isoformat()} after {st.consecutive_failures} consecutive "
                f"failures (last: {st.last_error})", hint="it retries by itself after the cool-down")
        if st.blocked_until is not None and now < st.blocked_until:
            wait = (st.blocked_until - now).total_seconds()
            if wait > self.policy.max_wait_s:
                raise HubError(f"not calling the Hub for {what}: rate limited until "
                               f"{st.blocked_until.isoformat()}",
                               hint="the next poll after that time continues")
            self.sleep(wait)

    def _succeeded(self) -> None:
        st = self.state
        was_failing = st.consecutive_failures > 0 or st.circuit_open_until is not None
        st.consecutive_failures = 0
        st.circuit_open_until = None
        st.last_success_at = self.clock()
        if was_failing:
            if self.store is not None:
                self.store.close_hub_outage(self.endpoint, now=st.last_success_at)
            self._save()

    def _failed(self, what: str, exc: BaseException) -> None:
        st = self.state
        st.consecutive_failures += 1
        st.last_error = f"{what}: {describe_error(exc)}"
        if st.consecutive_failures >= self.policy.circuit_threshold:
            now = self.clock()
            st.circuit_open_until = now + timedelta(seconds=self.policy.circuit_cooldown_s)
            if self.store is not None:
                self.store.open_hub_outage(self.endpoint, now=now, failures=st.consecutive_failures,
                                           error=st.last_error)
        self._save()

    def _rate_limited(self, wait_s: float) -> None:
        self.state.blocked_until = self.clock() + timedelta(seconds=wait_s)
        self._save()

    def _backoff(self, attempt: int) -> float:
        """Equal-jitter exponential backoff: half fixed, half random, capped."""
        ceiling = min(self.policy.cap_s, self.policy.base_s * 2 ** (attempt - 1))
        return ceiling / 2 + self.rng.uniform(0, ceiling / 2)

    @staticmethod
    def classify(exc: BaseException) -> Literal["rate_limited", "transient", "answer"]:
        """rate_limited (429), transient (5xx, 408, network), or a definitive answer."""
        import httpx2
        from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

        status = _status_of(exc)
        if isinstance(exc, HfHubHTTPError) and status is not None:
            if status == 429:
                return "rate_limited"
            return "transient" if status == 408 or status >= 500 else "answer"
        if isinstance(exc, (httpx2.TimeoutException, httpx2.NetworkError,
                            httpx2.RemoteProtocolError, LocalEntryNotFoundError)):
            return "transient"
        return "answer"

    def call(self, what: str, fn: Callable[[], T]) -> T:
        """Run one Hub call with our retry policy; definitive answers are re-raised as is."""
        last: BaseException | None = None
        for attempt in range(1, self.policy.attempts + 1):
            self._admit(what)
            self.requests += 1
            try:
                result = fn()
            except Exception as exc:  # classified below; bugs are re-raised unchanged
                kind = self.classify(exc)
                if kind == "answer":
                    self._succeeded()  # the Hub is up; it said no
                    raise
                last = exc
                if kind == "rate_limited":
                    self._rate_limited(rate_limit_wait(exc.response.headers)  # type: ignore[attr-defined]
                                       or self._backoff(attempt))
                else:
                    self._failed(what, exc)
                    if attempt < self.policy.attempts:
                        self._admit(what)  # raises at once if this failure opened the circuit
                        self.sleep(self._backoff(attempt))
                continue
            self._succeeded()
            return result
        assert last is not None
        raise HubError(f"the Hub failed {what} after {self.policy.attempts} tries: "
                       f"{describe_error(last)}", hint="the next poll asks again") from last

    # -- calls -----------------------------------------------------------------------------
    def iter_models(self, **kwargs: Any) -> Iterator[Any]:
        """`list_models` (newest-modified first); each page passes the circuit.

        huggingface_hub retries listing pages itself (honouring Retry-After), so a page
        that still fails counts as one failed request here and ends the iteration.
        """
        what = f"list_models({', '.join(f'{k}={v}' for k, v in kwargs.items() if k != 'expand')})"
        self._admit(what)
        self.requests += 1
        iterator = iter(self.api.list_models(sort="lastModified", expand=LIST_EXPAND, **kwargs))
        while True:
            try:
                item = next(iterator)
            except StopIteration:
                self._succeeded()
                return
            except Exception as exc:
                kind = self.classify(exc)
                if kind == "answer":
                    raise
                if kind == "rate_limited":  # still limited after the client's own waits
                    self._rate_limited(rate_limit_wait(exc.response.headers)  # type: ignore[attr-defined]
                                       or self.policy.max_wait_s)
                else:
                    self._failed(what, exc)
                raise HubError(f"the Hub failed {what}: {describe_error(exc)}",
                               hint="the watermark is kept; the next poll retries") from exc
            yield item

    def model_info(self, repo: str, revision: str | None, *, files_metadata: bool = True) -> Any:
        return self.call(f"model_info({repo}@{revision})",
                         lambda: self.api.model_info(repo, revision=revision,
                                                     files_metadata=files_metadata))

    def list_repo_refs(self, repo: str) -> Any:
        return self.call(f"list_repo_refs({repo})", lambda: self.api.list_repo_refs(repo))

    def safetensors_header(self, repo: str, filename: str, revision: str, *, file_size: int) -> Any:
        """One file's `SafetensorsHeader` by range requests: no weight byte is read.

        `file_size` is what the Hub announced; a header length running past it is refused
        before the header itself is requested. Raises `LayoutError` for a malformed header.
        """
        from monitor.safetensors_layout import header_length, parse_header

        first = min(file_size, 100_000)  # most headers fit: one request instead of two
        prefix = self.read_range(repo, filename, revision, 0, first) if first else b""
        n = header_length(prefix, file_size)
        raw = prefix[8:8 + n] if 8 + n <= len(prefix) else self.read_range(repo, filename, revision, 8, n)
        return parse_header(raw, n)

    def read_range(self, repo: str, filename: str, revision: str, start: int, length: int) -> bytes:
        """Bytes `[start, start + length)` of a repo file; never more are read from the wire."""
        from huggingface_hub import constants, hf_hub_url
        from huggingface_hub.utils import build_hf_headers

        from monitor.hub_download import read_range

        url = hf_hub_url(repo, filename, revision=revision, endpoint=self.endpoint)
        return self.call(f"read bytes {start}-{start + length - 1} of {repo}@{revision}:{filename}",
                         lambda: read_range(url, build_hf_headers(token=self.token), start, length,
                                            timeout=constants.HF_HUB_DOWNLOAD_TIMEOUT))

    def download(self, repo: str, filename: str, revision: str, *, cache_dir: Path,
                 max_bytes: int | None = None) -> Path:
        """`hf_hub_download` of one file; with `max_bytes`, stopped past that many bytes
        (IntegrityError) whatever size the server claims."""
        from huggingface_hub import hf_hub_download

        what = f"{repo}@{revision}: {filename}"
        return Path(self._capped(what, max_bytes, lambda progress: self.call(
            f"download({repo}@{revision}:{filename})",
            lambda: hf_hub_download(repo, filename, revision=revision, cache_dir=cache_dir,
                                    endpoint=self.endpoint, token=self.token, tqdm_class=progress))))

    def snapshot(self, repo: str, revision: str, *, allow_patterns: list[str], cache_dir: Path,
                 max_bytes: int | None = None) -> Path:
        """`snapshot_download` of the matching files; with `max_bytes`, stopped once their
        bytes together pass it (IntegrityError)."""
        from huggingface_hub import snapshot_download

        what = f"{repo}@{revision}: {', '.join(allow_patterns)}"
        return Path(self._capped(what, max_bytes, lambda progress: self.call(
            f"snapshot_download({repo}@{revision})",
            lambda: snapshot_download(repo, revision=revision, allow_patterns=allow_patterns,
                                      cache_dir=cache_dir, endpoint=self.endpoint,
                                      token=self.token, tqdm_class=progress))))

    @staticmethod
    def _capped(what: str, max_bytes: int | None, run: Callable[[Any], T]) -> T:
        from monitor.errors import IntegrityError
        from monitor.hub_download import DownloadTooLarge, capped_progress

        try:
            return run(capped_progress(max_bytes, what) if max_bytes is not None else None)
        except DownloadTooLarge as exc:
            raise IntegrityError(f"{exc}; download stopped",
                                 hint="the server sent more than it announced; nothing was kept") from None


# -- polling -------------------------------------------------------------------------------
@dataclass
class Candidate:
    """A (repo, commit) a rule selected, with the refs that point at it."""

    repo: str
    sha: str
    refs: tuple[str, ...]
    status: str = "discovered"
    reason: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class RulePoll:
    """What one rule's poll saw and did."""

    rule: str
    key: str
    listed: int = 0            # repos newer than the watermark
    candidates: int = 0        # (repo, commit) pairs selected
    new: int = 0               # rows inserted
    requests: int = 0          # requests the client let through for this rule
    watermark: str | None = None
    truncated: bool = False    # scan_limit reached before the watermark: older changes unseen
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _listing_params(item: Any) -> int | None:
    st = getattr(item, "safetensors", None)
    return int(st.total) if st is not None and getattr(st, "total", None) is not None else None


def _listing_meta(item: Any) -> dict[str, Any]:
    return {"listing": {"private": item.private, "gated": item.gated,
                        "pipeline_tag": item.pipeline_tag, "n_params": _listing_params(item),
                        "last_modified": item.last_modified.isoformat()}}


def candidates_for(client: HubClient, rule: WatchRule, item: Any) -> list[Candidate]:
    """The (repo, commit) pairs of a changed repo that `rule` counts."""
    from huggingface_hub.errors import DisabledRepoError, RepositoryNotFoundError

    meta = _listing_meta(item)
    try:
        if rule.revisions == "main":
            sha = item.sha or client.model_info(item.id, None, files_metadata=False).sha
            return [Candidate(item.id, sha, ("main",), meta=meta)]
        refs = client.list_repo_refs(item.id)
    except (RepositoryNotFoundError, DisabledRepoError) as exc:  # GatedRepoError included
        # Listed but not readable (gated, private, disabled): keep the head commit as a
        # skipped row with the Hub's reason so the operator can see why nothing was scored.
        if not item.sha:
            return []
        return [Candidate(item.id, item.sha, (), status="skipped",
                          reason=refusal_reason(exc) or describe_error(exc), meta=meta)]
    by_commit: dict[str, set[str]] = {}
    for kind, refs_of_kind in (("branch", refs.branches), ("tag", refs.tags)):
        for ref in refs_of_kind:
            if rule.revisions.matches(kind, ref.name):
                by_commit.setdefault(ref.target_commit, set()).add(ref.name)
    return [Candidate(item.id, sha, tuple(sorted(names)), meta=meta)
            for sha, names in sorted(by_commit.items())]


def poll_rule(store: Store, client: HubClient, rule: WatchRule, *,
              now: datetime | None = None) -> RulePoll:
    """Discover what changed for `rule` since its watermark; rows + watermark in one commit.

    Lists newest-modified first and stops at the first repo older than the watermark (or
    at the watermark itself when already seen), so a poll with nothing new costs one
    request. On any Hub failure nothing is written and the watermark stays where it was;
    the error is recorded in the poll log and in the result.
    """
    now = now or client.clock()
    key = rule.key(client.endpoint)
    result = RulePoll(rule=rule.name, key=key)
    start_requests = client.requests
    mark = store.get_watermark(key)
    seen_at_mark = set(mark["boundary"]) if mark else set()
    try:
        changed = []
        scanned = 0
        for item in client.iter_models(limit=rule.scan_limit, **rule.list_params()):
            scanned += 1
            if item.last_modified is None:
                raise HubError(f"the Hub's listing for rule {rule.name!r} lacks lastModified",
                               hint="incremental polling needs it; is the endpoint a Hub?")
            if mark is not None:
                if item.last_modified < mark["last_modified"]:
                    break
                if item.last_modified == mark["last_modified"] and item.id in seen_at_mark:
                    continue
            changed.append(item)
        else:
            result.truncated = mark is not None and scanned >= rule.scan_limit
        candidates: list[Candidate] = []
        for item in changed:
            if rule.matches_name(item.id) and rule.params_in_range(_listing_params(item)):
                candidates.extend(candidates_for(client, rule, item))
    except HubError as exc:
        result.error = exc.one_line()
    except Exception as exc:
        if client.classify(exc) != "answer":
            raise
        result.error = f"the Hub refused the listing: {describe_error(exc)}"
    result.requests = client.requests - start_requests
    result.listed = len(changed) if result.error is None else 0
    if result.error is not None:
        store.record_hub_poll(key, rule.name, now=now, ok=False, listed=0, new=0,
                              requests=result.requests, error=result.error)
        result.watermark = mark["last_modified"].isoformat() if mark else None
        return result

    if changed:
        newest = max(item.last_modified for item in changed)
        boundary = {item.id for item in changed if item.last_modified == newest}
        if mark is not None and newest == mark["last_modified"]:
            boundary |= seen_at_mark
    elif mark is not None:
        newest, boundary = mark["last_modified"], seen_at_mark
    else:
        newest, boundary = None, set()
    result.candidates = len(candidates)
    result.new = store.record_discoveries(
        key, rule.name, client.endpoint, candidates, watermark=newest,
        boundary=sorted(boundary), now=now, requests=result.requests, listed=len(changed))
    result.watermark = newest.isoformat() if newest else None
    return result


def poll_once(store: Store, client: HubClient, rules: Sequence[WatchRule], *,
              now: datetime | None = None) -> list[RulePoll]:
    """Poll every rule once; a failing rule does not stop the others."""
    return [poll_rule(store, client, rule, now=now) for rule in rules]
