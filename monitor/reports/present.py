"""How a report names and prints things: one rule each, used by every table, text and plot.

- `fmt`: every number in the text at one precision (4 decimals: the level b + ε = 0.2955
  is printed 0.2955 in the text, the tables and the plot legends alike);
- `checkpoint_name`: a checkpoint is `repo@ref (sha7)` (or `repo@sha12` without a ref) in
  every table.

Where a checkpoint sits in its lineage and which one is current is not decided here but in
`monitor.training_order` (the project's one rule, which the alert engine uses too); its names
are re-exported below for the report modules that import them from here.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from monitor.training_order import (FIRST_SEEN, HUB_COMMIT, SCORED, STEP_PATTERN, TIME_SOURCES, Placement,
                                    commit_date, lineage_order, orders_by_step, parse_step, place)

DIGITS = 4


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


__all__ = ["fmt", "short", "parse_step", "display_ref", "checkpoint_name", "Placement", "commit_date",
           "place", "lineage_order", "orders_by_step", "HUB_COMMIT", "FIRST_SEEN", "SCORED", "TIME_SOURCES"]
