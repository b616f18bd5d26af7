"""The gate job: check each discovered checkpoint against its rule's budgets and the Hub's
headers (`monitor.hub.gate`); it moves `discovered → gated` (or `skipped` with the reason).

The pinned reference bases a policy asks to have scored (`monitor.alerts.reference_bases`) join
the queue here and pass the same gate, with the budgets of the rule that found their
derivative. The gate runs inside the poll job's run, on its store and Hub client
(`monitor.jobs.poll`).
"""

from __future__ import annotations

from typing import Any, Protocol, TYPE_CHECKING

from monitor.hub import gate_pending
from monitor.jobs.context import JobContext
from monitor.store import utcnow

if TYPE_CHECKING:
    from collections.abc import Mapping
    from datetime import datetime

    from monitor.store.rows import CheckpointRow


class GateStore(Protocol):
    """What the gate reads and writes (`monitor.hub.gate.gate_pending`,
    `monitor.alerts.reference_bases.add_reference_bases`)."""

    def add_reference_base(self, repo: str, sha: str, *, why: Mapping[str, Any], now: datetime,
                           rule: str | None = None) -> int | None: ...
    def checkpoint(self) -> None: ...
    def list_checkpoints(self, *, status: str | None = None, repo: str | None = None,
                         limit: int | None = None) -> list[CheckpointRow]: ...
    def set_checkpoint_verdict(self, checkpoint_id: int, *, expect_status: str, status: str,
                               reason: str | None, meta: Mapping[str, Any] | None, now: datetime,
                               base: Mapping[str, Any] | None = None) -> bool: ...
    def unqueued_bases(self) -> list[dict[str, Any]]: ...


def gate(ctx: JobContext, store: GateStore, client: Any, rules: list[Any]) -> dict[str, Any]:
    """Gate what is pending, add the reference bases the policies ask for and gate those; the
    outcomes (`gated`) and the bases added (`references`, when there are any)."""
    from monitor.alerts.reference_bases import add_reference_bases, reference_rules

    out: dict[str, Any] = {}
    # A reference base is gated with the budgets of the rule that found its derivative.
    gating = [*rules, *reference_rules(rules)]
    outcomes = gate_pending(store, client, gating, cache_dir=ctx.config.cache_dir)  # type: ignore[arg-type]
    # The pinned bases a policy asks to have scored join the queue, and the same gate.
    references = add_reference_bases(store, ctx.policies(), now=utcnow())  # type: ignore[arg-type]
    if references:
        out["references"] = [r.as_dict() for r in references]
        outcomes += gate_pending(store, client, gating, cache_dir=ctx.config.cache_dir)  # type: ignore[arg-type]
    out["gated"] = [o.as_dict() for o in outcomes]
    return out


__all__ = ["GateStore", "gate"]
