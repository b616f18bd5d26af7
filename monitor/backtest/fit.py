"""Fit a backtest's curves on its reference lineages, with the code `lstar curves fit` uses
(`monitor.curves.fit.fit_curve`), pinned to the backtest's synthetic corpus and scoring spec.

The history's score runs are not measured by this installation: the replay writes each target
checkpoint as a score run on a synthetic corpus (`BACKTEST_CORPUS_SHA256`) and spec
(`BACKTEST_SPEC`), and the curves are pinned to the same pair, so the daemon's own corpus and
spec checks apply (a curve fitted on another corpus is still refused) without pretending that
the history was scored on `calib-v0`.
"""

from __future__ import annotations

import hashlib
import inspect
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
    kwargs = {} if family == "isotonic" else {"family": family}   # the sigmoid family where installed
    if kwargs and "family" not in inspect.signature(fit_curve).parameters:
        raise CurveError(f"curve family {family!r} is not available in this version (isotonic only)",
                         hint="use --family isotonic")
    return fit_curve([fit_label(label) for label in labels], task=task.task, metric=task.metric,
                     baseline=task.baseline, margin=task.margin, confidence=task.confidence,
                     resamples=resamples, seed=seed, corpus_sha256=BACKTEST_CORPUS_SHA256,
                     scoring_spec=BACKTEST_SPEC, axis=axis, lofo=False, now=FIT_TIME, **kwargs)


def fit_reference_curves(labels: Sequence[Label], spec: BacktestSpec, *, resamples: int = 1000,
                         seed: int = 0) -> dict[str, CurveArtifact]:
    """{policy task name: its curve fitted on the reference rows}."""
    return {task.name: fit_task_curve(labels, task, axis=spec.axis, family=spec.family, resamples=resamples,
                                      seed=seed) for task in spec.tasks}


def save_curves(curves: Mapping[str, CurveArtifact], folder: Path) -> dict[str, Path]:
    """Write each curve as `curve-<i>.json` under `folder` (task names are not file names);
    {task name: path}."""
    folder.mkdir(parents=True, exist_ok=True)
    return {name: save_curve(curve, folder / f"curve-{i}.json") for i, (name, curve) in enumerate(curves.items())}


__all__ = ["BACKTEST_CORPUS_SHA256", "BACKTEST_SPEC", "fit_label", "fit_reference_curves", "fit_task_curve",
           "save_curves"]
