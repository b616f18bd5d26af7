"""The plan of a sequential score (`monitor.scoring.sequential_run`): every task of every
policy that watches a repo, with the numbers of its curve that decide its state."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from monitor.alerts.outbox import watches
from monitor.alerts.predict import load_task_curve
from monitor.policy import Policy, Task


def task_entry(policy_name: str, task: Task | str, curve: Any, margin: float | None = None) -> dict[str, Any]:
    """One task of a plan: its name, threshold b_t + ε, the curve's confidence, band, knots and
    pins (corpus, scoring spec) — what `predict_task` uses, as JSON."""
    name = task if isinstance(task, str) else task.name
    if not isinstance(task, str) and task.margin is not None:
        margin = task.margin
    return {"policy": policy_name, "task": name, "curve_id": curve.curve_id,
            "threshold": float(curve.baseline + (margin if margin is not None else curve.margin)),
            "confidence": float(curve.confidence),
            "band": {"x": list(curve.band.x), "lower": list(curve.band.lower), "upper": list(curve.band.upper)},
            "knots": {"x": list(curve.knots.x), "y": list(curve.knots.y)},
            "corpus_sha256": curve.corpus_sha256,
            "scoring_spec": curve.scoring_spec.model_dump() if curve.scoring_spec is not None else None}


def plan_for_repo(policies: Sequence[Policy], repo: str, rule: str | None = None, *,
                  delta: float | None = None, block_documents: int | None = None,
                  seed: int = 0) -> dict[str, Any]:
    """The sequential plan of every task of every policy that watches `repo` (found by watch
    rule `rule`, if any)."""
    from monitor.scoring.sequential_run import sequential_plan

    tasks = [task_entry(p.name, t, load_task_curve(p.resolve_path(t.curve)))
             for p in policies if watches(p, repo, rule) for t in p.tasks]
    return sequential_plan(tasks, delta=delta, block_documents=block_documents, seed=seed)
