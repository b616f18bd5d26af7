"""One current checkpoint per lineage on every surface (issue 38, item 1).

The state's Pythia lineage was scored out of training order (step3000, step20000, step2000,
step1000, then step200 last), so "the newest score" and "the latest in training order" name
different checkpoints. The daemon's scheduled report (what `/report/latest` serves), the ad hoc
report after it (`lstar report` in the terminal, as Markdown, HTML and JSON, and the API's
`/report?policy=`, which is `report_for_cli`) must all name step20000, the rule of
`monitor.reports.current`; and the L*-over-time plot must draw every scored checkpoint.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest

from monitor.reports.current import current_checkpoint
from monitor.reports.present import Placement
from monitor.reports.report import report_figures, report_for_cli, to_html, to_markdown
from monitor.reports.schedule import write_due_reports
from support.report_state import LLAMA, NEOX, PYTHIA, T0, build_report_state

PYTHIA_CURRENT = f"org/pythia-tiny@step{max(step for step, *_ in PYTHIA)}"
PYTHIA_LAST_SCORED = f"org/pythia-tiny@step{max(PYTHIA, key=lambda row: row[4])[0]}"
# llama and neox are `main` commits, dated: the latest commit date (not the last scored) is current
LLAMA_CURRENT = max(LLAMA, key=lambda row: row[3])[0]
NEOX_CURRENT = max(NEOX, key=lambda row: row[3])[0]


def test_the_rule_is_training_order_not_scoring_order() -> None:
    t = T0
    # steps named by every checkpoint: the step decides, whatever the dates
    rows = [("a", Placement(2000, t, "Hub commit date")), ("b", Placement(1000, t + timedelta(hours=1),
                                                                            "Hub commit date"))]
    assert current_checkpoint(rows, lambda r: r[1])[0] == "a"
    # one checkpoint without a step: release time decides for the whole lineage
    rows.append(("c", Placement(None, t - timedelta(hours=1), "Hub commit date")))
    assert current_checkpoint(rows, lambda r: r[1])[0] == "b"
    # equal keys: the tiebreak (the commit), never the input order
    twins = [("y", Placement(5, t, "time scored")), ("x", Placement(5, t, "time scored"))]
    assert current_checkpoint(twins, lambda r: r[1], lambda r: r[0])[0] == "y"
    assert current_checkpoint(list(reversed(twins)), lambda r: r[1], lambda r: r[0])[0] == "y"
    assert current_checkpoint([], lambda r: r[1]) is None


@pytest.fixture(scope="module")
def state(tmp_path_factory):
    made = build_report_state(tmp_path_factory.mktemp("current"))
    # the daemon's scheduled report of everything scored (what /report/latest serves)
    [done] = write_due_reports(made.store, [made.policy], now=made.now, out_dir=made.folder / "reports")
    scheduled = json.loads((Path(done["folder"]) / "report.json").read_text())
    scheduled_md = (Path(done["folder"]) / "report.md").read_text()
    yield made, scheduled, scheduled_md
    made.store.close()


def _current(data: dict, lineage: str) -> str:
    [family] = [f for f in data["families"] if f["lineage"] == lineage]
    return family["current"]


def _task_current(data: dict, lineage: str) -> str:
    [row] = [x for t in data["tasks"] for x in t["lineages"] if x["lineage"] == lineage]
    return row["checkpoint"]


def test_every_report_names_the_latest_in_training_order(state) -> None:
    made, scheduled, scheduled_md = state
    assert PYTHIA_CURRENT != PYTHIA_LAST_SCORED   # the state really scores out of order
    # the ad hoc report after the daemon's: its window holds no score, every lineage is carried in
    adhoc = report_for_cli(made.store, made.policy, now=made.now + timedelta(hours=1))
    assert adhoc["summary"]["new_scores"] == 0
    for data in (scheduled, adhoc):
        assert _current(data, "org/pythia-tiny").startswith(PYTHIA_CURRENT + " (")
        assert _task_current(data, "org/pythia-tiny").startswith(PYTHIA_CURRENT + " (")
        llama = made.shas[("org/llama-tiny", LLAMA_CURRENT)][:7]
        assert _current(data, "org/llama-tiny") == _task_current(data, "org/llama-tiny") == \
            f"org/llama-tiny@main ({llama})"
        neox = made.shas[("org/neox-small", NEOX_CURRENT)][:7]
        assert _current(data, "org/neox-small") == f"org/neox-small@main ({neox})"
    # the state carried in is that of the current checkpoint: step20000's L* and its prediction
    pythia = {step: lstar for step, lstar, *_ in PYTHIA}
    [family] = [f for f in adhoc["families"] if f["lineage"] == "org/pythia-tiny"]
    assert family["latest_lstar"] == pytest.approx(pythia[max(pythia)])
    [row] = [x for t in adhoc["tasks"] for x in t["lineages"] if x["lineage"] == "org/pythia-tiny"]
    assert row["lstar"] == pytest.approx(pythia[max(pythia)])
    # Markdown and HTML say the same
    for text in (scheduled_md, to_markdown(adhoc)):
        line = next(li for li in text.splitlines() if li.startswith("- org/pythia-tiny: "))
        assert PYTHIA_CURRENT + " (" in line and PYTHIA_LAST_SCORED + " (" not in line
    html = to_html(adhoc, {})
    assert f"org/pythia-tiny: {PYTHIA_CURRENT} (" in html


def test_the_plots_show_every_scored_checkpoint_and_each_lineage_now(state) -> None:
    made, _, _ = state
    adhoc = report_for_cli(made.store, made.policy, now=made.now + timedelta(days=30))
    assert len(adhoc["lstar_table"]) == 3     # one carried row per lineage
    figures = report_figures(adhoc)
    drawn = {c.get_label(): len(c.lines[0].get_xdata()) for c in figures["lstar_over_time.png"].axes[0].containers}
    drawn |= {c.get_label(): len(c.lines[0].get_xdata()) for ax in figures["lstar_over_time.png"].axes[1:]
              for c in ax.containers}
    assert drawn == {"org/pythia-tiny": len(PYTHIA), "org/llama-tiny": len(LLAMA), "org/neox-small": len(NEOX)}
    # no prediction in the window, yet each lineage is marked on the curve at its current state
    [task] = adhoc["tasks"]
    assert task["new_points"] == []
    marked = {c.get_label() for ax in figures["curve_cloze.png"].axes for c in ax.containers}
    assert {f"{x['lineage']}: {x['state'].replace('_', ' ')}" for x in task["lineages"]} <= marked
    assert len(task["lineages"]) == 3


def test_the_cli_names_the_same_checkpoint(state, capsys) -> None:
    from monitor.cli import main

    made, _, _ = state
    made.store.checkpoint()
    made.store.close()
    args = ["report", "--policy", str(made.folder / "policy.yaml"), "--db", str(made.folder / "lstar.duckdb")]
    assert main([*args, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert _current(data, "org/pythia-tiny").startswith(PYTHIA_CURRENT + " (")
    assert _task_current(data, "org/pythia-tiny").startswith(PYTHIA_CURRENT + " (")
    assert main(args) == 0
    terminal = capsys.readouterr().out
    assert f"current org/pythia-tiny: {PYTHIA_CURRENT} (" in terminal
    assert PYTHIA_LAST_SCORED + " (" not in terminal
    assert main([*args, "--markdown"]) == 0
    assert f"- org/pythia-tiny: {PYTHIA_CURRENT} (" in capsys.readouterr().out
