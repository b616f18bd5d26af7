"""Render a task curve as a PNG: the curve g and its band, the logistic check, b_t + ε, the
threshold η̂ with its interval, and the checkpoints by family (`lstar curves show --png`).

matplotlib is imported when a plot is drawn, with the non-interactive Agg backend, so that
importing this module (and the CLI) stays cheap and no display is needed. Positions go through
`monitor.plotting.shown`, so any finite number in an artifact gives a figure.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from monitor.curves.artifact import CurveArtifact
from monitor.curves.axes import AXES
from monitor.curves.stats import logistic_value
from monitor.plotting import guard_ticks, pyplot, shown, shown_value


def plot_curve(curve: CurveArtifact, path: str | Path) -> Path:
    """Render the curve, its band, b_t + ε, η̂ with its interval, and the checkpoints as a PNG."""
    plt = pyplot()
    pred = AXES[curve.axis]
    fig, ax = plt.subplots(figsize=(7.5, 4.8), dpi=120)
    try:
        band = curve.band
        ax.fill_between(shown(band.x), shown(band.lower), shown(band.upper), color="tab:blue", alpha=0.2,
                        label=f"{curve.confidence:.0%} band")
        ax.plot(shown(band.x), shown(band.fit), color="tab:blue", lw=2, label="isotonic (centred)")
        if curve.logistic.converged and curve.logistic.ceiling is not None:
            xs = np.asarray(band.x)
            with np.errstate(all="ignore"):   # exp of a huge argument: inf, drawn at the edge
                ys = logistic_value(curve.logistic.model_dump(), xs, floor=curve.baseline, predictor=pred)
            ax.plot(shown(xs), shown(ys), color="tab:gray", ls="--", lw=1, label="logistic check")
        families = sorted({p.family or "" for p in curve.points})
        markers = "osD^v<>ph*"
        for i, family in enumerate(families):
            pts = [p for p in curve.points if (p.family or "") == family]
            ax.scatter(shown(p.x for p in pts), shown(p.value for p in pts), s=18,
                       marker=markers[i % len(markers)], label=family or None, zorder=3)
        ax.axhline(shown_value(curve.baseline), color="k", lw=0.8, ls=":",
                   label=f"baseline b = {curve.baseline:g}")
        ax.axhline(shown_value(curve.level), color="tab:red", lw=1, ls="-.", label=f"b + ε = {curve.level:g}")
        thr = curve.threshold
        if thr.estimate is not None:
            ax.axvline(shown_value(thr.estimate), color="tab:red", lw=1.2)
        lo = thr.lower if thr.lower is not None else min(curve.x_range)
        hi = thr.upper if thr.upper is not None else None
        if hi is not None:
            ax.axvspan(shown_value(min(lo, hi)), shown_value(max(lo, hi)), color="tab:red", alpha=0.1,
                       label=f"η̂ interval ({thr.never_share:.0%} never)")
        if pred.lower_is_progress:
            ax.invert_xaxis()   # progress runs left to right
        ax.set_xlabel(f"{pred.label}" + (" (lower = more progress)" if pred.lower_is_progress else ""))
        ax.set_ylabel(curve.metric)
        ax.set_title(f"{curve.task} · {curve.metric} · curve {curve.curve_id[:12]}")
        ax.legend(fontsize=7, loc="best")
        guard_ticks(fig)
        fig.tight_layout()
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path)
    finally:
        plt.close(fig)
    return path
