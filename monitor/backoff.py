"""When to try again: a server's `Retry-After` and jittered exponential backoff, in one place.

Every retrying caller (the Hub client, the alert dispatcher and its webhook channel) reads
the header and draws its delay here, so an HTTP-date `Retry-After`, a date in the past, a
garbage value and a value of years are treated the same way everywhere.

- `parse_retry_after`: RFC 9110 §10.2.3, delta-seconds or an HTTP date, in seconds from
  `now`, never negative, capped (a server asking for a year is asking for "much later");
  None when the header is absent or unreadable (the caller then falls back to its backoff).
- `backoff_seconds`: exponential backoff with jitter, `full` (U(0, ceiling), AWS's "full
  jitter": callers spread out most) or `equal` (ceiling/2 + U(0, ceiling/2): a guaranteed
  minimum wait), with ceiling = min(cap, base · 2^(attempt−1)). The uniform draw is passed
  in, so callers inject their RNG and tests their numbers.
"""

from __future__ import annotations

import math
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from typing import Literal

# The longest wait a Retry-After may ask for; longer values are read as this.
MAX_RETRY_AFTER_S = 86_400.0
# 2^60 times any positive base is past every cap in use; keeps the power finite for any attempt.
_MAX_DOUBLINGS = 60

Jitter = Literal["full", "equal"]


def parse_retry_after(value: str | None, *, now: datetime, cap_s: float = MAX_RETRY_AFTER_S) -> float | None:
    """Seconds to wait from a `Retry-After` value (delta-seconds or an HTTP date), in
    [0, cap_s]; None when absent or unreadable. A date in the past means 0 (try now)."""
    if value is None:
        return None
    text = value.strip()
    if not text or len(text) > 64:   # an HTTP date is 29 characters; anything far longer is not one
        return None
    if text.isascii() and text.isdigit():
        seconds = float(int(text[:20]))   # 20 digits are already past any cap
    else:
        try:
            when = parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
        if when is None:
            return None
        if when.tzinfo is None:   # RFC 9110 dates are GMT
            when = when.replace(tzinfo=timezone.utc)
        if now.tzinfo is None:
            now = now.replace(tzinfo=timezone.utc)
        seconds = (when - now).total_seconds()
    return min(max(seconds, 0.0), cap_s)


def backoff_seconds(attempt: int, *, base_s: float, cap_s: float, uniform: float,
                    jitter: Jitter = "full") -> float:
    """The delay before retry number `attempt` (counting from 1): full jitter U(0, ceiling)
    or equal jitter ceiling/2 + U(0, ceiling/2), ceiling = min(cap_s, base_s · 2^(attempt−1)).
    `uniform` is a draw from U[0, 1) supplied by the caller."""
    if attempt < 1:
        raise ValueError("attempt counts from 1")
    if not (0.0 <= uniform < 1.0 and math.isfinite(base_s) and math.isfinite(cap_s)):
        raise ValueError("uniform must lie in [0, 1) and the bounds be finite")
    ceiling = min(cap_s, base_s * 2.0 ** min(attempt - 1, _MAX_DOUBLINGS))
    if jitter == "full":
        return uniform * ceiling
    if jitter == "equal":
        return ceiling / 2.0 + uniform * ceiling / 2.0
    raise ValueError(f"unknown jitter {jitter!r}; use full or equal")


__all__ = ["MAX_RETRY_AFTER_S", "Jitter", "backoff_seconds", "parse_retry_after"]
