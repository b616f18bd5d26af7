"""matplotlib for every figure of the package: the Agg backend, PNG bytes, and ranges it can draw.

Every number that reaches a figure comes from a file or a store row, so any finite value can
arrive. matplotlib fails near the float maximum: the span of -1e308 … 1e308 overflows to inf,
which breaks its transforms (a singular matrix), and margins or tick spacing that overflow
break its tick locators (`arange: cannot compute length`). Two rules keep every finite input
drawable:

- `shown` holds the positions handed to matplotlib within ±PLOT_LIMIT (far beyond any loss,
  count or probability a real run produces); labels still print the true values;
- `guard_ticks` gives an axis whose view limits are still out of the locators' reach (a
  figure built without `shown`) three fixed ticks, before the figure is laid out and saved.

Degenerate ranges (all values equal, spans of 1e-300) need nothing: matplotlib widens them.
matplotlib is imported when a figure is drawn, so importing this module stays cheap.
"""

from __future__ import annotations

import io
import math
from collections.abc import Iterable
from typing import Any

# Positions beyond ±PLOT_LIMIT are drawn at that edge: twice it, plus matplotlib's margins,
# stays finite, and its default tick locators handle it.
PLOT_LIMIT = 1e300
# Past this magnitude (or with a span that is not finite) an axis gets fixed ticks.
_TICK_LIMIT = 1e305


def pyplot() -> Any:
    """matplotlib.pyplot on the non-interactive Agg backend (no display needed), with no
    mathtext: a title or legend holds names from files and the Hub, and a `$` pair in one
    would be parsed as TeX (`$\\bad{$` fails the whole figure); the package's own labels use
    none."""
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams["text.parse_math"] = False
    import matplotlib.pyplot as plt

    return plt


def shown_value(value: Any) -> float:
    """One position to draw: a float within ±PLOT_LIMIT; None and NaN give NaN (not drawn).

    Integers of any size are compared before conversion, so 10**400 is held too."""
    if value is None:
        return math.nan
    number = float(value) if not isinstance(value, int) else value
    if isinstance(number, float) and math.isnan(number):
        return math.nan
    return float(max(-PLOT_LIMIT, min(PLOT_LIMIT, number)))


def shown(values: Iterable[Any]) -> list[float]:
    """`shown_value` of each value."""
    return [shown_value(v) for v in values]


def _safe_limits(low: float, high: float) -> bool:
    return (math.isfinite(low) and math.isfinite(high) and math.isfinite(high - low)
            and max(abs(low), abs(high)) <= _TICK_LIMIT)


def guard_ticks(fig: Any) -> None:
    """Three fixed ticks (both ends and the middle, printed with 3 significant digits) on every
    axis whose view limits matplotlib's tick locators cannot handle; other axes are untouched."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    for ax in fig.axes:
        for axis, limits in ((ax.xaxis, ax.get_xlim()), (ax.yaxis, ax.get_ylim())):
            low, high = sorted(float(v) for v in limits)
            if _safe_limits(low, high):
                continue
            # Halves first: (low + high) / 2 overflows where low / 2 + high / 2 does not.
            ticks = [v for v in (low, low / 2 + high / 2, high) if math.isfinite(v)]
            axis.set_major_locator(FixedLocator(sorted(set(ticks))))
            axis.set_minor_locator(NullLocator())
            axis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:.3g}"))


def png(fig: Any) -> bytes:
    """The figure as PNG bytes (ticks guarded, laid out); the figure is closed."""
    plt = pyplot()
    try:
        guard_ticks(fig)
        fig.tight_layout()
        # tight_layout leaves a placeholder layout engine behind, for which savefig draws the
        # whole figure once more before the drawing it saves; the layout is done, so none is kept
        # (the same pixels, one draw: a tenth of a 10^5 report's four figures). `None` alone
        # means "the rcParams' engine": a matplotlibrc with figure.autolayout or
        # figure.constrained_layout.use would put one back and lay the figure out again on save
        # (constrained layout moving the axes), so those two are off while it is dropped.
        import matplotlib

        with matplotlib.rc_context({"figure.autolayout": False, "figure.constrained_layout.use": False}):
            fig.set_layout_engine(None)
        buf = io.BytesIO()
        fig.savefig(buf, format="png")
        return buf.getvalue()
    finally:
        plt.close(fig)


__all__ = ["PLOT_LIMIT", "guard_ticks", "png", "pyplot", "shown", "shown_value"]
