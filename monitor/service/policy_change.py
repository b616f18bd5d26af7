"""What a policy reload changes for the alerts: re-evaluate, resolve, and say so.

A reload that changes how a task judges a checkpoint (its curve, its margin and so its level
b + ε, its confidence, its budget, or how derivatives are judged) leaves every stored prediction
of that task judged by the old settings: an alert keeps firing for a level no longer in force,
and a report would print the new level above rows computed at the old one. So, for each task of
a policy whose judgement changed (`changed_tasks` of the `settings_in_force` before and after
the reload), `reevaluate_change`:

1. takes each lineage the task has judged and its current checkpoint
   (`monitor.reports.current`: the latest in training order);
2. predicts that checkpoint's newest judged run again under the new settings, through the same
   planning as a new score (`alert_planning.task_prediction_row`): a state that no longer holds is
   resolved (a resolve notification is queued in the outbox, and SENT as any other), a new one
   fires;
3. writes the new prediction over the old one of that run (`Store.replace_prediction`) and
   records the change with one line saying what it did (`TaskChange.summary`), which the
   daemon logs and reports list, e.g.

       policy watch: task arith level 0.3000 → 0.5000 (margin 0.0500 → 0.2500);
           re-evaluated 2 checkpoints; 1 alert resolved    (one line in the log)

At start the daemon compares with what the stored predictions were judged by
(`settings_judged`), so a change made while it was stopped is applied too. A task that is new,
or one whose curve cannot be loaded before or after, is left to the normal evaluation tick (a
new task's scope is new, so its runs are all evaluated once).

Only the current checkpoint of each lineage is judged again: it alone decides the lineage's
state, and the alerts follow that state. A re-fire on a checkpoint that already fired in that
state is not sent again (the alert key is per checkpoint and state, `rules.alert_key`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from monitor.alerts.derivatives import HOLD, Judgement, judge_derivative
from monitor.alerts.alert_planning import task_prediction_row
from monitor.alerts.prediction_eval import CurvePredictor
from monitor.alerts.prediction_eval import score_view
from monitor.alerts.predict import margin_in_force
from monitor.errors import CurveError
from monitor.policy import Policy, Task
from monitor.reports.present import fmt
from monitor.store import Store
from monitor.training_order import current_checkpoint, place

# What a task's judgement rests on, in the order the summary names a change.
SETTINGS = ("level", "margin", "curve_id", "confidence", "budget", "derivatives")


def task_settings(policy: Policy, task: Task, curves: CurvePredictor) -> dict[str, Any] | None:
    """The settings a task judges by: its curve's id, the margin ε in force and the level b + ε,
    the interval's confidence, the budget and the derivatives rule; None when its curve does not
    load (the evaluation tick reports that)."""
    try:
        curve = curves.curve(policy, task)
    except CurveError:
        return None
    margin = margin_in_force(curve, task)
    return {"level": float(curve.baseline) + float(margin), "margin": float(margin), "curve_id": curve.curve_id,
            "confidence": float(curve.confidence), "budget": task.budget, "derivatives": task.derivatives}


@dataclass
class TaskChange:
    """One task whose judgement a reload changed, and what re-evaluating it did."""

    policy: str
    task: str
    before: dict[str, Any]
    after: dict[str, Any]
    changed_at: datetime | None = None
    reevaluated: int = 0
    resolved: int = 0
    fired: int = 0
    states_changed: int = 0

    def what_changed(self) -> str:
        """`level 0.3000 → 0.5000 (margin 0.0500 → 0.2500)`, naming each setting that changed."""
        def show(key: str, value: Any) -> str:
            return str(value)[:12] if key == "curve_id" else fmt(value)

        parts = [f"{key.replace('_', ' ')} {show(key, self.before[key])} → {show(key, self.after[key])}"
                 for key in SETTINGS if self.before.get(key) != self.after.get(key)]
        if not parts:
            return "no setting changed"
        head, rest = parts[0], parts[1:]
        return head + (f" ({', '.join(rest)})" if rest else "")

    @property
    def summary(self) -> str:
        counted = [f"re-evaluated {self.reevaluated} checkpoint{'' if self.reevaluated == 1 else 's'}",
                   f"{self.resolved} alert{'' if self.resolved == 1 else 's'} resolved"]
        if self.fired:
            counted.append(f"{self.fired} alert{'' if self.fired == 1 else 's'} raised")
        return f"policy {self.policy}: task {self.task} {self.what_changed()}; {'; '.join(counted)}"

    def as_row(self) -> dict[str, Any]:
        return {"policy": self.policy, "task": self.task, "before": self.before, "after": self.after,
                "reevaluated": self.reevaluated, "resolved": self.resolved, "fired": self.fired,
                "summary": self.summary, "changed_at": self.changed_at}


def settings_in_force(policies: Sequence[Policy]) -> dict[tuple[str, str], dict[str, Any]]:
    """The settings of every (policy, task) whose curve loads, read now (a fresh read of each
    curve file: a curve replaced in place changes its id)."""
    curves = CurvePredictor()
    out = {}
    for policy in policies:
        for task in policy.tasks:
            settings = task_settings(policy, task, curves)
            if settings is not None:
                out[(policy.name, task.name)] = settings
    return out


def settings_judged(store: Store,
                    settings: dict[tuple[str, str], dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """The settings each (policy, task) of `settings` was last judged by, read from its newest
    stored prediction (level, margin, curve id, confidence; the rest as in `settings`): what a
    daemon compares with at start, when the policy may have changed while it was stopped."""
    out = {}
    for (policy, task), now in settings.items():
        detail = store.newest_judgement(policy, task)
        if not detail or not all(isinstance(detail.get(k), (int, float)) for k in ("floor", "margin", "confidence")):
            continue
        out[(policy, task)] = {**now, "level": float(detail["floor"]) + float(detail["margin"]),
                               "margin": float(detail["margin"]), "curve_id": detail.get("curve_id"),
                               "confidence": float(detail["confidence"])}
    return out


def changed_tasks(before: dict[tuple[str, str], dict[str, Any]],
                  after: dict[tuple[str, str], dict[str, Any]]) -> list[TaskChange]:
    """The tasks known before and after a reload (`settings_in_force` of each) whose settings
    differ, in (policy, task) order."""
    return [TaskChange(policy, task, before[(policy, task)], settings)
            for (policy, task), settings in sorted(after.items())
            if (policy, task) in before and before[(policy, task)] != settings]


def _current_runs(store: Store, policy: Policy, task: Task) -> list[dict[str, Any]]:
    """Each judged lineage's current checkpoint (training order), as its newest judged prediction."""
    by_lineage: dict[str, list[dict[str, Any]]] = {}
    for row in store.predicted_checkpoints(policy.name, task.name):
        by_lineage.setdefault(row["lineage"], []).append(row)

    def placement(row: dict[str, Any]) -> Any:
        return place(row["refs"], row["meta"], row["discovered_at"], row["finished_at"])

    picked = [current_checkpoint(rows, placement, lambda row: (row["commit_sha"], row["repo"])) for rows in by_lineage.values()]
    return [row for row in picked if row is not None]


def reevaluate_change(store: Store, policy: Policy, change: TaskChange, *, now: datetime,
                      curves: CurvePredictor | None = None) -> TaskChange:
    """Re-evaluate the current checkpoint of every lineage the task has judged under the policy
    in force, write each prediction over the old one with the alerts it calls for, and record
    the change; returns `change` with its counts."""
    curves = curves if curves is not None else CurvePredictor()
    task = next((t for t in policy.tasks if t.name == change.task), None)
    if task is None:   # removed by a later reload before this one was applied: nothing to judge
        return change
    current = _current_runs(store, policy, task)
    derived = store.derivative_keys()
    for run in store.run_candidates([row["run_id"] for row in current]):
        score = score_view(run)
        try:
            prediction = curves(policy, task, score)
            derivative = None
            if (score.repo, score.commit) in derived:
                derivative = judge_derivative(store, policy, task, score, curves.curve(policy, task), prediction)
        except CurveError:
            continue   # the evaluation tick records and reports a curve that does not apply
        if derivative == HOLD:
            continue
        judged = derivative if isinstance(derivative, Judgement) else None
        planned = task_prediction_row(store, policy, task, score, judged.prediction if judged else prediction,
                                      now=now, derivative=judged)
        counts = store.replace_prediction(planned, now=now)
        if not counts["predictions"]:
            continue
        change.reevaluated += 1
        change.states_changed += planned["previous_state"] != planned["state"]
        for alert in planned["alerts"][:counts["alerts"]]:
            if alert["status"] == "resolved":
                change.resolved += 1
            else:
                change.fired += 1
    change.changed_at = now
    store.record_policy_change(change.as_row())
    return change


__all__ = ["SETTINGS", "TaskChange", "changed_tasks", "reevaluate_change", "settings_in_force", "settings_judged",
           "task_settings"]
