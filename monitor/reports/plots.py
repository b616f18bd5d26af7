"""The figures of a governance report, as PNG bytes (matplotlib, Agg backend).

- L* over time, one line per lineage (lower is more progress);
- each task curve with its band, the level b_t + ε, and the report's new checkpoints on it;
- raw CE against L* per tokenizer (CE = L* + CE_uni, so each tokenizer is a line offset by
  its unigram entropy: the reason L* and not CE is compared across families).

matplotlib is imported when a figure is drawn, so importing this module stays cheap.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from typing import Any

FIGSIZE = (8.0, 4.0)
DPI = 100


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _png(fig: Any) -> bytes:
    plt = _pyplot()
    try:
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png")
        return buf.getvalue()
    finally:
        plt.close(fig)


def lstar_over_time(runs: Sequence[Mapping[str, Any]]) -> bytes:
    """L* (with ±SE bars) against the time each run finished, one series per lineage."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=FIGSIZE, dpi=DPI)
    lineages = sorted({r["lineage"] for r in runs})
    for lineage in lineages:
        pts = sorted((r for r in runs if r["lineage"] == lineage), key=lambda r: r["finished_at"])
        ax.errorbar([r["finished_at"] for r in pts], [r["lstar"] for r in pts],
                    yerr=[r["se"] for r in pts], marker="o", ms=4, capsize=2, label=lineage)
    ax.set_xlabel("scored at")
    ax.set_ylabel("L* (nats/token; lower = more progress)")
    ax.set_title("L* over time per lineage")
    if lineages:
        ax.legend(fontsize=7, loc="best")
    fig.autofmt_xdate()
    return _png(fig)


def task_curve(curve: Any, new_points: Sequence[Mapping[str, Any]]) -> bytes:
    """A task curve g(L*) with its band and level, and the new checkpoints' predictions on it."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=FIGSIZE, dpi=DPI)
    ax.fill_between(curve.band.x, curve.band.lower, curve.band.upper, color="tab:blue", alpha=0.2,
                    label=f"{curve.confidence:.0%} band")
    ax.plot(curve.band.x, curve.band.fit, color="tab:blue", lw=2, label="fitted curve")
    ax.scatter([p.x for p in curve.points], [p.value for p in curve.points], s=12, color="tab:gray",
               label="labelled checkpoints", zorder=3)
    colours = {"clear": "tab:green", "at_risk": "tab:orange", "emerged": "tab:red"}
    for state, colour in colours.items():
        pts = [p for p in new_points if p["state"] == state]
        if pts:
            ax.errorbar([p["lstar"] for p in pts], [p["p_hat"] for p in pts],
                        yerr=[[p["p_hat"] - p["lo"] for p in pts], [p["hi"] - p["p_hat"] for p in pts]],
                        fmt="D", ms=6, color=colour, capsize=2, label=f"new: {state}", zorder=4)
    ax.axhline(curve.level, color="tab:red", lw=1, ls="-.", label=f"b + ε = {curve.level:.3g}")
    if curve.threshold.estimate is not None:
        ax.axvline(curve.threshold.estimate, color="tab:red", lw=1)
    ax.invert_xaxis()  # progress runs left to right
    ax.set_xlabel("L* (lower = more progress)")
    ax.set_ylabel(curve.metric)
    ax.set_title(f"task {curve.task} · {curve.metric}")
    ax.legend(fontsize=7, loc="best")
    return _png(fig)


def ce_against_lstar(runs: Sequence[Mapping[str, Any]]) -> bytes:
    """Raw CE against L*, one series per tokenizer fingerprint."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=FIGSIZE, dpi=DPI)
    fingerprints = sorted({r["tokenizer"] for r in runs})
    for fp in fingerprints:
        pts = [r for r in runs if r["tokenizer"] == fp]
        ax.scatter([r["lstar"] for r in pts], [r["ce"] for r in pts], s=16,
                   label=f"tokenizer {fp[:12]} (CE_uni {pts[0]['ce_unigram']:.3f})")
    ax.set_xlabel("L* (nats/token)")
    ax.set_ylabel("raw CE (nats/token)")
    ax.set_title("raw CE against L* per tokenizer")
    if fingerprints:
        ax.legend(fontsize=7, loc="best")
    return _png(fig)
