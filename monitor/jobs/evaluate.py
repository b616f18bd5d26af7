"""The evaluate job: judge every scored checkpoint against each policy task that watches it
(`monitor.alerts.evaluate_pending`): a prediction row per (checkpoint, task), and the alerts
and their deliveries it calls for in the outbox; a scored checkpoint moves from not evaluated to
evaluated for each task (or is skipped with a reason code, logged and counted once).

The evaluation logic stays in `monitor.alerts`; this module only runs it on the daemon's
schedule and asks for the dispatch (deliveries to send) and observe (predictions to check)
runs that follow.
"""

from __future__ import annotations

from typing import Any, Protocol

from monitor.events import event
from monitor.jobs.context import JobContext
from monitor.store import utcnow


class EvaluateStore(Protocol):
    """What the evaluation tick reads and writes (`monitor.alerts.evaluate_pending`)."""


def evaluate(store: EvaluateStore, policies: list[Any], *, stop: Any) -> dict[str, Any]:
    """One evaluation pass over everything scored and not yet judged; its report."""
    from monitor.alerts import evaluate_pending

    return evaluate_pending(store, policies, now=utcnow(), complete=True,  # type: ignore[arg-type]
                            stop=stop).as_dict()


def log_new_skips(ctx: JobContext, skips: dict[str, str]) -> None:
    """Log and count each skipped evaluation (line -> reason code) not skipped in the
    previous pass: a policy-level skip is found again every pass until it is mended."""
    seen = ctx.job_memory.get("skips_seen", set())
    for line, reason in skips.items():
        if line not in seen:
            event("evaluation_skipped", reason=reason, detail=line)
            ctx.metrics.evaluations_skipped.labels(reason=reason).inc()
    ctx.job_memory["skips_seen"] = set(skips)


def run(ctx: JobContext) -> dict[str, Any]:
    """One evaluation pass; asks for a dispatch when deliveries wait and an observe run when
    new predictions can be checked."""
    policies = ctx.policies()
    with ctx.job_store() as store:
        report = evaluate(store, policies, stop=ctx.stopping.is_set)
    ctx.metrics.alerts_raised.inc(report["alerts"])
    log_new_skips(ctx, report["skip_reasons"])
    if report["deliveries"]:
        ctx.nudge("dispatch")
    if report["predictions"] and any(t.evaluate is not None for p in ctx.policies() for t in p.tasks):
        ctx.nudge("observe")
    return report


__all__ = ["EvaluateStore", "evaluate", "log_new_skips", "run"]
