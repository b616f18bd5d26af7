"""`run_backtest`: fit on the references (or take the curves given), replay the targets, compare,
in one call.

The replay's store is a temporary DuckDB file (deleted afterwards); the alerts go to the file
sink `alerts_out` (default: a file in that temporary folder, also deleted, so pass one to keep
them). Nothing is sent anywhere else.
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Mapping
from pathlib import Path

from monitor.backtest.compare import make_row
from monitor.backtest.fit import BACKTEST_CORPUS_SHA256, BACKTEST_SPEC, fit_reference_curves, given_curves, save_curves
from monitor.backtest.history import History
from monitor.backtest.replay import Replay, replay_history
from monitor.backtest.result import BacktestResult, LineageResult, group_rows
from monitor.backtest.scores import checkpoint_sha
from monitor.backtest.spec import BacktestSpec, replay_policy
from monitor.curves.artifact import CurveArtifact
from monitor.store import Store


def run_backtest(history: History, spec: BacktestSpec, *, alerts_out: str | Path | None = None,
                 paper_errors: Mapping[str, float] | None = None, resamples: int = 1000,
                 seed: int = 0, curves: Mapping[str, CurveArtifact] | None = None) -> BacktestResult:
    """Fit the spec's curves on the reference lineages, replay every target lineage through the
    daemon's evaluation and dispatch code, and compare each prediction with its observation.

    `curves` ({task name: curve}) replays with those curves instead of refitting (the history
    then needs no references): what a daemon applying them would have said. Each must match its
    task (`fit.given_curves`), and the replayed score runs are pinned to their corpus and
    scoring spec."""
    if curves is None:
        curves = fit_reference_curves(history.reference_labels(), spec, resamples=resamples, seed=seed)
        pin = (BACKTEST_CORPUS_SHA256, BACKTEST_SPEC)
    else:
        curves = dict(curves)
        pin = given_curves(curves, spec)
    # A task given without a metric is fitted on the one metric its rows have: compare on it too.
    spec = dataclasses.replace(spec, tasks=tuple(dataclasses.replace(t, metric=curves[t.name].metric)
                                                 for t in spec.tasks))
    with tempfile.TemporaryDirectory(prefix="lstar-backtest-") as tmp:
        folder = Path(tmp)
        sink = Path(alerts_out) if alerts_out is not None else folder / "alerts.jsonl"
        if alerts_out is not None:
            sink.parent.mkdir(parents=True, exist_ok=True)
            sink.write_text("", encoding="utf-8")   # this backtest's alerts only
        policy = replay_policy(spec, save_curves(curves, folder / "curves"), sink, corpus_sha256=pin[0])
        store = Store.open(folder / "replay.duckdb")
        try:
            replay = replay_history(store, history, spec, policy, corpus_sha256=pin[0], scoring_spec=pin[1])
        finally:
            store.close()
    return compare_replay(history, spec, replay, curves={n: _curve_info(c) for n, c in curves.items()},
                          paper_errors=paper_errors, alerts_file=str(sink) if alerts_out is not None else None)


def _curve_info(curve) -> dict:  # type: ignore[no-untyped-def]
    return {"curve_id": curve.curve_id, "task": curve.task, "metric": curve.metric, "axis": curve.axis,
            "baseline": curve.baseline, "margin": curve.margin, "level": curve.level,
            "confidence": curve.confidence, "n_checkpoints": curve.n_checkpoints,
            "x_range": list(curve.x_range), "family": curve.fit_family,
            "extrapolation_widening": curve.extrapolation_widening, "lineage_spread": curve.lineage_spread,
            "family_choice": _family_choice(curve.family_choice)}


def _family_choice(record: dict | None) -> dict | None:  # type: ignore[type-arg]
    """The forward-validation verdict that chose the family: the rule, the choice and each
    family's forward mean absolute relative error and coverage (the full record is in the curve)."""
    if not record:
        return None
    families = record.get("families") or {}
    return {"chosen": record.get("chosen"), "rule": record.get("rule"),
            "forward": {name: {k: v.get(k) for k in ("n", "mae", "mare", "coverage") if k in v}
                        for name, v in families.items() if isinstance(v, dict)}}


def compare_replay(history: History, spec: BacktestSpec, replay: Replay, *, curves: dict,
                   paper_errors: Mapping[str, float] | None = None, alerts_file: str | None = None) -> BacktestResult:
    """Join each target row with the replay's prediction for it and build the result."""
    predicted = {(p.task, p.repo, p.commit): p for p in replay.points}
    rows = []
    for lineage in history.targets:
        for task in spec.tasks:
            for label in lineage.task_labels(task.task, str(task.metric)):
                point = predicted.get((task.name, lineage.name, checkpoint_sha(lineage.name, float(label.step or 0))))
                if point is not None and point.state == "not_evaluated":
                    point = None
                rows.append(make_row(label, task, point))
    by_task = {t.name: t for t in spec.tasks}
    results = [LineageResult(task=t, lineage=lin, rows=tuple(group),
                             paper_error=(paper_errors or {}).get(by_task[t].task, (paper_errors or {}).get(t)))
               for t, lin, group in group_rows(rows)]
    alerts = [{"alert_key": a.alert_key, "task": a.task, "lineage": a.lineage, "commit": a.commit, "state": a.state,
               "kind": a.kind, "status": a.status, "at": a.at.isoformat()} for a in replay.alerts]
    skipped = [f"{p.task} {p.lineage} {p.commit[:12]}: {p.reason}" for p in replay.points if p.state == "not_evaluated"]
    # A task a target lineage has no rows of is predicted but cannot be compared: say so.
    seen = {(t, lin) for t, lin, _ in group_rows(rows)}
    skipped += [f"{task.name} {lineage.name}: no published {task.task} ({task.metric}) result to compare with"
                for lineage in history.targets for task in spec.tasks if (task.name, lineage.name) not in seen]
    return BacktestResult(history=history.path, axis=spec.axis, family=spec.family, source=spec.source,
                          references=[lin.name for lin in history.references],
                          targets=[lin.name for lin in history.targets], curves=curves, results=results,
                          alerts=alerts, alerts_file=alerts_file, notifications=replay.notifications,
                          not_evaluated=skipped)


__all__ = ["compare_replay", "run_backtest"]
