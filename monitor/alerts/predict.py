"""Task predictions: from a score (its value on the curve's axis, and that axis's SE) and a
task curve to a state.

States (docs/measurement.md §3), with the threshold t = b_t + ε:
    emerged   if lo ≥ t   (even the pessimistic end of the interval has crossed)
    at_risk   if hi ≥ t   (the optimistic end has)
    clear     otherwise
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from monitor.bands import classify_state
from monitor.curves import CurveArtifact, at_budget, curve_warnings, load_curve, predict
from monitor.curves.axes import AXES
from monitor.policy import Policy, Task

State = Literal["clear", "at_risk", "emerged"]


# -- states (classify_state: monitor.bands) ------------------------------------------------------
@dataclass(frozen=True)
class TaskPrediction:
    """What one task curve says about one score."""

    task: str
    lstar: float          # the value on the curve's axis (L* for an L* curve)
    se: float             # its standard error on that axis
    p_hat: float
    lo: float
    hi: float
    floor: float          # b_t
    margin: float         # ε
    confidence: float     # 1 − δ
    state: State
    curve_id: str
    corpus_sha256: str | None
    extrapolated: bool = False
    # The curve's own warnings ({code, message, unresolved}; `curve_artifact.curve_warnings`).
    curve_warnings: tuple[Mapping[str, Any], ...] = ()
    axis: str = "lstar"   # the curve's axis (monitor.curves.axes)
    # The score's L* and its SE (the headline number of every score), where known.
    score_lstar: float | None = None
    score_lstar_se: float | None = None
    # Signed distance beyond the curve's reference range on its axis (> 0 beyond the most
    # advanced reference, < 0 before the least advanced; `monitor.bands.extrapolation_distance`).
    extrapolation: float = 0.0

    @property
    def value(self) -> float:
        """The score's value on the curve's axis."""
        return self.lstar

    @property
    def axis_label(self) -> str:
        return AXES[self.axis].label

    @property
    def threshold(self) -> float:
        return self.floor + self.margin

    @property
    def threshold_resolved(self) -> bool:
        """False when a curve warning leaves the threshold unresolved."""
        return not any(w.get("unresolved") for w in self.curve_warnings)

    def as_dict(self) -> dict[str, Any]:
        """The numbers as they appear in alerts (`lstar` object) and `policy test --json`:
        `axis`, its `value` and `se` (the interval is widened by that SE); `lstar` is the
        score's L* (equal to `value` on an L* curve) with its SE `lstar_se`, where known."""
        lstar = self.lstar if self.axis == "lstar" else self.score_lstar
        lstar_se = self.se if self.axis == "lstar" else self.score_lstar_se
        axis = AXES[self.axis]
        return {"task": self.task, "axis": self.axis, "axis_label": axis.label, "axis_unit": axis.unit,
                "value": self.lstar, "lstar": lstar, "lstar_se": lstar_se, "se": self.se, "p_hat": self.p_hat,
                "interval": [self.lo, self.hi], "confidence": self.confidence,
                "floor": self.floor, "margin": self.margin, "threshold": self.threshold,
                "state": self.state, "curve_id": self.curve_id,
                "corpus_sha256": self.corpus_sha256, "extrapolated": self.extrapolated,
                "extrapolation": self.extrapolation,
                "threshold_resolved": self.threshold_resolved,
                "curve_warnings": [dict(w) for w in self.curve_warnings]}


def make_prediction(task: str, *, lstar: float, se: float, p_hat: float, lo: float, hi: float,
                    floor: float, margin: float, confidence: float, curve_id: str,
                    corpus_sha256: str | None, extrapolated: bool = False,
                    curve_warnings: Iterable[Mapping[str, Any]] = (), axis: str = "lstar",
                    score_lstar: float | None = None, score_lstar_se: float | None = None,
                    extrapolation: float = 0.0) -> TaskPrediction:
    """A prediction with its state classified against b_t + ε (`lstar`: the value on `axis`)."""
    return TaskPrediction(task=task, lstar=lstar, se=se, p_hat=p_hat, lo=lo, hi=hi, floor=floor,
                          margin=margin, confidence=confidence,
                          state=classify_state(lo, hi, floor + margin), curve_id=curve_id,
                          corpus_sha256=corpus_sha256, extrapolated=extrapolated,
                          curve_warnings=tuple(dict(w) for w in curve_warnings), axis=axis,
                          score_lstar=score_lstar, score_lstar_se=score_lstar_se, extrapolation=extrapolation)


# -- task curves (artifacts of monitor.curves.artifact) ------------------------------------------
def load_task_curve(path: str | Path, budget: float | None = None) -> CurveArtifact:
    """Load a task's curve artifact at the task's deployment budget (a budget curve's slice at
    that level; `monitor.curves.artifact.at_budget`); raises CurveError."""
    return at_budget(load_curve(path), budget)


def public_corpus(policy: Policy, curves: Iterable[CurveArtifact]) -> str | None:
    """The corpus a policy's scores are predicted on: `corpora.public`, else the one corpus
    its task curves were fitted on (None when they disagree or name none)."""
    if policy.corpora.public is not None:
        return policy.corpora.public
    shas = {c.corpus_sha256 for c in curves} - {None}
    return shas.pop() if len(shas) == 1 else None


def margin_in_force(curve: CurveArtifact, task: Task) -> float:
    """The margin ε of `task`'s level b_t + ε: the policy's, else the curve's own."""
    return task.margin if task.margin is not None else curve.margin


def predict_task(curve: CurveArtifact, task: Task, *, lstar: float | None = None, se: float,
                 corpus_sha256: str | None = None, scoring_spec: Any = None, value: float | None = None,
                 score_lstar: float | None = None, score_lstar_se: float | None = None) -> TaskPrediction:
    """P̂, its interval and the state of `task` for one value on the curve's axis (and its SE).

    `value` is the score's value on `curve.axis` (`lstar` is its older name; on an L* curve
    the two are the same); `score_lstar`/`score_lstar_se` are the score's L*, carried along as
    the headline number. The interval is the curve's band at its confidence, widened for the
    SE of the value on that axis; the
    threshold is the curve's floor b_t plus the task's margin ε (default: the curve's). The
    prediction carries the curve's own warnings, so an unresolved threshold reaches the alert.
    With `corpus_sha256`/`scoring_spec` given, a curve fitted on another corpus or spec is
    refused (CurveError).
    """
    x = value if value is not None else lstar
    if x is None:
        raise TypeError("predict_task needs the value on the curve's axis")
    curve = at_budget(curve, task.budget)
    out = predict(curve, x, se, corpus_sha256=corpus_sha256, scoring_spec=scoring_spec)
    margin = margin_in_force(curve, task)
    return make_prediction(task.name, lstar=x, se=se, p_hat=out.p_hat, lo=out.lower, hi=out.upper,
                           floor=curve.baseline, margin=margin, confidence=curve.confidence,
                           curve_id=curve.curve_id, corpus_sha256=curve.corpus_sha256,
                           extrapolated=out.extrapolated, extrapolation=out.extrapolation,
                           curve_warnings=[w.as_dict() for w in curve_warnings(curve, margin)], axis=curve.axis,
                           score_lstar=score_lstar, score_lstar_se=score_lstar_se)
