"""The Hub client: retries, rate limits and a circuit breaker around huggingface_hub.

`HubClient` wraps huggingface_hub's `HfApi`: calls the client does not retry itself
(`model_info`, `list_repo_refs`, the safetensors range GETs, downloads) get jittered
exponential backoff honouring `Retry-After` and `RateLimit`, and every call passes a
circuit breaker persisted in the store, so a down Hub is not hammered and one outage row is
recorded for the daemon's meta-alert. Watch rules are in `monitor.hub.rules`, polling in
`monitor.hub.poll`, the gate in `monitor.hub.gate` and the pinned download in
`monitor.hub.fetch`.
"""

from __future__ import annotations

import fnmatch
import json
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Literal, TypeVar

from monitor.backoff import backoff_seconds, parse_retry_after
from monitor.errors import HubError, IntegrityError
from monitor.hub.counting import count_requests_for
from monitor.hub.download import (DownloadTooLarge, cache_entries, capped_progress, read_page, read_range,
                                  refuse_oversized)
from monitor.hub.safetensors_layout import header_length, parse_header
from monitor.store import Store, utcnow

T = TypeVar("T")

# The most of a commit listing's first page read to find one commit's date.
COMMITS_PAGE_BYTES = 1 << 20
# What a listing asks the Hub to return per repo (the rest is fetched per candidate).
LIST_EXPAND = ["sha", "lastModified", "createdAt", "gated", "private", "pipeline_tag", "tags",
               "safetensors"]


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


def rate_limit_wait(headers: Any, *, now: datetime | None = None) -> float | None:
    """Seconds a 429 asks us to wait: `RateLimit: "api";r=0;t=N`, else `Retry-After`
    (delta-seconds or an HTTP date, read by `monitor.backoff.parse_retry_after`)."""
    ratelimit = headers.get("ratelimit") if headers is not None else None
    if ratelimit:
        fields = dict(part.strip().split("=", 1) for part in ratelimit.split(";") if "=" in part)
        if fields.get("r", "").strip() == "0" and fields.get("t", "").strip().isdigit():
            return float(fields["t"].strip())
    if headers is None:
        return None
    return parse_retry_after(headers.get("retry-after"), now=now or datetime.now(timezone.utc))


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
        # Every HTTP request sent on this client's behalf: each page of a listing, each
        # retry, each redirect hop (counted at the transport, `monitor.hub.counting`).
        self.requests = 0
        self._requests_lock = threading.Lock()
        loaded = self.store.get_hub_state(self.endpoint) if self.store else None
        self.state = HubState(**loaded.as_dict()) if loaded else HubState()

    def add_request(self) -> None:
        """Count one HTTP request (called by the transport hook, from any thread)."""
        with self._requests_lock:
            self.requests += 1

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
        """Equal-jitter exponential backoff (half fixed, half random, capped): a Hub outage
        is waited out at least half the ceiling, whoever else retries."""
        return backoff_seconds(attempt, base_s=self.policy.base_s, cap_s=self.policy.cap_s,
                               uniform=self.rng.random(), jitter="equal")

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
            try:
                with count_requests_for(self):
                    result = fn()
            except Exception as exc:  # classified below; bugs are re-raised unchanged
                kind = self.classify(exc)
                if kind == "answer":
                    self._succeeded()  # the Hub is up; it said no
                    raise
                last = exc
                if kind == "rate_limited":
                    self._rate_limited(rate_limit_wait(exc.response.headers,  # type: ignore[attr-defined]
                                                       now=self.clock())
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
        iterator = iter(self.api.list_models(sort="lastModified", expand=LIST_EXPAND, **kwargs))
        while True:
            try:
                with count_requests_for(self):  # a page is fetched inside next()
                    item = next(iterator)
            except StopIteration:
                self._succeeded()
                return
            except Exception as exc:
                kind = self.classify(exc)
                if kind == "answer":
                    raise
                if kind == "rate_limited":  # still limited after the client's own waits
                    self._rate_limited(rate_limit_wait(exc.response.headers,  # type: ignore[attr-defined]
                                                       now=self.clock())
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

    def commit_date(self, repo: str, sha: str) -> datetime | None:
        """The date of commit `sha`: the first entry of its commit listing (one page, newest
        first, read up to COMMITS_PAGE_BYTES), or None when that entry is not `sha` itself.

        The revision endpoint's `lastModified` is not documented to be the commit's date,
        so the commit listing is asked instead.
        """
        from urllib.parse import quote

        from huggingface_hub.utils import build_hf_headers, parse_datetime

        url = f"{self.endpoint}/api/models/{repo}/commits/{quote(sha, safe='')}"
        body = self.call(f"list_repo_commits({repo}@{sha})",
                         lambda: read_page(url, build_hf_headers(token=self.token), COMMITS_PAGE_BYTES))
        try:
            first = json.loads(body)[0]
            return parse_datetime(first["date"]) if first["id"] == sha else None
        except (ValueError, KeyError, IndexError, TypeError):
            return None

    def safetensors_header(self, repo: str, filename: str, revision: str, *, file_size: int) -> Any:
        """One file's `SafetensorsHeader` by range requests: no weight byte is read.

        `file_size` is what the Hub announced; a header length running past it is refused
        before the header itself is requested. Raises `LayoutError` for a malformed header.
        """
        first = min(file_size, 100_000)  # most headers fit: one request instead of two
        prefix = self.read_range(repo, filename, revision, 0, first) if first else b""
        n = header_length(prefix, file_size)
        raw = prefix[8:8 + n] if 8 + n <= len(prefix) else self.read_range(repo, filename, revision, 8, n)
        return parse_header(raw, n)

    def read_range(self, repo: str, filename: str, revision: str, start: int, length: int) -> bytes:
        """Bytes `[start, start + length)` of a repo file; never more are read from the wire."""
        from huggingface_hub import constants, hf_hub_url
        from huggingface_hub.utils import build_hf_headers

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
        before = cache_entries(Path(cache_dir), repo)
        path = Path(self._capped(what, max_bytes, lambda progress: self.call(
            f"download({repo}@{revision}:{filename})",
            lambda: hf_hub_download(repo, filename, revision=revision, cache_dir=cache_dir,
                                    endpoint=self.endpoint, token=self.token, tqdm_class=progress))))
        if max_bytes is not None:  # the cap above does not hold on the Xet path
            refuse_oversized(what, [path], max_bytes, Path(cache_dir), before)
        return path

    def snapshot(self, repo: str, revision: str, *, allow_patterns: list[str], cache_dir: Path,
                 max_bytes: int | None = None) -> Path:
        """`snapshot_download` of the matching files; with `max_bytes`, stopped once their
        bytes together pass it (IntegrityError)."""
        from huggingface_hub import snapshot_download

        what = f"{repo}@{revision}: {', '.join(allow_patterns)}"
        before = cache_entries(Path(cache_dir), repo)
        folder = Path(self._capped(what, max_bytes, lambda progress: self.call(
            f"snapshot_download({repo}@{revision})",
            lambda: snapshot_download(repo, revision=revision, allow_patterns=allow_patterns,
                                      cache_dir=cache_dir, endpoint=self.endpoint,
                                      token=self.token, tqdm_class=progress))))
        if max_bytes is not None:  # the cap above does not hold on the Xet path
            matched = [f for f in folder.rglob("*") if f.is_file()
                       and any(fnmatch.fnmatch(f.relative_to(folder).as_posix(), p) for p in allow_patterns)]
            refuse_oversized(what, matched, max_bytes, Path(cache_dir), before)
        return folder

    @staticmethod
    def _capped(what: str, max_bytes: int | None, run: Callable[[Any], T]) -> T:
        try:
            return run(capped_progress(max_bytes, what) if max_bytes is not None else None)
        except DownloadTooLarge as exc:
            raise IntegrityError(f"{exc}; download stopped",
                                 hint="the server sent more than it announced; nothing was kept") from None
