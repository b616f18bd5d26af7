"""Replay target lineages checkpoint by checkpoint through the daemon's own evaluation code.

Each target checkpoint is written into a temporary store as a score run (`monitor.backtest.scores`)
and the outbox pass runs at that checkpoint's time, exactly as the daemon's tick does:
`evaluate_pending` (prediction, interval, state, alert planning under the unique alert key)
then `Dispatcher.run_once` (silences, grouping, group_wait/group_interval, deduplication,
rate limits) sending through the file channel only. The clock is synthetic: checkpoint i of
the replay is at `EPOCH + i hours` (the target lineages one after another), so the policy's
timers behave as in a daemon that saw one checkpoint an hour; one more pass an hour after the
last flushes what is still grouped.

A curve on the task-loss axis has one value per task and checkpoint, which no score run
carries (`monitor.curves.axes.axis_value` refuses it): for it the pass runs with
`HistoryPredictor`, the daemon's `CurvePredictor` reading the axis value from the history for
(lineage, step, task) instead of from the run. Everything else (state, alert planning,
dispatch) is the same code and writes the same records.

`run_pass_at(store, policies, now, ...)` is one such tick over whatever score runs a store holds
and `read_replay(store, policy)` reads back what the ticks decided, so a test can feed the same
functions from a store written another way (e.g. `tests/support/scores.record_fake_score`).
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from monitor.alerts.channels.filesink import FileSender
from monitor.alerts.dispatcher import Dispatcher
from monitor.alerts.evaluation_tick import evaluate_pending
from monitor.alerts.prediction_eval import CurvePredictor
from monitor.alerts.predict import TaskPrediction, predict_task
from monitor.alerts.rules import ScoreView
from monitor.backtest.fit import BACKTEST_CORPUS_SHA256, BACKTEST_SPEC
from monitor.backtest.history import History, step_text
from monitor.backtest.scores import checkpoint_sha, record_history_score
from monitor.backtest.spec import BacktestSpec
from monitor.curves.artifact import ScoringRef
from monitor.curves.axes import get_axis, label_point
from monitor.curves.labels import Label
from monitor.errors import CurveError, LabelError
from monitor.policy import Policy, Task
from monitor.store import Store

EPOCH = datetime(2001, 1, 1, tzinfo=timezone.utc)
TICK = timedelta(hours=1)


@dataclass(frozen=True)
class ReplayPoint:
    """What the daemon's code decided for one task at one checkpoint of a target lineage."""

    task: str
    lineage: str
    repo: str
    commit: str
    at: datetime
    state: str
    value: float | None = None
    se: float | None = None
    p_hat: float | None = None
    lo: float | None = None
    hi: float | None = None
    extrapolated: bool = False
    extrapolation: float | None = None
    reason: str | None = None     # why a run was not evaluated (state not_evaluated)


@dataclass(frozen=True)
class ReplayAlert:
    """One alert the replay raised (its unique key, state and kind)."""

    alert_key: str
    task: str
    lineage: str
    commit: str
    state: str
    kind: str
    status: str
    at: datetime


@dataclass
class Replay:
    """What a replay decided: per-checkpoint predictions, alerts, notifications written."""

    points: list[ReplayPoint] = field(default_factory=list)
    alerts: list[ReplayAlert] = field(default_factory=list)
    notifications: int = 0
    alerts_file: str | None = None


class HistoryPredictor(CurvePredictor):
    """The daemon's predictor, reading the axis value of a task-loss curve from the history
    ({(repo, commit, curve task): (value, SE)}) instead of from the score run."""

    def __init__(self, values: Mapping[tuple[str, str, str], tuple[float, float]]) -> None:
        super().__init__()
        self.values = dict(values)

    def __call__(self, policy: Policy, task: Task, score: ScoreView) -> TaskPrediction:
        curve = self.curve(policy, task)
        if get_axis(curve.axis).source != "task":
            return super().__call__(policy, task, score)
        got = self.values.get((score.repo, score.commit, curve.task))
        if got is None:
            raise CurveError(f"the history has no {curve.axis_label} for task {curve.task!r} at {score.repo} "
                             f"{score.commit[:12]}")
        spec = ScoringRef.from_score_run(score.extra) if score.extra.get("spec_version") else None
        return predict_task(curve, task, value=got[0], se=got[1], corpus_sha256=score.corpus_sha256,
                            scoring_spec=spec, score_lstar=score.lstar, score_lstar_se=score.se)


def file_dispatcher(store: Store, policies: Sequence[Policy]) -> Dispatcher:
    """A dispatcher that can only append to files (a webhook or mail receiver has no sender)."""
    return Dispatcher(store, policies, senders={"file": FileSender()}, owner="backtest", rng=random.Random(0))


def run_pass_at(store: Store, policies: Sequence[Policy], now: datetime, *, dispatcher: Dispatcher,
                predictor: CurvePredictor | None = None) -> None:
    """One daemon tick (`monitor.alerts.dispatcher.run_pass`), with the predictor given."""
    evaluate_pending(store, policies, now=now, predictor=predictor)
    dispatcher.run_once(now)


def _checkpoint_value(rows: Sequence[Label], axis: str, where: str) -> tuple[float, float]:
    """The one (value, SE) of a checkpoint on a score axis (every task row must agree)."""
    points = {(p[0], p[1] or 0.0) for p in (label_point(r, axis) for r in rows) if p is not None}
    if not points:
        raise LabelError(f"{where}: no {get_axis(axis).label} value")
    values = {p[0] for p in points}
    if len(values) > 1:
        raise LabelError(f"{where}: its rows give {len(values)} different {get_axis(axis).label} values "
                         f"({', '.join(f'{v:g}' for v in sorted(values)[:4])})",
                         hint="one checkpoint has one value on a score axis; fix the history")
    return max(points, key=lambda p: p[1])


def _task_values(history: History, axis: str) -> dict[tuple[str, str, str], tuple[float, float]]:
    """{(repo, commit, task): (value, SE)} of every target row on a task axis."""
    values = {}
    for lineage in history.targets:
        for row in lineage.labels:
            point = label_point(row, axis)
            if point is not None:
                values[(lineage.name, checkpoint_sha(lineage.name, float(row.step or 0.0)), str(row.task))] = \
                    (point[0], point[1] or 0.0)
    return values


def target_checkpoints(history: History, axis: str) -> list[tuple[str, float, Label, float, float]]:
    """(lineage, step, a row, value, SE) of every target checkpoint in replay order: the
    lineages one after another, each in training order. On a task axis the run's own value is
    the first task's (the predictions read each task's from the history)."""
    out = []
    for lineage in history.targets:
        by_step: dict[float, list[Label]] = {}
        for label in lineage.labels:
            by_step.setdefault(float(label.step or 0.0), []).append(label)
        for step in sorted(by_step):
            rows = by_step[step]
            where = f"{history.path}: lineage {lineage.name!r} step {step_text(step)}"
            if get_axis(axis).source == "task":
                point = label_point(rows[0], axis)
                value, se = (point[0], point[1] or 0.0) if point is not None else (0.0, 0.0)
            else:
                value, se = _checkpoint_value(rows, axis, where)
            out.append((lineage.name, step, rows[0], value, se))
    return out


def replay_history(store: Store, history: History, spec: BacktestSpec, policy: Policy, *,
                   corpus_sha256: str = BACKTEST_CORPUS_SHA256, scoring_spec: ScoringRef = BACKTEST_SPEC) -> Replay:
    """Replay every target lineage of `history` under `policy` (whose task curves are the
    reference fits, or curves given): write each checkpoint's score run, pinned to the corpus
    and scoring spec those curves are pinned to, then run the daemon's pass at its time
    (`EPOCH + i·TICK`), and one pass a tick after the last to flush what is grouped."""
    axis = spec.axis
    predictor = HistoryPredictor(_task_values(history, axis) if get_axis(axis).source == "task" else {})
    dispatcher = file_dispatcher(store, [policy])
    at = EPOCH
    for i, (_, _, row, value, se) in enumerate(target_checkpoints(history, axis)):
        at = EPOCH + i * TICK
        record_history_score(store, row, axis=axis, value=value, se=se, finished_at=at,
                             corpus_sha256=corpus_sha256, scoring_spec=scoring_spec)
        run_pass_at(store, [policy], at, dispatcher=dispatcher, predictor=predictor)
    run_pass_at(store, [policy], at + TICK, dispatcher=dispatcher, predictor=predictor)
    replay = read_replay(store, policy)
    receivers = {r.file.path for r in policy.receivers if r.file is not None}
    replay.alerts_file = sorted(receivers)[0] if receivers else None
    return replay


def _json(value: Any) -> dict[str, Any]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return {}
    return value if isinstance(value, dict) else {}


def read_replay(store: Store, policy: Policy) -> Replay:
    """What the passes decided for `policy`: its predictions (oldest first) and alerts, and how
    many notifications were delivered."""
    rows = store.query("SELECT p.task, p.repo, p.commit_sha, p.lineage, p.state, p.p_hat, p.lo, p.hi, p.detail, "
                       "r.finished_at FROM predictions p JOIN score_runs r ON r.run_id = p.run_id "
                       "WHERE p.policy = ? ORDER BY r.finished_at, p.task", [policy.name])
    points = []
    for row in rows:
        detail = _json(row["detail"])
        extrapolation = detail.get("extrapolation")
        points.append(ReplayPoint(
            task=row["task"], lineage=row["lineage"], repo=row["repo"], commit=row["commit_sha"],
            at=row["finished_at"], state=row["state"], value=detail.get("value"), se=detail.get("se"),
            p_hat=row["p_hat"], lo=row["lo"], hi=row["hi"], extrapolated=bool(detail.get("extrapolated")),
            extrapolation=float(extrapolation) if isinstance(extrapolation, (int, float)) else None,
            reason=detail.get("reason")))
    alert_rows = store.query("SELECT alert_key, task, lineage, commit_sha, state, kind, status, created_at "
                             "FROM alerts WHERE policy = ? ORDER BY created_at, id", [policy.name])
    alerts = [ReplayAlert(alert_key=r["alert_key"], task=r["task"], lineage=r["lineage"], commit=r["commit_sha"],
                          state=r["state"], kind=r["kind"], status=r["status"], at=r["created_at"])
              for r in alert_rows]
    sent = store.query("SELECT count(*) AS n FROM notifications WHERE policy = ? AND status = 'delivered'",
                       [policy.name])
    return Replay(points=points, alerts=alerts, notifications=int(sent[0]["n"]))


def alerts_file_lines(path: str | Path | None) -> int:
    """How many notifications a file sink holds (0 when it was never written)."""
    if path is None or not Path(path).is_file():
        return 0
    with open(path, "rb") as handle:
        return sum(1 for _ in handle)


__all__ = ["EPOCH", "TICK", "HistoryPredictor", "Replay", "ReplayAlert", "ReplayPoint", "file_dispatcher",
           "read_replay", "replay_history", "run_pass_at", "target_checkpoints"]
