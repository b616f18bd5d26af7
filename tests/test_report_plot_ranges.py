"""Every figure of the package draws any finite numbers: values at the float maximum, spans that
overflow (-1e308 … 1e308), identical values, spans of 1e-300, integers past the float range.
matplotlib alone fails on the first two (`arange: cannot compute length`, a singular transform)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from lanes import fast_first

from monitor.curves.artifact import Band, CurvePoint
from monitor.curves.plot import plot_curve
from monitor.lab import plots as lab_plots
from monitor.plotting import PLOT_LIMIT, pyplot, shown
from monitor.reports import plots as report_plots
from support.report_state import _fit_curve

PNG = b"\x89PNG\r\n\x1a\n"
BIG = 1.7976931348623157e308          # the largest float
# name -> four values along an axis
RANGES: dict[str, list[float]] = {
    "overflowing span": [-1e308, -1e307, 1e307, 1e308],
    "at the float maximum": [BIG, BIG, BIG, BIG],
    "near the float maximum": [1.6e308, 1.7e308, 1.75e308, BIG],
    "identical": [0.37, 0.37, 0.37, 0.37],
    "span of 1e-300": [0.0, 3e-301, 6e-301, 1e-300],
    "subnormal span": [0.0, 5e-324, 1e-323, 1.5e-323],
    "integers past the float range": [0.1, 0.2, 0.3, 0.4],
}


def _count(name: str, i: int) -> int:
    """A step or a byte count: past the float range (10**400) in its own case only."""
    return 10**400 * (i + 1) if name == "integers past the float range" else 1000 * (i + 1)


@pytest.fixture(scope="module")
def curve(tmp_path_factory: pytest.TempPathFactory) -> Any:
    # The report state's curve, fitted alone: its store, scores and predictions were written
    # only to be closed again (1.2 CPU-seconds).
    return _fit_curve(tmp_path_factory.mktemp("report"))


def _extreme_curve(curve: Any, xs: list[float], ys: list[float]) -> Any:
    """The curve with its band, points, threshold and level moved to the given values."""
    band = Band(x=sorted(xs), fit=ys, lower=ys, upper=ys)
    points = [CurvePoint(checkpoint=f"c{i}", family=f"f{i % 2}", x=x, value=y, weight=1.0)
              for i, (x, y) in enumerate(zip(xs, ys))]
    threshold = curve.threshold.model_copy(update={"estimate": xs[1], "lower": xs[0], "upper": xs[-1]})
    return curve.model_copy(update={"band": band, "points": points, "threshold": threshold,
                                    "baseline": ys[0], "x_range": (min(xs), max(xs))})


def _runs(name: str) -> list[dict[str, Any]]:
    t0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
    rows = []
    for i, v in enumerate(RANGES[name]):
        for lineage, step in (("org/stepped", _count(name, i)), ("org/timed", None)):
            rows.append({"lineage": lineage, "step": step, "released_at": t0 + timedelta(hours=i),
                         "time_source": "Hub commit date", "commit": f"{i:040x}", "lstar": v, "se": abs(v),
                         "ce": v, "ce_unigram": v})
    return rows


@pytest.mark.parametrize("name", fast_first(RANGES, keep=2))
def test_governance_report_figures_draw_extreme_ranges(name: str, curve: Any) -> None:
    values = RANGES[name]
    runs = _runs(name)
    assert report_plots.lstar_over_time(runs)[:8] == PNG
    assert report_plots.ce_against_lstar(runs)[:8] == PNG
    new_points = [{"lineage": "org/stepped", "state": state, "lstar": v, "p_hat": v, "lo": -v, "hi": v}
                  for state, v in zip(("clear", "at_risk", "emerged", "clear"), values)]
    assert report_plots.task_curve(_extreme_curve(curve, values, values), new_points)[:8] == PNG


@pytest.mark.parametrize("name", fast_first(RANGES, keep=2))
def test_curve_png_draws_extreme_ranges(name: str, curve: Any, tmp_path: Path) -> None:
    values = RANGES[name]
    path = plot_curve(_extreme_curve(curve, values, values), tmp_path / "curve.png")
    assert path.read_bytes()[:8] == PNG


@pytest.mark.parametrize("name", fast_first(RANGES, keep=2))
def test_lab_figures_draw_extreme_ranges(name: str) -> None:
    values = RANGES[name]
    rows = [{"family": f"f{i % 2}", "size": ("small", "large")[i % 3 == 0], "seed": 0, "step": i, "text": "calib",
             "bytes_seen": _count(name, i), "axes": {"lstar": v, "bits_per_byte": v, "bytes_seen": _count(name, i)},
             "metrics": {"t": {"acc": v}}} for i, v in enumerate(values)]
    colours = lab_plots.family_colours(["f0", "f1"])
    markers = lab_plots.size_markers(["small", "large"])
    assert lab_plots.progress(rows, colours, markers)[:8] == PNG
    axes = {"lstar": {"label": "L*", "lower_is_progress": True},
            "bits_per_byte": {"label": "bits/byte", "lower_is_progress": True},
            "bytes_seen": {"label": "bytes seen", "lower_is_progress": False}}
    assert lab_plots.task_against_axes(rows, task="t", metric="acc", level=values[-1], axes=axes,
                                       colours=colours, markers=markers)[:8] == PNG


def test_a_figure_drawn_at_the_float_maximum_gets_fixed_ticks() -> None:
    """A figure built without `shown` (limits past the tick locators' reach) still renders."""
    plt = pyplot()
    fig, ax = plt.subplots()
    ax.scatter([BIG, BIG], [-1e308, 1e308])
    ax.set_xlim(1e308, BIG)
    assert report_plots.png(fig)[:8] == PNG


def test_positions_are_held_within_the_plot_limit() -> None:
    assert shown([BIG, -BIG, 10**400, -(10**400), 0.5, None, float("nan")])[:5] == \
        [PLOT_LIMIT, -PLOT_LIMIT, PLOT_LIMIT, -PLOT_LIMIT, 0.5]
    assert all(v != v for v in shown([None, float("nan")]))
