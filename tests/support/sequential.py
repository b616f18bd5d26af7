"""Synthetic task curves placed at a chosen L*, for sequential-scoring tests and the benchmark."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

BASELINE, MARGIN = 0.25, 0.05


def synthetic_curve(path: Path, *, midpoint: float, corpus_sha256: str, task: str = "cloze",
                    width: float = 0.5, spread: float = 4.0, seed: int = 0,
                    scoring_spec: Any = None) -> Any:
    """Fit and save (at `path`) a curve whose performance rises from the baseline 0.25 to 0.85
    as L* falls through `midpoint` (a logistic of scale `width`), from 24 noisy labels over
    `midpoint` ± `spread`; pinned to `corpus_sha256` and `scoring_spec` (a ScoringRef, or None)."""
    from monitor.curves.artifact import save_curve
    from monitor.curves.fit import fit_curve
    from monitor.curves.labels import Label

    rng = np.random.default_rng(seed)
    xs = np.linspace(midpoint - spread, midpoint + spread, 24)
    labels = [Label(checkpoint=f"s{i}", value=float(np.clip(BASELINE + 0.6 / (1 + np.exp((x - midpoint) / width))
                                                            + rng.normal(0, 0.02), 0, 1)),
                    family="f1" if i % 2 else "f2", task=task, metric="acc", n=400, lstar=float(x))
              for i, x in enumerate(xs)]
    curve = fit_curve(labels, task=task, metric="acc", baseline=BASELINE, margin=MARGIN, resamples=100,
                      lofo=False, corpus_sha256=corpus_sha256, scoring_spec=scoring_spec)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_curve(curve, path)
    return curve


def write_policy(folder: Path, curves: dict[str, Path], *, name: str = "seq") -> Path:
    """`folder/NAME.yaml` with one task per curve (no watch rules: it watches every repo),
    routed to a file receiver `folder/NAME-alerts.jsonl`."""
    tasks = "".join(f"  - name: {task}\n    curve: {path}\n" for task, path in curves.items())
    path = Path(folder) / f"{name}.yaml"
    path.write_text(f"name: {name}\ntasks:\n{tasks}route:\n  receiver: audit\nreceivers:\n"
                    f"  - name: audit\n    file:\n      path: {Path(folder).resolve() / (name + '-alerts.jsonl')}\n")
    return path
