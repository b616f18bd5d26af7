"""The figures of a governance report, as PNG bytes (matplotlib, Agg backend).

- L* over time, one line per lineage (lower is more progress), against training step for
  lineages whose branches name steps and against release time (Hub commit date) otherwise;
- each task curve with its band, the level b_t + ε, η̂ with its interval, and the report's
  new checkpoints on it;
- raw CE against L* per family (CE = L* + CE_uni, so each tokenizer is a line offset by
  its unigram entropy: the reason L* and not CE is compared across families).

A family has one colour in every figure (`family_colours`) and is named in the legends.
Each figure has a `*_figure` function returning the matplotlib Figure, for inspection, and
a function of the plain name returning its PNG bytes. Every position is drawn through
`monitor.plotting.shown`, so any finite number gives a figure.

matplotlib is imported when a figure is drawn, so importing this module stays cheap.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import timezone
from typing import Any

from monitor.curves.axes import AXES
from monitor.plotting import png, pyplot, shown, shown_value
from monitor.reports.present import fmt
from monitor.training_order import HUB_COMMIT, TIME_SOURCES, Placement, orders_by_step

FIGSIZE = (8.0, 4.0)
DPI = 100
# Family colours leave out blue (the fitted curve), red (the level and η̂) and grey (the
# labelled checkpoints), so a family's points never read as part of a curve.
FAMILY_PALETTE = ("tab:orange", "tab:green", "tab:purple", "tab:brown", "tab:pink", "tab:olive", "tab:cyan",
                  "#1b9e77", "#7570b3", "#e6ab02", "#a6761d", "#666600", "#e7298a", "#005f5f")
LEVEL_COLOUR = "black"
ETA_COLOUR = "tab:red"
STATE_MARKERS = {"clear": "o", "at_risk": "D", "emerged": "*"}


def family_colours(families: Iterable[str]) -> dict[str, str]:
    """One colour per family name, assigned in sorted name order: the same set of families gets
    the same colours in every figure, whatever order they are met in."""
    return {name: FAMILY_PALETTE[i % len(FAMILY_PALETTE)] for i, name in enumerate(sorted(set(families)))}


def _placement(row: Mapping[str, Any]) -> Placement:
    return Placement(row.get("step"), row.get("released_at"), row.get("time_source") or TIME_SOURCES[-1])


def time_axis_label(sources: Iterable[str]) -> str:
    """The label of a time axis: which time it is, naming each fallback that was needed."""
    used = [s for s in TIME_SOURCES if s in set(sources)]
    if used == [HUB_COMMIT]:
        return f"release time ({HUB_COMMIT})"
    if HUB_COMMIT in used:
        return f"release time ({HUB_COMMIT}; where unknown: {', '.join(used[1:])})"
    return f"{' / '.join(used) or 'time'} (no {HUB_COMMIT} known)"


def lstar_over_time_figure(runs: Sequence[Mapping[str, Any]],
                           colours: Mapping[str, str] | None = None) -> Any:
    """L* (with ±SE bars) per lineage, in lineage order, against training step for lineages whose
    every checkpoint names a step and against release time for the others (a second panel when
    both kinds are present)."""
    plt = pyplot()
    import matplotlib.dates as mdates

    lineages = sorted({r["lineage"] for r in runs})
    colours = dict(colours or family_colours(lineages))
    rows = {name: [r for r in runs if r["lineage"] == name] for name in lineages}
    stepped = [n for n in lineages if orders_by_step(_placement(r) for r in rows[n])]
    timed = [n for n in lineages if n not in stepped]
    panels = [p for p in (("step", stepped), ("time", timed)) if p[1]] or [("time", [])]
    fig, axes = plt.subplots(1, len(panels), figsize=FIGSIZE, dpi=DPI, squeeze=False)
    for ax, (kind, names) in zip(axes[0], panels):
        sources = []
        for name in names:
            pts = sorted(rows[name], key=(lambda r: r["step"]) if kind == "step"
                         else (lambda r: (r["released_at"], r["commit"])))
            xs = shown(r["step"] for r in pts) if kind == "step" else [r["released_at"] for r in pts]
            sources += [r.get("time_source") for r in pts]
            ax.errorbar(xs, shown(r["lstar"] for r in pts), yerr=shown(r["se"] for r in pts), marker="o", ms=4,
                        capsize=2, color=colours[name], label=name)
        if kind == "step":
            ax.set_xlabel("training step (from branch names)")
        else:
            ax.set_xlabel(time_axis_label(s for s in sources if s))
            # Date and time on every tick: no offset text to collide with the axis label.
            ax.xaxis.set_major_locator(mdates.AutoDateLocator(tz=timezone.utc))
            ax.xaxis.set_major_formatter(mdates.DateFormatter("%Y-%m-%d %H:%M", tz=timezone.utc))
            ax.tick_params(axis="x", labelsize=7, labelrotation=30)
            for tick in ax.get_xticklabels():
                tick.set_horizontalalignment("right")
        ax.set_ylabel("L* (nats/token; lower = more progress)")
        if names:
            ax.legend(fontsize=7, loc="best")
    fig.suptitle("L* over time per lineage")
    return fig


def lstar_over_time(runs: Sequence[Mapping[str, Any]], colours: Mapping[str, str] | None = None) -> bytes:
    """`lstar_over_time_figure` as PNG bytes."""
    return png(lstar_over_time_figure(runs, colours))


def task_curve_figure(curve: Any, new_points: Sequence[Mapping[str, Any]],
                      colours: Mapping[str, str] | None = None, *, margin: float | None = None) -> Any:
    """A task curve g(x) on its axis (L*, bits/byte, ...) with its band, level b + ε, η̂ and its interval (a shaded band), and the
    new checkpoints' predictions in their family's colour (marker by state). `margin` is the ε in
    force (the policy's; default: the curve's own): the level and η̂ drawn are those of b + ε."""
    from monitor.curves.artifact import threshold_at

    plt = pyplot()
    colours = dict(colours or family_colours(p["lineage"] for p in new_points))
    fig, ax = plt.subplots(figsize=FIGSIZE, dpi=DPI)
    band = curve.band
    ax.fill_between(shown(band.x), shown(band.lower), shown(band.upper), color="tab:blue", alpha=0.2,
                    label=f"{curve.confidence:.0%} band")
    ax.plot(shown(band.x), shown(band.fit), color="tab:blue", lw=2, label="fitted curve")
    ax.scatter(shown(p.x for p in curve.points), shown(p.value for p in curve.points), s=12, color="tab:gray",
               label="labelled checkpoints", zorder=3)
    eta = threshold_at(curve, margin)
    if eta.lower is not None and eta.upper is not None:
        ax.axvspan(shown_value(eta.lower), shown_value(eta.upper), color=ETA_COLOUR, alpha=0.12, lw=0,
                   label=f"η̂ {curve.confidence:.0%} interval [{fmt(eta.lower)}, {fmt(eta.upper)}]")
    if eta.estimate is not None:
        ax.axvline(shown_value(eta.estimate), color=ETA_COLOUR, lw=1.5,
                   label=f"η̂ (threshold) = {fmt(eta.estimate)}")
    ax.axhline(shown_value(eta.level), color=LEVEL_COLOUR, lw=1, ls="-.",
               label=f"level b + ε = {fmt(eta.level)}")
    for lineage in sorted({p["lineage"] for p in new_points}):
        for state, marker in STATE_MARKERS.items():
            pts = [p for p in new_points if p["lineage"] == lineage and p["state"] == state]
            if pts:
                # The error bars' lengths are differences of held positions: finite, whatever p̂.
                y = shown(p["p_hat"] for p in pts)
                yerr = [[max(0.0, v - shown_value(p["lo"])) for v, p in zip(y, pts)],
                        [max(0.0, shown_value(p["hi"]) - v) for v, p in zip(y, pts)]]
                ax.errorbar(shown(p.get("value", p["lstar"]) for p in pts), y, yerr=yerr,
                            fmt=marker, ms=7, color=colours[lineage], capsize=2,
                            label=f"{lineage}: {state.replace('_', ' ')}", zorder=4)
    axis = AXES[getattr(curve, "axis", "lstar")]
    if axis.lower_is_progress:
        ax.invert_xaxis()  # progress runs left to right
    ax.set_xlabel(f"{axis.label} ({axis.unit}; {'lower' if axis.lower_is_progress else 'higher'} = more progress)")
    ax.set_ylabel(curve.metric)
    ax.set_title(f"task {curve.task} · {curve.metric}")
    ax.legend(fontsize=7, loc="best")
    return fig


def task_curve(curve: Any, new_points: Sequence[Mapping[str, Any]],
               colours: Mapping[str, str] | None = None) -> bytes:
    """`task_curve_figure` as PNG bytes."""
    return png(task_curve_figure(curve, new_points, colours))


def ce_against_lstar_figure(runs: Sequence[Mapping[str, Any]], colours: Mapping[str, str] | None = None) -> Any:
    """Raw CE against L*, one series per family (named, with its tokenizer's unigram CE)."""
    plt = pyplot()
    lineages = sorted({r["lineage"] for r in runs})
    colours = dict(colours or family_colours(lineages))
    fig, ax = plt.subplots(figsize=FIGSIZE, dpi=DPI)
    for lineage in lineages:
        pts = [r for r in runs if r["lineage"] == lineage]
        unigram = sorted({r["ce_unigram"] for r in pts})
        ce_uni = fmt(unigram[0]) if len(unigram) == 1 else f"{fmt(unigram[0])}–{fmt(unigram[-1])}"
        ax.scatter(shown(r["lstar"] for r in pts), shown(r["ce"] for r in pts), s=16, color=colours[lineage],
                   label=f"{lineage} (CE_uni {ce_uni})")
    ax.set_xlabel("L* (nats/token)")
    ax.set_ylabel("raw CE (nats/token)")
    ax.set_title("raw CE against L* per family (offset = the tokenizer's unigram CE)")
    if lineages:
        ax.legend(fontsize=7, loc="best")
    return fig


def ce_against_lstar(runs: Sequence[Mapping[str, Any]], colours: Mapping[str, str] | None = None) -> bytes:
    """`ce_against_lstar_figure` as PNG bytes."""
    return png(ce_against_lstar_figure(runs, colours))
