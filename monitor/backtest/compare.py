"""Compare each replayed prediction with the checkpoint's own published result, and the metrics.

The observation of a checkpoint follows the active evaluation's rules (`monitor.curves.observe`):
with the item count n known, the Clopper–Pearson interval of k = round(value·n) of n at the
task's confidence; else value ± z·stderr (z the two-sided normal quantile). Its state is
`observed_state` against the level b_t + ε. Each metric is one small function over one task ×
target lineage's rows (`Row`, in training order):

- `crossing`: the first checkpoint observed emerged;
- `first_warning`: the first checkpoint predicted at_risk or emerged (a firing state);
- `lead`: steps, tokens and FLOPs to the crossing from the start of the last uninterrupted run
  of warnings before it (a warning that lapsed to clear earlier does not count), with the steps
  from the first warning of all reported beside it;
- `crossed_at_start`: the crossing, when it is the lineage's first checkpoint: no warning could
  have come before it, so it is neither a miss nor a late warning (a history that starts late
  in training cannot test the lead time of a level it had already passed);
- `missed`: a later crossing with no warning strictly before it (every late warning is also a miss);
- `late_warning`: the first warning when it falls at or after a later crossing;
- `false_alarm`: the first warning on a lineage that never crosses;
- `false_emerged`: every checkpoint predicted emerged while its observation is clear;
- `covered`: the observed value inside the predicted interval widened by its own noise
  (`observe.predictive_interval` with n; with a stderr alone the same quadrature with z·stderr);
  `coverage_of` pools rows into the share with its Clopper–Pearson interval, tested against the
  mean of the rows' own nominal levels (`pooled_nominal`; rows may carry different levels);
- `final_relative_error`: (p̂ − observed)/observed at the lineage's last checkpoint.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from monitor.backtest.replay import ReplayPoint
from monitor.backtest.spec import BacktestTask
from monitor.curves.labels import Label
from monitor.curves.observe import (Coverage, clopper_pearson, coverage, inside, observed_state,
                                    predictive_interval, verdict)

FIRING = ("at_risk", "emerged")


def z_of(confidence: float) -> float:
    from scipy.stats import norm

    return float(norm.ppf(0.5 + confidence / 2.0))


def observed_interval(value: float, n: int | None, stderr: float | None, confidence: float) -> tuple[float, float]:
    """The interval of one published result (Clopper–Pearson with n, else value ± z·stderr)."""
    if n:
        k = min(max(int(round(value * n)), 0), n)
        return clopper_pearson(k, n, confidence)
    half = z_of(confidence) * float(stderr or 0.0)
    return value - half, value + half


def widened_interval(p_hat: float, lo: float, hi: float, n: int | None, stderr: float | None,
                     confidence: float) -> tuple[float, float]:
    """Where the observation should fall if the curve is right: the predicted interval widened
    by the observation's own noise (binomial with n, else its stderr)."""
    if n:
        return predictive_interval(p_hat, lo, hi, n, confidence)
    noise = z_of(confidence) * float(stderr or 0.0)
    below, above = max(p_hat - lo, 0.0), max(hi - p_hat, 0.0)
    return p_hat - math.hypot(below, noise), p_hat + math.hypot(above, noise)


@dataclass(frozen=True)
class Row:
    """One target checkpoint of one task: the observation and the replay's prediction."""

    task: str
    lineage: str
    step: float
    tokens: float | None
    flops: float | None
    checkpoint: str
    observed: float
    n: int | None
    stderr: float | None
    observed_lo: float
    observed_hi: float
    observed_state: str
    level: float
    confidence: float
    predicted: ReplayPoint | None

    @property
    def state(self) -> str | None:
        return self.predicted.state if self.predicted is not None else None

    def where(self) -> dict[str, Any]:
        """The checkpoint as reports list it."""
        return {"lineage": self.lineage, "checkpoint": self.checkpoint, "step": self.step,
                "tokens": self.tokens, "flops": self.flops}


def make_row(label: Label, task: BacktestTask, predicted: ReplayPoint | None) -> Row:
    lo, hi = observed_interval(label.value, label.n, label.stderr, task.confidence)
    return Row(task=task.name, lineage=str(label.lineage), step=float(label.step or 0.0), tokens=label.tokens,
               flops=label.flops, checkpoint=label.checkpoint, observed=label.value, n=label.n,
               stderr=label.stderr, observed_lo=lo, observed_hi=hi,
               observed_state=observed_state(lo, hi, task.level), level=task.level,
               confidence=task.confidence, predicted=predicted)


# -- metrics, each over one task × lineage in training order ------------------------------------
def crossing(rows: Sequence[Row]) -> Row | None:
    """The first checkpoint observed emerged."""
    return next((r for r in rows if r.observed_state == "observed_emerged"), None)


def first_warning(rows: Sequence[Row]) -> Row | None:
    """The first checkpoint predicted at_risk or emerged."""
    return next((r for r in rows if r.state in FIRING), None)


def last_warning_run(rows: Sequence[Row], before: Row) -> tuple[Row, bool] | None:
    """The first checkpoint of the last uninterrupted run of warnings strictly before `before`
    (consecutive predicted checkpoints in a firing state; a checkpoint without a prediction
    neither breaks nor extends a run, one predicted clear breaks it), and whether that run was
    still in force at the last prediction before `before`. None: no warning before it."""
    start: Row | None = None
    in_force = False
    for r in rows:
        if r is before or not r.step < before.step:
            break
        if r.state in FIRING:
            if not in_force:
                start = r
            in_force = True
        elif r.state is not None:
            in_force = False
    return (start, in_force) if start is not None else None


def lead(rows: Sequence[Row]) -> dict[str, Any] | None:
    """Steps, tokens and FLOPs to the crossing from the start of the last uninterrupted run of
    warnings before it (`last_warning_run`: a warning that returned to clear and fired again
    counts from its return), whether that run was still in force when the crossing came, and,
    as `first_warning_steps`, the steps from the first warning of all. None unless a warning
    comes strictly before the crossing; tokens/FLOPs None where either checkpoint lacks them."""
    cross = crossing(rows)
    if cross is None:
        return None
    found = last_warning_run(rows, cross)
    if found is None:
        return None
    run, in_force = found
    warn = first_warning(rows)
    assert warn is not None

    def gap(a: float | None, b: float | None) -> float | None:
        return b - a if a is not None and b is not None else None

    return {"steps": cross.step - run.step, "tokens": gap(run.tokens, cross.tokens),
            "flops": gap(run.flops, cross.flops), "in_force": in_force,
            "first_warning_steps": cross.step - warn.step}


def crossed_at_start(rows: Sequence[Row]) -> Row | None:
    """The crossing, when it is the lineage's first checkpoint (no earlier warning was possible)."""
    cross = crossing(rows)
    return cross if cross is not None and cross is rows[0] else None


def missed(rows: Sequence[Row]) -> Row | None:
    """The crossing, when it is not the first checkpoint and no warning came strictly before it."""
    cross = crossing(rows)
    if cross is None or crossed_at_start(rows) is not None:
        return None
    return None if any(r.state in FIRING and r.step < cross.step for r in rows) else cross


def late_warning(rows: Sequence[Row]) -> Row | None:
    """The first warning, when it falls at or after a crossing that was not the first checkpoint."""
    cross, warn = crossing(rows), first_warning(rows)
    if cross is None or warn is None or crossed_at_start(rows) is not None:
        return None
    return warn if warn.step >= cross.step else None


def false_alarm(rows: Sequence[Row]) -> Row | None:
    """The first warning on a lineage whose observations never cross."""
    return first_warning(rows) if crossing(rows) is None else None


def false_emerged(rows: Sequence[Row]) -> list[Row]:
    """Every checkpoint predicted emerged while its observation is clear."""
    return [r for r in rows if r.state == "emerged" and r.observed_state == "observed_clear"]


def covered(row: Row) -> bool | None:
    """Whether the observation lies inside the predicted interval widened by its own noise
    (None: no prediction to check)."""
    p = row.predicted
    if p is None or p.p_hat is None or p.lo is None or p.hi is None:
        return None
    return inside(row.observed, *widened_interval(p.p_hat, p.lo, p.hi, row.n, row.stderr, row.confidence))


def contradicted(row: Row) -> bool:
    """Whether the observation contradicts the predicted interval (`observe.verdict`)."""
    p = row.predicted
    if p is None or p.lo is None or p.hi is None:
        return False
    return verdict(p.lo, p.hi, row.observed_lo, row.observed_hi, row.level) == "contradicted"


def pooled_nominal(rows: Sequence[Row], default: float = 0.9) -> float:
    """The nominal coverage of rows pooled together: the mean of the checked rows' own levels.
    Under calibration a row at level q is covered with probability q, so the expected share is
    that mean; the binomial test at the mean is conservative for mixed levels (the variance of
    a sum of Bernoulli(q_i) is at most that of Binomial(n, mean q))."""
    levels = [r.confidence for r in rows if covered(r) is not None]
    return sum(levels) / len(levels) if levels else default


def coverage_of(rows: Sequence[Row], nominal: float | None = None) -> Coverage:
    """The share of predicted rows covered, its Clopper–Pearson interval and the one-sided
    test against `nominal` (default: `pooled_nominal`, the rows' own levels)."""
    checks = [covered(r) for r in rows]
    checked = [c for c in checks if c is not None]
    if nominal is None:
        nominal = pooled_nominal(rows)
    return coverage(len(checked), sum(checked), sum(contradicted(r) for r in rows), nominal)


def final_relative_error(rows: Sequence[Row]) -> float | None:
    """(p̂ − observed)/observed at the last checkpoint (None: no prediction, or observed 0)."""
    if not rows:
        return None
    last = rows[-1]
    if last.predicted is None or last.predicted.p_hat is None or last.observed == 0:
        return None
    return (last.predicted.p_hat - last.observed) / last.observed


__all__ = ["FIRING", "Row", "contradicted", "crossed_at_start", "coverage_of", "covered", "crossing", "false_alarm", "false_emerged",
           "final_relative_error", "first_warning", "last_warning_run", "pooled_nominal", "late_warning", "lead", "make_row", "missed",
           "observed_interval", "widened_interval"]
