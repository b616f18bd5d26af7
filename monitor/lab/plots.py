"""Figures of the lab report, as PNG bytes: one colour per family, the same in every figure.

- a task metric against L*, raw CE and bits/byte (one panel each), with the curve fitted on
  all checkpoints and the level b_t + ε;
- training progress: L* and bits/byte against bytes seen, one line per family and seed.

Positions go through `monitor.plotting.shown`, so any finite number gives a figure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from monitor.plotting import png, pyplot, shown, shown_value

PANEL_AXES = ("lstar", "ce", "bits_per_byte")


def family_colours(families: Sequence[str]) -> dict[str, str]:
    """A fixed colour per family (tab10 in sorted order, then tab20)."""
    plt = pyplot()
    names = sorted(families)
    cmap = plt.get_cmap("tab10" if len(names) <= 10 else "tab20")
    from matplotlib.colors import to_hex

    return {name: to_hex(cmap(i % cmap.N)) for i, name in enumerate(names)}


def _x(checkpoint: Mapping[str, Any], axis: str) -> Any:
    return checkpoint["bytes_seen"] if axis == "bytes_seen" else checkpoint["metrics"][axis]


def task_against_axes(analysis: Mapping[str, Any], checkpoints: Sequence[Mapping[str, Any]],
                      axes: Mapping[str, Mapping[str, Any]], colours: Mapping[str, str]) -> bytes:
    """The task metric against L*, raw CE and bits/byte, coloured by family."""
    plt = pyplot()
    task, metric = analysis["task"], analysis["metric"]
    rows = [c for c in checkpoints if task in c["tasks"] and c["tasks"][task].get(metric) is not None]
    fig, panels = plt.subplots(1, len(PANEL_AXES), figsize=(13.0, 4.0), dpi=100, sharey=True)
    for ax, axis in zip(panels, PANEL_AXES):
        for family in sorted({c["family"] for c in rows}):
            pts = [c for c in rows if c["family"] == family]
            ax.scatter(shown(_x(c, axis) for c in pts), shown(c["tasks"][task][metric] for c in pts), s=14,
                       color=colours[family], label=family, zorder=3)
        curve = (analysis.get("curves") or {}).get(axis) or {}
        if curve.get("fitted"):
            band = curve["band"]
            ax.fill_between(shown(band["x"]), shown(band["lower"]), shown(band["upper"]), color="0.5", alpha=0.15)
            ax.plot(shown(band["x"]), shown(band["fit"]), color="0.3", lw=1.5, label="curve (all families)")
        ax.axhline(shown_value(analysis["level"]), color="tab:red", lw=1, ls="-.",
                   label=f"b + ε = {analysis['level']:.3g}")
        if axes[axis]["lower_is_progress"]:
            ax.invert_xaxis()  # progress runs left to right
        ax.set_xlabel(axes[axis]["label"] + (" (lower = more progress)" if axes[axis]["lower_is_progress"] else ""))
    panels[0].set_ylabel(metric)
    panels[0].legend(fontsize=7, loc="best")
    fig.suptitle(f"{task} · {metric} against L*, raw CE and bits/byte")
    return png(fig)


def progress(checkpoints: Sequence[Mapping[str, Any]], colours: Mapping[str, str]) -> bytes:
    """L* and bits/byte against bytes seen: one line per (family, seed)."""
    plt = pyplot()
    fig, panels = plt.subplots(1, 2, figsize=(13.0, 4.0), dpi=100)
    runs = sorted({(c["family"], c["seed"]) for c in checkpoints})
    labelled: set[str] = set()
    for family, seed in runs:
        pts = sorted((c for c in checkpoints if c["family"] == family and c["seed"] == seed),
                     key=lambda c: c["bytes_seen"])
        label = None if family in labelled else family
        labelled.add(family)
        for ax, key in zip(panels, ("lstar", "bits_per_byte")):
            ax.plot(shown(c["bytes_seen"] for c in pts), shown(c["metrics"][key] for c in pts), marker="o", ms=3,
                    color=colours[family], label=label)
    panels[0].set_ylabel("L* (nats/token)")
    panels[1].set_ylabel("bits/byte")
    for ax in panels:
        ax.set_xlabel("bytes seen")
    panels[0].legend(fontsize=7, loc="best")
    fig.suptitle("training progress per family (one line per seed)")
    return png(fig)
