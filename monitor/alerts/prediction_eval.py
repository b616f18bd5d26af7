"""Evaluating predictions: what a curve predicts for a score run, and the prediction row it makes.

The first stage of an evaluation tick (predictions -> alerts -> notifications): which runs a
policy watches (`watches`), the score as rules read it (`score_view`), the curve's prediction
(`CurvePredictor`), the calibration-gaming verdict, and the prediction row the outbox stores.
Alert planning (`monitor.alerts.alert_planning`) turns these into alert transitions; the outbox
(`monitor.alerts.outbox`) writes them; the tick (`monitor.alerts.evaluation_tick`) drives the three.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from monitor.alerts.predict import TaskPrediction, load_task_curve, predict_task, public_corpus
from monitor.alerts.rules import ScoreView, calibration_gaming
from monitor.curves import ScoringRef
from monitor.curves.artifact import score_axis_value
from monitor.errors import CurveError
from monitor.policy import Policy, Task
from monitor.store.rows import EVALUATION_AXIS_COLUMNS, EvaluationCandidateRow

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


def score_view(row: EvaluationCandidateRow) -> ScoreView:
    """The score run as rules and curves read it."""
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


def prediction_row(policy: Policy, task: str, score: ScoreView, *, state: str, now: datetime,
                    p_hat: float | None = None, lo: float | None = None, hi: float | None = None,
                    threshold: float | None = None, curve_id: str | None = None,
                    detail: Mapping[str, Any] = {}) -> dict[str, Any]:
    """The row `predictions` stores for one (policy, task, score) (alerts are added by planning)."""
    return {"policy": policy.name, "task": task, "run_id": score.run_id, "repo": score.repo,
            "commit_sha": score.commit, "lineage": score.lineage, "corpus_sha256": score.corpus_sha256,
            "lstar": score.lstar, "se": score.se, "p_hat": p_hat, "lo": lo, "hi": hi,
            "threshold": threshold, "state": state, "curve_id": curve_id, "detail": dict(detail),
            "evaluated_at": now}


def curve_id_of(curves: Predictor, policy: Policy, task: Task) -> str | None:
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


def gaming_verdict(policy: Policy, score: ScoreView, private: Any,
                   offsets: Sequence[float]) -> tuple[str, dict[str, Any]]:
    """The calibration-gaming state of a public score given its private one (`latest_score`)
    and the references' offsets, with the numbers its prediction and alert carry."""
    rule, corpora = policy.calibration_gaming, policy.corpora
    assert rule is not None
    verdict = calibration_gaming(score.lstar, score.se, float(private.lstar), float(private.se),
                                 reference_offsets=offsets, k=rule.k)
    state = "flagged" if verdict.flagged else "clear"
    numbers = {**verdict.as_dict(), "task": GAMING_TASK, "state": state, "lstar_public": score.lstar,
               "se_public": score.se, "lstar_private": float(private.lstar),
               "se_private": float(private.se), "corpus_public": corpora.public,
               "corpus_private": corpora.private, "repo": score.repo, "commit": score.commit,
               "lineage": score.lineage, "run_id": score.run_id}
    return state, numbers


__all__ = ["GAMING_TASK", "CurvePredictor", "Predictor", "curve_id_of", "evaluation_scope", "gaming_verdict",
           "partial_caveats", "prediction_row", "score_view", "watches"]
