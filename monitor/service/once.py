"""`lstar run --once`: count what the run did (from its events), wait a bounded time for the
alerts it raised to be sent, and print a summary."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any, TextIO

from monitor.events import subscribe
from monitor.store import utcnow

# The summary's lines: (label, event kind); task states follow "scored".
SUMMARY_ROWS = (("discovered", "discovered"), ("gated", "gated"), ("refused", "refused"),
                ("scored", "scored"), ("score failures", "score_failed"))
ALERT_ROWS = (("alerts raised", "alert_raised"), ("notifications delivered", "delivered"),
              ("send retries", "retried"), ("dead-lettered", "dead_lettered"), ("reports written", "report_written"))


class RunTally:
    """Counts the events of one run (by kind; task states by state) while it is open."""

    def __init__(self) -> None:
        self.kinds: Counter[str] = Counter()
        self.states: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._stop: Callable[[], None] | None = None

    def __enter__(self) -> "RunTally":
        self._stop = subscribe(self.count)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._stop is not None:
            self._stop()

    def count(self, kind: str, fields: Mapping[str, Any]) -> None:
        with self._lock:
            self.kinds[kind] += 1
            if kind == "state":
                self.states[str(fields.get("state"))] += 1

    def as_dict(self) -> dict[str, Any]:
        with self._lock:
            return {"events": dict(self.kinds), "states": dict(sorted(self.states.items()))}


def wait_for_outbox(read_store: Callable[[], Any], dispatch: Callable[[], None], *, bound_s: float,
                    say: Callable[[str], None], clock: Callable[[], float] = time.monotonic,
                    sleep: Callable[[float], None] = time.sleep) -> int:
    """Run `dispatch` until the outbox holds nothing pending, or for at most `bound_s` seconds;
    returns how many entries are still pending (0: everything raised was sent or settled).

    Pending entries due only after the bound (a long group_wait, a retry backed off for
    minutes) end the wait at once: waiting could not send them.
    """
    deadline = clock() + bound_s
    announced = False
    while True:
        with read_store() as store:
            due = store.outbox_due_times()
        if not due:
            return 0
        left = deadline - clock()
        first = min(due)
        if left <= 0 or first > utcnow() + timedelta(seconds=left):
            say(f"gave up waiting for the outbox after {bound_s - max(left, 0):.0f} s of at most {bound_s:g} s "
                f"(--once-wait): {len(due)} entr{'y' if len(due) == 1 else 'ies'} still pending, the next due "
                f"at {first.isoformat()}; a running daemon or `lstar alerts dispatch` sends them")
            return len(due)
        if not announced:
            say(f"waiting up to {bound_s:g} s (--once-wait) for {len(due)} pending outbox "
                f"entr{'y' if len(due) == 1 else 'ies'} to be sent")
            announced = True
        wait = (first - utcnow()).total_seconds()
        sleep(min(max(wait, 0.2), 1.0, max(left, 0.0)))
        dispatch()


def print_summary(tally: RunTally, pending: int, out: TextIO) -> None:
    """The summary `lstar run --once` ends with: one count per line."""
    data = tally.as_dict()
    events = data["events"]
    lines = ["summary of this run:"]
    lines += [f"  {label:<24} {events.get(kind, 0)}" for label, kind in SUMMARY_ROWS]
    lines += [f"  {'task state ' + state:<24} {n}" for state, n in data["states"].items()]
    lines += [f"  {label:<24} {events.get(kind, 0)}" for label, kind in ALERT_ROWS]
    lines.append(f"  {'outbox still pending':<24} {pending}")
    out.write("\n".join(lines) + "\n")
    out.flush()


__all__ = ["RunTally", "wait_for_outbox", "print_summary"]
