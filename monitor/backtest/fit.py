"""Fit a backtest's curves on its reference lineages, with the code `lstar curves fit` uses
(`monitor.curves.fit.fit_curve`), pinned to the backtest's synthetic corpus and scoring spec;
or check curves given for a replay (`given_curves`).

The history's score runs are not measured by this installation: the replay writes each target
checkpoint as a score run on a synthetic corpus (`BACKTEST_CORPUS_SHA256`) and spec
(`BACKTEST_SPEC`), and the curves are pinned to the same pair, so the daemon's own corpus and
spec checks apply (a curve fitted on another corpus is still refused) without pretending that
the history was scored on `calib-v0`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path

from monitor.backtest.history import step_text
from monitor.backtest.spec import BacktestSpec, BacktestTask
from monitor.curves.artifact import CurveArtifact, ScoringRef, save_curve
from monitor.curves.fit import fit_curve
from monitor.curves.labels import Label
from monitor.errors import CurveError

BACKTEST_CORPUS_SHA256 = hashlib.sha256(b"lstar-backtest: a history's own published values").hexdigest()
BACKTEST_SPEC = ScoringRef(spec_version="lstar-backtest/1", window=1, stride=1, prefix_policy="none")
# Fixed so that a backtest's curves (and their ids) are the same on every run of the same history.
FIT_TIME = datetime(2000, 1, 1, tzinfo=timezone.utc)


def fit_label(label: Label) -> Label:
    """A reference row as a curve point: its checkpoint named `lineage@step`, unique across
    lineages (training logs name checkpoints by step alone), and its lineage as its family."""
    return label.with_(checkpoint=f"{label.lineage}@{step_text(label.step)}", family=label.family or label.lineage)


def fit_task_curve(labels: Sequence[Label], task: BacktestTask, *, axis: str, family: str = "isotonic",
                   resamples: int = 1000, seed: int = 0) -> CurveArtifact:
    """One task's curve on the reference rows `labels` (leave-one-family-out is left to
    `lstar curves validate`: a backtest is itself the out-of-sample check)."""
    return fit_curve([fit_label(label) for label in labels], task=task.task, metric=task.metric,
                     baseline=task.baseline, margin=task.margin, confidence=task.confidence,
                     resamples=resamples, seed=seed, corpus_sha256=BACKTEST_CORPUS_SHA256,
                     scoring_spec=BACKTEST_SPEC, axis=axis, lofo=False, now=FIT_TIME, family=family)


def fit_reference_curves(labels: Sequence[Label], spec: BacktestSpec, *, resamples: int = 1000,
                         seed: int = 0) -> dict[str, CurveArtifact]:
    """{policy task name: its curve fitted on the reference rows}."""
    return {task.name: fit_task_curve(labels, task, axis=spec.axis, family=spec.family, resamples=resamples,
                                      seed=seed) for task in spec.tasks}


def given_curves(curves: Mapping[str, CurveArtifact], spec: BacktestSpec) -> tuple[str, ScoringRef]:
    """Check curves given for a replay (`run_backtest(..., curves=...)`) against the spec: one
    per task, on the spec's axis, of the task's history task and baseline, all pinned to one
    corpus and scoring spec. Returns that pair (the backtest's own where the curves pin none),
    which the replay's score runs are then pinned to: giving the curves says that the
    history's values were measured the way those curves were fitted."""
    names = {t.name for t in spec.tasks}
    if set(curves) != names:
        missing, extra = sorted(names - set(curves)), sorted(set(curves) - names)
        raise CurveError(f"the given curves do not match the backtest's tasks (missing: {', '.join(missing) or '-'}; "
                         f"not a task: {', '.join(extra) or '-'})", hint="give exactly one curve per task name")
    for task in spec.tasks:
        curve = curves[task.name]
        name = f"task {task.name!r}: the given curve {curve.curve_id[:12]}"
        if curve.axis != spec.axis:
            raise CurveError(f"{name} is on {curve.axis!r}, the backtest on {spec.axis!r}",
                             hint=f"replay on --axis {curve.axis}")
        if curve.task != task.task or curve.baseline != task.baseline:
            raise CurveError(f"{name} is of task {curve.task!r} at baseline {curve.baseline:g}, the backtest's of "
                             f"{task.task!r} at {task.baseline:g}", hint="give the curve of that task")
    corpora = {c.corpus_sha256 for c in curves.values()}
    specs = {c.scoring_spec.describe() if c.scoring_spec else None for c in curves.values()}
    if len(corpora) > 1 or len(specs) > 1:
        raise CurveError("the given curves are pinned to different corpora or scoring specs; a replayed "
                         "checkpoint is one score run on one of each", hint="backtest them separately")
    first = next(iter(curves.values()))
    return first.corpus_sha256 or BACKTEST_CORPUS_SHA256, first.scoring_spec or BACKTEST_SPEC


def save_curves(curves: Mapping[str, CurveArtifact], folder: Path) -> dict[str, Path]:
    """Write each curve as `curve-<i>.json` under `folder` (task names are not file names);
    {task name: path}."""
    folder.mkdir(parents=True, exist_ok=True)
    return {name: save_curve(curve, folder / f"curve-{i}.json") for i, (name, curve) in enumerate(curves.items())}


__all__ = ["BACKTEST_CORPUS_SHA256", "BACKTEST_SPEC", "fit_label", "fit_reference_curves", "fit_task_curve",
           "given_curves", "save_curves"]
