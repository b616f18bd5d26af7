"""How a report names, orders and prints things: one rule each, used by every table, text and plot.

- `fmt`: every number in the text at one precision (4 decimals: the level b + ε = 0.2955
  is printed 0.2955 in the text, the tables and the plot legends alike);
- `checkpoint_name`: a checkpoint is `repo@ref (sha7)` (or `repo@sha12` without a ref) in
  every table;
- `place` and `lineage_order`: where a checkpoint sits in its lineage: by the training step
  parsed from its branch or tag names (`step1000` < `step2000` < `step20000`, as numbers),
  else by the Hub commit date; the "current" checkpoint of a lineage is the last in that order.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, TypeVar

DIGITS = 4
# `step1000`, `step_1000`, `global_step1000`, `checkpoint-1000`, `ckpt1000`; not `v2step`-like
# words where the keyword runs on from letters or digits before it.
STEP_PATTERN = re.compile(r"(?<![a-z0-9])(?:step|checkpoint|ckpt)[-_]?(\d+)(?![0-9])", re.IGNORECASE)

# Where a checkpoint's time comes from, best first. Scoring time is only a last resort, for
# runs of local files the Hub never listed.
HUB_COMMIT = "Hub commit date"
FIRST_SEEN = "first seen on the Hub"
SCORED = "time scored"
TIME_SOURCES = (HUB_COMMIT, FIRST_SEEN, SCORED)


def fmt(value: Any, digits: int = DIGITS) -> str:
    """A number (or time) for the report's text, tables and plot labels ('—' for none)."""
    if value is None:
        return "—"
    if isinstance(value, datetime):
        return value.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def short(commit: str | None, n: int = 12) -> str:
    """The first `n` hex digits of a commit sha."""
    return (commit or "")[:n]


def parse_step(refs: Iterable[str]) -> int | None:
    """The training step named by a checkpoint's branches or tags, or None.

    When several refs name steps (two branches on one commit) the largest is taken: the
    commit was trained at least that far.
    """
    steps = [int(m.group(1)) for ref in refs for m in [STEP_PATTERN.search(ref)] if m]
    return max(steps) if steps else None


def display_ref(refs: Sequence[str]) -> str | None:
    """The ref a checkpoint is called by: one naming a step, else the first other than main,
    else main."""
    refs = sorted(refs or [])
    stepped = [r for r in refs if STEP_PATTERN.search(r)]
    others = [r for r in refs if r != "main"]
    return (stepped or others or refs or [None])[0]


def checkpoint_name(repo: str, commit: str | None, refs: Sequence[str] = ()) -> str:
    """A checkpoint as every table of the report names it: `repo@step2000 (abc1234)`, or
    `repo@abc1234def56` when no branch or tag points at it."""
    ref = display_ref(refs)
    return f"{repo}@{ref} ({short(commit, 7)})" if ref else f"{repo}@{short(commit)}"


@dataclass(frozen=True)
class Placement:
    """Where a checkpoint sits in its lineage: its training step (if its refs name one) and
    its release time with where that time came from (one of TIME_SOURCES)."""

    step: int | None
    time: datetime | None
    time_source: str


def _parse_time(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value
    if isinstance(value, str) and value:
        try:
            moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None
        return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)
    return None


def commit_date(refs: Sequence[str], meta: Mapping[str, Any] | None) -> datetime | None:
    """The Hub commit date recorded for a checkpoint, or None.

    The gate records the date of the very commit it inspected. Failing that, the listing's
    lastModified is the date of the commit only when the checkpoint was the `main` head the
    listing showed (a repo's lastModified is its newest commit), so it is used only then.
    """
    meta = meta or {}
    gated = _parse_time((meta.get("gate") or {}).get("commit_date"))
    if gated is not None:
        return gated
    if list(refs) == ["main"]:
        return _parse_time((meta.get("listing") or {}).get("last_modified"))
    return None


def place(refs: Sequence[str], meta: Mapping[str, Any] | None, discovered_at: datetime | None,
          scored_at: datetime | None) -> Placement:
    """A checkpoint's step and release time, from the best source known."""
    step = parse_step(refs or [])
    for moment, source in ((commit_date(refs or [], meta), HUB_COMMIT), (discovered_at, FIRST_SEEN),
                           (scored_at, SCORED)):
        if moment is not None:
            return Placement(step, moment, source)
    return Placement(step, None, SCORED)


T = TypeVar("T")


def lineage_order(items: Iterable[T], placement: Callable[[T], Placement],
                  tiebreak: Callable[[T], Any] = lambda item: "") -> list[T]:
    """The checkpoints of one lineage in training order: by step when every one of them names
    a step, else by release time; `tiebreak` settles equal keys so the order never depends on
    the input's."""
    items = list(items)
    floor = datetime.min.replace(tzinfo=timezone.utc)
    by_step = bool(items) and all(placement(i).step is not None for i in items)

    def key(item: T) -> tuple[Any, ...]:
        p = placement(item)
        return ((p.step if by_step else 0), p.time or floor, tiebreak(item))

    return sorted(items, key=key)


def orders_by_step(placements: Iterable[Placement]) -> bool:
    """Whether a lineage with these placements is ordered (and plotted) by training step."""
    placements = list(placements)
    return bool(placements) and all(p.step is not None for p in placements)


__all__ = ["fmt", "short", "parse_step", "display_ref", "checkpoint_name", "Placement", "commit_date",
           "place", "lineage_order", "orders_by_step", "HUB_COMMIT", "FIRST_SEEN", "SCORED", "TIME_SOURCES"]
