"""Figures of the lab report, as PNG bytes: one colour per family and one marker per model size,
the same in every figure.

- a task metric against L*, bits/byte and bytes seen (one panel each, on one evaluation text),
  with the level b + ε;
- training progress: L* and bits/byte against bytes seen, one line per lineage.

Input is race rows (`monitor.lab.analysis`). Positions go through `monitor.plotting.shown`, so
any finite number gives a figure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from monitor.escape import plain_text
from monitor.plotting import png, pyplot, shown, shown_value

PANEL_AXES = ("lstar", "bits_per_byte", "bytes_seen")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def family_colours(families: Sequence[str]) -> dict[str, str]:
    """A fixed colour per family (tab10 in sorted order, then tab20)."""
    plt = pyplot()
    names = sorted(set(families))
    cmap = plt.get_cmap("tab10" if len(names) <= 10 else "tab20")
    from matplotlib.colors import to_hex

    return {name: to_hex(cmap(i % cmap.N)) for i, name in enumerate(names)}


def size_markers(sizes: Sequence[str]) -> dict[str, str]:
    """A fixed marker per model size (sorted order)."""
    return {name: MARKERS[i % len(MARKERS)] for i, name in enumerate(sorted(set(sizes)))}


def _x(row: Mapping[str, Any], axis: str) -> Any:
    return row["axes"].get(axis, row.get("bytes_seen") if axis == "bytes_seen" else None)


def _legend(ax: Any, colours: Mapping[str, str], markers: Mapping[str, str]) -> None:
    from matplotlib.lines import Line2D

    # family and size names come from the rows: their control characters shown as escapes
    handles = [Line2D([], [], color=c, marker="o", ls="", label=plain_text(f)) for f, c in colours.items()]
    handles += [Line2D([], [], color="0.3", marker=m, ls="", label=plain_text(s)) for s, m in markers.items()]
    ax.legend(handles=handles, fontsize=7, loc="best")


def task_against_axes(rows: Sequence[Mapping[str, Any]], *, task: str, metric: str, level: float,
                      axes: Mapping[str, Mapping[str, Any]], colours: Mapping[str, str],
                      markers: Mapping[str, str], text: str = "calib") -> bytes:
    """The task metric against L*, bits/byte and bytes seen on `text`, coloured by family,
    marked by size."""
    plt = pyplot()
    pts = [r for r in rows if r["text"] == text and metric in r["metrics"].get(task, {})]
    fig, panels = plt.subplots(1, len(PANEL_AXES), figsize=(13.0, 4.0), dpi=100, sharey=True)
    for ax, axis in zip(panels, PANEL_AXES):
        for family in sorted({r["family"] for r in pts}):
            for size in sorted({r["size"] for r in pts if r["family"] == family}):
                cell = [r for r in pts if r["family"] == family and r["size"] == size and _x(r, axis) is not None]
                if cell:
                    ax.scatter(shown(_x(r, axis) for r in cell), shown(r["metrics"][task][metric] for r in cell),
                               s=14, color=colours[family], marker=markers[size], alpha=0.8, zorder=3)
        ax.axhline(shown_value(level), color="tab:red", lw=1, ls="-.")
        meta = axes.get(axis, {"label": axis, "lower_is_progress": False})
        if meta["lower_is_progress"]:
            ax.invert_xaxis()  # progress runs left to right
        ax.set_xlabel(meta["label"] + (" (lower = more progress)" if meta["lower_is_progress"] else ""))
    panels[0].set_ylabel(f"{plain_text(metric)} (level b + ε = {level:.3g})")
    _legend(panels[0], colours, markers)
    fig.suptitle(f"{plain_text(task)} · {plain_text(metric)} against L*, bits/byte and bytes seen ({text} text)")
    return png(fig)


def progress(rows: Sequence[Mapping[str, Any]], colours: Mapping[str, str], markers: Mapping[str, str],
             text: str = "calib") -> bytes:
    """L* and bits/byte on `text` against bytes seen: one line per (family, size, seed)."""
    plt = pyplot()
    fig, panels = plt.subplots(1, 2, figsize=(13.0, 4.0), dpi=100)
    pts = [r for r in rows if r["text"] == text]
    for family, size, seed in sorted({(r["family"], r["size"], r["seed"]) for r in pts}):
        line = sorted((r for r in pts if (r["family"], r["size"], r["seed"]) == (family, size, seed)),
                      key=lambda r: r["step"])
        for ax, key in zip(panels, ("lstar", "bits_per_byte")):
            have = [r for r in line if key in r["axes"]]
            if have:
                ax.plot(shown(_x(r, "bytes_seen") for r in have), shown(r["axes"][key] for r in have),
                        marker=markers[size], ms=3, lw=0.8, color=colours[family])
    panels[0].set_ylabel("L* (nats/token)")
    panels[1].set_ylabel("bits/byte")
    for ax in panels:
        ax.set_xlabel("bytes seen")
    _legend(panels[0], colours, markers)
    fig.suptitle(f"training progress on the {text} text (one line per family, size and seed)")
    return png(fig)
