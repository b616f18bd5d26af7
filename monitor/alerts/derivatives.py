"""Judging a derivative (a fine-tune, adapter or quantization of a base it names) on two
coordinates: the base's L*(base) and its own L*(θ).

Post-training moves task performance in ways weakly coupled to likelihood on generic text, so
a derivative's own L* is not the coordinate a task curve fitted on pretraining checkpoints
reads. For a derivative whose pinned base has a complete score on the same corpus and scoring
spec, a policy task's `derivatives:` mode decides:

- `base`: the state is predicted from L*(base) (the curve's band at the base's coordinate,
  widened by the base's SE); the task residual ρ_t = P_t(θ) − φ_t(L*(base)) is reported when
  a label of the derivative is stored, and flagged unmeasured otherwise.
- `residual`: P̂ = φ_t(L*(base)) + ρ̄, ρ̄ the mean residual over labelled pairs of the same
  relation (derivatives whose base is scored on this corpus and spec, this checkpoint left
  out). A new derivative's residual scatters around ρ̄, so the interval's half-widths are
  widened in quadrature by the predictive half-width w = t_{n−1}·s·√(1 + 1/n) (s the pairs'
  sample standard deviation, t the two-sided Student quantile of the curve's confidence):
  lower = P̂ − √((φ − lo)² + w²), upper = P̂ + √((hi − φ)² + w²). With two pairs t₁ is 6.3 at
  90 %: few pairs give honest, wide intervals. Fewer than two pairs: not evaluated, with the
  reason.
- `evaluate`: predicted as `base`, and every derivative's task is evaluated directly (the task's
  `evaluate:` block, `monitor.alerts.observations`), whatever its predicted state; the
  observation measures ρ_t and its observed state supersedes the prediction.

A measured residual's interval: [ρ − √((hi − φ)² + h_obs²), ρ + √((φ − lo)² + h_obs²)],
h_obs = z·(the label's stderr, else the binomial √(p(1−p)/n)) and [lo, hi] the band at
L*(base) around φ (not symmetric about φ in general). A checkpoint
without a matched base is predicted as any other. One whose base is still on the queue waits
(HOLD); one whose base will not be scored is predicted from its own L*, saying why.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from monitor.alerts.predict import TaskPrediction, make_prediction, predict_task
from monitor.alerts.rules import ScoreView
from monitor.bands import two_sided_z
from monitor.curves import ScoringRef
from monitor.curves.artifact import score_axis_value
from monitor.errors import CurveError
from monitor.policy import Policy, Task
from monitor.store import Store
from monitor.store.derivatives import PENDING_STATUSES

MIN_PAIRS = 2
HOLD = "hold"   # the base is still on its way to a score: evaluate this run on a later tick


@dataclass(frozen=True)
class Judgement:
    """A derivative's prediction and what the alert and report say about its coordinates."""

    prediction: TaskPrediction
    numbers: dict[str, Any]                  # the `derivative` object of the alert's numbers
    labels: dict[str, str]                   # coordinate, rho_measured
    caveats: list[str] = field(default_factory=list)


def _z(confidence: float) -> float:
    return two_sided_z(confidence)


def _spec(score: ScoreView) -> dict[str, Any]:
    return {k: score.extra.get(k) for k in ("spec_version", "window_len", "stride", "prefix_policy")}


def _predict_at(curve: Any, task: Task, run: Mapping[str, Any]) -> TaskPrediction:
    value, se = score_axis_value(curve, run)
    spec = ScoringRef.from_score_run(dict(run)) if run.get("spec_version") else None
    return predict_task(curve, task, value=value, se=se, corpus_sha256=run["corpus_sha256"], scoring_spec=spec,
                        score_lstar=float(run["lstar"]), score_lstar_se=float(run["se_ce"]))


def observation_half_width(label: Mapping[str, Any], z: float) -> float | None:
    """z times the SE of an observed task score: its stderr, else the binomial one from n."""
    if label.get("stderr") is not None and math.isfinite(float(label["stderr"])):
        return z * float(label["stderr"])
    n, p = label.get("n"), float(label["value"])
    if n and 0.0 <= p <= 1.0:
        return z * math.sqrt(p * (1.0 - p) / int(n))
    return None


def measured_residual(label: Mapping[str, Any], at_base: TaskPrediction) -> dict[str, Any]:
    """ρ = observed P(θ) − φ(L*(base)), with its interval (module docstring)."""
    z = _z(at_base.confidence)
    rho = float(label["value"]) - at_base.p_hat
    h_obs = observation_half_width(label, z)
    # φ lies in [lo, hi], not symmetrically about p̂: the band's upper side bounds ρ from below
    interval = None if h_obs is None else [rho - math.hypot(at_base.hi - at_base.p_hat, h_obs),
                                           rho + math.hypot(at_base.p_hat - at_base.lo, h_obs)]
    return {"rho": rho, "observed": float(label["value"]), "n": label.get("n"), "stderr": label.get("stderr"),
            "interval": interval, "source": label.get("source")}


def residual_estimate(store: Store, curve: Any, task: Task, relation: str, *, corpus: str,
                      spec: Mapping[str, Any], exclude: tuple[str, str]) -> dict[str, Any]:
    """ρ̄ and its SE over the labelled pairs of `relation` (this checkpoint left out); raises
    CurveError naming the count when fewer than MIN_PAIRS pairs have a scored base."""
    rhos, pairs = [], []
    for d in store.labelled_derivatives(relation, curve.task, curve.metric):
        if (d["repo"], d["sha"]) == exclude:
            continue
        base_run = store.complete_score(d["base_repo"], d["base_sha"], corpus, spec)
        if base_run is None:
            continue
        phi = _predict_at(curve, task, base_run).p_hat
        rhos.append(float(d["value"]) - phi)
        pairs.append(f"{d['repo']}@{d['sha'][:12]}")
    if len(rhos) < MIN_PAIRS:
        raise CurveError(f"task {task.name} judges derivatives by residual, which needs at least {MIN_PAIRS} "
                         f"labelled base/derivative pairs of relation {relation} with a scored base "
                         f"(found {len(rhos)})",
                         hint=f"import labels of {relation} derivatives for {curve.task}/{curve.metric}, "
                              "or use derivatives: base")
    from scipy.stats import t as student_t

    n = len(rhos)
    mean = statistics.fmean(rhos)
    sd = statistics.stdev(rhos)
    # A new derivative's residual scatters by sd around a mean known to sd/√n: the predictive
    # half-width t_{n−1}·sd·√(1 + 1/n), not the mean's standard error alone.
    t = float(student_t.ppf(0.5 + curve.confidence / 2.0, n - 1))
    return {"mean": mean, "se": sd / math.sqrt(n), "sd": sd, "n_pairs": n,
            "half_width": t * sd * math.sqrt(1.0 + 1.0 / n), "t": t, "relation": relation, "pairs": pairs}


def with_residual(at_base: TaskPrediction, residual: Mapping[str, Any]) -> TaskPrediction:
    """The base-coordinate prediction shifted by ρ̄, its half-widths widened in quadrature by the
    residual's predictive half-width t_{n−1}·sd·√(1 + 1/n)."""
    widen = float(residual["half_width"])
    p_hat = at_base.p_hat + float(residual["mean"])
    lo = p_hat - math.hypot(at_base.p_hat - at_base.lo, widen)
    hi = p_hat + math.hypot(at_base.hi - at_base.p_hat, widen)
    return make_prediction(at_base.task, lstar=at_base.lstar, se=at_base.se, p_hat=p_hat, lo=lo, hi=hi,
                           floor=at_base.floor, margin=at_base.margin, confidence=at_base.confidence,
                           curve_id=at_base.curve_id, corpus_sha256=at_base.corpus_sha256,
                           extrapolated=at_base.extrapolated, curve_warnings=at_base.curve_warnings,
                           axis=at_base.axis, score_lstar=at_base.score_lstar,
                           score_lstar_se=at_base.score_lstar_se, extrapolation=at_base.extrapolation)


def judge_derivative(store: Store, policy: Policy, task: Task, score: ScoreView, curve: Any,
                     own: TaskPrediction | None) -> Judgement | str | None:
    """How a derivative's state is predicted for `task` (module docstring): a Judgement, HOLD
    while its base waits for a score, or None for a checkpoint without a declared base.
    `own` is its prediction on its own coordinate (None where the curve refused it). Raises
    CurveError when the task's mode cannot predict (residual without enough pairs)."""
    base = store.hub_checkpoint_base(score.repo, score.commit)
    if base is None:
        return None
    about = {"relation": base["relation"], "relation_source": base["relation_source"],
             "base_repo": base["base_repo"], "base_sha": base["base_sha"], "mode": task.derivatives,
             "lstar_own": score.lstar, "lstar_own_se": score.se}
    base_run = None
    if base["base_sha"]:
        base_run = store.complete_score(base["base_repo"], base["base_sha"], score.corpus_sha256, _spec(score))
    if base_run is None:
        if base["base_sha"] and (base["base_status"] in PENDING_STATUSES or
                                 (base["base_status"] is None and policy.lineage.score_bases)):
            return HOLD
        why = (base["problem"] or "no single pinned base") if not base["base_sha"] else (
            f"base {base['base_repo']}@{base['base_sha'][:12]} has no complete score on this corpus and spec"
            + (f" ({base['base_status']}: {base['base_reason']})" if base["base_status"] else
               " (not in the store; lineage.score_bases adds it)"))
        if own is None:
            raise CurveError(f"derivative of {base['base_repo']}: {why}; its own coordinate is refused too")
        return Judgement(own, {**about, "coordinate": "own", "rho_measured": False, "lstar_base": None,
                               "lstar_base_se": None, "own_reason": why},
                         {"coordinate": "own", "rho_measured": "false"},
                         [f"derivative ({base['relation']}) predicted from its own L*: {why}; ρ unmeasured"])
    at_base = _predict_at(curve, task, base_run)
    # The observation of P_t(θ): a stored label (an active evaluation stores its result as one).
    label = store.observed_label(score.repo, score.commit, curve.task, curve.metric)
    rho = measured_residual(label, at_base) if label is not None else None
    numbers = {**about, "coordinate": "base", "rho_measured": rho is not None,
               "lstar_base": float(base_run["lstar"]), "lstar_base_se": float(base_run["se_ce"]),
               "base_run_id": base_run["run_id"],
               "at_base": {"p_hat": at_base.p_hat, "interval": [at_base.lo, at_base.hi], "state": at_base.state},
               "own": None if own is None else {"value": own.value, "p_hat": own.p_hat,
                                                "interval": [own.lo, own.hi], "state": own.state},
               "rho": rho, "residual": None}
    prediction = at_base
    caveats = []
    if task.derivatives == "residual":
        residual = residual_estimate(store, curve, task, base["relation"], corpus=score.corpus_sha256,
                                     spec=_spec(score), exclude=(score.repo, score.commit))
        numbers["residual"] = residual
        prediction = with_residual(at_base, residual)
        caveats.append(f"predicted from L*(base) = {base_run['lstar']:.4f} plus the mean residual "
                       f"{residual['mean']:+.3f} (predictive ± {residual['half_width']:.3f}) of "
                       f"{residual['n_pairs']} labelled {base['relation']} pairs")
    else:
        caveats.append(f"predicted from L*(base) = {base_run['lstar']:.4f} of {base['base_repo']}@"
                       f"{base['base_sha'][:12]} ({base['relation']})")
    if rho is None:
        caveats.append("ρ unmeasured: no label of this derivative for the task")
    measured = "true" if rho is not None else "false"
    return Judgement(prediction, numbers, {"coordinate": "base", "rho_measured": measured}, caveats)
