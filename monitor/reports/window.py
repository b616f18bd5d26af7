"""Report windows: "what changed this week?" for `lstar report --since/--until` and `/report`.

A window is (since, until]: the report lists the scores, predictions, crossings and
discoveries in it and the state each lineage carried into it (`build_report` reads each
lineage's state at `since`, as it does for the period since the last report).

`since` and `until` are each one of (`ACCEPTED`):

- a duration back from now: `7d`, `12h`, `2w`, `90m`, `30s`, or several units largest first
  (`1d12h`); at most 100 years;
- a date, `2026-11-01` (midnight UTC), or a date and time, `2026-11-01T12:00` (UTC unless it
  names an offset: `2026-11-01T12:00+01:00`, `...Z`);
- `now`.

The duration is read by a scanner that looks at each character once (no regular expression,
so no backtracking on a hostile value); a date by `datetime.fromisoformat` after a length and
character check. A bad value is refused in one line that lists the accepted forms.

The shorthands are whole ISO weeks in UTC: `last_week` is Monday 00:00 of the previous week to
Monday 00:00 of this one; `this_week` is Monday 00:00 of this week to now. An `until` later
than now is taken as now (nothing after now is recorded yet).
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

ACCEPTED = ("a duration back from now (7d, 12h, 2w, 90m, 1d12h), a date (2026-11-01, midnight UTC), "
            "a date and time (2026-11-01T12:00, UTC unless it gives an offset) or now")
MAX_TEXT = 40
MAX_DIGITS = 15
MAX_BACK = timedelta(days=100 * 365)
# Units largest first; each may appear once, in this order.
UNITS = {"w": 7 * 86400, "d": 86400, "h": 3600, "m": 60, "s": 1}
_UNIT_RANK = {unit: rank for rank, unit in enumerate(UNITS)}
_DATE_CHARS = frozenset("0123456789-:T +.Z")


class WindowError(ValueError):
    """A value that is not a moment or a window that is empty; its message is one line."""


def _refuse(text: str, why: str = "is not a time") -> WindowError:
    shown = text if len(text) <= MAX_TEXT else text[:MAX_TEXT] + "…"
    return WindowError(f"{shown!r} {why}; give {ACCEPTED}")


def parse_duration_back(text: str) -> timedelta | None:
    """`7d`, `1d12h`, `90m` as a timedelta; None when `text` is not written as a duration.

    One pass over the characters: digits accumulate a number (at most 15 digits), a unit
    letter closes it; units must come largest first, each once, and the text must end on one."""
    seconds, number, digits, last_rank = 0, 0, 0, -1
    for char in text:
        if "0" <= char <= "9":
            digits += 1
            if digits > MAX_DIGITS:
                return None
            number = number * 10 + (ord(char) - 48)
        elif char in _UNIT_RANK:
            if digits == 0 or _UNIT_RANK[char] <= last_rank:
                return None
            seconds += number * UNITS[char]
            number, digits, last_rank = 0, 0, _UNIT_RANK[char]
        else:
            return None
    if digits or last_rank < 0:
        return None
    return timedelta(seconds=seconds) if seconds <= MAX_BACK.total_seconds() else timedelta.max


def parse_moment(text: str, *, now: datetime) -> datetime:
    """The moment `text` names (module docstring), in UTC; WindowError when it names none."""
    value = text.strip()
    if not value or len(value) > MAX_TEXT:
        raise _refuse(text)
    if value.lower() == "now":
        return now
    back = parse_duration_back(value)
    if back is not None:
        if back > MAX_BACK:
            raise _refuse(text, "reaches back more than 100 years")
        return now - back
    if not value[0].isdigit() or not set(value) <= _DATE_CHARS:
        raise _refuse(text)
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise _refuse(text) from None
    try:   # 0001-01-01T00:00+01:00 is a valid text whose instant lies before the calendar's first
        return (moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)).astimezone(timezone.utc)
    except OverflowError:
        raise _refuse(text, "lies outside the calendar in UTC") from None


def week_start(moment: datetime) -> datetime:
    """Monday 00:00 UTC of the ISO week holding `moment`."""
    day = moment.astimezone(timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0)
    return day - timedelta(days=day.weekday())


def report_window(*, since: str | None, until: str | None, now: datetime, last_week: bool = False,
                  this_week: bool = False) -> tuple[datetime, datetime] | None:
    """The window (since, until] the options name, or None for the default period (since the
    policy's last report). WindowError for a bad value, a shorthand given with `since`/`until`
    or with the other shorthand, `until` without `since`, or a window that is empty."""
    shorthands = [name for name, on in (("--last-week", last_week), ("--this-week", this_week)) if on]
    if len(shorthands) > 1 or (shorthands and (since is not None or until is not None)):
        given = shorthands + [n for n, v in (("--since", since), ("--until", until)) if v is not None]
        raise WindowError(f"{' and '.join(given)} name two windows; give one shorthand, or --since (and --until)")
    if last_week:
        end = week_start(now)
        return end - timedelta(days=7), end
    if this_week:
        return week_start(now), now
    if since is None:
        if until is not None:
            raise WindowError("--until needs --since: give the window's start too (--since 7d, --since 2026-11-01)")
        return None
    start = parse_moment(since, now=now)
    end = min(parse_moment(until, now=now), now) if until is not None else now
    if start >= end:
        raise WindowError(f"the window is empty: since {start.isoformat()} is not before until {end.isoformat()}; "
                          "give an earlier --since or a later --until")
    return start, end


def window_report(store: Any, policy: Any, *, start: datetime, end: datetime, now: datetime) -> dict[str, Any]:
    """The report of the window (start, end] (`build_report`), generated at `now`."""
    from monitor.reports.report import build_report

    data = build_report(store, policy, now=end, period_start=start)
    data["generated_at"] = now
    return data


__all__ = ["ACCEPTED", "WindowError", "parse_duration_back", "parse_moment", "report_window", "week_start",
           "window_report"]
