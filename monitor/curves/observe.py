"""Checking a prediction with an observation: the binomial interval of an observed accuracy,
the observed state, whether it confirms or contradicts the predicted interval, and whether a
curve's intervals cover the observations as often as they claim (its track record).

The interval of an observed accuracy k/n is Clopper-Pearson's (exact, two-sided, at the
curve's confidence 1 − δ): lower = Beta(δ/2; k, n − k + 1), upper = Beta(1 − δ/2; k + 1, n − k),
with 0 and 1 at k = 0 and k = n. It never covers less than its nominal level, so a
contradiction it shows is not an artefact of a too-narrow interval.

A curve's coverage is the share of checked predictions whose observation lies inside the
predicted interval widened by the observation's own binomial noise (`predictive_interval`: the
predicted interval is for the task's true mean, an n-item observation scatters around it). It
is miscalibrated when a one-sided exact binomial test of H0: coverage ≥ the curve's confidence
rejects at α = 0.05, with at least `MIN_CHECKED` checked predictions (below that no test can
tell a bad curve from bad luck). The test is repeated as checks accumulate, without a
sequential correction: a curve whose coverage is exactly nominal gets one alert with a
probability of about 8 % by 20 checks and 17 % by 100.

Observations of derivatives (checkpoints that declare a base) are left out of a curve's track
record: their prediction reads the base's coordinate and their post-training residual is not
the curve's error.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

INTERVAL_METHOD = "clopper-pearson"
OBSERVED_STATES = ("observed_emerged", "observed_clear", "observed_unresolved")
MISCALIBRATION_ALPHA = 0.05
MIN_CHECKED = 5


def clopper_pearson(k: int, n: int, confidence: float) -> tuple[float, float]:
    """The exact two-sided binomial interval of k successes out of n at `confidence`."""
    from scipy.stats import beta

    if n <= 0 or not 0 <= k <= n:
        raise ValueError(f"need 0 <= k <= n and n > 0, got k={k}, n={n}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    alpha = 1.0 - confidence
    lo = 0.0 if k == 0 else float(beta.ppf(alpha / 2, k, n - k + 1))
    hi = 1.0 if k == n else float(beta.ppf(1 - alpha / 2, k + 1, n - k))
    return lo, hi


def observed_state(lo: float, hi: float, level: float) -> str:
    """`observed_emerged` when the observation's lower bound clears the level b + ε,
    `observed_clear` when its upper bound does not reach it, else `observed_unresolved`."""
    if lo >= level:
        return "observed_emerged"
    if hi < level:
        return "observed_clear"
    return "observed_unresolved"


def verdict(predicted_lo: float, predicted_hi: float, observed_lo: float, observed_hi: float,
            level: float) -> str:
    """`contradicted` when the observed interval lies wholly on the other side of the level
    from the predicted interval, else `confirmed`.

    A predicted interval wholly above the level (emerged) is contradicted by an observed one
    wholly below it, and the other way round. A predicted interval that holds the level
    (at_risk) claims the task is near it; an observed interval wholly on one side of the
    level and disjoint from the predicted interval contradicts that claim.
    """
    if predicted_lo >= level:
        return "contradicted" if observed_hi < level else "confirmed"
    if predicted_hi < level:
        return "contradicted" if observed_lo >= level else "confirmed"
    below = observed_hi < level and observed_hi < predicted_lo
    above = observed_lo >= level and observed_lo > predicted_hi
    return "contradicted" if below or above else "confirmed"


def predictive_interval(p_hat: float, lo: float, hi: float, n: int, confidence: float) -> tuple[float, float]:
    """Where an observation of `n` items should fall when the curve is right: the predicted
    interval [lo, hi] is for the task's true mean, so the observation's own binomial noise
    (standard deviation sqrt(p(1-p)/n) at p = p_hat) is added in quadrature to each side's
    half-width, z the two-sided normal quantile of `confidence`. Coverage of the observations by
    this interval is what a well-calibrated curve keeps at its nominal confidence."""
    from scipy.stats import norm

    z = float(norm.ppf(0.5 + confidence / 2.0))
    p = min(max(p_hat, 0.0), 1.0)
    noise = z * math.sqrt(p * (1.0 - p) / n) if n > 0 else 0.0
    below, above = max(p_hat - lo, 0.0), max(hi - p_hat, 0.0)
    return p_hat - math.hypot(below, noise), p_hat + math.hypot(above, noise)


def inside(value: float, lo: float, hi: float) -> bool:
    """Whether the observed value lies inside an interval (ends included)."""
    return lo <= value <= hi


@dataclass(frozen=True)
class Coverage:
    """A curve's track record: predictions checked, observations inside their predicted
    interval, the coverage's Clopper-Pearson interval, and the one-sided test against the
    nominal confidence."""

    checked: int
    covered: int
    contradictions: int
    nominal: float
    lo: float | None
    hi: float | None
    p_value: float | None          # P(at most `covered` | coverage = nominal); None below MIN_CHECKED
    miscalibrated: bool

    @property
    def share(self) -> float | None:
        return self.covered / self.checked if self.checked else None

    def as_dict(self) -> dict[str, Any]:
        return {"checked": self.checked, "covered": self.covered, "coverage": self.share,
                "coverage_lo": self.lo, "coverage_hi": self.hi, "nominal": self.nominal,
                "contradictions": self.contradictions, "p_value": self.p_value,
                "miscalibrated": self.miscalibrated, "test": f"one-sided exact binomial, alpha "
                f"{MISCALIBRATION_ALPHA:g}, at least {MIN_CHECKED} checked", "interval": INTERVAL_METHOD}


def coverage(checked: int, covered: int, contradictions: int, nominal: float) -> Coverage:
    """The track record of a curve at nominal confidence `nominal`."""
    from scipy.stats import binom

    if checked == 0:
        return Coverage(0, 0, contradictions, nominal, None, None, None, False)
    lo, hi = clopper_pearson(covered, checked, nominal)
    p_value = None
    if checked >= MIN_CHECKED:
        p_value = float(binom.cdf(covered, checked, nominal))
    miscalibrated = p_value is not None and p_value < MISCALIBRATION_ALPHA
    return Coverage(checked, covered, contradictions, nominal, lo, hi, p_value, miscalibrated)


def finite(value: float | None) -> float | None:
    """`value` if it is a finite float, else None (for JSON columns)."""
    return float(value) if value is not None and math.isfinite(value) else None


__all__ = ["INTERVAL_METHOD", "OBSERVED_STATES", "MIN_CHECKED", "MISCALIBRATION_ALPHA", "Coverage",
           "clopper_pearson", "coverage", "inside", "observed_state", "verdict"]
