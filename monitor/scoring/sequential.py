"""Sequential scoring: score a pinned document order in blocks and stop once every task's
state is settled (docs/measurement.md §4).

Pure numpy: the document order, the ratio estimator of CE over the pinned selection with its
finite-population standard error, the anytime-valid confidence box after look k, and the
stopping loop. The forward passes are the caller's (`monitor.scoring.sequential_run`), handed
in as a function from document indices to per-document (NLL, scored tokens).

The rule (proof sketch in docs/measurement.md §4): after look k (k = 1, 2, …) the interval
for the selection's CE is CE_hat ± t_{n−1}(δ_k/4)·SE_k with δ_k = δ·6/(π²k²), and the bracket for the
full score's standard error is ŝe_N·(1 ∓ z(δ_k/4)·r_k ∓ ε_boot). Σ_k δ_k = δ, so under the
normal approximation at every look the chance that any look's box misses the truth is at
most δ, whenever the run stops; a state that is the same over the whole box is the full
score's state unless the box missed.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
from scipy.stats import norm
from scipy.stats import t as t_dist

from monitor.bands import classify_state, predicted_interval

BOUND_NAME = "normal-union: delta_k = delta*6/(pi^2 k^2), CE and SE(full) each at delta_k/2"
# Relative Monte Carlo error allowed between the plug-in SE of the full selection and the
# full score's bootstrap SE (n_boot = 1000: the bootstrap SD's own relative SD is ≈ 1/√2000).
BOOTSTRAP_SLACK = 0.07
STATES = ("clear", "at_risk", "emerged")


def stratified_order(doc_slices: Sequence[str], seed: int) -> np.ndarray:
    """A pinned, seeded order of the documents in which every prefix holds each slice in
    proportion to its size (±1 document).

    Documents are shuffled within their slice (numpy Generator PCG64 seeded with `seed`, one
    permutation per slice in order of first appearance); the i-th document of a slice of n
    gets the key (i + ½)/n, and the order sorts by key (ties by slice, then position).
    """
    slices = np.asarray(list(doc_slices), dtype=object)
    rng = np.random.default_rng(seed)
    keys = np.empty(len(slices), dtype=np.float64)
    tie = np.empty(len(slices), dtype=np.int64)
    for s_index, name in enumerate(dict.fromkeys(slices.tolist())):
        members = np.flatnonzero(slices == name)
        shuffled = members[rng.permutation(len(members))]
        keys[shuffled] = (np.arange(len(members)) + 0.5) / len(members)
        tie[shuffled] = s_index
    return np.lexsort((np.arange(len(slices)), tie, keys))


@dataclass(frozen=True)
class RatioEstimate:
    """CE over a without-replacement sample of n of N documents, as Σ nll / Σ tokens.

    `se` is the estimator's standard error (finite-population corrected: 0 at n = N);
    `se_full` is the plug-in estimate of the standard error the full score reports (the same
    linearised variance with n = N and no correction); `se_full_rel` the relative standard
    error of `se_full` itself (delta method on the sample variance, from the kurtosis).
    """

    ce: float
    se: float
    se_full: float
    se_full_rel: float
    n_docs: int
    n_population: int
    n_tokens: int


def ratio_estimate(doc_nll: Sequence[float], doc_ntok: Sequence[int], n_population: int) -> RatioEstimate:
    """The ratio estimator of CE and its standard errors from the documents scored so far.

    Linearisation: with R = Σy/Σx and d_i = y_i − R·x_i, Var(R) ≈ (1 − n/N)·s_d²/(n·x̄²).
    """
    y = np.asarray(doc_nll, dtype=np.float64)
    x = np.asarray(doc_ntok, dtype=np.float64)
    n = len(y)
    if n == 0 or x.sum() <= 0:
        raise ValueError("the ratio estimator needs at least one scored document with tokens")
    if n > n_population:
        raise ValueError(f"{n} documents scored of a selection of {n_population}")
    r = float(y.sum() / x.sum())
    if n < 2:
        return RatioEstimate(r, math.inf, math.inf, math.inf, n, n_population, int(x.sum()))
    d = y - r * x
    s2 = float((d * d).sum() / (n - 1))
    xbar = float(x.mean())
    fpc = 1.0 - n / n_population
    se = math.sqrt(max(fpc, 0.0) * s2 / n) / xbar
    se_full = math.sqrt(s2 / n_population) / xbar
    m2 = float((d * d).mean())
    kurt = float((d ** 4).mean() / (m2 * m2)) if m2 > 0 else 1.0
    se_full_rel = math.sqrt(max(kurt - 1.0, 0.0) / (4.0 * n))
    return RatioEstimate(r, se, se_full, se_full_rel, n, n_population, int(x.sum()))


def look_delta(k: int, delta: float) -> float:
    """The error spent at look k ≥ 1: δ·6/(π²k²), which sums to δ over k = 1, 2, …"""
    if k < 1:
        raise ValueError(f"looks are numbered from 1 (got {k})")
    return delta * 6.0 / (math.pi ** 2 * k * k)


@functools.lru_cache(maxsize=4096)
def _t_quantile(tail: float, df: int) -> float:
    return float(t_dist.isf(tail, df))


@dataclass(frozen=True)
class Box:
    """Where the full score's (L*, SE) lies after a look, with probability ≥ 1 − δ_k."""

    lstar_lo: float
    lstar_hi: float
    se_lo: float
    se_hi: float
    exact: bool = False   # the whole selection is scored: no uncertainty left

    def as_dict(self) -> dict[str, Any]:
        return {"lstar": [self.lstar_lo, self.lstar_hi], "se": [self.se_lo, self.se_hi], "exact": self.exact}


def confidence_box(est: RatioEstimate, ce_unigram: float, k: int, delta: float) -> Box:
    """The box after look `k`: CE ± z·SE shifted by CE_uni, and the SE(full) bracket, each
    two-sided at δ_k/2 (so the box misses with probability ≤ δ_k)."""
    # Student's t with n − 1 degrees of freedom: the SE is itself estimated from n documents
    z = _t_quantile(look_delta(k, delta) / 4.0, max(est.n_docs - 1, 1))
    lstar = est.ce - ce_unigram
    half = z * est.se
    widen = z * est.se_full_rel + BOOTSTRAP_SLACK
    return Box(lstar - half, lstar + half, est.se_full * max(0.0, 1.0 - widen), est.se_full * (1.0 + widen))


class TaskRule(Protocol):
    """A task whose state is a function of (L*, SE) — a policy task with its curve."""

    name: str

    def state(self, lstar: float, se: float) -> str: ...

    def grid(self, lo: float, hi: float, se: float) -> np.ndarray: ...


def settled_state(task: TaskRule, box: Box) -> str | None:
    """The task's state when it is the same everywhere in `box`, else None.

    For each SE end the state is checked at both L* ends and at every point where it can
    change between them (the task's grid: its curve's knots and band points shifted by the
    interval half-width); between SE ends the interval only widens, so its ends suffice.
    """
    if box.exact:
        return task.state(box.lstar_lo, box.se_lo)
    seen: set[str] = set()
    for se in {box.se_lo, box.se_hi}:
        for x in task.grid(box.lstar_lo, box.lstar_hi, se):
            seen.add(task.state(float(x), se))
            if len(seen) > 1:
                return None
    return seen.pop()


@dataclass
class TaskOutcome:
    name: str
    state: str | None = None
    settled_at_look: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"task": self.name, "state": self.state, "settled_at_look": self.settled_at_look}


@dataclass
class SequentialResult:
    """What the loop did: the documents scored (indices into the selection, in order), their
    losses, the stopping reason and the last look's estimate and box."""

    scored: np.ndarray
    doc_nll: np.ndarray
    doc_ntok: np.ndarray
    reason: str                  # settled | exhausted
    looks: int
    estimate: RatioEstimate
    box: Box
    tasks: list[TaskOutcome] = field(default_factory=list)

    @property
    def partial(self) -> bool:
        return self.reason != "exhausted"


BlockScorer = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]


def block_schedule(n_docs: int, block_documents: int) -> list[int]:
    """Cumulative document counts at each look: block_documents, 2·block_documents, …, N."""
    if block_documents < 1:
        raise ValueError(f"a block needs at least one document (got {block_documents})")
    ends = list(range(block_documents, n_docs, block_documents))
    return [*ends, n_docs]


def min_documents(doc_slices: Sequence[str], order: np.ndarray, block_documents: int, min_blocks: int) -> int:
    """The fewest documents before a stop: `min_blocks` blocks, and the shortest prefix of
    `order` that holds every slice."""
    slices = np.asarray(list(doc_slices), dtype=object)[order]
    need = set(slices.tolist())
    seen: set[str] = set()
    cover = len(slices)
    for i, name in enumerate(slices.tolist()):
        seen.add(name)
        if seen == need:
            cover = i + 1
            break
    return max(cover, min_blocks * block_documents)


def run_sequential(score_block: BlockScorer, *, doc_slices: Sequence[str], ce_unigram: float,
                   tasks: Sequence[TaskRule], delta: float, block_documents: int, seed: int = 0,
                   min_blocks: int = 2, known: dict[int, tuple[float, int]] | None = None) -> SequentialResult:
    """Score blocks of the pinned order until every task is settled or the selection is spent.

    `known` maps document indices already scored (a resumed run) to (nll, tokens): they are
    taken first in order and not scored again. A look happens at each block's end, never
    before `min_documents`.
    """
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must lie in (0, 1), got {delta}")
    n = len(doc_slices)
    order = stratified_order(doc_slices, seed)
    known = dict(known or {})
    if known:   # documents already scored go first, in the pinned order, then the rest
        first = np.array([i for i in order if i in known], dtype=np.int64)
        order = np.concatenate([first, np.array([i for i in order if i not in known], dtype=np.int64)])
    floor = min_documents(doc_slices, order, block_documents, min_blocks)
    nll = np.zeros(n, dtype=np.float64)
    ntok = np.zeros(n, dtype=np.int64)
    done = 0
    outcomes = [TaskOutcome(t.name) for t in tasks]
    look = 0
    for end in block_schedule(n, block_documents):
        if end < floor and end < n:
            continue
        block = order[done:end]
        fresh = np.array([i for i in block if i not in known], dtype=np.int64)
        if len(fresh):
            b_nll, b_ntok = score_block(fresh)
            nll[fresh], ntok[fresh] = b_nll, b_ntok
        for i in block:
            if i in known:
                nll[i], ntok[i] = known[i]
        done = end
        look += 1
        taken = order[:done]
        est = ratio_estimate(nll[taken], ntok[taken], n)
        box = (Box(est.ce - ce_unigram, est.ce - ce_unigram, est.se_full, est.se_full, exact=True)
               if done == n else confidence_box(est, ce_unigram, look, delta))
        for task, outcome in zip(tasks, outcomes):
            state = settled_state(task, box)
            if state is not None and outcome.settled_at_look is None:
                outcome.state, outcome.settled_at_look = state, look
            elif state is None:
                outcome.state, outcome.settled_at_look = None, None
        if done == n or all(o.state is not None for o in outcomes):
            reason = "exhausted" if done == n else "settled"
            return SequentialResult(order[:done], nll[order[:done]], ntok[order[:done]], reason, look,
                                    est, box, outcomes)
    raise AssertionError("the block schedule always ends at the whole selection")


# -- tasks ---------------------------------------------------------------------------------------
@dataclass
class CurveTask:
    """A policy task as a `TaskRule`: the state `monitor.alerts.predict.predict_task` gives with
    its curve, from the curve's numbers carried in the plan (`entry`: threshold b_t + ε,
    confidence, band {x, lower, upper}, knots {x, y}; see `monitor.alerts.sequential_plan`)."""

    name: str
    entry: dict[str, Any]

    def __post_init__(self) -> None:
        e = self.entry
        self.threshold = float(e["threshold"])
        self.confidence = float(e["confidence"])
        self._z = float(norm.ppf(0.5 + self.confidence / 2.0))
        self._band = tuple(np.asarray(e["band"][k], dtype=np.float64) for k in ("x", "lower", "upper"))
        self._knots = tuple(np.asarray(e["knots"][k], dtype=np.float64) for k in ("x", "y"))

    def state(self, lstar: float, se: float) -> str:
        _, lower, upper = predicted_interval(lstar, se, self._z, *self._band, *self._knots)
        return classify_state(lower, upper, self.threshold)

    def grid(self, lo: float, hi: float, se: float) -> np.ndarray:
        """L* ends plus every point in between where the predicted interval's edges bend."""
        zs = self._z * se
        gx, kx = self._band[0], self._knots[0]
        points = np.concatenate([[lo, hi], gx - zs, gx + zs, kx, np.linspace(lo, hi, 17)])
        return np.unique(points[(points >= lo) & (points <= hi)])


@dataclass
class ThresholdTask:
    """A synthetic task (tests, simulation): state from [L* − z·SE, L* + z·SE] against
    `threshold` with P̂ = −L* (performance rises as L* falls)."""

    name: str
    threshold: float
    z: float = 1.959963984540054

    def state(self, lstar: float, se: float) -> str:
        return classify_state(-lstar - self.z * se, -lstar + self.z * se, self.threshold)

    def grid(self, lo: float, hi: float, se: float) -> np.ndarray:
        return np.array([lo, hi])
