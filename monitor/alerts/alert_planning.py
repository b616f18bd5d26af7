"""Alert planning: turning a prediction into the alert transition it calls for (fire, repeat,
resolve, or none), with one delivery per receiver its route names.

The second stage of an evaluation tick (predictions -> alerts -> notifications). It reads the
lineage's history (its state in training order, its newest firing alert, the receivers' last
sends) from `Store.lineage_history`, or, in a tick, from the batch's `LineageBatch`, and decides
per receiver with `monitor.alerts.rules.decide`. It writes nothing: the outbox does.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from monitor.alerts.derivatives import Judgement
from monitor.alerts.model import Alert, Delivery
from monitor.alerts.payload import gaming_annotations, task_annotations
from monitor.alerts.predict import TaskPrediction
from monitor.alerts.prediction_eval import GAMING_TASK, prediction_row
from monitor.alerts.rules import (FIRING_STATES, GAMING_ALERTNAME, RouteTarget, ScoreView, alert_key, decide,
                                  group_key, group_labels, route_alert, task_labels)
from monitor.policy import Policy, Task
from monitor.store import Store
from monitor.store.rows import LineageHistory
from monitor.stress.storage import stress_caveats

# What a tick passes instead of reading per run: {(repo, commit): [observation rows]}
Observed = Mapping[tuple[str, str], Sequence[Mapping[str, Any]]]


def _delivery(policy: Policy, target: RouteTarget, labels: Mapping[str, str]) -> Delivery:
    grouped = group_labels(labels, target.group_by)
    return Delivery(receiver=target.receiver, group_key=group_key(policy.name, target.receiver, grouped),
                    group_labels=grouped, group_wait_s=target.group_wait.total_seconds(),
                    group_interval_s=target.group_interval.total_seconds())


def plan_alert(policy: Policy, *, task: str, score: ScoreView, state: str, numbers: dict[str, Any],
               history: LineageHistory, now: datetime, labels: dict[str, str],
               annotate: Callable[[bool], dict[str, str]]) -> Alert | None:
    """The alert (with its deliveries) one evaluation calls for, or None.

    Pure apart from reading `history` (from `Store.lineage_history`): routes the alert's
    labels and asks `decide` per receiver. The state it compares with is the lineage's: that
    of its current checkpoint in training order (`monitor.training_order`). A checkpoint
    EARLIER in training order than that one (scored late) calls for no alert: its prediction
    is recorded, but the lineage's state, and the alert about it, stay the current one's.
    """
    if history.behind_current:
        return None
    previous = history.state
    last_firing = history.last_firing
    resolving = state == "clear"
    if resolving:
        if last_firing is None:
            return None
        labels = dict(last_firing.labels)  # a resolved alert keeps the labels it fired with
    deliveries = []
    kinds = set()
    for target in route_alert(policy.route, labels):
        receiver = policy.receiver(target.receiver)
        seen = history.receivers.get(target.receiver)
        fired_at, resolved_at = (seen.last_firing_at, seen.last_resolved_at) if seen else (None, None)
        decision = decide(previous, state, now=now, last_firing_sent_at=fired_at,
                          repeat_interval=target.repeat_interval,
                          episode_notified=fired_at is not None and (resolved_at is None or fired_at > resolved_at),
                          send_resolved=receiver.resolved_notifications)
        if decision != "none":
            kinds.add(decision)
            deliveries.append(_delivery(policy, target, labels))
    if not deliveries:
        return None
    kind = "fire" if "fire" in kinds else ("resolve" if resolving else "repeat")
    continuing = previous == state and last_firing is not None
    starts_at = last_firing.starts_at if (resolving or continuing) and last_firing else now
    return Alert(alert_key=alert_key(policy.name, task, score.repo, score.commit, state), kind=kind,
                 policy=policy.name, task=task, repo=score.repo, commit_sha=score.commit,
                 lineage=score.lineage, state=state, status="resolved" if resolving else "firing",
                 labels=labels, annotations=annotate(resolving), numbers=numbers, starts_at=starts_at,
                 ends_at=now if resolving else None, created_at=now, deliveries=tuple(deliveries))


def task_prediction_row(store: Store, policy: Policy, task: Task, score: ScoreView,
                        prediction: TaskPrediction, *, now: datetime,
                        derivative: Judgement | None = None, history: LineageHistory | None = None,
                        observed: Observed | None = None,
                        stress: Sequence[str] | None = None) -> dict[str, Any]:
    """The prediction row (with its alert, if any) for one (policy, task, score); for a
    derivative, `derivative` (monitor.alerts.derivatives) says which coordinate drove the
    state, and its numbers, labels and caveats go into the row and the alert. A tick passes the
    lineage's `history` and the batch's `observed` states (read once for the batch); without
    them they are read from `store`, and so are the stress caveats of the prediction's curve
    (`stress`: a tick reads them once per batch, as one task has one curve)."""
    if history is None:
        history = store.lineage_history(policy.name, task.name, score.lineage,
                                        (score.repo, score.commit, score.finished_at))
    numbers = {**prediction.as_dict(), "repo": score.repo, "commit": score.commit,
               "lineage": score.lineage, "run_id": score.run_id}
    caveats = list(score.extra.get("caveats") or [])
    extra_labels = {**policy.labels, **task.labels}
    if derivative is not None:
        numbers["derivative"] = derivative.numbers
        numbers["lstar_base"] = derivative.numbers.get("lstar_base")
        caveats += derivative.caveats
        extra_labels.update(derivative.labels)
    # a curve a stress test flagged (monitor.stress.limits): its forecasts carry the caveat
    caveats += list(stress) if stress is not None else stress_caveats(store, prediction.curve_id)
    if caveats:
        numbers["caveats"] = caveats
    labels = task_labels(policy=policy.name, task=task.name, repo=score.repo, lineage=score.lineage,
                         commit=score.commit, state=prediction.state,
                         extra=extra_labels, axis=prediction.axis)
    if task.evaluate is not None:
        # An evaluation already observed this checkpoint (a rescore): its observed state, which
        # supersedes the prediction, travels with the alert beside the predicted one.
        states = observed if observed is not None else store.observed_states([(score.repo, score.commit)])
        done = [o for o in states.get((score.repo, score.commit), [])
                if o["policy"] == policy.name and o["task"] == task.name and o["status"] == "done"]
        if done:
            labels.update(predicted_state=prediction.state, observed_state=done[-1]["observed_state"])
            numbers["observed_state"] = done[-1]["observed_state"]
    alert = plan_alert(
        policy, task=task.name, score=score, state=prediction.state, numbers=numbers, history=history,
        now=now, labels=labels,
        annotate=lambda resolved: task_annotations(numbers, repo=score.repo, commit=score.commit,
                                                   state=prediction.state, resolved=resolved))
    row = prediction_row(policy, task.name, score, state=prediction.state, now=now,
                          p_hat=prediction.p_hat, lo=prediction.lo, hi=prediction.hi,
                          threshold=prediction.threshold, curve_id=prediction.curve_id,
                          detail={**prediction.as_dict(), **({"caveats": caveats} if caveats else {}),
                                  **({"derivative": derivative.numbers} if derivative is not None else {})})
    row["alerts"] = [alert.as_row()] if alert else []
    note_history(row, history)
    return row


def note_history(row: dict[str, Any], history: LineageHistory) -> None:
    """What the event log and the evaluation report say of a planned row (not columns): the
    lineage's state before it, and the current checkpoint when the row's is earlier than it."""
    row["previous_state"] = history.state
    if history.behind_current:
        row["behind_current"] = history.current


def late_line(row: Mapping[str, Any]) -> str:
    """The report's line for a prediction of an earlier checkpoint scored late."""
    return (f"policy {row['policy']}, task {row['task']}: {row['repo']}@{str(row['commit_sha'])[:12]} is earlier "
            f"in training order than the current checkpoint {str(row['behind_current'])[:12]}; its state "
            f"{row['state']} is recorded, the lineage stays {row.get('previous_state') or 'none'} (no alert)")


def gaming_prediction_row(policy: Policy, score: ScoreView, *, state: str, numbers: dict[str, Any],
                          history: LineageHistory, now: datetime) -> dict[str, Any]:
    """The calibration-gaming prediction row of a public score (with its alert, if any)."""
    rule = policy.calibration_gaming
    assert rule is not None
    labels = task_labels(policy=policy.name, task=GAMING_TASK, repo=score.repo, lineage=score.lineage,
                         commit=score.commit, state=state, extra={**policy.labels, **rule.labels})
    labels["alertname"] = GAMING_ALERTNAME
    alert = plan_alert(policy, task=GAMING_TASK, score=score, state=state, numbers=numbers,
                       history=history, now=now, labels=labels,
                       annotate=lambda resolved: gaming_annotations(numbers, repo=score.repo,
                                                                    commit=score.commit,
                                                                    resolved=resolved))
    planned = prediction_row(policy, GAMING_TASK, score, state=state, now=now, threshold=rule.k, detail=numbers)
    planned["alerts"] = [alert.as_row()] if alert else []
    note_history(planned, history)
    return planned


__all__ = ["FIRING_STATES", "Observed", "gaming_prediction_row", "late_line", "note_history", "plan_alert",
           "task_prediction_row"]
