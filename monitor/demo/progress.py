"""How far the demo's long steps are and how long they have left, from what they measure.

The demo trains a lineage and then scores, evaluates and alerts on its checkpoints one daemon
pass at a time; on a busy machine either takes many times what it takes on an idle one, so no
duration is written down in advance. `Pace` keeps the count done of a total and the time it
took, and estimates what is left at that pace; `progress_bar` draws the same as a rich bar
(count, elapsed, remaining) on stderr when it is a terminal. Where stderr is not a terminal
(a log file, CI), `Pace.milestone` gives a line at each quarter instead, so a long step is
never silent.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def duration_text(seconds: float) -> str:
    """`42 s`, `3 min 05 s`, `1 h 02 min`: a measured duration for a log line."""
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


class Pace:
    """`done` of `total` units after the time measured since the start; the rest estimated at
    that pace (None until one unit is done)."""

    def __init__(self, total: int, *, clock: Callable[[], float] = time.perf_counter) -> None:
        self.total = max(0, int(total))
        self.done = 0
        self._clock = clock
        self._started = clock()
        self._quarters_said = 0

    def advance_to(self, done: int, total: int | None = None) -> None:
        if total is not None:
            self.total = max(0, int(total))
        self.done = max(self.done, min(int(done), self.total))

    @property
    def elapsed_s(self) -> float:
        return self._clock() - self._started

    def remaining_s(self) -> float | None:
        if self.done <= 0:
            return None
        return self.elapsed_s / self.done * (self.total - self.done)

    def describe(self, unit: str) -> str:
        """`120 of 480 steps in 40 s; about 2 min 00 s left at that pace`."""
        text = f"{self.done} of {self.total} {unit} in {duration_text(self.elapsed_s)}"
        left = self.remaining_s()
        if left is None:
            return text
        return text + ("; done" if self.done >= self.total else f"; about {duration_text(left)} left at that pace")

    def milestone(self, unit: str) -> str | None:
        """`describe(unit)` the first time each quarter of the total is reached, else None."""
        if self.total <= 0:
            return None
        quarters = 4 * self.done // self.total
        if quarters <= self._quarters_said:
            return None
        self._quarters_said = quarters
        return self.describe(unit)


def progress_bar(enabled: bool) -> Any:
    """A rich progress bar on stderr: description, bar, done/total, elapsed and the time left
    rich estimates from the speed it measures; drawn only when `enabled` (stderr a terminal)."""
    from rich.console import Console
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                               TimeRemainingColumn)

    return Progress(TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), TextColumn("left"), TimeRemainingColumn(),
                    console=Console(stderr=True), disable=not enabled, transient=False)


__all__ = ["Pace", "duration_text", "progress_bar"]
