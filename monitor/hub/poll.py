"""Incremental polling: list a rule's repos newest-modified first, stop at its watermark, and
record each new (repo, commit) as a `discovered` checkpoint together with the advanced watermark.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from monitor.errors import HubError
from monitor.events import event
from monitor.hub.client import HubClient, describe_error, refusal_reason
from monitor.hub.rules import WatchRule
from monitor.store import Store


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
    seen_at_mark = set(mark.boundary) if mark else set()
    try:
        changed = []
        scanned = 0
        for item in client.iter_models(limit=rule.scan_limit, **rule.list_params()):
            scanned += 1
            if item.last_modified is None:
                raise HubError(f"the Hub's listing for rule {rule.name!r} lacks lastModified",
                               hint="incremental polling needs it; is the endpoint a Hub?")
            if mark is not None:
                if item.last_modified < mark.last_modified:
                    break
                if item.last_modified == mark.last_modified and item.id in seen_at_mark:
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
        result.watermark = mark.last_modified.isoformat() if mark else None
        return result

    if changed:
        newest = max(item.last_modified for item in changed)
        boundary = {item.id for item in changed if item.last_modified == newest}
        if mark is not None and newest == mark.last_modified:
            boundary |= seen_at_mark
    elif mark is not None:
        newest, boundary = mark.last_modified, seen_at_mark
    else:
        newest, boundary = None, set()
    result.candidates = len(candidates)
    inserted: list[tuple[int, Candidate]] = []
    result.new = store.record_discoveries(
        key, rule.name, client.endpoint, candidates, watermark=newest,
        boundary=sorted(boundary), now=now, requests=result.requests, listed=len(changed),
        inserted_ids=inserted)
    for row_id, c in inserted:
        event("discovered", checkpoint=row_id, repo=c.repo, commit=c.sha, rule=rule.name,
              refs=",".join(c.refs) or None)
        if c.status == "skipped":   # listed but unreadable: refused at once, with the Hub's reason
            event("refused", checkpoint=row_id, repo=c.repo, commit=c.sha, rule=rule.name, reason=c.reason)
    result.watermark = newest.isoformat() if newest else None
    return result


def poll_once(store: Store, client: HubClient, rules: Sequence[WatchRule], *,
              now: datetime | None = None) -> list[RulePoll]:
    """Poll every rule once; a failing rule does not stop the others."""
    return [poll_rule(store, client, rule, now=now) for rule in rules]
