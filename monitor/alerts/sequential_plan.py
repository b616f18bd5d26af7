"""The plan of a sequential score (`monitor.scoring.sequential_run`): every task of every
policy that watches a repo, with the numbers of its curve that decide its state."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from monitor.alerts.prediction_eval import watches
from monitor.alerts.predict import load_task_curve
from monitor.errors import CurveError
from monitor.policy import Policy, Task

log = logging.getLogger("lstar.daemon")


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
                  seed: int = 0, strict: bool = True) -> dict[str, Any]:
    """The sequential plan of every task of every policy that watches `repo` (found by watch
    rule `rule`, if any).

    The stopping rule watches L*: a task whose curve is on another axis, or whose curve file
    cannot be read, cannot be settled by it. With `strict` (the CLI) that is a `CurveError`;
    without (the daemon) the plan has no tasks, so the checkpoint is scored in full and its
    tasks are evaluated, or refused with their reason, as in full mode: a broken curve never
    fails the scoring job, and no state rests on a stop that did not watch it."""
    from monitor.scoring.sequential_run import sequential_plan

    tasks = []
    for policy in policies:
        if not watches(policy, repo, rule):
            continue
        for task in policy.tasks:
            try:
                curve = load_task_curve(policy.resolve_path(task.curve), task.budget)
                if curve.axis != "lstar":
                    raise CurveError(f"task {task.name!r} of policy {policy.name!r} is predicted on "
                                     f"{curve.axis_label}, and sequential stopping watches L* only",
                                     hint="score in full (without --until-settled)")
            except CurveError as exc:
                if strict:
                    raise
                log.warning("sequential scoring of %s: %s; scoring it in full", repo, exc.one_line())
                return sequential_plan([], delta=delta, block_documents=block_documents, seed=seed)
            tasks.append(task_entry(policy.name, task, curve))
    return sequential_plan(tasks, delta=delta, block_documents=block_documents, seed=seed)
