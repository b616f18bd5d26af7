"""Silences: runtime state (not policy), with matchers, an expiry and a comment.

A silence stops matching alerts from being sent while it is active; the deliveries it
catches are marked `silenced` with its id, so `lstar alerts show` says why nothing went out.
"""

from __future__ import annotations

import getpass
import uuid
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from monitor.errors import PolicyError
from monitor.policy import Matcher, matches_all, parse_duration, parse_matcher
from monitor.policy.vocabulary import SILENCED_VALUES, never_matches
from monitor.store import Store
from monitor.yamlio import clip


def parse_time(text: str) -> datetime:
    """An ISO 8601 time as an aware datetime (UTC when no offset is given)."""
    try:
        moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise PolicyError(f"{clip(repr(text), 80)} is not an ISO 8601 time",
                          hint="write e.g. 2025-06-01T12:00:00Z") from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=timezone.utc)


def parse_until(text: str, *, now: datetime) -> datetime:
    """The end of a silence: an ISO 8601 time (UTC if no offset) or a duration from now ("2h")."""
    try:
        return now + parse_duration(text.strip())
    except ValueError as exc:
        duration_error = str(exc)
    try:
        return parse_time(text)
    except PolicyError:
        if "longer than" in duration_error:  # a duration, only too long: say that, not "neither"
            said = duration_error.removeprefix(f"value {clip(repr(text.strip()), 80)} ")
            raise PolicyError(f"--until {clip(repr(text), 80)}: {said}",
                              hint="silence for at most 100 years, or give an ISO 8601 end time") from None
        raise PolicyError(f"--until {clip(repr(text), 80)} is neither a time nor a duration",
                          hint="write e.g. 2h, 3d, or 2025-06-01T12:00:00Z") from None


def add_silence(store: Store, matchers: Sequence[str], *, until: datetime, comment: str, now: datetime,
                starts_at: datetime | None = None, created_by: str | None = None) -> dict[str, Any]:
    """Validate and store a silence; returns its row."""
    if not matchers:
        raise PolicyError("a silence needs at least one --match", hint="e.g. --match policy=frontier")
    parsed = []
    for text in matchers:
        try:
            parsed.append(parse_matcher(text))
        except ValueError as exc:
            raise PolicyError(f"--match {clip(repr(text), 80)}: {exc}") from None
    for text, matcher in zip(matchers, parsed):
        dead = never_matches(matcher, SILENCED_VALUES)
        if dead is not None:
            raise PolicyError(f"--match {clip(repr(text), 80)}: {dead}")
    if all(m.matches({}) for m in parsed):
        # As in Alertmanager: matchers that all match an empty label set silence everything.
        raise PolicyError("these matchers would silence every alert",
                          hint="add a matcher that needs a label value, e.g. --match policy=NAME")
    start = starts_at or now
    if until <= start:
        raise PolicyError(f"--until {until.isoformat()} is not after the start {start.isoformat()}")
    if not comment.strip():
        raise PolicyError("a silence needs a --comment saying why")
    row = {"id": str(uuid.uuid4()), "matchers": [str(m) for m in parsed], "starts_at": start,
           "ends_at": until, "comment": comment.strip(),
           "created_by": created_by or current_user(), "created_at": now, "expired_at": None}
    store.add_silence(row)
    # Said at once, so a silence that catches nothing (or everything) is noticed now.
    return {**row, "matches_current": count_matching(store, parsed)}


def count_matching(store: Store, matchers: Sequence[Matcher]) -> int:
    """How many alerts in force (`Store.current_alert_labels`) every matcher matches."""
    return sum(1 for labels in store.current_alert_labels() if matches_all(matchers, labels))


def current_user() -> str:
    """The login name recorded as a silence's creator ("unknown" where there is none)."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


MIN_PREFIX = 4               # characters of an id a prefix needs, as git asks of a commit's
MAX_CANDIDATES_LISTED = 10   # ids an ambiguous prefix's message names


def list_silences(store: Store, *, now: datetime, include_expired: bool = False) -> list[dict[str, Any]]:
    """Silences with a `state` of active / pending / expired, newest first."""
    out = []
    for row in store.silences():
        end = row.ends_at if row.expired_at is None else min(row.ends_at, row.expired_at)
        state = "expired" if end <= now else ("pending" if row.starts_at > now else "active")
        if state == "expired" and not include_expired:
            continue
        out.append({**row.as_dict(), "state": state})
    return out


def expire_silence(store: Store, silence_id: str, *, now: datetime) -> str:
    """End a silence now; returns its whole id. `silence_id` may be a unique prefix of at least
    MIN_PREFIX characters of the id of an active or pending silence (as git takes a commit's:
    a stray character or a truncated paste must not end a silence and let its alerts page);
    no match, several or a shorter prefix raise, the second listing the candidates."""
    if store.expire_silence(silence_id, now=now):
        return silence_id
    shown = clip(silence_id, 80)
    candidates = [row["id"] for row in list_silences(store, now=now)
                  if silence_id and str(row["id"]).startswith(silence_id)]
    if len(candidates) > 1:
        listed = sorted(candidates)[:MAX_CANDIDATES_LISTED]
        more = f" and {len(candidates) - len(listed)} more" if len(candidates) > len(listed) else ""
        raise PolicyError(f"silence id {shown} is ambiguous: it begins {len(candidates)} active or pending "
                          f"silences ({', '.join(listed)}{more})",
                          hint="give more characters of the id")
    if candidates and len(silence_id) < MIN_PREFIX:
        raise PolicyError(f"silence id {shown} is {len(silence_id)} character(s) long: a prefix must have at "
                          f"least {MIN_PREFIX}", hint=f"give at least {MIN_PREFIX} characters of the id "
                                                      "(see `lstar silence list`)")
    if not candidates or not store.expire_silence(candidates[0], now=now):
        raise PolicyError(f"no active or pending silence with id {shown}",
                          hint="see `lstar silence list`")
    return candidates[0]
