"""Lab v3's pilot gate (docs/lab-v3-preregistration.md, "Pilot gate").

Before the race runs, a small pilot must show that some loss axis has skill on the primary
task metric and text. Per axis, its leave-one-family-out crossing error (v2's LOFO,
`monitor.lab.analysis`) must beat, each by the pre-registered margin:

(a) predicting that every checkpoint is above the level (its error: the share below it);
(b) the same axis shuffled within each lineage (family, seed), refitted leave-one-family-out,
    averaged over seeded shuffles: the alignment between families kept, the order of
    training inside a lineage destroyed.

The level must also be crossed inside the pilot (a pre-registered share of checkpoints on
each side), or every axis errs 0 and (a) says nothing. The gate passes when the level is
crossed and at least one axis beats both. v2's race failed both on calib-v0: always-above
0.343, L* shuffled 0.344, L* 0.356, bits/byte 0.329.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from monitor.errors import CurveError, LabelError, LabError
from monitor.lab import analysis as race
from monitor.lab.rows_v3 import check_rows_v3


def level_margin(prereg: Mapping[str, Any], metric: str) -> float:
    """ε of the pre-registered level b + ε for a task metric."""
    try:
        return float(prereg["levels"][metric]["margin"])
    except (KeyError, TypeError, ValueError):
        raise LabError(f"the pre-registration gives no level for metric {metric!r}",
                       hint="levels are fixed in data/lab-v3-preregistration.json") from None


# The pilot reads seed 0 only (data/lab-v3-preregistration.json, pilot_gate.pilot: "the first 6
# kept families, seed 0"); the families are named there too (families.pilot_families).
PILOT_SEED = 0

# "At least the margin below" includes exactly the margin. Errors are shares of checkpoints (and
# means of 20 shuffles of them), so a difference of exactly 0.05 occurs (10/36 against 236/720)
# and comes out of floating point a few 1e-17 short; real gaps between such shares are far above 1e-9.
MARGIN_TOLERANCE = 1e-9


def pilot_families(prereg: Mapping[str, Any]) -> list[str]:
    """The pre-registered pilot's families, in their order."""
    names = (prereg.get("families") or {}).get("pilot_families")
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise LabError("the pre-registration names no pilot families (families.pilot_families)",
                       hint="the pilot is fixed in data/lab-v3-preregistration.json")
    return list(names)


def pilot_rows(rows: Sequence[Mapping[str, Any]], prereg: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The rows of the pre-registered pilot: its families at seed 0, taken from a full record's
    rows or a pilot-only record's (the same rows either way, so the gate reads the same numbers
    before and after the race)."""
    names = set(pilot_families(prereg))
    return [r for r in rows if isinstance(r, Mapping) and r.get("family") in names and r.get("seed") == PILOT_SEED]


def pilot_coverage(rows: Sequence[Mapping[str, Any]], prereg: Mapping[str, Any]) -> dict[str, Any]:
    """Which pilot families the pilot rows hold, which they lack, and how they differ from the
    pre-registered pilot (`deviations`: families missing, families or seeds not the pilot's),
    each a deviation the report lists beside the verdict."""
    good = [r for r in rows if isinstance(r, Mapping)]
    present = {r.get("family") for r in good}
    names = pilot_families(prereg)
    missing = [n for n in names if n not in present]
    foreign = sorted(str(f) for f in present if f not in names)
    seeds = sorted({repr(r.get("seed")) for r in good if r.get("seed") != PILOT_SEED})
    deviations = []
    if missing:
        deviations.append(f"the pilot gate read {len(names) - len(missing)} of the {len(names)} pre-registered "
                          f"pilot families (missing: {', '.join(missing)})")
    if foreign:
        deviations.append("the pilot rows hold families outside the pre-registered pilot: "
                          + ", ".join(foreign)[:300])
    if seeds:
        deviations.append(f"the pilot rows hold seeds other than {PILOT_SEED}: " + ", ".join(seeds)[:100])
    return {"families": names, "seed": PILOT_SEED, "present": [n for n in names if n in present],
            "missing": missing, "deviations": deviations}


def shuffled_within_lineage(d: race._Data, rng: np.random.Generator) -> race._Data:
    """`d` with every axis's values permuted among each lineage's checkpoints (one permutation
    per lineage, shared by the axes)."""
    order = np.arange(len(d.y))
    lineage = np.array([f"{f}\x00{s}\x00{z}" for f, s, z in zip(d.family, d.seed, d.size)], dtype=object)
    for key in sorted(set(lineage.tolist())):
        idx = np.flatnonzero(lineage == key)
        order[idx] = idx[rng.permutation(len(idx))]
    return race._Data(y=d.y, family=d.family, size=d.size, seed=d.seed,
                      xs={a: x[order] for a, x in d.xs.items()}, missing=d.missing)


def _pooled_errors(d: race._Data, *, baseline: float, margin: float, seed: int) -> dict[str, float]:
    lofo = race._lofo(d, np.arange(len(d.y)), None, baseline=baseline, margin=margin, seed=seed)
    return {r.predictor: r.crossing_error for r in lofo.rows}


def pilot_gate(rows: Sequence[Mapping[str, Any]], prereg: Mapping[str, Any]) -> dict[str, Any]:
    """The gate on pilot rows (v3 shape): per axis its crossing error, the two baselines, and
    whether it passes; `passed` when the level is crossed and any axis passes."""
    g = prereg["pilot_gate"]
    task, metric, text = g["task"], g["metric"], g["text"]
    axes = tuple(g["axes"])
    clean = check_rows_v3(rows, what="pilot rows")
    eps = level_margin(prereg, metric)
    base = {"task": task, "metric": metric, "text": text, "margin": g["margin"], "shuffles": g["shuffles"],
            "criterion": (f"an axis passes when its LOFO crossing error is at least {g['margin']:g} below both "
                          "the always-above error and the mean over shuffles of the axis shuffled within each "
                          f"lineage; the level must have at least {g['min_share_each_side']:.0%} of the pilot's "
                          "checkpoints on each side; the gate passes when any axis passes")}
    chosen = [r for r in clean if r["text"] == text and metric in r["metrics"].get(task, {})]
    families = sorted({r["family"] for r in chosen})
    if len(families) < g["min_families"]:
        return {**base, "ran": False, "passed": False,
                "reason": f"{len(families)} pilot famil{'y' if len(families) == 1 else 'ies'} on {text} with "
                          f"{task}/{metric}; the gate needs {g['min_families']}"}
    baseline = race._baseline(chosen, task, metric)
    level = baseline + eps
    d = race._data(chosen, task, metric, text, axes)
    missing = [a for a in axes if a not in d.xs]
    if missing:
        raise LabError(f"pilot rows lack axis {missing[0]!r} on some rows", hint="every pilot row needs every axis")
    share_above = float(np.mean(d.y >= level))
    always_above = 1.0 - share_above
    crossed = g["min_share_each_side"] <= share_above <= 1.0 - g["min_share_each_side"]
    try:
        errors = _pooled_errors(d, baseline=baseline, margin=eps, seed=g["seed"])
        shuffled: dict[str, list[float]] = {a: [] for a in axes}
        for s in range(g["shuffles"]):
            sh = shuffled_within_lineage(d, np.random.default_rng([g["seed"], s]))
            for a, e in _pooled_errors(sh, baseline=baseline, margin=eps, seed=g["seed"]).items():
                shuffled[a].append(e)
    except (LabelError, CurveError) as exc:
        return {**base, "ran": False, "passed": False, "reason": exc.message}
    per_axis = {}
    for a in axes:
        if a not in errors or not shuffled[a]:
            per_axis[a] = {"passed": False, "reason": "no fold could be fitted"}
            continue
        mean_sh = float(np.mean(shuffled[a]))
        beats_above = errors[a] <= always_above - g["margin"] + MARGIN_TOLERANCE
        beats_shuffled = errors[a] <= mean_sh - g["margin"] + MARGIN_TOLERANCE
        per_axis[a] = {"crossing_error": errors[a], "always_above_error": always_above,
                       "shuffled_mean_error": mean_sh, "shuffled_errors": shuffled[a],
                       "beats_always_above": bool(beats_above), "beats_shuffled": bool(beats_shuffled),
                       "passed": bool(beats_above and beats_shuffled)}
    passing = [a for a, v in per_axis.items() if v["passed"]]
    passed = bool(crossed and passing)
    if not crossed:
        reason = (f"the level {level:.4g} is not crossed in the pilot: {share_above:.1%} of its checkpoints are "
                  "at or above it")
    elif not passing:
        reason = "no loss axis beats both the always-above and the shuffled-within-lineage baselines"
    else:
        reason = f"{', '.join(passing)} beat{'s' if len(passing) == 1 else ''} both baselines"
    return {**base, "ran": True, "passed": passed, "reason": reason, "baseline": baseline, "level": level,
            "families": families, "n_rows": int(len(d.y)), "share_above_level": share_above,
            "level_crossed": bool(crossed), "axes": per_axis, "passing_axes": passing}
