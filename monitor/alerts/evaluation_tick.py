"""The evaluation tick: evaluate new scores against policies, set-based.

For each score run a policy has not yet evaluated, and each of its tasks: predict (P̂,
interval, state; `monitor.alerts.prediction_eval`), plan the alert per receiver
(`monitor.alerts.alert_planning`), and write the prediction, the alert and one delivery row per
receiver (`monitor.alerts.outbox`). A batch of runs reads what it needs with a fixed number of
queries (the lineages' histories, `Store.lineage_batch`; the observed states) and writes with
one bulk insert per table, whatever the number of runs in it; the runs are still planned one
after another, each seeing what the ones before it planned.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from monitor.alerts import outbox
from monitor.alerts.alert_planning import Observed, gaming_prediction_row, late_line, task_prediction_row
from monitor.alerts.derivatives import HOLD, Judgement, judge_derivative
from monitor.alerts.gaps import track_evaluation_gap
from monitor.alerts.prediction_eval import (GAMING_TASK, CurvePredictor, Predictor, curve_id_of, evaluation_scope,
                                            gaming_verdict, prediction_row, score_view, watches)
from monitor.alerts.rules import ScoreView
from monitor.errors import CurveError
from monitor.policy import Policy, Task
from monitor.store import Store
from monitor.store.evaluation_gaps import NOT_EVALUATED
from monitor.store.lineage_batch import LineageBatch
from monitor.store.rows import EvaluationCandidateRow
from monitor.stress.storage import stress_caveats


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
            curve_id = curve_id_of(curves, policy, task)
            candidates, full = tick.candidates(store, policy, task.name, public, curve_id)
            new = new or full
            for chunk in outbox.chunks(candidates):
                with outbox.OutboxBatch.open(store) as batch:
                    for run_id in _evaluate_batch(store, policy, task, chunk, curves, curve_id, now, report, batch,
                                                  derived, stop):
                        # a derivative whose base is still to be scored: looked at again later
                        tick.held.add(run_id)
                        if full:
                            store.requeue_evaluation([run_id], public, now=now)
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


def _evaluate_batch(store: Store, policy: Policy, task: Task, chunk: Sequence[EvaluationCandidateRow],
                    curves: Predictor, curve_id: str | None, now: datetime, report: EvaluationReport,
                    batch: outbox.OutboxBatch, derived: Collection[tuple[str, str]],
                    stop: Callable[[], bool] | None) -> list[str]:
    """Plan every run of `chunk` for one task, in order, and write the plans in one bulk write
    into `batch`; the run ids that wait (a derivative whose base is not scored yet). The
    lineages' histories and the observed states are read once for the chunk."""
    watched = [row for row in chunk if watches(policy, row.repo, row.rule)]
    histories = store.lineage_batch(policy.name, task.name,
                                    [(r.lineage, r.repo, r.commit_sha, r.run_id) for r in watched])
    observed = (store.observed_states([(r.repo, r.commit_sha) for r in watched])
                if task.evaluate is not None and watched else {})
    # the stress caveats of each curve the chunk predicts with, read once for the chunk
    stress: dict[str | None, list[str]] = {}
    planned: list[dict[str, Any]] = []
    held: list[str] = []
    for row in chunk:
        if stop is not None and stop():
            report.stopped = True
            break
        if not watches(policy, row.repo, row.rule):
            continue
        plan = _plan_run(store, policy, task, score_view(row), curves, curve_id, now, report, derived,
                         histories, observed, stress)
        if plan is None:
            held.append(row.run_id)
            continue
        histories.record(plan, now=now)
        planned.append(plan)
    for plan, counts in zip(planned, outbox.write_planned(store, planned, now, batch)):
        report.add(counts, plan)
    return held


def _plan_run(store: Store, policy: Policy, task: Task, score: ScoreView, curves: Predictor,
              curve_id: str | None, now: datetime, report: EvaluationReport,
              derived: Collection[tuple[str, str]], histories: LineageBatch,
              observed: Observed, stress: dict[str | None, list[str]]) -> dict[str, Any] | None:
    """The planned prediction row (with its alert) of one run for one task; None when the run
    waits (a derivative whose base is not scored yet). `derived`: the (repo, commit) of the
    checkpoints that declare a base."""
    derivative = None
    try:
        prediction = curves(policy, task, score)
        if isinstance(curves, CurvePredictor) and (score.repo, score.commit) in derived:
            derivative = judge_derivative(store, policy, task, score, curves.curve(policy, task), prediction)
    except CurveError as exc:
        # Recorded, so that it is shown (and not tried again until the curve changes).
        report.skip("curve_refused", f"policy {policy.name}, task {task.name}, "
                                     f"run {score.run_id}: {exc.one_line()}")
        return prediction_row(policy, task.name, score, state=NOT_EVALUATED, now=now, curve_id=curve_id,
                              detail={"reason": exc.one_line()})
    if derivative == HOLD:
        return None
    if isinstance(derivative, Judgement):
        prediction = derivative.prediction
    history = histories.history(score.lineage, score.repo, score.commit, score.finished_at)
    return task_prediction_row(store, policy, task, score, prediction, now=now,
                               derivative=derivative if isinstance(derivative, Judgement) else None,
                               history=history, observed=observed,
                               stress=_stress_caveats(store, stress, prediction.curve_id))


def _stress_caveats(store: Store, known: dict[str | None, list[str]], curve_id: str | None) -> list[str]:
    """`stress_caveats` of `curve_id`, read once per chunk (`known` is the chunk's memo)."""
    if curve_id not in known:
        known[curve_id] = stress_caveats(store, curve_id)
    return known[curve_id]


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
    for chunk in outbox.chunks(candidates):
        with outbox.OutboxBatch.open(store) as batch:
            privates = store.latest_scores([(r.repo, r.commit_sha) for r in chunk], corpora.private)
            histories = store.lineage_batch(policy.name, GAMING_TASK,
                                            [(r.lineage, r.repo, r.commit_sha, r.run_id) for r in chunk])
            planned = []
            for row in chunk:
                private = privates.get((row.repo, row.commit_sha))
                if private is None:
                    hold([row])
                    continue  # not scored on the private corpus yet; evaluated once it is
                score = score_view(row)
                state, numbers = gaming_verdict(policy, score, private, offsets)
                history = histories.history(score.lineage, score.repo, score.commit, score.finished_at)
                plan = gaming_prediction_row(policy, score, state=state, numbers=numbers, history=history, now=now)
                histories.record(plan, now=now)
                planned.append(plan)
            for plan, counts in zip(planned, outbox.write_planned(store, planned, now, batch)):
                report.add(counts, plan)
        written = written or batch.written
    if written and tick is None:
        store.checkpoint()
    return written


__all__ = ["EvaluationReport", "evaluate_pending", "reference_offsets", "write_gaming_predictions", "late_line"]
