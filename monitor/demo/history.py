"""The demo's history: the additions curve fitted on seed 0 of the demo's lab.

A watcher applies curves fitted beforehand on labelled checkpoints; so does the demo. Its
curve (`SHIPPED_CURVE`, package data) was fitted by `fit_history` on seed 0 of
`monitor.lab.demo.demo_config`: each of its twelve checkpoints scored on the demo's documents
and evaluated on the 55 additions, then `fit_demo_curve` (b = chance, ε = half the fitted rise).
`lstar demo --fit-history` runs the same steps inside the demo instead (about as long again as
the demo itself) and uses the curve it fits; `lstar demo --fit-history --save-history-curve PATH`
writes a file that replaces the shipped one.

`shipped_curve` refuses the shipped file when the calibration corpus the demo scores on is not
the one the curve was fitted on (its documents' sha256), naming both and what to run instead:
a curve applied to scores of another corpus predicts nothing.
"""

from __future__ import annotations

import platform
from dataclasses import replace
from pathlib import Path
from typing import Any

from monitor.errors import LstarError

SHIPPED_CURVE = Path(__file__).resolve().parent / "data" / "add-words-curve.json"
TASK = "add-words"          # the lab's additions in words (monitor.lab.tasks.ADD_TASK)
METRIC = "acc"
HISTORY_SEED = 0


def label_history(db: Path, request: Any, task_path: Path, folders: dict[str, list[Path]]) -> list[Any]:
    """Score each history checkpoint into `db` and evaluate it on `task_path`; the METRIC labels."""
    from monitor.curves import evaluate_checkpoint, evaluation_labels, label_rows
    from monitor.scoring import score_checkpoint
    from monitor.store import Store

    labels = []
    for family, paths in folders.items():
        for folder in paths:
            run = score_checkpoint(replace(request, model=str(folder)), db_path=db)
            evaluation = evaluate_checkpoint(str(folder), task_path, device="cpu", dtype="float32")
            rows = [label for label in evaluation_labels(evaluation, family=family, run_id=run["run_id"])
                    if label.metric == METRIC]
            with Store.open(db) as store:
                store.record_labels(label_rows(rows, source_ref=f"demo:{run['run_id']}"))
            labels += rows
    return labels


def fit_demo_curve(db: Path, labels: list[Any], *, provenance: dict[str, Any] | None = None) -> Any:
    """Fit the task curve on the history; b = chance, ε = half the fitted rise above chance.

    Raises LstarError when the history does not rise above chance (no level can be set)."""
    from monitor.curves import ScoringRef, join_scores
    from monitor.curves.fit import fit_curve
    from monitor.store import Store

    with Store.open(db, read_only=True) as store:
        joined, pins = join_scores(labels, store)
    spec = ScoringRef(spec_version=pins["spec_version"], window=pins["window"], stride=pins["stride"],
                      prefix_policy=pins["prefix_policy"])
    chance = float(joined[0].details["baseline"])
    common = dict(task=joined[0].task, metric=METRIC, baseline=chance, confidence=0.9, resamples=200,
                  lofo_resamples=50, corpus_sha256=pins["corpus_sha256"], scoring_spec=spec)
    first = fit_curve(joined, margin=0.01, **common)
    rise = max(first.band.fit) - chance
    if rise <= 0.01:
        raise LstarError(f"the fitted {TASK} curve rises only {rise:.4f} above chance ({chance:.3f}); "
                         "no emergence level can be set from it",
                         hint="train the demo's lab longer (monitor.lab.demo.demo_config)")
    curve = fit_curve(joined, margin=round(rise / 2.0, 4), **common)
    if provenance:
        draft = curve.model_copy(update={"provenance": provenance})
        curve = draft.model_copy(update={"curve_id": draft.content_id()})
    return curve


def history_provenance(config: Any) -> dict[str, Any]:
    """What a reader needs to tell how the history curve was made, and to make it again."""
    import torch

    return {"made_by": "lstar demo --fit-history", "lab": "monitor.lab.demo.demo_config",
            "family": config.families[0], "seed": HISTORY_SEED, "byte_budget": config.byte_budget,
            "checkpoints": len(config.fractions), "torch_threads": config.threads,
            "task": f"{TASK} (55 additions in words, {METRIC})",
            "level": "b = chance (1/10), ε = half the fitted rise above it",
            "torch": torch.__version__, "python": platform.python_version()}


def fit_history(db: Path, request: Any, task_path: Path, folders: list[Path], config: Any) -> Any:
    """Label seed 0's checkpoints (`folders`) and fit the curve, its provenance set."""
    labels = label_history(db, request, task_path, {config.families[0]: folders})
    return fit_demo_curve(db, labels, provenance=history_provenance(config))


def shipped_curve(corpus_sha256: str) -> Any:
    """The shipped history curve, checked against the sha256 of the documents the demo scores."""
    from monitor.curves import load_curve

    curve = load_curve(SHIPPED_CURVE)
    if curve.corpus_sha256 != corpus_sha256:
        raise LstarError(f"the demo's shipped curve {SHIPPED_CURVE.name} was fitted on calibration documents with "
                         f"sha256 {str(curve.corpus_sha256)[:16]}…, but the documents the demo scores have "
                         f"sha256 {corpus_sha256[:16]}… (is ../shared/corpus/calib-v0 another version?)",
                         hint="run `lstar demo --fit-history`: it fits the curve on this corpus (about as "
                              "long again as the demo itself)")
    return curve


def curve_facts(curve: Any) -> dict[str, Any]:
    """The curve's level and threshold as the demo's summary gives them."""
    from monitor.curves.artifact import unresolved_warnings

    unresolved = unresolved_warnings(curve)
    thr = curve.threshold
    return {"fit": {"chance": curve.baseline, "margin": curve.margin, "level": curve.level,
                    "rise": max(curve.band.fit) - curve.baseline, "corpus_sha256": curve.corpus_sha256,
                    "spec": curve.scoring_spec.describe() if curve.scoring_spec else None,
                    "curve_id": curve.curve_id, "provenance": curve.provenance,
                    "unresolved_warnings": [w.message for w in unresolved]},
            "threshold": {"resolved": not unresolved, "axis": curve.axis, "estimate": thr.estimate,
                          "lower": thr.lower, "upper": thr.upper, "confidence": thr.confidence,
                          "level": curve.level, "status": thr.status}}


def emerged_margin(curve: Any, lstar: float, se: float) -> dict[str, float | None]:
    """How far a score is from the edge of `emerged` on the curve, in L* and in its own SEs.

    A score is predicted emerged when the band's lower edge at L* + z·SE is at or above the
    level (`monitor.curves.predict`; the band falls as L* rises). The edge is the L* at which
    that lower edge meets the level, found by bisection on `predict` itself, so the margin is
    the rule the daemon applies; the margin is edge − (L* + z·SE): positive for an emerged
    score (it would stay emerged were its L* that much larger), negative for one short of it.
    `se_units` divides by the score's SE (None for an SE of 0)."""
    from scipy.stats import norm

    from monitor.curves import predict

    level = curve.level
    lo, hi = curve.x_range
    lo, hi = lo - (hi - lo), hi + (hi - lo)      # beyond the data the band is flat
    if predict(curve, lo).lower < level:
        return {"edge": None, "lstar": None, "se_units": None}      # the band never reaches the level
    for _ in range(60):
        mid = (lo + hi) / 2.0
        if predict(curve, mid).lower >= level:
            lo = mid
        else:
            hi = mid
    z = float(norm.ppf(0.5 + curve.confidence / 2.0))
    margin = lo - (lstar + z * se)
    return {"edge": lo, "lstar": margin, "se_units": margin / se if se > 0 else None}
