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

import contextlib
import hashlib
import json
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from monitor.alerts.derivatives import HOLD, Judgement, judge_derivative
from monitor.alerts.gaps import track_evaluation_gap
from monitor.alerts.model import Alert, Delivery
from monitor.alerts.payload import gaming_annotations, task_annotations
from monitor.alerts.predict import TaskPrediction, load_task_curve, predict_task, public_corpus
from monitor.alerts.rules import (FIRING_STATES, GAMING_ALERTNAME, RouteTarget, ScoreView, alert_key,
                                  calibration_gaming, decide, group_key, group_labels, route_alert,
                                  task_labels)
from monitor.curves import ScoringRef
from monitor.curves.artifact import score_axis_value
from monitor.errors import CurveError
from monitor.events import event
from monitor.failpoints import failpoint
from monitor.policy import Policy, Task
from monitor.store import Store
from monitor.store.evaluation_gaps import NOT_EVALUATED
from monitor.store.rows import EVALUATION_AXIS_COLUMNS, EvaluationCandidateRow, LineageHistory
from monitor.stress.storage import stress_caveats

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
        key = f"{path.resolve()}@{task.budget}"  # one curve file may serve tasks at several budgets
        if key not in self._curves:
            self._curves[key] = load_task_curve(path, task.budget)
        return self._curves[key]

    def __call__(self, policy: Policy, task: Task, score: ScoreView) -> TaskPrediction:
        spec = ScoringRef.from_score_run(score.extra) if score.extra.get("spec_version") else None
        curve = self.curve(policy, task)
        # The score's value on the curve's axis and that axis's SE; a score without one (e.g. no
        # declared FLOPs for a log_flops curve) raises CurveError, recorded as not_evaluated.
        value, se = score_axis_value(curve, {**score.extra, "run_id": score.run_id, "lstar": score.lstar,
                                             "se_ce": score.se})
        return predict_task(curve, task, value=value, se=se, corpus_sha256=score.corpus_sha256,
                            scoring_spec=spec, score_lstar=score.lstar, score_lstar_se=score.se)

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
    late: list[str] = field(default_factory=list)   # earlier checkpoints scored late: recorded, no alert
    stopped: bool = False   # ended early by `stop` (shutdown); the rest waits on the queue

    def skip(self, reason: str, line: str) -> None:
        """Record an evaluation that could not be done: a reason code and the line that says why."""
        self.skipped.append(line)
        self.skip_reasons[line] = reason

    def add(self, counts: Mapping[str, int], row: Mapping[str, Any] | None = None) -> None:
        """Count what one write wrote; `row` (the planned prediction) adds its late line."""
        if row is not None and counts["predictions"] and row.get("behind_current"):
            self.late.append(late_line(row))
        self.predictions += counts["predictions"]
        self.alerts += counts["alerts"]
        self.deliveries += counts["deliveries"]

    def as_dict(self) -> dict[str, Any]:
        return {"predictions": self.predictions, "alerts": self.alerts,
                "deliveries": self.deliveries, "skipped": list(self.skipped),
                "skip_reasons": dict(self.skip_reasons), **({"late": list(self.late)} if self.late else {}),
                **({"stopped": True} if self.stopped else {})}


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
        if not w.matches_name(repo):
            continue
        return True
    return False


def _view(row: EvaluationCandidateRow) -> ScoreView:
    return ScoreView(run_id=row.run_id, repo=row.repo, commit=row.commit_sha,
                     lineage=row.lineage, lstar=float(row.lstar), se=float(row.se),
                     corpus_sha256=row.corpus_sha256, finished_at=row.finished_at, rule=row.rule,
                     extra={"spec_version": row.spec_version, "window_len": row.window_len,
                            "stride": row.stride, "prefix_policy": row.prefix_policy,
                            **{k: getattr(row, k) for k in EVALUATION_AXIS_COLUMNS},
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
                  prediction: TaskPrediction, *, now: datetime,
                  derivative: Judgement | None = None) -> dict[str, Any]:
    """The prediction row (with its alert, if any) for one (policy, task, score); for a
    derivative, `derivative` (monitor.alerts.derivatives) says which coordinate drove the
    state, and its numbers, labels and caveats go into the row and the alert."""
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
    caveats += stress_caveats(store, prediction.curve_id)
    if caveats:
        numbers["caveats"] = caveats
    labels = task_labels(policy=policy.name, task=task.name, repo=score.repo, lineage=score.lineage,
                         commit=score.commit, state=prediction.state,
                         extra=extra_labels, axis=prediction.axis)
    if task.evaluate is not None:
        # An evaluation already observed this checkpoint (a rescore): its observed state, which
        # supersedes the prediction, travels with the alert beside the predicted one.
        observed = [o for o in store.observed_states([(score.repo, score.commit)]).get((score.repo, score.commit), [])
                    if o["policy"] == policy.name and o["task"] == task.name and o["status"] == "done"]
        if observed:
            labels.update(predicted_state=prediction.state, observed_state=observed[-1]["observed_state"])
            numbers["observed_state"] = observed[-1]["observed_state"]
    alert = plan_alert(
        policy, task=task.name, score=score, state=prediction.state, numbers=numbers, history=history,
        now=now, labels=labels,
        annotate=lambda resolved: task_annotations(numbers, repo=score.repo, commit=score.commit,
                                                   state=prediction.state, resolved=resolved))
    row = _prediction_row(policy, task.name, score, state=prediction.state, now=now,
                          p_hat=prediction.p_hat, lo=prediction.lo, hi=prediction.hi,
                          threshold=prediction.threshold, curve_id=prediction.curve_id,
                          detail={**prediction.as_dict(), **({"caveats": caveats} if caveats else {}),
                                  **({"derivative": derivative.numbers} if derivative is not None else {})})
    row["alerts"] = [alert.as_row()] if alert else []
    _note_history(row, history)
    return row


def _note_history(row: dict[str, Any], history: LineageHistory) -> None:
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


# Runs evaluated per write transaction: one commit for a tick's new scores, while a full scan
# (after a curve or rule change) still commits as it goes.
BATCH_RUNS = 500


class _Batch:
    """The writes of up to BATCH_RUNS evaluated runs in ONE transaction of the store.

    Each plan reads the lineage's history inside the transaction, so it sees the rows
    written before it in the batch, exactly as when each run committed alone. The events
    that tell what was written are logged after the commit (a rolled-back batch told
    nothing). A crash before the commit leaves the batch's runs on the queue (it is drained
    only after the tick's writes), and the predictions' unique key makes the next tick's
    writes of the runs already committed a no-op."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.written = False

    @classmethod
    @contextlib.contextmanager
    def open(cls, store: Store) -> Iterator[_Batch]:
        batch = cls(store)
        with store.transaction():
            yield batch
        for name, fields in batch.events:
            event(name, **fields)


def _chunks(rows: Sequence[EvaluationCandidateRow]) -> Iterator[Sequence[EvaluationCandidateRow]]:
    for start in range(0, len(rows), BATCH_RUNS):
        yield rows[start:start + BATCH_RUNS]


def _write(store: Store, rows: Sequence[dict[str, Any]], now: datetime,
           batch: _Batch | None = None) -> dict[str, int]:
    """Write planned prediction rows (one at a time, as callers pass them) and log what was
    written: the task's state, and the alert it raised. In `batch`, the rows join its
    transaction and the lines wait for its commit."""
    failpoint("after_score_before_outbox")
    counts = store.write_outbox(rows, now=now, before_commit=lambda conn: failpoint("mid_outbox_write"))
    events: list[tuple[str, dict[str, Any]]] = []
    if len(rows) == 1 and counts["predictions"]:   # 0: evaluated meanwhile, nothing new to tell
        row = rows[0]
        ids = {"policy": row["policy"], "task": row["task"], "repo": row["repo"], "commit": row["commit_sha"],
               "run": row["run_id"]}
        previous = row.get("previous_state")
        behind = row.get("behind_current")
        # An earlier checkpoint scored late leaves the lineage's state as it was: said so.
        late = {"late": True, "current": str(behind)[:12]} if behind else {}
        events.append(("state", dict(**ids, state=row["state"], previous=previous or "none",
                                     changed=not behind and previous != row["state"], p_hat=row["p_hat"],
                                     lo=row["lo"], hi=row["hi"], threshold=row["threshold"], **late)))
        if counts["alerts"]:
            for alert in row.get("alerts", ()):
                events.append(("alert_raised", dict(
                    **ids, alert=alert["alert_key"], kind=alert["kind"], state=alert["state"],
                    receivers=",".join(d["receiver"] for d in alert["deliveries"]))))
    if batch is None:
        for name, fields in events:
            event(name, **fields)
    else:
        batch.events.extend(events)
        batch.written = True
    return counts


def _curve_id(curves: Predictor, policy: Policy, task: Task) -> str | None:
    """The id of the task's curve as `curves` loads it; None when it cannot be loaded."""
    if not isinstance(curves, CurvePredictor):
        return None
    try:
        return str(curves.curve(policy, task).curve_id)
    except CurveError:
        return None


def evaluation_scope(policy: Policy, curve_id: str | None) -> str:
    """A digest of what decides which runs are candidates for one (policy, task): the curve id
    and the policy's watch rules and corpora (and its calibration-gaming rule). While it is the
    one recorded, the evaluation queue holds every run still to look at."""
    what = {"curve_id": curve_id, "watch": [w.model_dump(mode="json") for w in policy.watch],
            "corpora": policy.corpora.model_dump(mode="json"),
            "gaming": None if policy.calibration_gaming is None else
            policy.calibration_gaming.model_dump(mode="json")}
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()


@dataclass
class _Tick:
    """One evaluation tick's view of the queue: the runs queued when it began, the
    (policy, task, corpus) consumers it handled, the runs one of them still waits on, and the
    scopes to record once the tick's writes are done."""

    queue: dict[str, str]
    scopes: dict[tuple[str, str], str] = field(default_factory=dict)
    handled: set[tuple[str, str, str]] = field(default_factory=set)
    held: set[str] = field(default_factory=set)
    to_record: list[tuple[str, str, str, str]] = field(default_factory=list)

    def candidates(self, store: Store, policy: Policy, task: str, corpus: str,
                   curve_id: str | None) -> tuple[list[EvaluationCandidateRow], bool]:
        """The runs (policy, task) has to look at: the queued ones on `corpus` while its scope is
        unchanged, else every run once (full scan: True)."""
        scope = evaluation_scope(policy, curve_id)
        self.handled.add((policy.name, task, corpus))
        if self.scopes.get((task, corpus)) == scope:
            queued = [r for r, c in self.queue.items() if c == corpus]
            return store.queued_candidates(policy.name, task, corpus, curve_id, queued), False
        self.to_record.append((policy.name, task, corpus, scope))
        return store.evaluation_candidates(policy.name, task, corpus, curve_id), True


def evaluate_pending(store: Store, policies: Sequence[Policy], *, now: datetime,
                     predictor: Predictor | None = None, complete: bool = False,
                     stop: Callable[[], bool] | None = None) -> EvaluationReport:
    """Evaluate every score run each policy has not evaluated yet (oldest first).

    Idempotent: run it after every score, on start-up and on a schedule; a second call
    with nothing new writes nothing. Its cost follows what is new: the runs queued since the
    last tick (`evaluation_queue`), plus one scan of every run for a (policy, task) whose
    curve, watch rules or corpora changed. `complete`: `policies` is the whole configuration
    (the daemon's), so a (policy, task, corpus) not in it is forgotten, and scans every run
    again if it comes back; otherwise the queued runs it has not seen wait for it. `stop()`
    true (the daemon is shutting down) ends the tick before the next score: what is left
    stays queued for the next tick.
    """
    report = EvaluationReport()
    curves = predictor if predictor is not None else CurvePredictor()
    tick = _Tick(queue=store.evaluation_queue())
    # The checkpoints that declare a base, read once: only they are judged on two coordinates.
    derived = store.derivative_keys()
    written = False
    for policy in policies:
        public = policy.corpora.public
        if public is None and isinstance(curves, CurvePredictor):
            try:
                public = curves.corpus_of(policy)
            except CurveError as exc:
                report.skip("curve_unusable", f"policy {policy.name}: {exc.one_line()}")
                store.forget_evaluation_scopes(policy.name)   # scanned in full once it is usable
                continue
        if public is None and policy.tasks:
            report.skip("no_public_corpus", f"policy {policy.name}: no public corpus (set corpora.public, "
                                            "or use curves fitted on one corpus)")
            store.forget_evaluation_scopes(policy.name)
            continue
        tick.scopes = store.evaluation_scopes(policy.name)
        new = any(c == public for c in tick.queue.values())
        for task in policy.tasks:
            curve_id = _curve_id(curves, policy, task)
            candidates, full = tick.candidates(store, policy, task.name, public, curve_id)
            new = new or full
            for chunk in _chunks(candidates):
                with _Batch.open(store) as batch:
                    for row in chunk:
                        if stop is not None and stop():
                            report.stopped = True
                            break
                        if _evaluate_run(store, policy, task, _view(row), curves, curve_id, now, report, batch,
                                         derived):
                            # a derivative whose base is still to be scored: looked at again later
                            tick.held.add(row.run_id)
                            if full:
                                store.requeue_evaluation([row.run_id], public, now=now)
                written = written or batch.written
                if report.stopped:   # nothing recorded nor drained: the next tick goes on
                    if written:
                        store.checkpoint()
                    return report
        # The episode changes only with new predictions; an open one is followed every tick.
        if new or store.open_evaluation_gap(policy.name) is not None:
            report.deliveries += track_evaluation_gap(store, policy, now=now)
        if policy.calibration_gaming is not None:
            written = write_gaming_predictions(store, policy, now=now, report=report, tick=tick) or written
    _finish_tick(store, tick, now, complete=complete)
    if written:   # the commits are durable in the WAL; one fold into the file per tick
        store.checkpoint()
    return report


def _evaluate_run(store: Store, policy: Policy, task: Task, score: ScoreView, curves: Predictor,
                  curve_id: str | None, now: datetime, report: EvaluationReport, batch: _Batch,
                  derived: Collection[tuple[str, str]] = ()) -> bool:
    """Predict one run for one task and write its prediction (and alert) into `batch`; True
    when nothing was written because the run waits (a derivative whose base is not scored yet).
    `derived`: the (repo, commit) of the checkpoints that declare a base."""
    if not watches(policy, score.repo, score.rule):
        return False
    derivative = None
    try:
        prediction = curves(policy, task, score)
        if isinstance(curves, CurvePredictor) and (score.repo, score.commit) in derived:
            derivative = judge_derivative(store, policy, task, score, curves.curve(policy, task), prediction)
    except CurveError as exc:
        # Recorded, so that it is shown (and not tried again until the curve changes).
        report.skip("curve_refused", f"policy {policy.name}, task {task.name}, "
                                     f"run {score.run_id}: {exc.one_line()}")
        report.add(_write(store, [_prediction_row(
            policy, task.name, score, state=NOT_EVALUATED, now=now, curve_id=curve_id,
            detail={"reason": exc.one_line()})], now, batch))
        return False
    if derivative == HOLD:
        return True
    if isinstance(derivative, Judgement):
        prediction = derivative.prediction
    planned = task_prediction_row(store, policy, task, score, prediction, now=now,
                                  derivative=derivative if isinstance(derivative, Judgement) else None)
    report.add(_write(store, [planned], now, batch), planned)
    return False


def _finish_tick(store: Store, tick: _Tick, now: datetime, *, complete: bool) -> None:
    """Record the scopes scanned in full and drain the queued runs every consumer has handled.

    Last, after every write of the tick: a crash before it looks at the same runs again,
    and the predictions' unique key makes that write nothing twice."""
    for policy, task, corpus, scope in tick.to_record:
        store.record_evaluation_scope(policy, task, corpus, scope, now=now)
    if not tick.queue:
        return
    # A consumer recorded earlier but not handled now has not seen the queued runs of its
    # corpus. Given the whole configuration, it is gone (a policy, a task or a corpus no
    # longer there) and is forgotten; given part of it, it is waiting, and those runs stay.
    stale = [key for key in store.evaluation_consumers() if key not in tick.handled]
    if complete:
        store.forget_evaluation_scopes(consumers=stale)
        stale = []
    waiting = {corpus for (_, _, corpus) in stale}
    store.drain_evaluation_queue([r for r, c in tick.queue.items() if r not in tick.held and c not in waiting])


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
                             report: EvaluationReport, tick: _Tick | None = None) -> bool:
    """The calibration-gaming rule for every public score that also has a private one.

    With `tick` (from `evaluate_pending`) only the runs it has to look at are read, and a
    run that waits (for its private score, for the references' scores) is held on the queue.
    Returns whether anything was written (a tick checkpoints once, at its end; without
    `tick`, this checkpoints itself)."""
    rule, corpora = policy.calibration_gaming, policy.corpora
    assert rule is not None
    if corpora.public is None or corpora.private is None:
        report.skip("gaming_corpora_missing",
                    f"policy {policy.name}: calibration_gaming needs corpora.public and .private")
        return False
    if tick is None:
        rows = store.evaluation_candidates(policy.name, GAMING_TASK, corpora.public)
        full = False
    else:
        rows, full = tick.candidates(store, policy, GAMING_TASK, corpora.public, None)
    candidates = [r for r in rows if watches(policy, r.repo, r.rule)]

    def hold(waiting: Sequence[EvaluationCandidateRow]) -> None:
        if tick is None:
            return
        tick.held.update(r.run_id for r in waiting)
        if full:   # found by the scan, not on the queue: queued, so that they are looked at again
            store.requeue_evaluation([r.run_id for r in waiting], corpora.public, now=now)

    if not candidates:
        return False
    offsets, missing = reference_offsets(store, policy)
    if missing:
        report.skip("gaming_references_unscored",
                    f"policy {policy.name}: calibration_gaming waits for scores of reference "
                    f"checkpoint(s) on both corpora: {', '.join(missing)}")
        hold(candidates)
        return False
    written = False
    for chunk in _chunks(candidates):
        with _Batch.open(store) as batch:
            for row in chunk:
                _gaming_run(store, policy, row, offsets, now, report, batch, hold)
        written = written or batch.written
    if written and tick is None:
        store.checkpoint()
    return written


def _gaming_run(store: Store, policy: Policy, row: EvaluationCandidateRow, offsets: Sequence[float],
                now: datetime, report: EvaluationReport, batch: _Batch,
                hold: Callable[[Sequence[EvaluationCandidateRow]], None]) -> None:
    """The calibration-gaming verdict of one public score, written into `batch`."""
    rule, corpora = policy.calibration_gaming, policy.corpora
    assert rule is not None and corpora.private is not None
    score = _view(row)
    private = store.latest_score(score.repo, score.commit, corpora.private)
    if private is None:
        hold([row])
        return  # not scored on the private corpus yet; evaluated once it is
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
    history = store.lineage_history(policy.name, GAMING_TASK, score.lineage,
                                    (score.repo, score.commit, score.finished_at))
    alert = plan_alert(policy, task=GAMING_TASK, score=score, state=state, numbers=numbers,
                       history=history, now=now, labels=labels,
                       annotate=lambda resolved: gaming_annotations(numbers, repo=score.repo,
                                                                    commit=score.commit,
                                                                    resolved=resolved))
    planned = _prediction_row(policy, GAMING_TASK, score, state=state, now=now, threshold=rule.k,
                              detail=numbers)
    planned["alerts"] = [alert.as_row()] if alert else []
    _note_history(planned, history)
    report.add(_write(store, [planned], now, batch), planned)


__all__ = ["CurvePredictor", "EvaluationReport", "evaluate_pending", "evaluation_scope",
           "task_prediction_row", "write_gaming_predictions", "plan_alert", "reference_offsets", "watches", "GAMING_TASK", "FIRING_STATES"]
