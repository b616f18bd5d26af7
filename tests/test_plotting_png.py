"""`plotting.png` draws a figure once and saves the pixels the two-draw path saved."""

from __future__ import annotations

import io
import warnings

import pytest

from monitor.plotting import guard_ticks, png, pyplot


def _figure():
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=80)
    for k in range(4):
        ax.plot(range(200), [((i * (k + 3)) % 17) / 17 for i in range(200)], label=f"lineage {k}")
    ax.set_title("L* over time")
    ax.legend(fontsize=7, loc="best")      # "best" places itself at draw time, from the data
    return fig


def _two_draw_png() -> bytes:
    """The previous path: laid out, then saved with the layout engine tight_layout leaves behind."""
    old = _figure()
    guard_ticks(old)
    old.tight_layout()
    buf = io.BytesIO()
    old.savefig(buf, format="png")
    pyplot().close(old)
    return buf.getvalue()


def _count_draws(monkeypatch) -> list[int]:
    """A list that gains an item each time a figure is drawn from now on."""
    from matplotlib.figure import Figure

    draws: list[int] = []
    original = Figure.draw
    monkeypatch.setattr(Figure, "draw", lambda self, renderer: (draws.append(1), original(self, renderer))[1])
    return draws


def test_one_draw_and_the_same_pixels(monkeypatch) -> None:
    old = _two_draw_png()
    draws = _count_draws(monkeypatch)
    new = png(_figure())
    assert len(draws) == 1
    assert new == old


@pytest.mark.parametrize("rc", [{"figure.autolayout": True}, {"figure.constrained_layout.use": True}])
def test_an_operators_layout_setting_adds_no_second_layout(monkeypatch, rc) -> None:
    """A matplotlibrc that asks every figure for a layout engine (`figure.autolayout`,
    `figure.constrained_layout.use`) must not put one back after `tight_layout`: the figure
    would be laid out again when saved (a second draw; constrained layout moves the axes)."""
    import matplotlib

    with matplotlib.rc_context(rc), warnings.catch_warnings():
        warnings.simplefilter("ignore")          # "The figure layout has changed to tight"
        old = _two_draw_png()
        draws = _count_draws(monkeypatch)
        new = png(_figure())
    assert len(draws) == 1
    assert new == old
