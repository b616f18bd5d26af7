"""Which progress axis should a task's curve use? Chosen by leave-one-family-out evidence.

For one task metric and labelled points, each with a family and values on several axes
(L*, bits/byte, L* per byte, L_rel, L_gain, raw CE, log10 parameters, log10 FLOPs), the curve
is fitted on each axis with the ordinary curve code and validated leave-one-family-out
(`monitor.curves.validation.lofo_axes`: same fit, weights, folds and seeds on every axis).
The comparison is made at the level of families, the unit a threshold has to transfer to:

- per-family errors: RMSE of the predicted performance and the crossing error (share of the
  held-out family's points put on the wrong side of b_t + ε), per axis;
- the family-averaged difference of each axis's error to the reference axis (L*):
  mean over families of (error on the axis − error on L*), negative when the axis is better;
- an exact sign-flip permutation test of that mean over families (all 2^F sign patterns for
  F ≤ 16 families, else a seeded Monte Carlo sample), two-sided;
- a refit bootstrap over families: families are drawn with replacement and the whole LOFO
  is refitted on the draw (a family drawn k times is one fold whose points weigh k times),
  giving percentile intervals of each axis's family-averaged error and of the difference
  (`refit_bootstrap`; the lab's race adds a second stage, seeds within each drawn family).

The rule (`rule_text`, printed with every choice): the recommended axis is L* unless
another axis is better by both the permutation test (p < α) and the bootstrap interval of
its difference (wholly below zero); among several such axes the one with the largest mean
improvement wins; ties stay L*. Where
no point has L* (published data without the corpus behind it), the first available axis in
`AXIS_ORDER` is the reference, and the output says so. An axis missing on some points is
validated, together with the reference, only on the points having both, and says so.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from monitor.curves.axes import AXES as AXIS_REGISTRY, label_point
from monitor.curves.labels import Label
from monitor.curves.stats import Predictor, label_weights
from monitor.curves.validation import lofo_axes, sigmoid_fold_requests
from monitor.errors import CurveError, LabelError

REFERENCE = "lstar"
# The closed set of axes (monitor.curves.axes), in the order a fallback reference is taken.
AXES: dict[str, Predictor] = {name: AXIS_REGISTRY[name] for name in (
    "lstar", "lstar_per_byte", "bits_per_byte", "l_rel", "l_gain", "raw_ce", "log_params", "log_flops")}
AXIS_ORDER = tuple(AXES)
ERRORS = ("rmse", "crossing_error")
FIT_FAMILIES = ("isotonic", "sigmoid")
EXACT_MAX_FAMILIES = 16


@dataclass(frozen=True)
class ChoiceConfig:
    """Knobs of the axis choice (all recorded in its output)."""

    error: str = "rmse"               # the error the rule compares
    alpha: float = 0.05               # permutation test level
    interval: float = 0.95            # bootstrap interval level
    family_resamples: int = 200       # refit bootstrap over families
    permutations: int = 10_000        # Monte Carlo sign patterns when F > 16
    confidence: float = 0.9           # curve bands (Brier of the main LOFO)
    resamples: int = 200              # band bootstrap per LOFO fold
    seed: int = 0

    def check(self) -> None:
        if self.error not in ERRORS:
            raise CurveError(f"unknown error {self.error!r} for the axis choice", hint=f"choose from {', '.join(ERRORS)}")
        if not (0.0 < self.alpha < 1.0 and 0.0 < self.interval < 1.0 and 0.0 < self.confidence < 1.0):
            raise CurveError("alpha, interval and confidence must lie in (0, 1)")
        if self.family_resamples < 20 or self.permutations < 100 or self.resamples < 1:
            raise CurveError("use at least 20 family resamples and 100 permutations")


def rule_text(reference: str, cfg: ChoiceConfig) -> str:
    """The recommendation rule, as printed with every choice."""
    default = reference if reference == REFERENCE else (
        f"{REFERENCE}, here {reference} as no point has {REFERENCE}")
    return (f"default {default}; another axis is recommended only if its family-averaged LOFO "
            f"{cfg.error} is lower than {reference}'s with sign-flip permutation p < {cfg.alpha:g} over "
            f"families AND the {cfg.interval:.0%} refit-bootstrap interval of the difference wholly "
            f"below 0; among several, the largest improvement; ties stay {reference}")


def pair_rule_text(reference: str, cfg: ChoiceConfig, families: Sequence[str]) -> str:
    """How the (axis, fit family) pair is chosen, as printed and recorded with every choice."""
    if len(families) == 1:
        return f"fit family {families[0]} only; axis: {rule_text(reference, cfg)}"
    from monitor.curves.forward import TIE_TOLERANCE

    return (f"axis, within each fit family ({', '.join(families)}; the reference {reference} fitted with "
            f"the same family): {rule_text(reference, cfg)}. Family, between those winners: where the "
            f"labels order the models (by size, or lineage and step), the lowest forward mean absolute "
            f"error, a non-isotonic family only if below isotonic's by more than {TIE_TOLERANCE:.0%} of "
            f"it; otherwise a non-isotonic family only if its family-averaged LOFO {cfg.error} is lower "
            f"with sign-flip p < {cfg.alpha:g} and the {cfg.interval:.0%} family-bootstrap interval of the "
            f"difference wholly below 0; ties → isotonic")


def parse_fit_families(text: str | None) -> list[str]:
    """Fit family names from `all` or a comma-separated list, checked against the closed set."""
    if text is None or text.strip().lower() in ("", "all"):
        return list(FIT_FAMILIES)
    names = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [n for n in names if n not in FIT_FAMILIES]
    if unknown or not names:
        raise CurveError(f"unknown fit family {', '.join(map(repr, unknown)) or '(none)'} in --fit-families",
                         hint=f"choose from all, {', '.join(FIT_FAMILIES)}")
    return list(dict.fromkeys(names))


def parse_axes(text: str | None) -> list[str]:
    """Axis names from `all` or a comma-separated list, checked against the closed set."""
    if text is None or text.strip().lower() in ("", "all"):
        return list(AXIS_ORDER)
    names = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [n for n in names if n not in AXES]
    if unknown:
        raise CurveError(f"unknown axis {', '.join(map(repr, unknown))} in --axes",
                         hint=f"choose from all, {', '.join(AXIS_ORDER)}")
    return list(dict.fromkeys(names))


def axis_values(labels: Sequence[Label], axis: str) -> np.ndarray:
    """Each label's value on `axis` (NaN where it lacks one), read as every curve reads it
    (`monitor.curves.axes.label_point`: log_params / log_flops are log10 of the counts)."""
    out = np.full(len(labels), np.nan)
    for i, label in enumerate(labels):
        point = label_point(label, axis)
        if point is not None and math.isfinite(point[0]):
            out[i] = float(point[0])
    return out


# -- the family-level statistics ----------------------------------------------------------------
def sign_flip_pvalue(diffs: Sequence[float], *, permutations: int = 10_000, seed: int = 0,
                     exact_max: int = EXACT_MAX_FAMILIES) -> tuple[float, str]:
    """Two-sided sign-flip permutation p-value of mean(diffs) = 0, and how it was computed.

    Under the null each family's difference is as likely positive as negative. Exact for
    F ≤ `exact_max`: the share of all 2^F sign patterns (the observed one included) whose
    |mean| reaches the observed |mean|. Beyond, (1 + hits) / (1 + M) over M seeded patterns.
    """
    d = np.asarray(diffs, dtype=np.float64)
    f = len(d)
    if f == 0:
        return math.nan, "no families"
    observed = abs(float(d.mean()))
    tol = 1e-12 * max(1.0, float(np.abs(d).max()))   # equal means must count as reaching it
    if f <= exact_max:
        signs = np.array(list(itertools.product((1.0, -1.0), repeat=f)))
        means = np.abs(signs @ d) / f
        return float(np.mean(means >= observed - tol)), f"exact, all 2^{f} = {2 ** f} sign patterns"
    rng = np.random.default_rng(seed)
    signs = rng.choice((1.0, -1.0), size=(permutations, f))
    hits = int(np.sum(np.abs(signs @ d) / f >= observed - tol))
    return (1 + hits) / (1 + permutations), f"Monte Carlo, {permutations} seeded sign patterns"


def _family_errors(per_family: Sequence[dict[str, Any]], axis: str) -> dict[str, dict[str, float]]:
    return {r["family"]: r for r in per_family if r["predictor"] == axis}


def _interval(samples: Sequence[float], level: float) -> tuple[float | None, float | None]:
    s = np.asarray([v for v in samples if math.isfinite(v)])
    if len(s) == 0:
        return None, None
    lo, hi = np.quantile(s, [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(lo), float(hi)


def cluster_draw(families: np.ndarray, rng: np.random.Generator, *, sizes: np.ndarray | None = None,
                 seeds: np.ndarray | None = None) -> tuple[np.ndarray, dict[str, int]]:
    """Row multiplicities of one cluster-bootstrap draw, and how often each family was drawn.

    Families are drawn with replacement. With `seeds` (and optionally `sizes`), a second stage
    follows: for each drawn copy of a family, independently, its seeds are drawn with
    replacement within each of its sizes, whole lineages at a time; a row's multiplicity is the
    number of times its lineage was drawn over all copies. Without, every row of a family drawn
    k times has multiplicity k.
    """
    names = sorted(set(families.tolist()))
    drawn = rng.choice(len(names), size=len(names), replace=True)
    if seeds is None:
        counts = {names[i]: int(c) for i, c in zip(*np.unique(drawn, return_counts=True))}
        return np.array([counts.get(f, 0) for f in families], dtype=np.float64), counts
    size_of = np.zeros(len(families), dtype=np.int64) if sizes is None else sizes
    mult = np.zeros(len(families))
    counts = {}
    for i in drawn:
        fam = names[i]
        counts[fam] = counts.get(fam, 0) + 1
        in_fam = families == fam
        for size in sorted(set(size_of[in_fam].tolist())):
            cell = in_fam & (size_of == size)
            choices = np.unique(seeds[cell])
            for s in rng.choice(choices, size=len(choices), replace=True):
                mult[cell & (seeds == s)] += 1.0
    return mult, counts


def _weighted_family_errors(points: dict[str, np.ndarray], families: np.ndarray,
                            mult: np.ndarray) -> dict[str, dict[str, float]]:
    """Per family, the RMSE and crossing error of its held-out rows, each weighing its multiplicity."""
    out: dict[str, dict[str, float]] = {}
    idx = points["index"]
    for fam in sorted(set(families[idx].tolist())):
        js = np.flatnonzero(families[idx] == fam)
        w = mult[idx[js]]
        out[fam] = {"rmse": float(np.sqrt(np.average(points["sq_error"][js], weights=w))),
                    "crossing_error": float(np.average(points["wrong"][js], weights=w))}
    return out


def refit_bootstrap(values: np.ndarray, families: np.ndarray, weights: np.ndarray,
                    xs: dict[str, np.ndarray], predictors: dict[str, Predictor], *, baseline: float,
                    margin: float, reference: str, resamples: int, seed: Sequence[int], fold_seed: int,
                    confidence: float = 0.9, sizes: np.ndarray | None = None,
                    seeds: np.ndarray | None = None,
                    fit_family: str = "isotonic") -> tuple[dict[str, dict[str, list[float]]], int]:
    """Cluster bootstrap (`cluster_draw`) that refits the whole LOFO on every draw.

    Returns per axis and error the family-averaged error of every resample ("<error>") and its
    difference to the reference ("<error>_diff"), families weighted by how often they were
    drawn; and the number of draws left out (fewer than two distinct families). A family drawn
    k times is one fold whose rows weigh by their multiplicity (the same isotonic fit as that
    many copies), so it is never in its own training set. With the sigmoid, the folds of every
    draw are fitted in one call (`_sigmoid_refits`) before the draws are scored.
    """
    rng = np.random.default_rng([*seed, 7])
    out: dict[str, dict[str, list[float]]] = {a: {k: [] for e in ERRORS for k in (e, f"{e}_diff")} for a in xs}
    degenerate = 0
    draws = []
    for b in range(resamples):
        mult, counts = cluster_draw(families, rng, sizes=sizes, seeds=seeds)
        if len(counts) < 2:
            degenerate += 1
            continue
        rows = np.flatnonzero(mult > 0)
        # The band is not needed for RMSE and crossing error: one resample per fold.
        data = (values[rows], families[rows].tolist(), {a: (predictors[a], x[rows]) for a, x in xs.items()})
        stderr = (1.0 / np.sqrt(weights[rows] * mult[rows])).tolist()
        options = {"baseline": baseline, "margin": margin, "stderr": stderr, "confidence": confidence,
                   "resamples": 1, "seed": fold_seed + b}
        draws.append((mult, counts, rows, data, options))
    fits = _sigmoid_refits([(data, options) for *_, data, options in draws]) if fit_family == "sigmoid" \
        else [None] * len(draws)
    # An isotonic fold's prediction depends only on its rows and their weights (its seed moves
    # only the band, which RMSE and crossing error do not read), so draws with the same row
    # multiplicities have the same errors and are validated once. Few families make most draws
    # alike: with two, every draw that holds both is the same one.
    validated: dict[bytes, dict[str, dict[str, dict[str, float]]]] = {}
    for (mult, counts, rows, data, options), fitted in zip(draws, fits):
        per = validated.get(mult.tobytes()) if fit_family == "isotonic" else None
        if per is None:
            lofo = lofo_axes(*data, **options, fit_family=fit_family, fits=fitted)
            if seeds is None:   # every row of a family weighs alike: its plain LOFO errors
                per = {a: _family_errors(lofo.per_family, a) for a in xs}
            else:
                per = {a: _weighted_family_errors(p, families[rows], mult[rows]) for a, p in lofo.points.items()}
            validated[mult.tobytes()] = per
        ref = per.get(reference, {})
        for axis in xs:
            mine = per.get(axis, {})
            for e in ERRORS:
                fams = [f for f in mine if f in counts]
                w = np.array([counts[f] for f in fams], dtype=np.float64)
                out[axis][e].append(float(np.average([mine[f][e] for f in fams], weights=w))
                                    if fams else math.nan)
                both = [f for f in fams if f in ref]
                w = np.array([counts[f] for f in both], dtype=np.float64)
                out[axis][f"{e}_diff"].append(
                    float(np.average([mine[f][e] - ref[f][e] for f in both], weights=w)) if both else math.nan)
    return out, degenerate


# Draws whose sigmoid refits are fitted in one call (`_sigmoid_refits`): enough to fill the
# batches, few enough that their fitted curves (axes × families per draw) stay small.
_REFIT_DRAWS_AT_ONCE = 20


def _sigmoid_refits(draws: list[tuple[tuple[Any, ...], dict[str, Any]]]) -> list[dict[tuple[str, int], Any]]:
    """The sigmoid folds of every draw's validation (`lofo_axes` arguments), fitted together so
    that their solves share batches (`fit_sigmoid_bands`); per draw its fits by (axis, family)."""
    from monitor.curves.parametric import fit_sigmoid_bands

    out = []
    for first in range(0, len(draws), _REFIT_DRAWS_AT_ONCE):   # the fits of a few draws held at once
        keyed = [sigmoid_fold_requests(*data, **options) for data, options in draws[first:first + _REFIT_DRAWS_AT_ONCE]]
        fitted = iter(fit_sigmoid_bands([request for pairs in keyed for _, request in pairs]))
        out.extend({key: next(fitted) for key, _ in pairs} for pairs in keyed)
    return out


# -- the choice ----------------------------------------------------------------------------------
def choose_axis(labels: Sequence[Label], *, baseline: float, margin: float,
                axes: Sequence[str] | None = None, config: ChoiceConfig | None = None,
                task: str | None = None, metric: str | None = None,
                fit_families: Sequence[str] = ("isotonic",)) -> dict[str, Any]:
    """Validate every available axis leave-one-family-out, with each fit family in
    `fit_families`; recommend an (axis, family) pair by `pair_rule_text`.

    Returns a JSON-ready dict (no NaN): the task, the reference axis (and why, if not L*), the
    axis rule text, the recommended axis and family, per axis (of the first family, `axes`; of
    every family, `axes_by_family`) its pooled LOFO errors, family-level intervals, per-family
    errors and its comparison with the reference; and `choice`, the record a curve artifact
    stores: {axis, family, rule, decided_by, reason, candidates: one row per (axis, family)}.
    """
    cfg = config or ChoiceConfig()
    cfg.check()
    families_compared = list(dict.fromkeys(fit_families))
    unknown = [f for f in families_compared if f not in FIT_FAMILIES]
    if not families_compared or unknown:
        raise CurveError(f"unknown fit family {', '.join(map(repr, unknown)) or '(none given)'} for the axis choice",
                         hint=f"choose from {', '.join(FIT_FAMILIES)}")
    labels = list(labels)
    if not labels:
        raise LabelError("no labels to choose an axis on")
    if any(label.family is None for label in labels):
        raise LabelError("choosing an axis needs a family on every row",
                         hint="add a `family` column (e.g. the tokenizer or model series)")
    names = list(axes) if axes is not None else list(AXIS_ORDER)
    for name in names:
        if name not in AXES:
            raise CurveError(f"unknown axis {name!r}", hint=f"choose from {', '.join(AXIS_ORDER)}")
    values = np.array([label.value for label in labels], dtype=np.float64)
    families = np.array([str(label.family) for label in labels], dtype=object)
    weights, _ = label_weights(values, [label.n for label in labels], [label.stderr for label in labels])
    xs = {a: axis_values(labels, a) for a in AXIS_ORDER if a in names or a == REFERENCE}
    have = {a: np.isfinite(x) for a, x in xs.items()}
    available = [a for a in AXIS_ORDER if a in xs and have[a].any()]
    if not available:
        raise LabelError(f"no point has a value on any of the axes {', '.join(names)}")
    reference = REFERENCE if REFERENCE in available else available[0]
    reference_note = None if reference == REFERENCE else (
        f"no point has L*; {AXES[reference].label} ({reference}) is the reference instead")
    rule = rule_text(reference, cfg)
    base: dict[str, Any] = {"task": task, "metric": metric, "baseline": baseline, "margin": margin,
                            "level": baseline + margin, "n_points": len(labels),
                            "families": sorted(set(families.tolist())), "reference": reference,
                            "reference_note": reference_note, "error": cfg.error, "rule": rule,
                            "config": asdict(cfg)}
    tables: dict[str, list[dict[str, Any]]] = {}
    picks: dict[str, tuple[str, str]] = {}
    for fit_family in families_compared:
        tables[fit_family], picks[fit_family] = _axis_table(
            labels, values, families, weights, xs, have, available, names, reference,
            baseline=baseline, margin=margin, cfg=cfg, fit_family=fit_family)
    first = families_compared[0]
    choice = _choose_pair(labels, tables, picks, reference=reference, baseline=baseline, margin=margin,
                          cfg=cfg, task=task, metric=metric)
    return finite_json({**base, "recommended": choice["axis"], "recommended_reason": choice["reason"],
                        "recommended_family": choice["family"], "fit_families": list(families_compared),
                        "axes": tables[first], "axes_by_family": tables, "choice": choice})


def _axis_table(labels: list[Label], values: np.ndarray, families: np.ndarray, weights: np.ndarray,
                xs: dict[str, np.ndarray], have: dict[str, np.ndarray], available: list[str], names: list[str],
                reference: str, *, baseline: float, margin: float, cfg: ChoiceConfig,
                fit_family: str) -> tuple[list[dict[str, Any]], tuple[str, str]]:
    """The axis table of one fit family (every axis fitted with that family, the reference too)
    and the axis `rule_text` recommends within it, with the reason."""
    rows: dict[str, dict[str, Any]] = {}
    for g, (mask, members) in enumerate(_groups_sharing_points(available, have, reference)):
        group_axes = list(dict.fromkeys([reference, *members]))
        idx = np.flatnonzero(mask)
        fam = families[idx]
        if len(set(fam.tolist())) < 2:
            for a in members:
                rows[a] = {"axis": a, "available": False,
                           "reason": f"its {len(idx)} point(s) with {reference} are of one family; "
                                     "leave-one-family-out needs two"}
            continue
        lofo = lofo_axes(values[idx], fam.tolist(), {a: (AXES[a], xs[a][idx]) for a in group_axes},
                         baseline=baseline, margin=margin, n=[labels[i].n for i in idx],
                         stderr=[labels[i].stderr for i in idx], confidence=cfg.confidence,
                         resamples=cfg.resamples, seed=cfg.seed, fit_family=fit_family)
        boot, degenerate = refit_bootstrap(values[idx], fam, weights[idx], {a: xs[a][idx] for a in group_axes},
                                           AXES, baseline=baseline, margin=margin, reference=reference,
                                           resamples=cfg.family_resamples, seed=[cfg.seed + g],
                                           fold_seed=cfg.seed, confidence=cfg.confidence,
                                           fit_family=fit_family)
        pooled = {r.predictor: r for r in lofo.rows}
        ref_fam = _family_errors(lofo.per_family, reference)
        for a in members:
            if a not in pooled:
                rows[a] = {"axis": a, "available": False,
                           "reason": "; ".join(f"{k}: {v}" for k, v in lofo.skipped.items()
                                               if k.split(":")[0] == a) or "no fold could be fitted"}
                continue
            mine = _family_errors(lofo.per_family, a)
            missing = sorted({labels[i].checkpoint for i in np.flatnonzero(~mask)})
            note = None
            if missing:
                need = a if a == reference else f"both {a} and {reference}"
                note = (f"validated only on the {len(idx)} of {len(labels)} points with {need} "
                        f"(without: {', '.join(missing[:8])}{', …' if len(missing) > 8 else ''})")
            row: dict[str, Any] = {
                "axis": a, "label": AXES[a].label, "available": True, "n_points": len(idx),
                "note": note, "families": sorted(set(fam.tolist())), "n_folds": pooled[a].n_folds,
                "rmse": pooled[a].rmse, "crossing_error": pooled[a].crossing_error, "brier": pooled[a].brier,
                "extrapolated": pooled[a].extrapolated,
                "per_family": [{k: mine[f][k] for k in ("family", "n", "rmse", "crossing_error", "brier")}
                               for f in sorted(mine)],
                "skipped": {k: v for k, v in lofo.skipped.items() if k.split(":")[0] == a},
                "bootstrap": {"resamples": cfg.family_resamples, "left_out": degenerate,
                              "level": cfg.interval},
            }
            for e in ERRORS:
                per = [mine[f][e] for f in sorted(mine)]
                lo, hi = _interval(boot[a][e], cfg.interval)
                row[f"family_{e}"] = {"mean": float(np.mean(per)), "lower": lo, "upper": hi}
            row["vs_reference"] = None if a == reference else _against_reference(mine, ref_fam, boot[a],
                                                                                 reference=reference, cfg=cfg)
            rows[a] = row
    for a in names:
        if a not in rows:
            rows[a] = {"axis": a, "available": False,
                       "reason": "no point has it" if a not in available
                       else f"no point has both it and the reference {reference}"}
    table = [rows[a] for a in AXIS_ORDER if a in rows and (a in names or a == reference)]
    for r in table:
        if r.get("available"):
            r["fit_family"] = fit_family
    return table, _recommended_axis(table, reference=reference, cfg=cfg)


def _groups_sharing_points(available: list[str], have: dict[str, np.ndarray],
                           reference: str) -> list[tuple[np.ndarray, list[str]]]:
    """Axes sharing one set of usable points (those with both the axis and the reference), with
    that set: each group is validated together, paired on the same folds and family draws."""
    groups: dict[bytes, list[str]] = {}
    masks: dict[bytes, np.ndarray] = {}
    for a in available:
        mask = have[a] & have[reference]
        if mask.any():
            groups.setdefault(mask.tobytes(), []).append(a)
            masks[mask.tobytes()] = mask
    return [(masks[key], members) for key, members in groups.items()]


def _against_reference(mine: dict[str, dict[str, Any]], ref_fam: dict[str, dict[str, Any]],
                       boot: dict[str, Any], *, reference: str, cfg: ChoiceConfig) -> dict[str, Any]:
    """One axis against the reference on the families both were validated on: per error, the
    family-paired difference with its sign-flip p-value and refit-bootstrap interval, and whether
    it is better by the rule (lower, significant at alpha, interval below zero)."""
    both = sorted(set(mine) & set(ref_fam))
    comparison: dict[str, Any] = {"reference": reference, "n_families": len(both)}
    for e in ERRORS:
        d = [mine[f][e] - ref_fam[f][e] for f in both]
        p, how = sign_flip_pvalue(d, permutations=cfg.permutations, seed=cfg.seed)
        lo, hi = _interval(boot[f"{e}_diff"], cfg.interval)
        comparison[e] = {"difference": float(np.mean(d)) if d else None, "lower": lo,
                         "upper": hi, "p_value": p, "permutation": how,
                         # the reference's own family mean on these points and folds
                         "reference_mean": float(np.mean([ref_fam[f][e] for f in both]))
                         if both else None}
    c = comparison[cfg.error]
    comparison["better_by_rule"] = bool(
        c["difference"] is not None and c["difference"] < 0 and math.isfinite(c["p_value"])
        and c["p_value"] < cfg.alpha and c["upper"] is not None and c["upper"] < 0)
    return comparison


def _recommended_axis(table: list[dict[str, Any]], *, reference: str, cfg: ChoiceConfig) -> tuple[str, str]:
    """The axis better than the reference by the rule with the largest improvement, else the
    reference, with the reason in one line."""
    winners = [r for r in table if r.get("available") and r.get("vs_reference")
               and r["vs_reference"]["better_by_rule"]]
    if not winners:
        return reference, f"no axis is better than {reference} by the rule"
    best = min(winners, key=lambda r: r["vs_reference"][cfg.error]["difference"])
    c = best["vs_reference"][cfg.error]
    return best["axis"], (f"{best['axis']} beats {reference} on family-averaged LOFO {cfg.error} by "
                          f"{-c['difference']:.4g} (p = {c['p_value']:.3g}, {cfg.interval:.0%} interval "
                          f"[{c['lower']:.4g}, {c['upper']:.4g}])")



def _candidates(tables: dict[str, list[dict[str, Any]]], picks: dict[str, tuple[str, str]],
                error: str) -> list[dict[str, Any]]:
    """One row per validated (axis, fit family): its LOFO errors and its comparison with the
    reference fitted with the same family."""
    out = []
    for fam, table in tables.items():
        for r in table:
            if not r.get("available"):
                continue
            v = r.get("vs_reference")
            out.append({"axis": r["axis"], "family": fam, "n_points": r["n_points"], "rmse": r["rmse"],
                        "crossing_error": r["crossing_error"], "family_error": r[f"family_{error}"]["mean"],
                        "difference": v[error]["difference"] if v else None,
                        "p_value": v[error]["p_value"] if v else None,
                        "better_by_rule": v["better_by_rule"] if v else None,
                        "axis_pick": picks[fam][0] == r["axis"],
                        "forward_mae": None, "forward_coverage": None, "forward_note": None})
    return out


def _forward_errors(labels: list[Label], candidates: list[dict[str, Any]], *, baseline: float, margin: float,
                    cfg: ChoiceConfig, task: str | None, metric: str | None) -> tuple[str | None, dict[tuple[str, str], dict[str, Any]]]:
    """Forward validation (`monitor.curves.forward`) of every candidate pair, where the labels
    order the models; (ordering or None, {(axis, family): its record of that family})."""
    from monitor.curves.fit import fit_curve
    from monitor.curves.forward import forward_validate, splits

    try:
        ordering, _ = splits(labels)
    except (LabelError, CurveError):
        return None, {}
    task = task if task is not None else labels[0].task
    metric = metric if metric is not None else labels[0].metric
    records: dict[tuple[str, str], dict[str, Any]] = {}
    for c in candidates:
        try:
            record = forward_validate(labels, fit=fit_curve, task=str(task), metric=metric, baseline=baseline,
                                      margin=margin, confidence=cfg.confidence, axis=c["axis"],
                                      ordering=ordering, families=(c["family"],),
                                      resamples=max(cfg.resamples, 50), seed=cfg.seed)
        except (LabelError, CurveError) as exc:
            c["forward_note"] = exc.message
            continue
        row = record["families"][c["family"]]
        c["forward_mae"], c["forward_coverage"] = row["mae"], row["coverage"]
        if row["mae"] is None:
            c["forward_note"] = "no split could be fitted"
        records[(c["axis"], c["family"])] = {**record, "chosen": c["family"]}
    return ordering, records


def _family_bootstrap(diffs: Sequence[float], cfg: ChoiceConfig) -> tuple[float | None, float | None]:
    """Percentile interval of the mean per-family difference, families drawn with replacement."""
    d = np.asarray(diffs, dtype=np.float64)
    if len(d) == 0:
        return None, None
    rng = np.random.default_rng([cfg.seed, 11])
    means = d[rng.integers(0, len(d), size=(cfg.family_resamples, len(d)))].mean(axis=1)
    return _interval(means.tolist(), cfg.interval)


def _choose_pair(labels: list[Label], tables: dict[str, list[dict[str, Any]]], picks: dict[str, tuple[str, str]],
                 *, reference: str, baseline: float, margin: float, cfg: ChoiceConfig, task: str | None,
                 metric: str | None) -> dict[str, Any]:
    """The (axis, family) pair by `pair_rule_text`: each family's axis by the axis rule, then the
    family between those winners by forward validation where possible, else by LOFO."""
    from monitor.curves.forward import TIE_TOLERANCE

    fams = list(tables)
    candidates = _candidates(tables, picks, cfg.error)
    rule = pair_rule_text(reference, cfg, fams)
    if len(fams) == 1:
        axis, reason = picks[fams[0]]
        return {"axis": axis, "family": fams[0], "rule": rule, "decided_by": "leave-one-family-out",
                "reason": reason, "ordering": None, "candidates": candidates, "forward": None}
    ordering, records = _forward_errors(labels, candidates, baseline=baseline, margin=margin, cfg=cfg,
                                        task=task, metric=metric)
    winners = {f: next((c for c in candidates if c["family"] == f and c["axis"] == picks[f][0]), None)
               for f in fams}
    default = "isotonic" if "isotonic" in fams else fams[0]
    base = winners[default]
    chosen, decided_by, why = default, None, ""
    forward_ok = {f: w for f, w in winners.items() if w is not None and w["forward_mae"] is not None}
    if ordering is not None and forward_ok:
        decided_by = f"forward validation by {ordering}"
        if default not in forward_ok:
            chosen = min(forward_ok, key=lambda f: forward_ok[f]["forward_mae"])
            why = f"{default} could not be forward-validated; {chosen} has the lowest forward mean absolute error"
        else:
            ref_mae = forward_ok[default]["forward_mae"]
            others = [f for f in forward_ok if f != default]
            best = min(others, key=lambda f: forward_ok[f]["forward_mae"]) if others else None
            if best is not None and forward_ok[best]["forward_mae"] < ref_mae * (1.0 - TIE_TOLERANCE):
                chosen = best
                why = (f"predicting the larger (later) models from the smaller (earlier) ones, {best} on "
                       f"{picks[best][0]} misses by {forward_ok[best]['forward_mae']:.4g} on average against "
                       f"{default} on {picks[default][0]}'s {ref_mae:.4g}, better by more than "
                       f"{TIE_TOLERANCE:.0%}")
            elif best is not None:
                why = (f"predicting the larger (later) models from the smaller (earlier) ones, {best} on "
                       f"{picks[best][0]} misses by {forward_ok[best]['forward_mae']:.4g} on average against "
                       f"{default} on {picks[default][0]}'s {ref_mae:.4g}, not better by more than "
                       f"{TIE_TOLERANCE:.0%}, so {default} stays")
            else:
                why = f"only {default} could be forward-validated"
    else:
        decided_by = "leave-one-family-out"
        lead = "the labels give no model order for forward validation" if ordering is None else \
            "forward validation fitted no winner"
        why = f"{lead}; {default} stays unless another family is better by the LOFO rule"
        mine = {p["family"]: p for r in tables[default] if r.get("axis") == picks[default][0]
                for p in r.get("per_family", [])} if base is not None else {}
        best_gain = 0.0
        for f in fams:
            w = winners[f]
            if f == default or w is None or not mine:
                continue
            theirs = {p["family"]: p for r in tables[f] if r.get("axis") == w["axis"] for p in r.get("per_family", [])}
            both = sorted(set(mine) & set(theirs))
            d = [theirs[k][cfg.error] - mine[k][cfg.error] for k in both]
            if not d:
                continue
            p, _ = sign_flip_pvalue(d, permutations=cfg.permutations, seed=cfg.seed)
            lo, hi = _interval([], cfg.interval) if len(d) < 2 else _family_bootstrap(d, cfg)
            mean = float(np.mean(d))
            w["vs_default"] = {"difference": mean, "lower": lo, "upper": hi, "p_value": p, "n_families": len(d)}
            if mean < 0 and math.isfinite(p) and p < cfg.alpha and hi is not None and hi < 0 and -mean > best_gain:
                best_gain, chosen = -mean, f
                why = (f"across {len(d)} held-out families {f} on {w['axis']} has a family-averaged "
                       f"{cfg.error} lower than {default} on {picks[default][0]}'s by {-mean:.4g} "
                       f"(p = {p:.3g}, interval [{lo:.4g}, {hi:.4g}])")
            elif chosen == default:
                why += (f"; {f} on {w['axis']} differs by {mean:+.4g} (p = {p:.3g}), not better by the rule")
    axis = picks[chosen][0]
    forward = records.get((axis, chosen))
    reason = f"{chosen} on {axis}: {why}. Axis within {chosen}: {picks[chosen][1]}"
    return {"axis": axis, "family": chosen, "rule": rule, "decided_by": decided_by, "reason": reason,
            "ordering": ordering, "candidates": candidates, "forward": forward}


def finite_json(value: Any) -> Any:
    """NaN and ±inf become None, numpy scalars plain numbers (strict JSON)."""
    if isinstance(value, dict):
        return {str(k): finite_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_json(v) for v in value]
    if isinstance(value, (np.floating, float)):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.bool_):
        return bool(value)
    return value


# -- rendering -----------------------------------------------------------------------------------
def _g(v: float | None, digits: int = 3) -> str:
    return "—" if v is None else f"{v:.{digits}g}"


def choice_markdown(choice: dict[str, Any]) -> str:
    """The axis table of one task in Markdown, with the recommendation and its rule."""
    e = choice["error"]
    lines = [(f"| axis | points | LOFO RMSE | family RMSE [interval] | crossing error [interval] | "
              f"Δ{e} vs {choice['reference']} [interval] | p |"),
             "|---|---:|---:|---:|---:|---:|---:|"]
    notes: list[str] = []
    absent = [r["axis"] for r in choice["axes"] if not r["available"] and r["reason"] == "no point has it"]
    for r in choice["axes"]:
        if not r["available"]:
            if r["axis"] not in absent:
                notes.append(f"- {r['axis']}: not validated ({r['reason']})")
            continue
        fr, fc, v = r["family_rmse"], r["family_crossing_error"], r["vs_reference"]
        diff = "—" if v is None else (f"{_g(v[e]['difference'])} [{_g(v[e]['lower'])}, {_g(v[e]['upper'])}]")
        p = "—" if v is None else _g(v[e]["p_value"])
        lines.append(f"| {r['axis']} | {r['n_points']} | {_g(r['rmse'], 4)} | {_g(fr['mean'])} "
                     f"[{_g(fr['lower'])}, {_g(fr['upper'])}] | {_g(fc['mean'])} [{_g(fc['lower'])}, "
                     f"{_g(fc['upper'])}] | {diff} | {p} |")
        if r.get("note"):
            notes.append(f"- {r['axis']}: {r['note']}")
    if absent:
        notes.append(f"- no point has {', '.join(absent)}")
    lines += [""] + notes + ([""] if notes else [])
    if choice.get("reference_note"):
        lines += [f"Reference: {choice['reference_note']}.", ""]
    pair = choice.get("choice")
    if pair is not None and len(choice.get("fit_families", [])) > 1:
        lines += [candidates_markdown(pair), ""]
        lines += [f"Chosen: **{pair['axis']} with the {pair['family']} fit** ({pair['reason']}).", "",
                  f"Rule: {pair['rule']}."]
    else:
        lines += [f"Recommended axis: **{choice['recommended']}** ({choice['recommended_reason']}).", "",
                  f"Rule: {choice['rule']}."]
    return "\n".join(lines) + "\n"


def candidates_markdown(pair: dict[str, Any]) -> str:
    """The (axis, fit family) candidates of a choice in Markdown: LOFO and forward errors; the
    rows each family's axis rule picked are marked, the chosen pair in bold."""
    lines = ["| axis | family | points | LOFO RMSE | crossing error | family error | Δ vs reference | p | "
             "forward MAE | forward cover | |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for c in pair.get("candidates", []):
        chosen = c["axis"] == pair["axis"] and c["family"] == pair["family"]
        mark = "chosen" if chosen else ("axis pick" if c.get("axis_pick") else "")
        cover = "—" if c.get("forward_coverage") is None else f"{c['forward_coverage']:.0%}"
        name = f"**{c['axis']}**" if chosen else c["axis"]
        lines.append(f"| {name} | {c['family']} | {c['n_points']} | {_g(c['rmse'], 4)} | "
                     f"{_g(c['crossing_error'])} | {_g(c['family_error'])} | {_g(c.get('difference'))} | "
                     f"{_g(c.get('p_value'))} | {_g(c.get('forward_mae'))} | {cover} | {mark} |")
    return "\n".join(lines) + "\n"
