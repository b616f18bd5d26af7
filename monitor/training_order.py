"""Where a checkpoint sits in its lineage, and which checkpoint is current: the project's one rule.

Every surface that shows or acts on "the current checkpoint" of a lineage — the reports, the
watchlist, the status page, a policy change's re-evaluation and the alert engine's "previous
state" — goes through this module (`tests/test_training_order.py` checks that no other module
orders checkpoints itself). It is pure (no database, no policy) so that the store and the alert
engine, low in the layers, can use it as the reports do.

The rule:

    A lineage's current checkpoint is the latest of its scored checkpoints in TRAINING order,
    never in scoring order:

    1. by training step, when every scored checkpoint of the lineage names one in a branch or
       tag (`step1000` < `step2000` < `step20000`, compared as numbers; `checkpoint-N`,
       `ckpt_N` and `global_stepN` count too, `STEP_PATTERN`);
    2. otherwise by release time, from the best source known for each checkpoint: the Hub
       commit date (recorded by the gate, or the listing's lastModified for the `main` head),
       else the time the poller first saw it on the Hub, else the time it was scored (`place`);
    3. equal keys are settled by a tiebreak (the commit sha, then the repo), so the answer never
       depends on the order the scores arrived in.

A report ranks a long history in DuckDB with the same rule (`monitor.store.placement_sql` and
`monitor.store.report_ranks`, checked against this module by `tests/test_placement_sql.py`).

A re-score of an old checkpoint, or scoring step2000 before step1000, does not change which
checkpoint is current. Token counts are not parsed from ref names: a lineage without steps is
ordered by time.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Generic, TypeVar

RULE = ("the latest scored checkpoint in training order: by training step when every checkpoint of the "
        "lineage names one, else by Hub commit date (else first seen on the Hub, else time scored)")

# `step1000`, `step_1000`, `global_step1000`, `checkpoint-1000`, `ckpt1000`; not `v2step`-like
# words where the keyword runs on from letters or digits before it.
STEP_PATTERN = re.compile(r"(?<![a-z0-9])(?:step|checkpoint|ckpt)[-_]?(\d+)(?![0-9])", re.IGNORECASE)

# Where a checkpoint's time comes from, best first. Scoring time is only a last resort, for
# runs of local files the Hub never listed.
HUB_COMMIT = "Hub commit date"
FIRST_SEEN = "first seen on the Hub"
SCORED = "time scored"
TIME_SOURCES = (HUB_COMMIT, FIRST_SEEN, SCORED)

T = TypeVar("T")


@dataclass(frozen=True)
class Placement:
    """Where a checkpoint sits in its lineage: its training step (if its refs name one) and
    its release time with where that time came from (one of TIME_SOURCES)."""

    step: int | None
    time: datetime | None
    time_source: str


def string_refs(refs: Any) -> list[str]:
    """A stored refs value as every reader takes it: the strings of a JSON array; any other
    value names no ref (an object's keys are not refs, and a number among them would stop the
    names being sorted)."""
    return [ref for ref in refs if isinstance(ref, str)] if isinstance(refs, (list, tuple)) else []


def parse_step(refs: Iterable[str]) -> int | None:
    """The training step named by a checkpoint's branches or tags, or None.

    When several refs name steps (two branches on one commit) the largest is taken: the
    commit was trained at least that far.
    """
    steps = [int(m.group(1)) for ref in refs for m in [STEP_PATTERN.search(ref)] if m]
    return max(steps) if steps else None


def _parse_time(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=timezone.utc)
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
    meta = meta if isinstance(meta, Mapping) else {}
    gate = meta.get("gate") if isinstance(meta.get("gate"), Mapping) else {}
    gated = _parse_time(gate.get("commit_date"))
    if gated is not None:
        return gated
    listing = meta.get("listing") if isinstance(meta.get("listing"), Mapping) else {}
    if list(refs) == ["main"]:
        return _parse_time(listing.get("last_modified"))
    return None


def place(refs: Sequence[str] | None, meta: Mapping[str, Any] | None, discovered_at: datetime | None,
          scored_at: datetime | None) -> Placement:
    """A checkpoint's step and release time, from the best source known."""
    refs = string_refs(refs)
    step = parse_step(refs)
    for moment, source in ((commit_date(refs, meta), HUB_COMMIT), (_parse_time(discovered_at), FIRST_SEEN),
                           (_parse_time(scored_at), SCORED)):
        if moment is not None:
            return Placement(step, moment, source)
    return Placement(step, None, SCORED)


def orders_by_step(placements: Iterable[Placement]) -> bool:
    """Whether a lineage with these placements is ordered (and plotted) by training step:
    every one of its checkpoints names a step."""
    placements = list(placements)
    return bool(placements) and all(p.step is not None for p in placements)


def lineage_order(items: Iterable[T], placement: Callable[[T], Placement],
                  tiebreak: Callable[[T], Any] = lambda item: "") -> list[T]:
    """The checkpoints of ONE lineage in training order (the rule above), earliest first."""
    items = list(items)
    placed = [placement(item) for item in items]
    by_step = orders_by_step(placed)
    floor = datetime.min.replace(tzinfo=timezone.utc)
    keyed = sorted(range(len(items)), key=lambda i: ((placed[i].step if by_step else 0), placed[i].time or floor,
                                                     tiebreak(items[i])))
    return [items[i] for i in keyed]


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_FLOOR_US = -(2 ** 63)   # below every time, as `datetime.min` is in `lineage_order`


def time_key(moment: datetime | None) -> int | None:
    """A release time as whole microseconds since the epoch (what `order_by_keys` compares):
    the same order as the datetimes (every placed time is zoned)."""
    return None if moment is None else (moment - _EPOCH) // timedelta(microseconds=1)


def order_by_keys(keys: Sequence[tuple[int | None, int | None, Any]]) -> list[int]:
    """The rule of `lineage_order` for checkpoints placed elsewhere (a report's history, placed
    by DuckDB: `monitor.store.placement_sql`): `keys` holds each checkpoint of ONE lineage as
    (step, `time_key` of its release time, tiebreak); the answer is their indices in training
    order, earliest first."""
    by_step = bool(keys) and all(key[0] is not None for key in keys)
    return sorted(range(len(keys)), key=lambda i: (keys[i][0] if by_step else 0,
                                                   _FLOOR_US if keys[i][1] is None else keys[i][1], keys[i][2]))


def training_ranks(items: Iterable[T], placement: Callable[[T], Placement], key: Callable[[T], Hashable],
                   tiebreak: Callable[[T], Any] = lambda item: "") -> dict[Hashable, int]:
    """Each checkpoint's position in its lineage's training order (0 = earliest), by `key`;
    `items` are the scored checkpoints of ONE lineage."""
    return {key(item): rank for rank, item in enumerate(lineage_order(items, placement, tiebreak))}


def current_checkpoint(items: Iterable[T], placement: Callable[[T], Placement],
                       tiebreak: Callable[[T], Any] = lambda item: "") -> T | None:
    """The current checkpoint among `items` (the scored checkpoints of ONE lineage): the last
    in training order; None when there are none."""
    ordered = lineage_order(items, placement, tiebreak)
    return ordered[-1] if ordered else None


class LatestInOrder(Generic[T]):
    """The latest of ONE lineage's checkpoints in training order, kept as checkpoints are added:
    what `current_checkpoint` answers, without sorting the lineage again for each new one (an
    evaluation tick asks it once per run it evaluates).

    `put(key, item)` adds a checkpoint or replaces the one under `key` (a newer prediction of
    the same checkpoint); `latest()` is the current checkpoint, `would_lead(item)` whether a
    checkpoint not yet among them would be the latest once added."""

    def __init__(self, placement: Callable[[T], Placement], tiebreak: Callable[[T], Any] = lambda item: "") -> None:
        self._placement = placement
        self._tiebreak = tiebreak
        self._items: dict[Hashable, tuple[T, Placement]] = {}
        self._stepless = 0   # checkpoints naming no step: any one of them orders the lineage by time
        self._by_step: tuple[Any, T] | None = None
        self._by_time: tuple[Any, T] | None = None

    def _keys(self, item: T, placed: Placement) -> tuple[Any, Any]:
        floor = datetime.min.replace(tzinfo=timezone.utc)
        when = placed.time or floor
        return (placed.step or 0, when, self._tiebreak(item)), (0, when, self._tiebreak(item))

    def put(self, key: Hashable, item: T) -> None:
        placed = self._placement(item)
        if key in self._items:   # a replaced checkpoint may have led: start again from the rest
            rest = {k: v for k, v in self._items.items() if k != key}
            self._items, self._stepless, self._by_step, self._by_time = {}, 0, None, None
            for k, (old, _) in rest.items():
                self.put(k, old)
        self._items[key] = (item, placed)
        self._stepless += placed.step is None
        by_step, by_time = self._keys(item, placed)
        if self._by_step is None or by_step > self._by_step[0]:
            self._by_step = (by_step, item)
        if self._by_time is None or by_time > self._by_time[0]:
            self._by_time = (by_time, item)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._items

    def latest(self) -> T | None:
        """The current checkpoint (None when there is none)."""
        lead = self._by_time if self._stepless else self._by_step
        return lead[1] if lead is not None else None

    def would_lead(self, item: T) -> bool:
        """Whether `item` (not among the checkpoints) would be the latest once added."""
        placed = self._placement(item)
        by_step, by_time = self._keys(item, placed)
        if self._stepless or placed.step is None:
            return self._by_time is None or by_time > self._by_time[0]
        return self._by_step is None or by_step > self._by_step[0]


__all__ = ["RULE", "STEP_PATTERN", "HUB_COMMIT", "FIRST_SEEN", "SCORED", "TIME_SOURCES", "Placement", "parse_step", "order_by_keys", "time_key", "string_refs",
           "commit_date", "place", "orders_by_step", "lineage_order", "training_ranks", "current_checkpoint", "LatestInOrder"]
