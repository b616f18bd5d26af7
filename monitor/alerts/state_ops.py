"""Changes to alert state (silences, dead-lettered notifications) that `lstar` makes on the
database itself or, while a daemon holds the file, asks the daemon's API to make. Both paths run
these same functions, so the input is validated and the rows are written the same way either way.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from monitor.alerts.silences import add_silence, parse_time, parse_until
from monitor.errors import DeliveryError, PolicyError
from monitor.store import Store


def parse_now(text: str | None) -> datetime:
    """--now ISO (replays, tests) or the current time, as aware UTC."""
    if text is None:
        return datetime.now(timezone.utc)
    return parse_time(text)


def add_silence_from_args(store: Store, *, match: Sequence[str], until: str, comment: str,
                          start: str | None, now: datetime, created_by: str | None = None) -> dict[str, Any]:
    """`lstar silence add`: parse --start/--until (times or durations), validate, store; the row."""
    try:
        starts = parse_until(start, now=now) if start else None
        ends = parse_until(until, now=starts or now)
    except OverflowError:  # a duration or time past the calendar's end (year 9999)
        what = f"--start {start!r} / --until {until!r}" if start else f"--until {until!r}"
        raise PolicyError(f"{what} reaches beyond the year 9999",
                          hint="write e.g. 2h, 3d, or 2025-06-01T12:00:00Z") from None
    return add_silence(store, list(match), until=ends, comment=comment, now=now, starts_at=starts,
                       created_by=created_by)


def retry_dead_letters(store: Store, ident: str, *, now: datetime) -> list[str]:
    """`lstar alerts retry`: requeue the dead-lettered notifications of an alert id or one
    notification id (msg_...); the ids requeued. Raises when there is nothing to retry."""
    if ident.startswith("msg_"):
        ids = [ident]
    else:
        if not ident.isdigit():
            raise DeliveryError(f"{ident!r} is neither an alert id nor a notification id")
        detail = store.alert_detail(int(ident))
        if detail is None:
            raise DeliveryError(f"no alert with id {ident}", hint="see `lstar alerts list`")
        ids = [n.id for n in detail.notifications]
    done = store.requeue_notifications(ids, now=now)
    if not done:
        raise DeliveryError(f"nothing to retry for {ident}: no dead-lettered notification",
                            hint="see `lstar alerts show ID`")
    return done


__all__ = ["parse_now", "add_silence_from_args", "retry_dead_letters"]
