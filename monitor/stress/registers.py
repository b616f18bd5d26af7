"""The registers stress test (paper §9, calibration-corpus mismatch): is L* the same progress
coordinate when the calibration corpus is code, technical prose or dictionary prose instead
of calib-v0?

For each checkpoint the vector L*(register) is measured (every register scored with one load of
the model, `monitor.scoring.engine.score_corpora`). Two numbers come out of it:

- rank stability: Kendall τ between each pair of registers across checkpoints, with a seeded
  percentile bootstrap interval over checkpoints (resampled with replacement; a resample whose
  τ is undefined, all ties, is skipped);
- for the subject's curve: the curve refitted (`monitor.curves.fit.fit_curve`, same family,
  task, baseline, margin and confidence) on each register's L* of its labelled checkpoints.
  The threshold under register r is in r's L* units; it is mapped onto the primary register's
  L* by linear interpolation between the checkpoints (ordered by L*(r)) so that the shift is in
  the primary register's L* units, beside the primary threshold's own interval width. A curve's
  points keep no per-checkpoint sample size, so every register is refitted with the points'
  values alone, the primary register included: the reference threshold is that refit's, and the
  comparison is like for like. The
  crossing error is the share of the curve's checkpoints whose observed state (value above
  baseline + margin) the threshold gets wrong; its change is register r's minus the primary's.

Section shape (read by `monitor.stress.limits`): `{"test": "registers", "registers": [{"name",
"corpus_id"}], "lstar": {label: {register: value}}, "kendall_tau": [{"a", "b", "tau", "low",
"high"}], "curves": [{"curve_id", "register", "threshold_lstar", "threshold_shift_lstar",
"threshold_interval_width", "crossing_error_change"}]}`, plus `scores` (CE, CE_uni, tokens per
checkpoint and register), `bootstrap` and `notes`.

`options.extra` may carry `lstar` (a ready {label: {register: L*}} table: nothing is scored),
`n_boot` (default 1000), `fit_resamples` (default 200), `device` and `dtype` for scoring, and
`every` (score every k-th document before the `max_documents` cap, so that a cap does not
keep only the first slice of a corpus).
"""

from __future__ import annotations

import itertools
import math
import re
import warnings
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import kendalltau

from monitor.errors import SpecError
from monitor.stress.subject import StressOptions, StressSubject

CONFIDENCE = 0.95
_SHORT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def register_name(corpus_dir: Path) -> tuple[str, str]:
    """(register name, corpus id 'name version sha256[:12]') of a corpus folder: a register
    corpus names its register in register.json; any other corpus goes by its name."""
    from monitor.scoring.corpus import load_corpus

    corpus = load_corpus(corpus_dir)
    name = f"{corpus.name}-{corpus.version}"
    pins = Path(corpus_dir) / "register.json"
    if pins.exists():
        from monitor.errors import PolicyError
        from monitor.files import NotJsonError, read_bounded_json
        from monitor.scoring.register_build import _PINS_FILE, REGISTER_PINS_MAX_BYTES, REGISTERS

        try:   # bounded: a register.json may be a FIFO or gigabytes
            data, _ = read_bounded_json(pins, str(pins), what=_PINS_FILE, limit=REGISTER_PINS_MAX_BYTES)
        except (PolicyError, NotJsonError):
            data = None    # an unreadable register file: the corpus name still identifies it
        register = data.get("register") if isinstance(data, dict) else None
        # a register name goes into every result row and flag message: only the known short ones
        if isinstance(register, str) and (register in REGISTERS or _SHORT_NAME.fullmatch(register)):
            name = register
    return name, f"{corpus.name} {corpus.version} {corpus.sha256[:12]}"


def score_registers(subject: StressSubject, options: StressOptions,
                    corpora: list[Path], names: list[str]) -> dict[str, dict[str, dict[str, float]]]:
    """{label: {register: {ce, ce_unigram, lstar, n_tokens}}}, one model load per checkpoint."""
    from monitor.scoring.engine import ScoreRequest, score_corpora

    out: dict[str, dict[str, dict[str, float]]] = {}
    for cp in subject.checkpoints:
        request = ScoreRequest(model=cp.ref, corpus_dir=corpora[0], docs=options.max_documents,
                               every=options.extra.get("every"),
                               tokenizer_dir=cp.tokenizer_dir, with_tcb=False, n_boot=100, seed=options.seed,
                               progress=False, device=options.extra.get("device", "auto"),
                               dtype=options.extra.get("dtype", "auto"), resume_partial=False)
        results = score_corpora(request, corpora, db_path=None)
        out[cp.label] = {name: {k: float(r[k]) for k in ("ce", "ce_unigram", "lstar", "n_tokens")}
                         for name, r in zip(names, results)}
    return out


def kendall_with_interval(a: np.ndarray, b: np.ndarray, *, n_boot: int, seed: int) -> dict[str, float | None]:
    """τ-b of (a, b) over checkpoints and its percentile bootstrap interval over checkpoints."""
    if len(a) < 2:   # one checkpoint orders nothing: no τ, and no resample to draw
        return {"tau": None, "low": None, "high": None, "resamples_used": 0}
    tau = kendalltau(a, b).statistic
    rng = np.random.default_rng(seed)
    taus = []
    with warnings.catch_warnings():
        # a resample that repeats one checkpoint has no τ (NaN, dropped and counted below);
        # scipy warns about each, which says nothing the count does not
        warnings.simplefilter("ignore")
        for _ in range(n_boot):
            idx = rng.integers(0, len(a), len(a))
            t = kendalltau(a[idx], b[idx]).statistic
            if math.isfinite(t):
                taus.append(t)
    tail = (1.0 - CONFIDENCE) / 2.0
    low, high = (float(np.quantile(taus, tail)), float(np.quantile(taus, 1.0 - tail))) if taus else (None, None)
    return {"tau": float(tau) if math.isfinite(tau) else None, "low": low, "high": high,
            "resamples_used": len(taus)}


def crossing_error(x: np.ndarray, crossed: np.ndarray, threshold: float | None, lower_is_progress: bool) -> float:
    """Share of checkpoints whose observed state the threshold gets wrong (a curve that never
    crosses predicts 'not crossed' everywhere)."""
    if threshold is None:
        predicted = np.zeros_like(crossed)
    else:
        predicted = x <= threshold if lower_is_progress else x >= threshold
    return float(np.mean(predicted != crossed))


def to_primary_units(value: float | None, x_register: np.ndarray, x_primary: np.ndarray) -> float | None:
    """A point on register r's L* axis mapped onto the primary register's L* by linear
    interpolation between the checkpoints (clamped at the ends)."""
    if value is None:
        return None
    order = np.argsort(x_register, kind="stable")
    return float(np.interp(value, x_register[order], x_primary[order]))


def curve_shifts(curve, lstar: dict[str, dict[str, float]], names: list[str], *, seed: int,
                 resamples: int) -> tuple[list[dict[str, Any]], list[str]]:
    """The curve refitted on each register's L*: threshold, its shift in primary L* units and
    the crossing-error change (rows), and notes on what could not be refitted."""
    from monitor.curves.axes import AXES
    from monitor.curves.fit import fit_curve
    from monitor.curves.labels import Label

    if curve.axis != "lstar":
        return [], [f"curve {curve.curve_id} is on the {curve.axis} axis; only L* curves are refitted per register"]
    points = [p for p in curve.points if p.checkpoint in lstar]
    if len(points) < 3:
        return [], [f"curve {curve.curve_id}: {len(points)} of its checkpoints were scored per register; "
                    "a refit needs 3"]
    family = "sigmoid" if getattr(curve, "sigmoid", None) is not None else "isotonic"
    lower = AXES["lstar"].lower_is_progress
    # A curve's `direction` is how its value runs along the axis (non-increasing on L*, where
    # lower is progress), not which side of the level is crossed: a curve's metric is always
    # higher-is-better (`fit_curve` refuses the others), so crossed means value ≥ b_t + ε.
    crossed = np.array([p.value >= curve.level for p in points])
    xs = {name: np.array([lstar[p.checkpoint][name] for p in points]) for name in names}
    fits = {}
    for name in names:
        labels = [Label(checkpoint=p.checkpoint, value=p.value, family=p.family, task=curve.task,
                        metric=curve.metric, lstar=lstar[p.checkpoint][name]) for p in points]
        fits[name] = fit_curve(labels, task=curve.task, metric=curve.metric, baseline=curve.baseline,
                               margin=curve.margin, confidence=curve.confidence, family=family,
                               resamples=resamples, seed=seed, lofo=False).threshold
    primary = fits[names[0]]
    width = (primary.upper - primary.lower) if primary.lower is not None and primary.upper is not None else None
    base_error = crossing_error(xs[names[0]], crossed, primary.estimate, lower)
    rows = []
    for name in names:
        t = fits[name]
        mapped = to_primary_units(t.estimate, xs[name], xs[names[0]])
        rows.append({"curve_id": curve.curve_id, "register": name, "threshold_lstar": t.estimate,
                     "threshold_in_primary_lstar": mapped,
                     "threshold_shift_lstar": (mapped - primary.estimate
                                               if mapped is not None and primary.estimate is not None else None),
                     "threshold_interval_width": width,
                     "crossing_error": crossing_error(xs[name], crossed, t.estimate, lower),
                     "crossing_error_change": crossing_error(xs[name], crossed, t.estimate, lower) - base_error})
    return rows, []


def register_stress(subject: StressSubject, options: StressOptions) -> dict[str, Any]:
    """The `registers` section for `subject` (see the module docstring)."""
    corpora = [Path(subject.corpus), *(Path(c) for c in options.register_corpora)]
    if len(corpora) < 2:
        raise SpecError("the registers test needs at least one register corpus besides the primary corpus",
                        hint="build them with `lstar corpus build-registers OUT` and pass their folders")
    named = [register_name(c) for c in corpora]
    names = [n for n, _ in named]
    if len(set(names)) != len(names):
        raise SpecError(f"two corpora go by the same register name ({', '.join(names)})",
                        hint="pass each register once")
    notes: list[str] = []
    scores: dict[str, dict[str, dict[str, float]]] = {}
    if options.extra.get("lstar") is not None:
        lstar = {label: {r: float(v) for r, v in row.items()} for label, row in options.extra["lstar"].items()}
        notes.append("L* per register given with the options, not scored here")
    else:
        scores = score_registers(subject, options, corpora, names)
        lstar = {label: {r: s["lstar"] for r, s in row.items()} for label, row in scores.items()}
    if options.max_documents is not None or options.extra.get("every"):
        every = options.extra.get("every")
        notes.append(f"each corpus scored on {'every ' + str(every) + '-th document, ' if every else ''}"
                     f"the first {options.max_documents or 'all'} of them")
    labels = [cp.label for cp in subject.checkpoints if cp.label in lstar] or sorted(lstar)
    gaps = [f"{label}: {name}" for label in labels for name in names if name not in lstar[label]]
    if gaps:   # a KeyError deep in the τ loop otherwise
        raise SpecError(f"L* missing for checkpoint and register {', '.join(gaps[:5])}",
                        hint="give every checkpoint an L* for every register: " + ", ".join(names))
    n_boot = int(options.extra.get("n_boot", 1000))
    taus = []
    for i, j in itertools.combinations(range(len(names)), 2):
        a = np.array([lstar[label][names[i]] for label in labels])
        b = np.array([lstar[label][names[j]] for label in labels])
        taus.append({"a": names[i], "b": names[j],
                     **kendall_with_interval(a, b, n_boot=n_boot, seed=options.seed + 1000 * i + j)})
    if len(labels) < 3:
        notes.append(f"{len(labels)} checkpoint(s): Kendall τ and its interval say little")
    curves: list[dict[str, Any]] = []
    if options.curve_path is not None:
        from monitor.curves.artifact import load_curve

        rows, curve_notes = curve_shifts(load_curve(options.curve_path), lstar, names, seed=options.seed,
                                         resamples=int(options.extra.get("fit_resamples", 200)))
        curves, notes = rows, notes + curve_notes
    elif subject.curve_id is not None:
        notes.append(f"curve {subject.curve_id} named but no curve file given: thresholds not refitted")
    if subject.proxy_note:
        notes.append(subject.proxy_note)
    return {"test": "registers", "registers": [{"name": n, "corpus_id": c} for n, c in named],
            "primary": names[0], "lstar": {label: lstar[label] for label in labels}, "scores": scores,
            "kendall_tau": taus, "bootstrap": {"resamples": n_boot, "confidence": CONFIDENCE, "seed": options.seed,
                                               "over": "checkpoints, with replacement"},
            "curves": curves, "notes": notes}
