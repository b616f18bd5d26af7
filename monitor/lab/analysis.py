"""The race between progress axes: which one transfers a task threshold to a family it has not seen?

Input: race rows (`monitor.lab.records.race_rows`, docs/lab.md "Pre-registration (v2)"), one
per (checkpoint, evaluation text), each with its family (tokenizer), model size, seed, the
checkpoint's values on every progress axis measured on that text, and its task metrics.
The family is the unit of analysis, because a threshold has to transfer to a new family:

- leave-one-family-out (LOFO) with the curve code (`monitor.curves.validation.lofo_axes`,
  the same fit, weights and folds on every axis): each family's RMSE and threshold-crossing
  error, pooled over its sizes and seeds, and split by size;
- per axis, the family-averaged difference of its error to L*'s (negative: the axis erred
  less), an exact sign-flip permutation test of it over families
  (`monitor.curves.axis_choice.sign_flip_pvalue`: all 2^F patterns up to 16 families,
  seeded Monte Carlo beyond), Holm's adjustment across the secondary comparisons;
- a two-stage cluster bootstrap that refits the whole LOFO on every resample
  (`monitor.curves.axis_choice.refit_bootstrap`): families are drawn with replacement, then,
  independently for each drawn copy, seeds with replacement within each of its sizes. A
  family drawn k times is one fold whose rows weigh by their multiplicity, so it never trains
  on itself;
- per axis, the spread of the per-family thresholds against their own intervals: Cochran's Q
  (and its chi-squared p-value) and the DerSimonian–Laird between-family variance τ²;
- a negative control: leave-one-size-out on bytes seen, which should not transfer now that
  the schedule and budgets make bytes seen a poor clock across sizes.

`race(rows, cfg)` returns all of it as strict JSON (no NaN), with the verdict of the rule
written in docs/lab.md before the full run (`RULE`). The rule never concludes "equivalent":
when its conditions are not all met the verdict is "not distinguishable".
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from scipy.stats import chi2, norm

from monitor.curves.axis_choice import EXACT_MAX_FAMILIES, _interval, finite_json, refit_bootstrap, sign_flip_pvalue
from monitor.curves.stats import Predictor, fit_monotone
from monitor.curves.validation import lofo_axes
from monitor.errors import CurveError, LabelError, LabError

# The axes raced, in table order (name -> how the curve code reads it).
AXES: dict[str, Predictor] = {
    "lstar": Predictor("lstar", "L*", "lstar", lower_is_progress=True),
    "lstar_oos": Predictor("lstar_oos", "L* (out-of-sample unigram)", "lstar_oos", lower_is_progress=True),
    "bits_per_byte": Predictor("bits_per_byte", "bits/byte", "bits_per_byte", lower_is_progress=True),
    "raw_ce": Predictor("raw_ce", "raw CE", "raw_ce", lower_is_progress=True),
    "l_rel": Predictor("l_rel", "L_rel", "l_rel", lower_is_progress=True),
    "l_gain": Predictor("l_gain", "L_gain", "l_gain", lower_is_progress=False),
    "bpb_minus_unigram": Predictor("bpb_minus_unigram", "bits/byte − unigram bits/byte", "bpb_minus_unigram",
                                   lower_is_progress=True),
    # Not a loss: how far training got.
    "bytes_seen": Predictor("bytes_seen", "bytes seen", "bytes_seen", lower_is_progress=False),
}
REFERENCE = "lstar"
TEXTS = ("calib", "heldout")
ERRORS = ("rmse", "crossing_error")
# The pre-registered primary comparison (docs/lab.md, "Pre-registration (v2)").
PRIMARY = {"task": "add-words", "metric": "exact_match", "axis": "bits_per_byte", "reference": REFERENCE,
           "error": "crossing_error", "text": "calib"}
RULE = ("Primary: L* against bits/byte on the family-averaged leave-one-family-out threshold-crossing "
        "error of add-words exact match, on calib-v0. Secondary: every other axis against L*, on every "
        "task metric (same error and text), Holm-adjusted across them. 'Axis A transfers better than B' "
        "only if the sign-flip permutation p over families (Holm-adjusted for secondaries) is below "
        "{alpha:g}, the {interval:.0%} two-stage refit-bootstrap interval of the family-averaged "
        "difference excludes zero, and the difference has the same sign on both evaluation texts "
        "(calib and heldout) and within each model size on both. Otherwise: not distinguishable.")
MAX_ROWS = 200_000
SCHEMA = "lstar-lab-race/1"


@dataclass(frozen=True)
class RaceConfig:
    """Knobs of the race (all recorded in its output)."""

    margin: float = 0.1               # ε above the task metric's baseline: the level b + ε
    alpha: float = 0.05               # level of the rule's permutation test
    interval: float = 0.95            # level of the refit-bootstrap interval
    resamples: int = 200              # two-stage refit-bootstrap resamples
    permutations: int = 10_000        # Monte Carlo sign patterns beyond 16 families
    threshold_confidence: float = 0.9  # per-family threshold intervals (for Q and τ²)
    threshold_resamples: int = 100    # bootstrap resamples of each per-family threshold
    bootstrap_texts: tuple[str, ...] = ("calib",)   # the texts whose intervals the rule reads
    axes: tuple[str, ...] = tuple(AXES)              # the axes raced (L* always)
    seed: int = 0

    def check(self) -> None:
        if not 0.0 < self.margin < 1.0:
            raise CurveError(f"the margin ε must lie in (0, 1), got {self.margin}")
        for name in ("alpha", "interval", "threshold_confidence"):
            if not 0.0 < getattr(self, name) < 1.0:
                raise CurveError(f"{name} must lie in (0, 1), got {getattr(self, name)}")
        if self.resamples < 20 or self.permutations < 100 or self.threshold_resamples < 20:
            raise CurveError("use at least 20 refit resamples, 100 permutations and 20 threshold resamples")
        unknown = [t for t in self.bootstrap_texts if t not in TEXTS]
        if unknown:
            raise CurveError(f"unknown evaluation text {unknown[0]!r}", hint=f"choose from {', '.join(TEXTS)}")
        unknown = [a for a in self.axes if a not in AXES]
        if unknown:
            raise CurveError(f"unknown axis {unknown[0]!r}", hint=f"choose from {', '.join(AXES)}")


# -- rows -----------------------------------------------------------------------------------------
def _where(i: int, key: str) -> str:
    return f"race row {i}: {key}"


def _finite(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(float(value)) \
            or abs(float(value)) > 1e18:
        raise LabError(f"{where} is {value!r}, not a finite number", hint="regenerate the lab rows")
    return float(value)


def check_rows(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Validate race rows: the keys of docs/lab.md, finite numbers, known texts, each
    (family, size, seed, step, text) once. Returns plain copies; raises one LabError line."""
    if not isinstance(rows, Sequence) or isinstance(rows, (str, bytes)):
        raise LabError("the race rows must be a list of objects")
    if not rows:
        raise LabError("there are no race rows", hint="run the lab first")
    if len(rows) > MAX_ROWS:
        raise LabError(f"{len(rows)} race rows; the race takes at most {MAX_ROWS}")
    out, seen = [], set()
    for i, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise LabError(f"race row {i} is not an object")
        for key in ("family", "size", "seed", "step", "bytes_seen", "text", "axes", "metrics", "baselines"):
            if key not in row:
                raise LabError(f"race row {i} has no {key!r}", hint="rows need the keys docs/lab.md lists")
        for key in ("family", "size"):
            if not isinstance(row[key], str) or not 0 < len(row[key]) <= 100:
                raise LabError(f"{_where(i, key)} must be a name of 1 to 100 characters")
        if row["text"] not in TEXTS:
            raise LabError(f"{_where(i, 'text')} is {row['text']!r}", hint=f"use one of {', '.join(TEXTS)}")
        for key in ("seed", "step"):
            if isinstance(row[key], bool) or not isinstance(row[key], int) or not 0 <= row[key] < 10**18:
                raise LabError(f"{_where(i, key)} must be an integer in [0, 1e18)")
        axes = row["axes"]
        if not isinstance(axes, Mapping):
            raise LabError(f"{_where(i, 'axes')} must be an object")
        clean_axes = {a: _finite(v, _where(i, f"axes.{a}")) for a, v in axes.items() if v is not None}
        clean_axes.setdefault("bytes_seen", _finite(row["bytes_seen"], _where(i, "bytes_seen")))
        metrics: dict[str, dict[str, float]] = {}
        baselines: dict[str, dict[str, float]] = {}
        for part, target in (("metrics", metrics), ("baselines", baselines)):
            if not isinstance(row[part], Mapping):
                raise LabError(f"{_where(i, part)} must be an object of tasks")
            for task, values in row[part].items():
                if not isinstance(values, Mapping):
                    raise LabError(f"{_where(i, f'{part}.{task}')} must be an object of metrics")
                target[str(task)] = {str(m): _finite(v, _where(i, f"{part}.{task}.{m}"))
                                     for m, v in values.items() if v is not None}
        key = (row["family"], row["size"], row["seed"], row["step"], row["text"])
        if key in seen:
            raise LabError(f"race row {i}: family {key[0]!r} size {key[1]!r} seed {key[2]} step {key[3]} "
                           f"text {key[4]!r} is listed more than once")
        seen.add(key)
        out.append({"family": row["family"], "size": row["size"], "seed": int(row["seed"]),
                    "step": int(row["step"]), "text": row["text"], "axes": clean_axes,
                    "metrics": metrics, "baselines": baselines})
    return out


def _task_metrics(rows: Sequence[Mapping[str, Any]]) -> list[tuple[str, str]]:
    pairs = {(t, m) for r in rows for t, ms in r["metrics"].items() for m in ms}
    return sorted(pairs)


@dataclass
class _Data:
    """One task metric on one text: the rows' values, families, sizes, lineages and axes."""

    y: np.ndarray
    family: np.ndarray
    size: np.ndarray
    seed: np.ndarray
    xs: dict[str, np.ndarray]
    missing: dict[str, int]


def _data(rows: Sequence[Mapping[str, Any]], task: str, metric: str, text: str,
          axes: Sequence[str] = tuple(AXES)) -> _Data:
    chosen = [r for r in rows if r["text"] == text and metric in r["metrics"].get(task, {})]
    xs, missing = {}, {}
    for a in AXES:
        if a not in axes and a != REFERENCE:
            continue
        have = [a in r["axes"] for r in chosen]
        if chosen and all(have):
            xs[a] = np.array([r["axes"][a] for r in chosen], dtype=np.float64)
        else:
            missing[a] = len(chosen) - sum(have)
    return _Data(y=np.array([r["metrics"][task][metric] for r in chosen], dtype=np.float64),
                 family=np.array([r["family"] for r in chosen], dtype=object),
                 size=np.array([r["size"] for r in chosen], dtype=object),
                 seed=np.array([r["seed"] for r in chosen], dtype=np.int64), xs=xs, missing=missing)


def _baseline(rows: Sequence[Mapping[str, Any]], task: str, metric: str) -> float:
    found = {r["baselines"].get(task, {}).get(metric) for r in rows if metric in r["metrics"].get(task, {})}
    if None in found:
        raise LabError(f"task {task!r} metric {metric!r}: some race rows have no baseline",
                       hint="every row needs baselines[task][metric] (0 for exact match)")
    if len(found) != 1:
        raise LabError(f"task {task!r} metric {metric!r}: the rows disagree on the baseline ({sorted(found)})",
                       hint="every checkpoint of a task must be scored on the same items")
    return float(found.pop())


# -- statistics -----------------------------------------------------------------------------------
def holm(pvalues: Mapping[str, float | None]) -> dict[str, float | None]:
    """Holm's step-down adjustment: the i-th smallest of m p-values becomes
    max over j ≤ i of min(1, (m − j + 1)·p_(j)). Missing p-values are not counted in m."""
    named = sorted(((p, k) for k, p in pvalues.items() if p is not None and math.isfinite(p)))
    m = len(named)
    out: dict[str, float | None] = {k: None for k in pvalues}
    running = 0.0
    for j, (p, k) in enumerate(named):
        running = max(running, min(1.0, (m - j) * p))
        out[k] = running
    return out


def cochran_q(estimates: Sequence[float], ses: Sequence[float]) -> dict[str, Any]:
    """Cochran's Q of estimates against their standard errors, its chi-squared p-value
    (k − 1 degrees of freedom), the DerSimonian–Laird τ² and I²."""
    t = np.asarray(estimates, dtype=np.float64)
    s = np.asarray(ses, dtype=np.float64)
    k = len(t)
    if k < 2:
        return {"k": k, "q": None, "df": None, "p_value": None, "tau2": None, "i2": None, "pooled": None}
    w = 1.0 / s ** 2
    pooled = float(np.sum(w * t) / np.sum(w))
    q = float(np.sum(w * (t - pooled) ** 2))
    df = k - 1
    c = float(np.sum(w) - np.sum(w ** 2) / np.sum(w))
    tau2 = max(0.0, (q - df) / c) if c > 0 else 0.0
    return {"k": k, "q": q, "df": df, "p_value": float(chi2.sf(q, df)), "tau2": tau2,
            "i2": max(0.0, (q - df) / q) if q > 0 else 0.0, "pooled": pooled}


def _lofo(d: _Data, rows: np.ndarray, mult: np.ndarray | None, *, baseline: float, margin: float,
          seed: int, groups: np.ndarray | None = None) -> Any:
    """One LOFO (or leave-one-size-out with `groups`) on `rows`, weighted by `mult`."""
    groups = d.family if groups is None else groups
    stderr = None if mult is None else (1.0 / np.sqrt(mult)).tolist()
    # The band is not needed for RMSE and crossing error: one band resample per fold.
    return lofo_axes(d.y[rows], groups[rows].tolist(), {a: (AXES[a], x[rows]) for a, x in d.xs.items()},
                     baseline=baseline, margin=margin, stderr=stderr, resamples=1, seed=seed)


def _cell_errors(points: Mapping[str, np.ndarray], keys: np.ndarray, weight: np.ndarray) -> dict[Any, dict[str, float]]:
    """Per key (a family, or a (family, size) pair): RMSE and crossing error of the held-out
    points, each point weighing `weight` (its multiplicity in a resample)."""
    idx = points["index"]
    out: dict[Any, dict[str, float]] = {}
    cells: dict[Any, list[int]] = {}
    for j, i in enumerate(idx):
        cells.setdefault(keys[i], []).append(j)
    for key, js in cells.items():
        w = weight[idx[js]]
        if w.sum() <= 0:
            continue
        out[key] = {"rmse": float(np.sqrt(np.average(points["sq_error"][js], weights=w))),
                    "crossing_error": float(np.average(points["wrong"][js], weights=w)),
                    "n": int(len(js))}
    return out


def _refit_bootstrap(d: _Data, *, baseline: float, margin: float, cfg: RaceConfig,
                     seed: Sequence[int]) -> tuple[dict[str, dict[str, list[float]]], int]:
    """The two-stage refit bootstrap of `monitor.curves.axis_choice.refit_bootstrap` (families,
    then seeds within each size of each drawn copy) on one task metric and text."""
    return refit_bootstrap(d.y, d.family, np.ones(len(d.y)), d.xs, AXES, baseline=baseline, margin=margin,
                           reference=REFERENCE, resamples=cfg.resamples, seed=seed, fold_seed=cfg.seed,
                           sizes=d.size, seeds=d.seed)


def _thresholds(d: _Data, axis: str, *, level: float, cfg: RaceConfig) -> dict[str, Any]:
    """Each family's own threshold on `axis` (the curve fitted on its rows alone), with an
    interval, and Cochran's Q / τ² of those that cross inside the data with a finite interval."""
    z = float(norm.ppf(0.5 + cfg.threshold_confidence / 2.0))
    per, est, ses = [], [], []
    proportion = bool(np.all((d.y >= 0) & (d.y <= 1)))
    for k, fam in enumerate(sorted(set(d.family.tolist()))):
        rows = d.family == fam
        entry: dict[str, Any] = {"family": fam}
        try:
            fit = fit_monotone(d.xs[axis][rows], d.y[rows], np.ones(int(rows.sum())), predictor=AXES[axis],
                               level=level, confidence=cfg.threshold_confidence,
                               resamples=cfg.threshold_resamples, seed=cfg.seed + k, known_variance=False,
                               bounds=(0.0, 1.0) if proportion else None)
        except (LabelError, CurveError) as exc:
            per.append({**entry, "used": False, "reason": exc.message})
            continue
        t = fit.threshold
        entry.update(estimate=t["estimate"], lower=t["lower"], upper=t["upper"], status=t["status"])
        if t["status"] != "crosses" or t["lower"] is None or t["upper"] is None or t["upper"] == t["lower"]:
            entry.update(used=False, reason=("its curve does not cross the level inside the data"
                                             if t["status"] != "crosses" else "its interval is open or empty"))
        else:
            se = abs(t["upper"] - t["lower"]) / (2.0 * z)
            entry.update(used=True, se=se)
            est.append(t["estimate"])
            ses.append(se)
        per.append(entry)
    return {"per_family": per, **cochran_q(est, ses)}


def _compare(d: _Data, lofo: Any, *, boot: Mapping[str, Mapping[str, list[float]]] | None,
             degenerate: int, cfg: RaceConfig) -> dict[str, Any]:
    """Per axis: per-family errors (pooled and by size), and against L*: the family-averaged
    difference, its permutation p, its bootstrap interval, and the difference within each size."""
    ones = np.ones(len(d.y))
    pooled = {r.predictor: r for r in lofo.rows}
    fam_err = {a: _cell_errors(p, d.family, ones) for a, p in lofo.points.items()}
    pairs = np.array([f"{f}\x00{s}" for f, s in zip(d.family, d.size)], dtype=object)
    cell_err = {a: _cell_errors(p, pairs, ones) for a, p in lofo.points.items()}
    sizes = sorted(set(d.size.tolist()))
    axes: dict[str, Any] = {}
    for a in AXES:
        if a not in d.xs and a not in d.missing:
            continue   # not raced (RaceConfig.axes)
        if a not in d.xs:
            axes[a] = {"available": False, "reason": f"missing on {d.missing.get(a, 0)} row(s)"}
            continue
        if a not in pooled:
            axes[a] = {"available": False,
                       "reason": "; ".join(f"{k}: {v}" for k, v in lofo.skipped.items() if k.split(":")[0] == a)
                       or "no fold could be fitted"}
            continue
        mine = fam_err[a]
        row: dict[str, Any] = {
            "available": True, "label": AXES[a].label, "rmse": pooled[a].rmse,
            "crossing_error": pooled[a].crossing_error, "n_heldout": pooled[a].n_heldout,
            "n_folds": pooled[a].n_folds, "extrapolated": pooled[a].extrapolated,
            "per_family": [{"family": f, **mine[f],
                            "by_size": {s: cell_err[a].get(f"{f}\x00{s}") for s in sizes}} for f in sorted(mine)],
            "family_mean": {e: float(np.mean([mine[f][e] for f in mine])) for e in ERRORS},
            "skipped": {k: v for k, v in lofo.skipped.items() if k.split(":")[0] == a}}
        if a != REFERENCE and REFERENCE in fam_err:
            ref = fam_err[REFERENCE]
            both = sorted(set(mine) & set(ref))
            vs: dict[str, Any] = {"n_families": len(both)}
            for e in ERRORS:
                diffs = [mine[f][e] - ref[f][e] for f in both]
                p, how = sign_flip_pvalue(diffs, permutations=cfg.permutations, seed=cfg.seed)
                by_size = {}
                for s in sizes:
                    fs = [f for f in both if f"{f}\x00{s}" in cell_err[a] and f"{f}\x00{s}" in cell_err[REFERENCE]]
                    by_size[s] = (float(np.mean([cell_err[a][f"{f}\x00{s}"][e] - cell_err[REFERENCE][f"{f}\x00{s}"][e]
                                                 for f in fs])) if fs else None)
                lo, hi = (_interval(boot[a][f"{e}_diff"], cfg.interval) if boot is not None and a in boot
                          else (None, None))
                vs[e] = {"difference": float(np.mean(diffs)) if diffs else None,
                         "per_family": dict(zip(both, diffs)), "p_value": p, "permutation": how,
                         "lower": lo, "upper": hi, "by_size": by_size}
            vs["bootstrap"] = (None if boot is None else
                               {"resamples": cfg.resamples, "left_out": degenerate, "level": cfg.interval,
                                "method": "two-stage cluster bootstrap (families, then seeds within each "
                                          "size of each drawn family), whole LOFO refitted per resample"})
            row["vs_reference"] = vs
        axes[a] = row
    return axes


# Errors are shares and RMSEs of order one; a mean of differences that are exactly zero can come
# out as ±1e-17, which must read as no sign, not as a direction.
SIGN_TOLERANCE = 1e-12


def _sign(v: float | None) -> int:
    return 0 if v is None or not math.isfinite(v) or abs(v) <= SIGN_TOLERANCE else (1 if v > 0 else -1)


def verdict(axis: str, comparisons: Mapping[str, Mapping[str, Any]], *, p_used: float | None,
            cfg: RaceConfig, error: str = PRIMARY["error"]) -> dict[str, Any]:
    """The rule on one comparison (axis against L*), given its results on both texts.

    `comparisons[text]` is the axis's `vs_reference` on that text. Returns the conditions
    checked, which failed, and the statement: "<A> transfers better than <B>" or
    "not distinguishable"."""
    main = comparisons.get(PRIMARY["text"]) or {}
    c = main.get(error) or {}
    d = c.get("difference")
    sign = _sign(d)
    signs_texts = {t: _sign((comparisons.get(t) or {}).get(error, {}).get("difference")) for t in TEXTS}
    signs_sizes = {f"{t}/{s}": _sign(v) for t in TEXTS
                   for s, v in ((comparisons.get(t) or {}).get(error, {}).get("by_size") or {}).items()}
    lo, hi = c.get("lower"), c.get("upper")
    checks = {
        "permutation_p_below_alpha": p_used is not None and p_used < cfg.alpha,
        "interval_excludes_zero": lo is not None and hi is not None and sign != 0
                                  and _sign(lo) == sign and _sign(hi) == sign,
        "same_sign_on_both_texts": sign != 0 and all(s == sign for s in signs_texts.values()),
        "same_sign_within_each_size": sign != 0 and bool(signs_sizes)
                                      and all(s == sign for s in signs_sizes.values()),
    }
    decided = all(checks.values())
    label = AXES[axis].label
    if decided:
        better, worse = (label, AXES[REFERENCE].label) if sign < 0 else (AXES[REFERENCE].label, label)
        statement = f"{better} transfers better than {worse}"
    else:
        statement = "not distinguishable"
    return {"axis": axis, "reference": REFERENCE, "error": error, "difference": d, "p_used": p_used,
            "lower": lo, "upper": hi, "signs_by_text": signs_texts, "signs_by_size": signs_sizes,
            "checks": checks, "failed": [k for k, ok in checks.items() if not ok],
            "decided": decided, "statement": statement}


def negative_control(rows: Sequence[Mapping[str, Any]], *, baseline: float, cfg: RaceConfig) -> dict[str, Any]:
    """Leave-one-size-out on the primary task metric and text: fit on one size, predict the
    other, on bytes seen, L* and bits/byte. Bytes seen "failed to transfer" (as it should) when
    its crossing error exceeds L*'s under the same leave-one-size-out."""
    d = _data(rows, PRIMARY["task"], PRIMARY["metric"], PRIMARY["text"])
    sizes = sorted(set(d.size.tolist()))
    base = {"task": PRIMARY["task"], "metric": PRIMARY["metric"], "text": PRIMARY["text"], "sizes": sizes,
            "criterion": "bytes seen fails to transfer when its leave-one-size-out crossing error is "
                         "larger than L*'s under the same leave-one-size-out"}
    if len(sizes) < 2 or "bytes_seen" not in d.xs:
        return {**base, "ran": False, "reason": f"{len(sizes)} size(s); leave-one-size-out needs two"}
    keep = {a: d.xs[a] for a in ("bytes_seen", REFERENCE, "bits_per_byte") if a in d.xs}
    sub = _Data(y=d.y, family=d.family, size=d.size, seed=d.seed, xs=keep, missing={})
    try:
        lofo = _lofo(sub, np.arange(len(d.y)), None, baseline=baseline, margin=cfg.margin, seed=cfg.seed,
                     groups=d.size)
    except (LabelError, CurveError) as exc:
        return {**base, "ran": False, "reason": exc.message}
    per_size = {a: _cell_errors(p, d.size, np.ones(len(d.y))) for a, p in lofo.points.items()}
    pooled = {r.predictor: {"rmse": r.rmse, "crossing_error": r.crossing_error, "extrapolated": r.extrapolated}
              for r in lofo.rows}
    b, ref = pooled.get("bytes_seen"), pooled.get(REFERENCE)
    failed = None if b is None or ref is None else bool(b["crossing_error"] > ref["crossing_error"])
    return {**base, "ran": True, "errors": pooled, "per_held_out_size": per_size, "skipped": lofo.skipped,
            "failed_to_transfer": failed}


def design(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """What the rows hold: families, sizes, seeds, lineages, checkpoints per lineage, and the
    smallest p-value an exact sign-flip test over these families can give."""
    fams = sorted({r["family"] for r in rows})
    lineages = sorted({(r["family"], r["size"], r["seed"]) for r in rows})
    steps = [len({r["step"] for r in rows if (r["family"], r["size"], r["seed"]) == lin}) for lin in lineages]
    f = len(fams)
    return {"families": fams, "n_families": f, "sizes": sorted({r["size"] for r in rows}),
            "seeds": sorted({r["seed"] for r in rows}), "n_lineages": len(lineages),
            "checkpoints_per_lineage": {"min": min(steps), "max": max(steps)},
            "n_checkpoints": len({(r["family"], r["size"], r["seed"], r["step"]) for r in rows}),
            "texts": sorted({r["text"] for r in rows}),
            "smallest_permutation_p": (2.0 / 2 ** f if f <= EXACT_MAX_FAMILIES else None) if f else None}


def race(rows: Sequence[Mapping[str, Any]], cfg: RaceConfig | None = None) -> dict[str, Any]:
    """Every number of the race, JSON-ready (no NaN: missing numbers are None).

    Per task metric, text and axis: LOFO errors per family (pooled and by size); against L*:
    the family-averaged difference, its exact sign-flip p, its refit-bootstrap interval (on
    `cfg.bootstrap_texts`); Holm-adjusted p across the secondary comparisons; Cochran's Q and
    τ² of per-family thresholds; the verdict of every comparison; the primary verdict; the
    negative control.
    """
    cfg = cfg or RaceConfig()
    cfg.check()
    rows = check_rows(rows)
    import sklearn

    # Thousands of small isotonic fits: skip sklearn's per-call argument checks (the curve
    # code passes finite float arrays), which cost more than the fits themselves.
    with sklearn.config_context(skip_parameter_validation=True, assume_finite=True):
        return _race(rows, cfg)


def _race(rows: list[dict[str, Any]], cfg: RaceConfig) -> dict[str, Any]:
    if len({r["family"] for r in rows}) < 2:
        raise LabError("the race needs at least two families", hint="add families to the lab")
    metrics_out = []
    pvals: dict[str, float | None] = {}
    for m_i, (task, metric) in enumerate(_task_metrics(rows)):
        baseline = _baseline(rows, task, metric)
        level = baseline + cfg.margin
        entry: dict[str, Any] = {"task": task, "metric": metric, "baseline": baseline, "level": level,
                                 "texts": {}, "thresholds": {}}
        for t_i, text in enumerate(TEXTS):
            d = _data(rows, task, metric, text, (REFERENCE, *cfg.axes))
            fams = set(d.family.tolist())
            if len(d.y) < 3 or float(np.ptp(d.y)) == 0.0 or len(fams) < 2 or REFERENCE not in d.xs:
                entry["texts"][text] = {"skipped": f"{len(d.y)} row(s), {len(fams)} family(ies)"
                                                   + (", values constant" if len(d.y) and float(np.ptp(d.y)) == 0
                                                      else "") + ("" if REFERENCE in d.xs else ", no L*")}
                continue
            lofo = _lofo(d, np.arange(len(d.y)), None, baseline=baseline, margin=cfg.margin, seed=cfg.seed)
            boot, degenerate = (None, 0)
            if text in cfg.bootstrap_texts:
                boot, degenerate = _refit_bootstrap(d, baseline=baseline, margin=cfg.margin, cfg=cfg,
                                                    seed=[cfg.seed, m_i, t_i])
            # A level that no checkpoint crosses (or that every one clears) makes every axis's
            # crossing error 0: such a comparison is uninformative, and the report says so.
            above = int(np.sum(d.y >= level))
            entry["texts"][text] = {"n_rows": len(d.y), "above_level": above,
                                    "level_crossed": 0 < above < len(d.y),
                                    "axes": _compare(d, lofo, boot=boot, degenerate=degenerate, cfg=cfg)}
            entry["thresholds"][text] = {a: _thresholds(d, a, level=level, cfg=cfg) for a in d.xs}
        calib = entry["texts"].get(PRIMARY["text"], {}).get("axes", {})
        for a, row in calib.items():
            vs = row.get("vs_reference")
            if vs is not None:
                key = f"{task}/{metric}/{a}"
                if key != _primary_key():
                    pvals[key] = vs[PRIMARY["error"]]["p_value"]
        metrics_out.append(entry)
    adjusted = holm(pvals)
    primary = None
    for entry in metrics_out:
        entry["verdicts"] = {}
        for a in AXES:
            if a == REFERENCE or a not in cfg.axes:
                continue
            comps = {t: (entry["texts"].get(t, {}).get("axes", {}).get(a) or {}).get("vs_reference") or {}
                     for t in TEXTS}
            if not comps[PRIMARY["text"]]:
                continue
            key = f"{entry['task']}/{entry['metric']}/{a}"
            is_primary = key == _primary_key()
            p_raw = comps[PRIMARY["text"]][PRIMARY["error"]]["p_value"]
            p_used = p_raw if is_primary else adjusted.get(key)
            v = verdict(a, comps, p_used=p_used, cfg=cfg)
            v.update(role="primary" if is_primary else "secondary", p_value=p_raw,
                     p_holm=None if is_primary else adjusted.get(key))
            comps[PRIMARY["text"]][PRIMARY["error"]]["p_holm"] = None if is_primary else adjusted.get(key)
            entry["verdicts"][a] = v
            if is_primary:
                primary = {"task": entry["task"], "metric": entry["metric"], **v}
    prim_rows = [r for r in rows if PRIMARY["metric"] in r["metrics"].get(PRIMARY["task"], {})]
    control = (negative_control(rows, baseline=_baseline(rows, PRIMARY["task"], PRIMARY["metric"]), cfg=cfg)
               if prim_rows else {"ran": False, "reason": f"no row has {PRIMARY['task']}/{PRIMARY['metric']}"})
    return finite_json({
        "schema": SCHEMA, "config": asdict(cfg), "reference": REFERENCE, "primary_spec": PRIMARY,
        "rule": RULE.format(alpha=cfg.alpha, interval=cfg.interval),
        "axes": {a: {"label": p.label, "lower_is_progress": p.lower_is_progress} for a, p in AXES.items()},
        "design": design(rows), "n_secondary": len(pvals),
        "level_not_crossed": [f"{e['task']}/{e['metric']}/{t}" for e in metrics_out
                              for t, v in e["texts"].items() if v.get("level_crossed") is False],
        "primary": primary or {"decided": False, "statement": "not distinguishable",
                               "failed": ["the primary comparison could not be computed"]},
        "metrics": metrics_out, "negative_control": control})


def _primary_key() -> str:
    return f"{PRIMARY['task']}/{PRIMARY['metric']}/{PRIMARY['axis']}"
