"""The write side of the outbox: evaluate new scores against policies, atomically.

For each score run a policy has not yet evaluated, and each of its tasks: predict (P̂,
interval, state), decide per receiver (`monitor.alerts.rules.decide`), and write the
prediction, the alert and one delivery row per receiver in ONE transaction, under the
unique key (policy, task, repo, commit, state). A crash before the commit leaves nothing,
so the run is evaluated again; after it, the prediction row marks the run as done and the
alert key stops a second alert — exactly one delivery per receiver either way.

Fail points (crash tests, `LSTAR_FAILPOINT`): `after_score_before_outbox` (the decision is
made, nothing written) and `mid_outbox_write` (inside the transaction, before COMMIT).
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from monitor.alerts.gaps import track_evaluation_gap
from monitor.alerts.model import Alert, Delivery
from monitor.alerts.payload import gaming_annotations, task_annotations
from monitor.alerts.predict import TaskPrediction, load_task_curve, predict_task, public_corpus
from monitor.alerts.rules import (FIRING_STATES, GAMING_ALERTNAME, RouteTarget, ScoreView, alert_key,
                                  calibration_gaming, decide, group_key, group_labels, route_alert,
                                  task_labels)
from monitor.curves import ScoringRef
from monitor.errors import CurveError
from monitor.events import event
from monitor.failpoints import failpoint
from monitor.policy import Policy, Task
from monitor.store import Store
from monitor.store.evaluation_gaps import NOT_EVALUATED
from monitor.store.rows import EvaluationCandidateRow, LineageHistory

GAMING_TASK = "calibration_gaming"
# (policy, task, score) -> prediction; raises CurveError when the curve does not apply.
Predictor = Callable[[Policy, Task, ScoreView], TaskPrediction]


class CurvePredictor:
    """Predicts with each task's curve artifact (loaded once), refusing a curve fitted on
    another corpus or scoring spec than the score's."""

    def __init__(self) -> None:
        self._curves: dict[str, Any] = {}

    def curve(self, policy: Policy, task: Task) -> Any:
        path = policy.resolve_path(task.curve)
        key = str(path.resolve())
        if key not in self._curves:
            self._curves[key] = load_task_curve(path)
        return self._curves[key]

    def __call__(self, policy: Policy, task: Task, score: ScoreView) -> TaskPrediction:
        spec = ScoringRef.from_score_run(score.extra) if score.extra.get("spec_version") else None
        return predict_task(self.curve(policy, task), task, lstar=score.lstar, se=score.se,
                            corpus_sha256=score.corpus_sha256, scoring_spec=spec)

    def corpus_of(self, policy: Policy) -> str | None:
        """The public corpus of a policy (`predict.public_corpus`), loading its curves."""
        return public_corpus(policy, [self.curve(policy, t) for t in policy.tasks])


@dataclass
class EvaluationReport:
    """What one pass wrote, and what it could not evaluate (with why)."""

    predictions: int = 0
    alerts: int = 0
    deliveries: int = 0
    skipped: list[str] = field(default_factory=list)
    skip_reasons: dict[str, str] = field(default_factory=dict)   # line of `skipped` -> its reason code

    def skip(self, reason: str, line: str) -> None:
        """Record an evaluation that could not be done: a reason code and the line that says why."""
        self.skipped.append(line)
        self.skip_reasons[line] = reason

    def add(self, counts: Mapping[str, int]) -> None:
        self.predictions += counts["predictions"]
        self.alerts += counts["alerts"]
        self.deliveries += counts["deliveries"]

    def as_dict(self) -> dict[str, Any]:
        return {"predictions": self.predictions, "alerts": self.alerts,
                "deliveries": self.deliveries, "skipped": list(self.skipped),
                "skip_reasons": dict(self.skip_reasons)}


def watches(policy: Policy, repo: str, rule: str | None) -> bool:
    """Whether a score of `repo` concerns `policy` (no watch rules: every repo does).

    A checkpoint found by one of the policy's rules does; otherwise the rules' offline-
    checkable selectors (author, name glob, search text) decide.
    """
    if not policy.watch:
        return True
    owner = repo.split("/", 1)[0] if "/" in repo else ""
    for w in policy.watch:
        if rule is not None and rule == w.name:
            return True
        if w.author is not None and w.author.lower() != owner.lower():
            continue
        if w.search is not None and w.search.lower() not in repo.lower():
            continue
        if w.name_glob is not None:
            target = repo if "/" in w.name_glob else repo.split("/", 1)[-1]
            if not fnmatch.fnmatchcase(target, w.name_glob):
                continue
        return True
    return False


def _view(row: EvaluationCandidateRow) -> ScoreView:
    return ScoreView(run_id=row.run_id, repo=row.repo, commit=row.commit_sha,
                     lineage=row.lineage, lstar=float(row.lstar), se=float(row.se),
                     corpus_sha256=row.corpus_sha256, finished_at=row.finished_at, rule=row.rule,
                     extra={"spec_version": row.spec_version, "window_len": row.window_len,
                            "stride": row.stride, "prefix_policy": row.prefix_policy,
                            "caveats": partial_caveats(row.partial, row.sequential)})


def partial_caveats(partial: bool, sequential: Any) -> list[str]:
    """The caveat of a state that rests on a partial (sequential) score, else none."""
    if not partial:
        return []
    record = json.loads(sequential) if isinstance(sequential, str) else (sequential or {})
    return [f"rests on a partial score: {record.get('documents_scored', '?')} of "
            f"{record.get('documents_total', '?')} documents ({record.get('tokens_scored', '?')} of "
            f"{record.get('tokens_total', '?')} tokens) scored; stopped: {record.get('reason', '?')} "
            f"at delta {record.get('delta', '?')} ({record.get('bound', '?')})"]


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
    labels and asks `decide` per receiver.
    """
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


def _prediction_row(policy: Policy, task: str, score: ScoreView, *, state: str, now: datetime,
                    p_hat: float | None = None, lo: float | None = None, hi: float | None = None,
                    threshold: float | None = None, curve_id: str | None = None,
                    detail: Mapping[str, Any] = {}) -> dict[str, Any]:
    return {"policy": policy.name, "task": task, "run_id": score.run_id, "repo": score.repo,
            "commit_sha": score.commit, "lineage": score.lineage, "corpus_sha256": score.corpus_sha256,
            "lstar": score.lstar, "se": score.se, "p_hat": p_hat, "lo": lo, "hi": hi,
            "threshold": threshold, "state": state, "curve_id": curve_id, "detail": dict(detail),
            "evaluated_at": now}


def task_prediction_row(store: Store, policy: Policy, task: Task, score: ScoreView,
                  prediction: TaskPrediction, *, now: datetime) -> dict[str, Any]:
    """The prediction row (with its alert, if any) for one (policy, task, score)."""
    history = store.lineage_history(policy.name, task.name, score.lineage)
    numbers = {**prediction.as_dict(), "repo": score.repo, "commit": score.commit,
               "lineage": score.lineage, "run_id": score.run_id}
    caveats = list(score.extra.get("caveats") or [])
    if caveats:
        numbers["caveats"] = caveats
    labels = task_labels(policy=policy.name, task=task.name, repo=score.repo, lineage=score.lineage,
                         commit=score.commit, state=prediction.state,
                         extra={**policy.labels, **task.labels})
    alert = plan_alert(
        policy, task=task.name, score=score, state=prediction.state, numbers=numbers, history=history,
        now=now, labels=labels,
        annotate=lambda resolved: task_annotations(numbers, repo=score.repo, commit=score.commit,
                                                   state=prediction.state, resolved=resolved))
    row = _prediction_row(policy, task.name, score, state=prediction.state, now=now,
                          p_hat=prediction.p_hat, lo=prediction.lo, hi=prediction.hi,
                          threshold=prediction.threshold, curve_id=prediction.curve_id,
                          detail={**prediction.as_dict(), **({"caveats": caveats} if caveats else {})})
    row["alerts"] = [alert.as_row()] if alert else []
    row["previous_state"] = history.state   # for the event log only; not a column
    return row


def _write(store: Store, rows: Sequence[dict[str, Any]], now: datetime) -> dict[str, int]:
    """Write planned prediction rows (one at a time, as callers pass them) and log what was
    written: the task's state, and the alert it raised."""
    failpoint("after_score_before_outbox")
    counts = store.write_outbox(rows, now=now, before_commit=lambda conn: failpoint("mid_outbox_write"))
    if len(rows) == 1 and counts["predictions"]:   # 0: evaluated meanwhile, nothing new to tell
        row = rows[0]
        ids = {"policy": row["policy"], "task": row["task"], "repo": row["repo"], "commit": row["commit_sha"],
               "run": row["run_id"]}
        previous = row.get("previous_state")
        event("state", **ids, state=row["state"], previous=previous or "none",
              changed=previous != row["state"], p_hat=row["p_hat"], lo=row["lo"], hi=row["hi"],
              threshold=row["threshold"])
        if counts["alerts"]:
            for alert in row.get("alerts", ()):
                event("alert_raised", **ids, alert=alert["alert_key"], kind=alert["kind"],
                      state=alert["state"], receivers=",".join(d["receiver"] for d in alert["deliveries"]))
    return counts


def _curve_id(curves: Predictor, policy: Policy, task: Task) -> str | None:
    """The id of the task's curve as `curves` loads it; None when it cannot be loaded."""
    if not isinstance(curves, CurvePredictor):
        return None
    try:
        return str(curves.curve(policy, task).curve_id)
    except CurveError:
        return None


def evaluate_pending(store: Store, policies: Sequence[Policy], *, now: datetime,
                     predictor: Predictor | None = None) -> EvaluationReport:
    """Evaluate every score run each policy has not evaluated yet (oldest first).

    Idempotent: run it after every score, on start-up and on a schedule; a second call
    with nothing new writes nothing.
    """
    report = EvaluationReport()
    curves = predictor if predictor is not None else CurvePredictor()
    for policy in policies:
        public = policy.corpora.public
        if public is None and isinstance(curves, CurvePredictor):
            try:
                public = curves.corpus_of(policy)
            except CurveError as exc:
                report.skip("curve_unusable", f"policy {policy.name}: {exc.one_line()}")
                continue
        if public is None and policy.tasks:
            report.skip("no_public_corpus", f"policy {policy.name}: no public corpus (set corpora.public, "
                                            "or use curves fitted on one corpus)")
            continue
        for task in policy.tasks:
            curve_id = _curve_id(curves, policy, task)
            for row in store.evaluation_candidates(policy.name, task.name, public, curve_id):
                score = _view(row)
                if not watches(policy, score.repo, score.rule):
                    continue
                try:
                    prediction = curves(policy, task, score)
                except CurveError as exc:
                    # Recorded, so that it is shown (and not tried again until the curve changes).
                    report.skip("curve_refused", f"policy {policy.name}, task {task.name}, "
                                                 f"run {score.run_id}: {exc.one_line()}")
                    report.add(_write(store, [_prediction_row(
                        policy, task.name, score, state=NOT_EVALUATED, now=now, curve_id=curve_id,
                        detail={"reason": exc.one_line()})], now))
                    continue
                planned = task_prediction_row(store, policy, task, score, prediction, now=now)
                report.add(_write(store, [planned], now))
        report.deliveries += track_evaluation_gap(store, policy, now=now)
        if policy.calibration_gaming is not None:
            write_gaming_predictions(store, policy, now=now, report=report)
    return report


def reference_offsets(store: Store, policy: Policy) -> tuple[list[float], list[str]]:
    """L*_public − L*_private of each reference checkpoint, and the references lacking a score."""
    rule, corpora = policy.calibration_gaming, policy.corpora
    assert rule is not None and corpora.public is not None and corpora.private is not None
    offsets, missing = [], []
    for repo, sha in rule.references():
        pub = store.latest_score(repo, sha, corpora.public)
        priv = store.latest_score(repo, sha, corpora.private)
        if pub is None or priv is None:
            missing.append(f"{repo}@{sha}")
            continue
        offsets.append(float(pub.lstar) - float(priv.lstar))
    return offsets, missing


def write_gaming_predictions(store: Store, policy: Policy, *, now: datetime,
                             report: EvaluationReport) -> None:
    """The calibration-gaming rule for every public score that also has a private one."""
    rule, corpora = policy.calibration_gaming, policy.corpora
    assert rule is not None
    if corpora.public is None or corpora.private is None:
        report.skip("gaming_corpora_missing",
                    f"policy {policy.name}: calibration_gaming needs corpora.public and .private")
        return
    candidates = [r for r in store.evaluation_candidates(policy.name, GAMING_TASK, corpora.public)
                  if watches(policy, r.repo, r.rule)]
    if not candidates:
        return
    offsets, missing = reference_offsets(store, policy)
    if missing:
        report.skip("gaming_references_unscored",
                    f"policy {policy.name}: calibration_gaming waits for scores of reference "
                    f"checkpoint(s) on both corpora: {', '.join(missing)}")
        return
    for row in candidates:
        score = _view(row)
        private = store.latest_score(score.repo, score.commit, corpora.private)
        if private is None:
            continue  # not scored on the private corpus yet; evaluated once it is
        verdict = calibration_gaming(score.lstar, score.se, float(private.lstar), float(private.se),
                                     reference_offsets=offsets, k=rule.k)
        state = "flagged" if verdict.flagged else "clear"
        numbers = {**verdict.as_dict(), "task": GAMING_TASK, "state": state, "lstar_public": score.lstar,
                   "se_public": score.se, "lstar_private": float(private.lstar),
                   "se_private": float(private.se), "corpus_public": corpora.public,
                   "corpus_private": corpora.private, "repo": score.repo, "commit": score.commit,
                   "lineage": score.lineage, "run_id": score.run_id}
        labels = task_labels(policy=policy.name, task=GAMING_TASK, repo=score.repo, lineage=score.lineage,
                             commit=score.commit, state=state, extra={**policy.labels, **rule.labels})
        labels["alertname"] = GAMING_ALERTNAME
        history = store.lineage_history(policy.name, GAMING_TASK, score.lineage)
        alert = plan_alert(policy, task=GAMING_TASK, score=score, state=state, numbers=numbers,
                           history=history, now=now, labels=labels,
                           annotate=lambda resolved: gaming_annotations(numbers, repo=score.repo,
                                                                        commit=score.commit,
                                                                        resolved=resolved))
        planned = _prediction_row(policy, GAMING_TASK, score, state=state, now=now, threshold=rule.k,
                                  detail=numbers)
        planned["alerts"] = [alert.as_row()] if alert else []
        planned["previous_state"] = history.state
        report.add(_write(store, [planned], now))


__all__ = ["CurvePredictor", "EvaluationReport", "evaluate_pending", "task_prediction_row",
           "write_gaming_predictions", "plan_alert", "reference_offsets", "watches", "GAMING_TASK", "FIRING_STATES"]
