"""The poll job: ask the Hub for the new commits of every watched repo; each one becomes a
checkpoint row `discovered` (`monitor.hub.poll`).

A webhook that arrives while a poll runs asks for one more (at most three in a run). After each
poll, the step the daemon hands in (`then`: the gate job, `monitor.jobs.gate`) runs on the same
store and Hub client, so a discovered checkpoint is gated in the run that found it: poll and
gate are one scheduled job.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Protocol, TYPE_CHECKING

from monitor.hub import poll_once
from monitor.jobs.context import JobContext

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from datetime import datetime

    from monitor.store.rows import HubStateRow, WatermarkRow


class PollStore(Protocol):
    """What the poll writes: the watermarks and poll log it reads and extends, the checkpoints
    it discovers (`monitor.hub.poll.poll_once`)."""

    def close_hub_outage(self, endpoint: str, *, now: datetime) -> None: ...
    def get_hub_state(self, endpoint: str) -> HubStateRow | None: ...
    def get_watermark(self, rule_key: str) -> WatermarkRow | None: ...
    def open_hub_outage(self, endpoint: str, *, now: datetime, failures: int, error: str | None) -> int: ...
    def put_hub_state(self, endpoint: str, state: Mapping[str, Any], *, now: datetime) -> None: ...
    def record_discoveries(self, rule_key: str, rule_name: str, endpoint: str, candidates: Sequence[Any], *,
                           watermark: datetime | None, boundary: Sequence[str], now: datetime, requests: int,
                           listed: int, inserted_ids: list[tuple[int, Any]] | None = None) -> int: ...
    def record_hub_poll(self, rule_key: str, rule_name: str, *, now: datetime, ok: bool, listed: int,
                        new: int, requests: int, error: str | None = None) -> None: ...


def watch_rules(policies: list[Any]) -> list[Any]:
    """The watch rules of every policy in force, the first of each name."""
    seen: dict[str, Any] = {}
    for policy in policies:
        for rule in policy.watch:
            seen.setdefault(rule.name, rule)
    return list(seen.values())


def poll_rules(store: PollStore, client: Any, rules: list[Any], metrics: Any) -> list[Any]:
    """One poll of every rule, counted in the metrics; what each found."""
    polls = poll_once(store, client, rules)   # type: ignore[arg-type]  # the part of Store it uses
    for p in polls:
        metrics.polls.labels(result="error" if p.error else "ok").inc()
        metrics.discovered.inc(p.new)
        if p.error is None:
            metrics.rule_polled(p.rule)
    return polls


def run(ctx: JobContext, poll_requested: threading.Event,
        then: Callable[[JobContext, Any, Any, list[Any]], dict[str, Any]]) -> dict[str, Any]:
    """Poll (again while `poll_requested` is set by a webhook, three times at most), each poll
    followed by `then(ctx, store, client, rules)`, whose result joins the poll's; asks for a
    score run once something is gated."""
    rules = watch_rules(ctx.policies())
    out: dict[str, Any] = {"rules": len(rules), "polls": [], "gated": []}
    if not rules:
        return out
    for _ in range(3):  # a webhook that arrives during a poll asks for one more
        poll_requested.clear()
        with ctx.job_store() as store:
            client = ctx.hub_client(store)
            out["polls"] = [p.as_dict() for p in poll_rules(store, client, rules, ctx.metrics)]
            out.update(then(ctx, store, client, rules))
        if not poll_requested.is_set() or ctx.stopping.is_set():
            break
    if any(o["status"] == "gated" for o in out["gated"]):
        ctx.nudge("score")
    return out


__all__ = ["PollStore", "poll_rules", "run", "watch_rules"]
