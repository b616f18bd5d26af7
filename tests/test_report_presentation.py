"""How the governance report presents its numbers, against a real DuckDB file with three families
(tests/support/report_state.py): one colour and the family's name per family in every plot,
lineages in training-step or commit-date order with the last as "current", the time axis,
η̂ with its interval, one checkpoint name in every table, one number format, and the
"how to read this" notes; and the HTML page in headless Chromium."""

from __future__ import annotations

import copy
import html as html_lib
import re
import shutil
from datetime import timedelta
from pathlib import Path

import pytest
from markupsafe import escape

from monitor.reports import plots as report_plots
from monitor.reports.explain import HOW_TO_READ
from monitor.reports.present import checkpoint_name, fmt, parse_step
from monitor.reports.report import build_report, report_colours, report_figures, to_html, to_markdown, write_report
from support.report_state import LLAMA, MARGIN, NEOX, PYTHIA, T0, BASELINE, build_report_state

ROOT = Path(__file__).resolve().parents[1]
FAMILIES = ["org/llama-tiny", "org/neox-small", "org/pythia-tiny"]


# One state and one report for the module: no test writes to the store, and each test gets its
# own copy of the report's data, which some of them edit (the plots, an extrapolation note).
# Building both per test cost about 1.5 of the file's CPU-seconds per test.
@pytest.fixture(scope="module")
def state(tmp_path_factory: pytest.TempPathFactory):
    st = build_report_state(tmp_path_factory.mktemp("presentation"))
    yield st
    st.store.close()


@pytest.fixture(scope="module")
def built(state):
    return build_report(state.store, state.policy, now=state.now, period_start=T0)


@pytest.fixture()
def data(built):
    return copy.deepcopy(built)


def _close(figures) -> None:
    import matplotlib.pyplot as plt

    for fig in figures.values():
        plt.close(fig)


def _handle_colour(handle) -> str:
    """The colour a legend entry is drawn in (errorbar line, scatter face, or line)."""
    from matplotlib.colors import to_hex

    if hasattr(handle, "lines"):              # ErrorbarContainer: (data line, caps, bars)
        return to_hex(handle.lines[0].get_color())
    if hasattr(handle, "get_facecolor") and not hasattr(handle, "get_xdata"):
        return to_hex(handle.get_facecolor()[0] if len(handle.get_facecolor().shape) > 1
                      else handle.get_facecolor())
    return to_hex(handle.get_color())


def _family_entries(fig) -> dict[str, set[str]]:
    """{family name: the colours its legend entries are drawn in} over every axes of a figure."""
    found: dict[str, set[str]] = {}
    for ax in fig.axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            family = re.split(r"[: ]", label)[0]
            if family.startswith("org/"):
                found.setdefault(family, set()).add(_handle_colour(handle))
    return found


# -- 1. colours and names ------------------------------------------------------------------------
def test_a_family_has_one_colour_in_every_plot_named_in_the_legends(data) -> None:
    figures = report_figures(data)
    try:
        per_figure = {name: _family_entries(fig) for name, fig in figures.items()}
        labels = [label for fig in figures.values() for ax in fig.axes for label in ax.get_legend_handles_labels()[1]]
    finally:
        _close(figures)
    assert set(per_figure["lstar_over_time.png"]) == set(per_figure["ce_vs_lstar.png"]) == set(FAMILIES)
    # the task curve shows the families whose checkpoints were predicted in the period: all three
    assert set(per_figure["curve_cloze.png"]) == set(FAMILIES)
    colour_of = {}
    for entries in per_figure.values():
        for family, colours in entries.items():
            assert len(colours) == 1, (family, colours)            # one colour within a figure
            colour_of.setdefault(family, colours).update(colours)
    assert all(len(c) == 1 for c in colour_of.values()), colour_of   # and the same in every figure
    assert len({next(iter(c)) for c in colour_of.values()}) == 3     # three families, three colours
    fingerprints = {r["tokenizer"] for r in data["lstar_table"]}
    assert not [lab for lab in labels for fp in fingerprints if fp[:6] in lab], labels   # names, never hashes


def test_family_colours_do_not_depend_on_input_order(data) -> None:
    assert report_plots.family_colours(FAMILIES) == report_plots.family_colours(reversed(FAMILIES)) \
        == report_plots.family_colours(FAMILIES[1:] + FAMILIES[:1] + FAMILIES)
    shuffled = {**data, "lstar_table": list(reversed(data["lstar_table"])),
                "tasks": [{**t, "new_points": list(reversed(t["new_points"]))} for t in data["tasks"]]}
    assert report_colours(shuffled) == report_colours(data)
    figures = report_figures(shuffled)
    try:
        drawn = {f: c.pop() for fig in figures.values() for f, c in _family_entries(fig).items()}
    finally:
        _close(figures)
    from matplotlib.colors import to_hex

    assert drawn == {f: to_hex(c) for f, c in report_colours(data).items()}


# -- 2. lineage order and the current checkpoint -----------------------------------------------
def test_steps_are_parsed_as_numbers_from_branch_names() -> None:
    assert parse_step(["step1000"]) == 1000 and parse_step(["main", "step20000"]) == 20000
    assert parse_step(["global_step200"]) == 200 and parse_step(["checkpoint-50"]) == 50
    assert parse_step(["main"]) is None and parse_step(["v2step3"]) is None and parse_step([]) is None


def test_lineages_are_ordered_by_step_else_commit_date_never_scoring_time(state, data) -> None:
    by_lineage = {f: [r for r in data["lstar_table"] if r["lineage"] == f] for f in FAMILIES}
    steps = sorted(s for s, *_ in PYTHIA)
    # the data would sort differently as strings, by commit date, and by scoring time
    assert sorted(f"step{s}" for s in steps) != [f"step{s}" for s in steps]
    by_date = [s for s, *_ in sorted(PYTHIA, key=lambda p: p[3])]
    by_scoring = [s for s, *_ in sorted(PYTHIA, key=lambda p: p[4])]
    assert by_date != steps and by_scoring != steps
    assert [r["step"] for r in by_lineage["org/pythia-tiny"]] == steps
    assert [r["commit"] for r in by_lineage["org/pythia-tiny"]] == \
        [state.shas[("org/pythia-tiny", f"step{s}")] for s in steps]

    for family, spec in (("org/llama-tiny", LLAMA), ("org/neox-small", NEOX)):
        dated = [label for label, *_ in sorted(spec, key=lambda p: p[3])]
        assert dated != [label for label, *_ in sorted(spec, key=lambda p: p[4])]   # scored in another order
        assert [r["commit"] for r in by_lineage[family]] == [state.shas[(family, label)] for label in dated]
        assert [r["released_at"] for r in by_lineage[family]] == \
            [T0 + timedelta(hours=p[3]) for p in sorted(spec, key=lambda p: p[3])]
        assert {r["time_source"] for r in by_lineage[family]} == {"Hub commit date"}

    # "current" is the last in that order: its L* and its newest prediction's state
    last = {"org/pythia-tiny": ("org/pythia-tiny", f"step{steps[-1]}"),
            "org/llama-tiny": ("org/llama-tiny", max(LLAMA, key=lambda p: p[3])[0]),
            "org/neox-small": ("org/neox-small", max(NEOX, key=lambda p: p[3])[0])}
    families = {f["lineage"]: f for f in data["families"]}
    lstar_of = {("org/pythia-tiny", f"step{s}"): lstar for s, lstar, *_ in PYTHIA}
    lstar_of.update({("org/llama-tiny", c): lstar for c, lstar, *_ in LLAMA})
    lstar_of.update({("org/neox-small", c): lstar for c, lstar, *_ in NEOX})
    preds = state.store.query("SELECT lineage, commit_sha, state FROM predictions WHERE policy = 'governance' "
                              "ORDER BY evaluated_at, id")
    newest_state = {(p["lineage"], p["commit_sha"]): p["state"] for p in preds}
    (task,) = data["tasks"]
    current = {x["lineage"]: x for x in task["lineages"]}
    for family, key in last.items():
        sha = state.shas[key]
        assert families[family]["latest_lstar"] == lstar_of[key]
        assert families[family]["current"] == by_lineage[family][-1]["checkpoint"]
        assert current[family]["commit"] == sha and current[family]["lstar"] == lstar_of[key]
        assert current[family]["state"] == newest_state[(family, sha)]
    # the pythia checkpoint scored last (step200) is in another state than the current one
    scored_last = max(PYTHIA, key=lambda p: p[4])[0]
    assert newest_state[("org/pythia-tiny", state.shas[("org/pythia-tiny", f"step{scored_last}")])] != \
        current["org/pythia-tiny"]["state"]


# -- 3. the time axis ------------------------------------------------------------------------------
def test_lstar_over_time_is_drawn_against_step_and_commit_date_with_labelled_axes(data) -> None:
    import matplotlib.dates as mdates

    fig = report_plots.lstar_over_time_figure(data["lstar_table"], report_colours(data))
    try:
        axes = {ax.get_xlabel(): ax for ax in fig.axes}
        assert set(axes) == {"training step (from branch names)", "release time (Hub commit date)"}
        lines = {label: handle.lines[0] for ax in fig.axes
                 for handle, label in zip(*ax.get_legend_handles_labels())}
        step_ax = axes["training step (from branch names)"]
        assert [label for label in step_ax.get_legend_handles_labels()[1]] == ["org/pythia-tiny"]
        assert list(lines["org/pythia-tiny"].get_xdata()) == sorted(s for s, *_ in PYTHIA)
        for family, spec in (("org/llama-tiny", LLAMA), ("org/neox-small", NEOX)):
            dates = [T0 + timedelta(hours=p[3]) for p in sorted(spec, key=lambda p: p[3])]
            xs = mdates.date2num(list(lines[family].get_xdata()))
            assert list(xs) == pytest.approx(list(mdates.date2num(dates)))
            scored = mdates.date2num([T0 + timedelta(hours=p[4]) for p in spec])
            assert not set(xs) & set(scored)
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)


def test_the_time_axis_names_its_fallbacks() -> None:
    assert report_plots.time_axis_label(["Hub commit date"]) == "release time (Hub commit date)"
    assert report_plots.time_axis_label(["time scored", "Hub commit date"]) == \
        "release time (Hub commit date; where unknown: time scored)"
    assert report_plots.time_axis_label(["time scored"]) == "time scored (no Hub commit date known)"


# -- 4. η̂ and its interval -------------------------------------------------------------------------
def test_eta_and_its_interval_are_drawn_and_labelled(state, data) -> None:
    curve = state.curve
    (task,) = data["tasks"]
    fig = report_plots.task_curve_figure(curve, task["new_points"], report_colours(data))
    try:
        (ax,) = fig.axes
        entries = dict(zip(ax.get_legend_handles_labels()[1], ax.get_legend_handles_labels()[0]))
        eta = curve.threshold
        line = entries[f"η̂ (threshold) = {fmt(eta.estimate)}"]
        assert set(line.get_xdata()) == {eta.estimate}
        band = entries[f"η̂ 90% interval [{fmt(eta.lower)}, {fmt(eta.upper)}]"]
        assert band.get_alpha() > 0                             # a shaded band
        assert sorted([band.get_x(), band.get_x() + band.get_width()]) == pytest.approx([eta.lower, eta.upper])
        assert f"level b + ε = {fmt(BASELINE + MARGIN)}" in entries
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)


# -- 5. one checkpoint name in every table ---------------------------------------------------------
def test_checkpoints_are_named_the_same_in_every_table(state, data) -> None:
    names = {(r["repo"], r["commit"]): r["checkpoint"] for r in data["lstar_table"]}
    for (repo, label), sha in state.shas.items():
        ref = label if label.startswith("step") else "main"
        assert names[(repo, sha)] == f"{repo}@{ref} ({sha[:7]})"
    assert data["crossings"]
    for row in [*data["crossings"], *data["tasks"][0]["lineages"], *data["tasks"][0]["new_points"],
                *data["new_checkpoints"]]:
        assert row["checkpoint"] == names[(row["repo"], row["commit"])]
    data["plots"] = []
    md = to_markdown(data)
    page = to_html(data, {})
    for c in data["crossings"]:
        assert f"| {c['task']} | {c['lineage']} | {c['checkpoint']} |" in md
        assert f"<td>{html_lib.escape(c['checkpoint'])}</td>" in page
    for r in data["lstar_table"]:
        assert f"| {r['lineage']} | {r['checkpoint']} |" in md and f"| {r['checkpoint']} | " in md
    assert "@" + next(iter(state.shas.values()))[:12] not in md   # no bare 12-digit hashes for named refs
    assert checkpoint_name("org/x", "f" * 40, []) == "org/x@" + "f" * 12


# -- 6. one precision for numbers ------------------------------------------------------------------
def test_levels_and_thresholds_are_shown_at_the_precision_stored(state, data) -> None:
    (task,) = data["tasks"]
    assert task["level"] == pytest.approx(0.2955)
    data["plots"] = []
    md, page = to_markdown(data), to_html(data, {})
    for text in (md, page):
        assert "= 0.2955" in text and "0.2500 + 0.0455 = 0.2955" in text
        assert not re.search(r"0\.295(?!\d)", text)             # never rounded to 0.295
        assert f"{fmt(task['eta'])} [{fmt(task['eta_lower'])}, {fmt(task['eta_upper'])}]" in text
    for x in task["lineages"]:
        assert f"| {fmt(x['threshold'])} |" in md and fmt(x["threshold"]) == "0.2955"
    fig = report_plots.task_curve_figure(state.curve, task["new_points"])
    try:
        labels = fig.axes[0].get_legend_handles_labels()[1]
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)
    assert "level b + ε = 0.2955" in labels and not [lab for lab in labels if re.search(r"0\.295(?!\d)", lab)]


# -- 7. how to read each section -------------------------------------------------------------------
def test_each_section_says_how_to_read_it(data) -> None:
    data["plots"] = []
    md, page = to_markdown(data), to_html(data, {})
    headings = {"lstar": "## L* by family", "tasks": "## Tasks", "crossings": "## Crossings",
                "stability": "## Stability diagnostics", "plots": "## Plots"}
    for section, heading in headings.items():
        after = md.split(heading, 1)[1]
        assert after.lstrip().startswith(f"*How to read this:* {HOW_TO_READ[section]}"), section
        assert f"<strong>How to read this:</strong> {escape(HOW_TO_READ[section])}</p>" in page, section
    text = " ".join(HOW_TO_READ.values())
    for phrase in ("nats per token", "unigram", "Lower is more capable", "heavy right tail", "mean is much larger "
                   "than the median", "V_eff", "margin ε", "at risk when", "logit margin"):
        assert phrase in text, phrase
    assert "V_eff (tokens)" in md and "logit margin (nats)" in md


# -- 8. the page in Chromium -----------------------------------------------------------------------
@pytest.mark.skipif(shutil.which("chromium") is None,
                    reason="headless Chromium missing: apt-get install -y chromium")
def test_the_report_of_three_families_renders_with_non_blank_plots(data, tmp_path_factory) -> None:
    from support.screenshot import chromium_screenshot, drawn_plots

    paths = write_report(data, tmp_path_factory.mktemp("report") / "out")
    shot = chromium_screenshot(paths["html"], tmp_path_factory.mktemp("chromium") / "report.png",
                               tmp_path_factory.mktemp("chromium-profile"))
    keep = ROOT / "state" / "test-artifacts"
    keep.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(shot, keep / "report-families-screenshot.png")
    plots = drawn_plots(shot)
    assert len(plots) == 3
    for non_white, colours in plots:
        assert non_white > 0.02 and colours > 50, (non_white, colours)


def test_tasks_whose_names_slug_alike_get_one_curve_figure_each() -> None:
    """"a b" and "a/b" both slug to `a_b`: each still gets its own file, and neither name is a
    fixed figure's; the same names give the same files on every run."""
    from monitor.reports.report import curve_figure_names

    fixed = {"lstar_over_time.png", "ce_vs_lstar.png"}
    names = curve_figure_names(["a b", "a/b", "a_b", "cloze"], taken=fixed)
    assert len(set(names.values())) == 4 and not set(names.values()) & fixed
    assert names["a b"] == "curve_a_b.png" and names["cloze"] == "curve_cloze.png"
    assert all(n.startswith("curve_a_b_") and n.endswith(".png") for n in (names["a/b"], names["a_b"]))
    assert curve_figure_names(["a b", "a/b", "a_b", "cloze"], taken=fixed) == names


def test_a_prediction_beyond_the_references_says_how_far_in_both_renderings(data) -> None:
    rows = [x for t in data["tasks"] for x in t["lineages"]]
    assert rows and all(x["extrapolation"] in ("",) or x["extrapolation"].startswith("extrapolated by")
                        for x in rows)
    text = "extrapolated by 0.25 nats/token beyond the most advanced reference"
    hostile = "extrapolated by <b>*x*</b>"
    first = data["tasks"][0]["lineages"][0]
    first["extrapolation"] = text
    md, page = to_markdown(data), to_html(data, {})
    assert f"({text})" in md and f"({text})" in page
    first["extrapolation"] = hostile
    md, page = to_markdown(data), to_html(data, {})
    assert "<b>" not in md and "<b>*x*</b>" not in page and "&lt;b&gt;" in page
