"""Forward validation: predict each larger model (or later stretch of training) from the smaller
(earlier) ones only, per fit family, and choose the family by it (docs/measurement.md §3a).

Leave-one-family-out validation (`monitor.curves.validation`) holds out a family whose points
lie among the others', so it rewards a curve that interpolates well. The situation that matters
for an early warning is a release better than every reference; forward validation holds out
what lies ahead:

- ordering: `params` (model size: train on the sizes up to a split, predict every larger one)
  or `training` (each lineage's checkpoints by step, else tokens, else FLOPs, as a fraction of
  that lineage's own length: train on every lineage's first part, predict the rest). `auto`
  takes `params` when the labels give at least three distinct sizes, else `training`;
- split points: sizes — every distinct size but the largest (at most `MAX_SPLITS`, the largest
  ones); training — the fractions `TRAINING_SPLITS`;
- each family is fitted on the training part with `monitor.curves.fit.fit_curve` (no widening),
  and each held-out point is predicted from that artifact: P̂, the band there, and the point's
  signed extrapolation distance beyond the training range (`monitor.bands.extrapolation_distance`);
- per family: the mean absolute error and mean absolute relative error over every (split,
  held-out point), the share covered by the band widened by the point's own binomial noise
  (`monitor.curves.observe.predictive_interval`), and both by extrapolation distance;
- the widening, a + c·distance added to the band's half-width: the spread a is the `confidence`
  quantile, over held-out points inside their training range, of the smallest addition that
  would have covered each (with its binomial noise; 0 for points already covered) — how far a
  new model sits off the references' curve at an equal axis value; c (per axis unit beyond the
  training range) is the `confidence` quantile, over points ahead of it, of the smallest c that
  would have covered each given a. c widens what the curve's family widens (`WIDENING_SIDES`):
  a sigmoid both sides, a flat isotonic curve only the open side (upward ahead of its data), so
  a forward point below a flat isotonic curve is beyond any c: it is left out of c's quantile and
  counted (`beyond_widening`). `coverage_widened` is computed with the band a curve with these
  a and c actually predicts (`widened_interval`: the artifact's widening, monotone bounds and
  clipping included). Both are fitted on these labels only; the coverage they give here is
  in-sample and is reported as such.

`choose_family` picks the family with the lowest forward mean absolute relative error; a
sigmoid must beat isotonic by more than `TIE_TOLERANCE` (relative) to be chosen, so a tie goes
to isotonic, whose failure beyond the data is the visible one (flat, marked, widened).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from monitor.bands import extrapolation_distance
from monitor.curves.axes import AXES
from monitor.curves.labels import Label
from monitor.errors import CurveError, LabelError

FAMILIES = ("isotonic", "sigmoid")
MAX_SPLITS = 6
TRAINING_SPLITS = (0.5, 0.6, 0.7, 0.8, 0.9)
TIE_TOLERANCE = 0.02
DISTANCE_BINS = 4
# By the absolute error, in the metric's own units: a relative error explodes where the observed
# value is near zero (an open-vocabulary task early in training), and would let a few such points
# decide the family.
RULE = (f"lowest forward mean absolute error; sigmoid only if below isotonic's by more than "
        f"{TIE_TOLERANCE:.0%} of it (ties → isotonic)")


def _training_position(labels: Sequence[Label]) -> np.ndarray | None:
    """Each label's position in its lineage (0 … 1 by step, tokens or FLOPs), or None."""
    for key in ("step", "tokens", "flops"):
        if all(label.lineage is not None and getattr(label, key) is not None for label in labels):
            break
    else:
        return None
    pos = np.empty(len(labels))
    by_lineage: dict[str, list[int]] = {}
    for i, label in enumerate(labels):
        by_lineage.setdefault(str(label.lineage), []).append(i)
    for idx in by_lineage.values():
        v = np.array([float(getattr(labels[i], key)) for i in idx])
        lo, hi = float(v.min()), float(v.max())
        pos[idx] = (v - lo) / (hi - lo) if hi > lo else 1.0
    return pos


def splits(labels: Sequence[Label], ordering: str = "auto") -> tuple[str, list[tuple[str, np.ndarray]]]:
    """(ordering used, [(split name, boolean mask of the training rows)]); the rest of each
    split is held out. LabelError when the labels carry no ordering key."""
    sizes = [label.params for label in labels]
    distinct = sorted({float(s) for s in sizes if s is not None})
    if ordering == "auto":
        ordering = "params" if all(s is not None for s in sizes) and len(distinct) >= 3 else "training"
    if ordering == "params":
        if any(s is None for s in sizes) or len(distinct) < 2:
            raise LabelError("forward validation by model size needs a params value on every row and two sizes",
                             hint="give a params column, or order by training (lineage and step)")
        size = np.array(sizes, dtype=np.float64)
        cuts = distinct[:-1][-MAX_SPLITS:]
        return ordering, [(f"params ≤ {c:.4g}", size <= c) for c in cuts]
    if ordering == "training":
        pos = _training_position(labels)
        if pos is None:
            raise LabelError("forward validation by training order needs lineage and step (or tokens, "
                             "or flops) on every row", hint="give lineage and step columns, or params")
        return ordering, [(f"first {q:.0%} of each lineage", pos <= q) for q in TRAINING_SPLITS]
    raise CurveError(f"unknown ordering {ordering!r}", hint="choose params, training or auto")


def _needed_widening(err: float, half: float, noise: float, distance: float) -> float:
    """Smallest c with hypot(half + c·distance, noise) ≥ |err| (0 when already covered)."""
    need = math.sqrt(max(err * err - noise * noise, 0.0)) - half
    return max(need, 0.0) / distance if need > 0 else 0.0


def forward_validate(labels: Sequence[Label], *, fit: Callable[..., Any], task: str, metric: str | None,
                     baseline: float, margin: float, confidence: float = 0.9, axis: str = "lstar",
                     ordering: str = "auto", families: Sequence[str] = FAMILIES, resamples: int = 200,
                     seed: int = 0) -> dict[str, Any]:
    """The forward-validation record (JSON-able, no NaN): per family its errors, coverage,
    errors by extrapolation distance and the widening it calibrates; skipped splits with why.

    `fit` is `monitor.curves.fit.fit_curve` (passed in: fit_curve's `family="auto"` calls this
    module, so this module does not import it back)."""
    from scipy.stats import norm

    from monitor.curves.observe import predictive_interval

    if axis not in AXES:
        raise CurveError(f"unknown axis {axis!r}", hint=f"choose from {', '.join(AXES)}")
    labels = list(labels)
    used, parts = splits(labels, ordering)
    pred = AXES[axis]
    sign = -1.0 if pred.lower_is_progress else 1.0
    z = float(norm.ppf(0.5 + confidence / 2.0))
    rows: dict[str, list[tuple[float, ...]]] = {f: [] for f in families}
    skipped: dict[str, str] = {}
    split_rows = []
    for name, mask in parts:
        train = [label for label, m in zip(labels, mask) if m]
        test = [label for label, m in zip(labels, mask) if not m]
        if not test:
            continue
        split_rows.append({"split": name, "n_train": len(train), "n_heldout": len(test)})
        for family in families:
            try:
                curve = fit(train, task=task, metric=metric, baseline=baseline, margin=margin,
                            confidence=confidence, resamples=resamples, seed=seed, lofo=False,
                            axis=axis, family=family, widening=0.0)
            except (CurveError, LabelError) as exc:
                skipped[f"{name} / {family}"] = exc.message if hasattr(exc, "message") else str(exc)
                continue
            x = pred.values(test)
            assert x is not None
            p_hat = np.interp(x, curve.knots.x, curve.knots.y)
            lo = np.minimum(np.interp(x, curve.band.x, curve.band.lower), p_hat)
            hi = np.maximum(np.interp(x, curve.band.x, curve.band.upper), p_hat)
            # The monotone bounds beyond the training range (`monitor.bands.widen_beyond`).
            first, last = sorted(curve.x_range, key=lambda v: sign * v)
            floor_ahead = float(np.interp(last, curve.band.x, curve.band.lower))
            ceiling_behind = float(np.interp(first, curve.band.x, curve.band.upper))
            proportion = all(0.0 <= label.value <= 1.0 for label in train)
            for label, xi, p, a, b in zip(test, x, p_hat, lo, hi):
                d = extrapolation_distance(float(xi), curve.x_range, sign)
                n = label.n or 0
                noise = z * math.sqrt(min(max(p, 0.0), 1.0) * (1.0 - min(max(p, 0.0), 1.0)) / n) if n > 0 else 0.0
                err = label.value - float(p)
                plo, phi = predictive_interval(float(p), float(a), float(b), n, confidence)
                covered = 1.0 if plo <= label.value <= phi else 0.0
                rows[family].append((d, err, label.value, float(p - a), float(b - p), noise, covered,
                                     floor_ahead, ceiling_behind, 1.0 if proportion else 0.0))

    out_families: dict[str, Any] = {}
    for family in families:
        out_families[family] = _summarise(rows[family], confidence, two_sided=family != "isotonic")
    return {"ordering": used, "axis": axis, "confidence": confidence, "resamples": resamples,
            "splits": split_rows, "families": out_families, "skipped": skipped}


WIDENING_SIDES = {True: "both sides beyond the data (the shape can be wrong either way), never past the "
                        "band's edge at the last reference",
                  False: "the open side only: upward ahead of the data, downward before it (the curve is flat "
                         "there and the band's edge at the last reference bounds the other side)"}


def widened_interval(p: float, half_lo: float, half_hi: float, noise: float, *, spread: float, c: float,
                     distance: float, two_sided: bool, floor_ahead: float, ceiling_behind: float,
                     proportion: bool) -> tuple[float, float]:
    """The interval a curve with spread a and widening c predicts at a point `distance` beyond its
    training range, the way `monitor.curves.artifact` widens it (a on both sides everywhere,
    c·distance by `monitor.bands.widen_beyond`, one side for a flat isotonic curve), then widened
    by the point's own noise in quadrature (`observe.predictive_interval`)."""
    from monitor.bands import widen_beyond

    lower, upper = p - half_lo - spread, p + half_hi + spread
    if proportion:
        lower, upper = max(lower, 0.0), min(upper, 1.0)
    if distance != 0.0:
        lower, upper = widen_beyond(lower, upper, ahead=max(distance, 0.0), behind=max(-distance, 0.0), c=c,
                                    two_sided=two_sided, floor_ahead=floor_ahead, ceiling_behind=ceiling_behind,
                                    bounds=(0.0, 1.0) if proportion else None)
    return p - math.hypot(max(p - lower, 0.0), noise), p + math.hypot(max(upper - p, 0.0), noise)


def _summarise(rows: list[tuple[float, ...]], confidence: float, *, two_sided: bool) -> dict[str, Any]:
    if not rows:
        return {"n": 0, "mae": None, "mare": None, "coverage": None, "coverage_widened": None,
                "spread": None, "widening": None, "widening_sides": WIDENING_SIDES[two_sided],
                "beyond_widening": 0, "by_distance": []}
    arr = np.array(rows, dtype=np.float64)
    d, err, y, half_lo, half_hi, noise, covered, floor_ahead, ceiling_behind, proportion = arr.T
    half = np.where(err > 0, half_hi, half_lo)   # the band's side toward the observation
    rel = np.abs(err) / np.maximum(np.abs(y), 1e-12)
    ahead = d > 0
    # The spread a (both sides, every family): what the band misses for held-out points inside
    # the training range (a new model off the references' curve at equal axis value), at the
    # nominal rate.
    inside = ~ahead
    spread_need = np.array([_needed_widening(e, h, s, 1.0) for e, h, s in zip(err[inside], half[inside],
                                                                               noise[inside])])
    spread = float(np.quantile(spread_need, confidence)) if len(spread_need) else None
    a = spread or 0.0
    # c widens only the side the curve actually widens: for a flat isotonic curve ahead of its
    # data, the upper side. A point below it there is beyond any c and is left out of c's
    # quantile (it is counted, and uncovered unless a covers it).
    helped = ahead & ((err > 0) | two_sided)
    needed = np.array([_needed_widening(e, h + a, s, di) for e, h, s, di in zip(err[helped], half[helped],
                                                                                  noise[helped], d[helped])])
    widening = float(np.quantile(needed, confidence)) if len(needed) else None
    c = widening or 0.0
    widened = np.array([lo <= yi <= hi for yi, (lo, hi) in zip(y, (
        widened_interval(float(yi - e), hl, hh, s, spread=a, c=c, distance=float(di), two_sided=two_sided,
                         floor_ahead=fa, ceiling_behind=cb, proportion=bool(pr))
        for yi, e, hl, hh, s, di, fa, cb, pr in zip(y, err, half_lo, half_hi, noise, d, floor_ahead,
                                                    ceiling_behind, proportion)))])
    bins = [{"from": None, "to": 0.0, "mask": d <= 0}]
    if ahead.any():
        edges = np.quantile(d[ahead], np.linspace(0.0, 1.0, DISTANCE_BINS + 1))
        for i in range(DISTANCE_BINS):
            lo_e, hi_e = float(edges[i]), float(edges[i + 1])
            mask = ahead & (d >= lo_e) & ((d <= hi_e) if i == DISTANCE_BINS - 1 else (d < hi_e))
            bins.append({"from": lo_e, "to": hi_e, "mask": mask})
    by_distance = []
    for b in bins:
        m = b["mask"]
        if not m.any():
            continue
        by_distance.append({"from": b["from"], "to": b["to"], "n": int(m.sum()),
                            "mae": float(np.mean(np.abs(err[m]))), "mare": float(np.mean(rel[m])),
                            "bias": float(np.mean(err[m])), "coverage": float(np.mean(covered[m]))})
    return {"n": int(len(arr)), "n_ahead": int(ahead.sum()), "mae": float(np.mean(np.abs(err))),
            "mare": float(np.mean(rel)), "coverage": float(np.mean(covered)),
            "coverage_widened": float(np.mean(widened)), "spread": spread, "widening": widening,
            "widening_sides": WIDENING_SIDES[two_sided], "beyond_widening": int(np.sum(ahead & ~helped)),
            "by_distance": by_distance}


def choose_family(labels: Sequence[Label], *, fit: Callable[..., Any], task: str, metric: str | None,
                  baseline: float, margin: float, confidence: float = 0.9, axis: str = "lstar",
                  ordering: str = "auto", resamples: int = 200, seed: int = 0) -> dict[str, Any]:
    """Forward validation of both families and the one chosen by `RULE`: the record a curve
    stores as `family_choice` (`chosen`, `rule`, and `forward_validate`'s fields)."""
    record = forward_validate(labels, fit=fit, task=task, metric=metric, baseline=baseline, margin=margin,
                              confidence=confidence, axis=axis, ordering=ordering, families=FAMILIES,
                              resamples=resamples, seed=seed)
    iso, sig = record["families"]["isotonic"]["mae"], record["families"]["sigmoid"]["mae"]
    if iso is None and sig is None:
        raise CurveError(f"task {task!r}: forward validation fitted no family on any split",
                         hint="; ".join(f"{k}: {v}" for k, v in list(record["skipped"].items())[:3]) or None)
    if iso is None:
        chosen = "sigmoid"
    elif sig is None:
        chosen = "isotonic"
    else:
        chosen = "sigmoid" if sig < iso * (1.0 - TIE_TOLERANCE) else "isotonic"
    return {"chosen": chosen, "rule": RULE, **record}
