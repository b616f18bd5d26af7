"""The current checkpoint of a lineage: one definition, used by every report, endpoint and command.

The rule (docs/guide.md, section 6, "The current checkpoint"):

    A lineage's current checkpoint is the latest of its scored checkpoints in TRAINING order,
    never in scoring order:

    1. by training step, when every scored checkpoint of the lineage names one in a branch or
       tag (`step1000` < `step2000` < `step20000`, compared as numbers; `checkpoint-N`,
       `ckpt_N` and `global_stepN` count too, `present.STEP_PATTERN`);
    2. otherwise by release time, from the best source known for each checkpoint: the Hub
       commit date (recorded by the gate, or the listing's lastModified for the `main` head),
       else the time the poller first saw it on the Hub, else the time it was scored
       (`present.place`);
    3. equal keys are settled by the commit sha, so the answer never depends on the order the
       scores arrived in.

A re-score of an old checkpoint, or scoring step2000 before step1000, does not change which
checkpoint is current. Token counts are not parsed from ref names: a lineage without steps is
ordered by time.

`current_checkpoint` picks it from any rows (a report's L* rows, predictions); `training_ranks`
gives every checkpoint's position, for callers that order other rows (a task's predictions)
by the same rule.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from typing import Any, TypeVar

from monitor.reports.present import Placement, lineage_order

T = TypeVar("T")
RULE = ("the latest scored checkpoint in training order: by training step when every checkpoint of the "
        "lineage names one, else by Hub commit date (else first seen on the Hub, else time scored)")


def training_ranks(items: Iterable[T], placement: Callable[[T], Placement], key: Callable[[T], Hashable],
                   tiebreak: Callable[[T], Any] = lambda item: "") -> dict[Hashable, int]:
    """Each checkpoint's position in its lineage's training order (0 = earliest), by `key`;
    `items` are the scored checkpoints of ONE lineage."""
    return {key(item): rank for rank, item in enumerate(lineage_order(items, placement, tiebreak))}


def current_checkpoint(items: Iterable[T], placement: Callable[[T], Placement],
                       tiebreak: Callable[[T], Any] = lambda item: "") -> T | None:
    """The current checkpoint among `items` (the scored checkpoints of ONE lineage), by the
    rule above; None when there are none."""
    ordered = lineage_order(items, placement, tiebreak)
    return ordered[-1] if ordered else None


__all__ = ["RULE", "current_checkpoint", "training_ranks"]
