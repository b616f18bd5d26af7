"""Refitting a curve with the observations the daemon made (`lstar curves refit --add-observed`).

The new artifact is the old curve's labelled points plus one point per finished observation
of that curve (its checkpoint's value on the curve's axis, as the prediction read it, and the
observed metric with its item count), fitted with the old curve's settings. It gets a new id
and a `provenance` naming its parent curve and the observed checkpoints (repo@sha). Nothing
else changes: a policy keeps pointing at the reviewed file until a person edits it, and
`lstar policy check` says when a refit of a policy's curve lies beside it (`newer_refits`).
"""

from __future__ import annotations

import json
import math
from datetime import datetime
from pathlib import Path
from typing import Any

from monitor.curves.artifact import CurveArtifact, load_curve
from monitor.curves.axes import AXES
from monitor.curves.fit import fit_curve
from monitor.curves.labels import Label
from monitor.errors import CurveError
from monitor.store import Store


def _point_labels(curve: CurveArtifact) -> list[Label]:
    """The curve's own labelled points as labels (the stored weight is 1/se²)."""
    axis = AXES[curve.axis]
    out = []
    for p in curve.points:
        raw = 10.0 ** p.x if axis.log10 else p.x
        se = 1.0 / math.sqrt(p.weight) if p.weight > 0 else None
        out.append(Label(checkpoint=p.checkpoint, value=p.value, family=p.family, task=curve.task,
                         metric=curve.metric, stderr=se, source="curve", **{axis.column: raw}))
    return out


def observed_labels(store: Store, curve: CurveArtifact) -> list[tuple[Label, str]]:
    """One label per finished observation of `curve` (oldest first, one per checkpoint), with
    its checkpoint as repo@sha."""
    axis = AXES[curve.axis]
    rows = store.query(
        "SELECT o.repo, o.commit_sha, o.lineage, o.observed, o.n, p.detail FROM observations o "
        "JOIN predictions p ON p.id = o.prediction_id WHERE o.curve_id = ? AND o.status = 'done' "
        "ORDER BY o.finished_at, o.id", [curve.curve_id])
    out: list[tuple[Label, str]] = []
    seen: set[str] = set()
    for r in rows:
        ref = f"{r['repo']}@{r['commit_sha']}"
        if ref in seen:
            continue
        seen.add(ref)
        detail = json.loads(r["detail"]) if isinstance(r["detail"], str) else r["detail"]
        x = detail.get("value", detail.get("lstar"))
        if x is None:
            continue
        raw = 10.0 ** float(x) if axis.log10 else float(x)
        out.append((Label(checkpoint=ref, value=float(r["observed"]), family=r["lineage"], task=curve.task,
                          metric=curve.metric, n=int(r["n"]), source="observed", repo=r["repo"],
                          sha=r["commit_sha"], **{axis.column: raw}), ref))
    return out


def refit_with_observed(curve_path: Path, store: Store, *, now: datetime | None = None) -> CurveArtifact:
    """The curve at `curve_path` refitted with its observations in `store` (new id, provenance)."""
    curve = load_curve(curve_path)
    observed = observed_labels(store, curve)
    if not observed:
        raise CurveError(f"no finished evaluation of curve {curve.curve_id[:12]} ({curve_path}) in this state",
                         hint="the daemon evaluates tasks with `evaluate:` in their policy; see `lstar status`")
    known = {p.checkpoint for p in curve.points}
    labels = _point_labels(curve) + [label for label, ref in observed if label.checkpoint not in known]
    new = fit_curve(labels, task=curve.task, metric=curve.metric, baseline=curve.baseline, margin=curve.margin,
                    confidence=curve.confidence, resamples=curve.bootstrap.resamples, seed=curve.bootstrap.seed,
                    corpus_sha256=curve.corpus_sha256, scoring_spec=curve.scoring_spec, lofo=False,
                    grid_size=len(curve.band.x), now=now, axis=curve.axis)
    provenance: dict[str, Any] = {"kind": "refit", "parent_curve_id": curve.curve_id,
                                  "parent_file": str(Path(curve_path).resolve()),
                                  "observed_checkpoints": [ref for _, ref in observed],
                                  "added_points": len(labels) - len(curve.points)}
    draft = new.model_copy(update={"provenance": provenance, "curve_id": ""})
    return draft.model_copy(update={"curve_id": draft.content_id()})


def newer_refits(curve_path: Path) -> list[tuple[Path, str]]:
    """Refits of the curve at `curve_path` lying beside it: (file, new curve id) of each JSON
    file in its folder whose provenance names this curve's id as its parent."""
    try:
        curve = load_curve(curve_path)
    except Exception:  # noqa: BLE001 - a curve that does not load is reported elsewhere
        return []
    found = []
    for other in sorted(Path(curve_path).parent.glob("*.json")):
        if other.resolve() == Path(curve_path).resolve():
            continue
        try:
            candidate = load_curve(other)
        except Exception:  # noqa: BLE001 - not a curve, or a broken one: not a refit of this
            continue
        parent = (candidate.provenance or {}).get("parent_curve_id")
        if parent == curve.curve_id:
            found.append((other, candidate.curve_id))
    return found


__all__ = ["newer_refits", "observed_labels", "refit_with_observed"]
