"""A report is about its window (docs/reliability.md row 48): old history (scores,
predictions, discoveries and `not_evaluated` records before the window) changes nothing in it
but the lineage states carried in — one row per lineage (its current checkpoint before the
window, in training order) and, per task, its state then — and the Markdown shows the top rows
of long tables with counts, the JSON every row."""

from __future__ import annotations

import json
import shutil
from datetime import timedelta
from pathlib import Path

import pytest

from monitor.reports.report import build_report, to_json, to_markdown
from monitor.reports.summary import TOP_ROWS
from monitor.store import Store
from monitor.store.placing import META_COLUMNS, META_VALUES
from support.report_state import T0, build_report_state

CORPUS = "c" * 64
OLD = T0 - timedelta(days=30)
START, NOW = T0 - timedelta(hours=1), T0 + timedelta(hours=7)
REAL = ("org/pythia-tiny", "org/llama-tiny", "org/neox-small")
OLD_LINEAGES = [f"org/old-{i:03d}" for i in range(120)]

RUN = ("INSERT INTO score_runs (run_id, checkpoint_id, model_repo, model_sha, model_source, tokenizer_fingerprint, "
       "corpus_sha256, spec_version, window_len, stride, prefix_policy, dtype, device, n_tokens, n_bytes, nll_sum, "
       "ce, ce_unigram, lstar, l_rel, l_gain, bits_per_byte, tokens_per_byte, se_ce, slices, spec, model, "
       "library_versions, wall_s, tokens_per_s, finished_at) VALUES (?, ?, ?, ?, 'hub', 'fp-old', ?, 'lstar-score/1', "
       "64, 32, 'bos', 'float32', 'cpu', 1000, 4000, 1.0, ?, 7.0, ?, 1.0, 0.0, 1.0, 0.25, 0.03, '{}', '{}', '{}', "
       "'{}', 1.0, 1000.0, ?)")
PREDICTION = ("INSERT INTO predictions (policy, task, run_id, repo, commit_sha, lineage, corpus_sha256, lstar, se, "
              "p_hat, lo, hi, threshold, state, curve_id, detail, evaluated_at) VALUES ('governance', 'cloze', "
              "?, ?, ?, ?, ?, ?, 0.03, 0.5, 0.4, 0.6, 0.3, ?, 'curve', ?, ?)")


def old_history() -> list[dict]:
    """Old runs, a month before the window: three more checkpoints of each real lineage (earlier
    steps and commit dates, higher L*) and two of each of 120 lineages the window never sees."""
    runs = []
    for lineage in REAL:
        for k in range(3):
            runs.append({"lineage": lineage, "ref": f"step{10 + k}" if "pythia" in lineage else "main",
                         "lstar": 3.6 - k / 10, "state": "clear", "at": OLD + timedelta(hours=k)})
    for i, lineage in enumerate(OLD_LINEAGES):
        for k in range(2):
            runs.append({"lineage": lineage, "ref": "main", "lstar": 2.0 + (i % 7) / 10 - k / 5,
                         "state": ("at_risk" if i % 3 == 0 else "clear") if k else "clear",
                         "at": OLD + timedelta(hours=k, minutes=i)})
    for n, run in enumerate(runs):
        run.update(id=10_000 + n, run_id=f"old{n:04d}", sha=f"{n:040x}")
    return runs


def add_old_history(store, runs: list[dict]) -> None:
    with store.transaction() as conn:
        for r in runs:
            meta = json.dumps({"gate": {"verdict": "passed", "commit_date": r["at"].isoformat()}})
            conn.execute("INSERT INTO checkpoints (id, repo, sha, source, refs, lineage, rule, discovered_at, "
                         f"updated_at, status, {META_COLUMNS}) VALUES (?, ?, ?, 'hub', ?, ?, 'watch', ?, ?, 'scored', "
                         f"{META_VALUES})",
                         [r["id"], r["lineage"], r["sha"], json.dumps([r["ref"]]), r["lineage"], r["at"], r["at"],
                          meta, meta])
            conn.execute(RUN, [r["run_id"], r["id"], r["lineage"], r["sha"], CORPUS, r["lstar"] + 7.0, r["lstar"],
                               r["at"]])
            conn.execute(PREDICTION, [r["run_id"], r["lineage"], r["sha"], r["lineage"], CORPUS, r["lstar"],
                                      r["state"], "{}", r["at"] + timedelta(minutes=1)])
        # a score the policy could not evaluate, long ago: no problem of this window
        conn.execute(PREDICTION.replace("0.5, 0.4, 0.6, 0.3", "NULL, NULL, NULL, NULL"),
                     [runs[0]["run_id"] + "-ne", runs[0]["lineage"], runs[0]["sha"], runs[0]["lineage"], CORPUS, 3.0,
                      "not_evaluated", json.dumps({"reason": "the curve was missing"}), OLD])


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    """The report of the window on a state without old history and on the same state with it."""
    built = build_report_state(tmp_path_factory.mktemp("plain"))
    # The state with history is a copy of the same file, then the old rows: building the state a
    # second time cost 1.4 CPU-seconds and made the same rows.
    built.store.close()
    copy = tmp_path_factory.mktemp("with-old") / "lstar.duckdb"
    shutil.copyfile(built.folder / "lstar.duckdb", copy)
    plain, with_old = Store.open(built.folder / "lstar.duckdb"), Store.open(copy)
    runs = old_history()
    add_old_history(with_old, runs)
    try:
        a = json.loads(to_json(build_report(plain, built.policy, now=NOW, period_start=START)))
        full = build_report(with_old, built.policy, now=NOW, period_start=START)
        b = json.loads(to_json(full))
        yield a, b, runs, to_markdown(full)
    finally:
        plain.close()
        with_old.close()


def newest_by_lineage(runs: list[dict]) -> dict[str, dict]:
    """The newest old run of each lineage, by a plain loop."""
    out: dict[str, dict] = {}
    for r in sorted(runs, key=lambda r: (r["at"], r["run_id"])):
        out[r["lineage"]] = r
    return out


def test_old_history_changes_only_the_lineage_states_carried_in(reports):
    a, b, runs, _ = reports
    newest = newest_by_lineage(runs)
    # Without history nothing is carried in; with it, exactly one row per lineage: its newest old run.
    assert all(r["new"] for r in a["lstar_table"])
    assert [r for r in b["lstar_table"] if r["new"]] == a["lstar_table"]
    carried = {r["lineage"]: r["run_id"] for r in b["lstar_table"] if not r["new"]}
    assert carried == {lineage: r["run_id"] for lineage, r in newest.items()}
    assert len(b["lstar_table"]) == len(a["lstar_table"]) + len(REAL) + len(OLD_LINEAGES)

    # The families the window saw keep their current checkpoint, order and numbers; they count
    # the checkpoints scored before the window; the others are their state at the window's start.
    families_a = {f["lineage"]: f for f in a["families"]}
    families_b = {f["lineage"]: f for f in b["families"]}
    assert set(families_b) == set(REAL) | set(OLD_LINEAGES)
    for lineage, fa in families_a.items():
        fb = families_b[lineage]
        assert fa["checkpoints_before"] == 0 and fb["checkpoints_before"] == 3
        assert fb["checkpoints"] == fa["checkpoints"] + 1
        same = ("current", "order", "latest_lstar", "latest_se", "best_lstar", "new_scores")
        assert {k: fb[k] for k in same} == {k: fa[k] for k in same}
    for lineage in OLD_LINEAGES:
        mine = [r for r in runs if r["lineage"] == lineage]
        fb = families_b[lineage]
        assert (fb["checkpoints_before"], fb["new_scores"]) == (2, 0)
        assert fb["best_lstar"] == pytest.approx(min(r["lstar"] for r in mine))
        assert fb["latest_lstar"] == pytest.approx(newest[lineage]["lstar"])

    # Task states: the window's lineages as before; the others carried in at their newest state.
    (task_a,), (task_b,) = a["tasks"], b["tasks"]
    states_b = {x["lineage"]: x for x in task_b["lineages"]}
    assert [states_b[x["lineage"]] for x in task_a["lineages"]] == task_a["lineages"]
    assert {k: v["state"] for k, v in states_b.items() if k in OLD_LINEAGES} == \
        {lineage: newest[lineage]["state"] for lineage in OLD_LINEAGES}
    assert task_b["new_points"] == task_a["new_points"]

    # Crossings: a lineage's first change in the window starts from its carried-in state (and
    # is no change when it stays there); every later one is the same.
    expected, seen = [], set()
    for c in a["crossings"]:
        if c["lineage"] not in seen:
            seen.add(c["lineage"])
            before = newest[c["lineage"]]["state"]
            if before == c["to"]:
                continue
            c = {**c, "from": before}
        expected.append(c)
    assert b["crossings"] == expected
    assert b["problems"] == a["problems"] and not any("missing" in p for p in b["problems"])
    assert b["new_checkpoints"] == a["new_checkpoints"]
    carried_at_risk = sum(newest[lineage]["state"] == "at_risk" for lineage in OLD_LINEAGES)
    assert b["summary"]["at_risk"] == a["summary"]["at_risk"] + carried_at_risk == len(b["at_risk"])
    assert b["summary"]["lineages"] == len(REAL) + len(OLD_LINEAGES)
    assert {k: v for k, v in b["summary"].items() if k not in ("lineages", "crossings", "at_risk")} == \
        {k: v for k, v in a["summary"].items() if k not in ("lineages", "crossings", "at_risk")}


def test_markdown_shows_the_top_rows_and_counts_while_the_json_has_every_row(reports):
    _, b, _, md = reports
    table = md.split("## L* by family")[1].split("Current checkpoint per lineage")[0]
    rows = [line for line in table.splitlines() if line.startswith("| org/")]
    # the three lineages with new scores first (13 rows), then whole old lineages up to the cap
    assert len(rows) <= TOP_ROWS and {"org/pythia-tiny", "org/llama-tiny", "org/neox-small"} <= \
        {line.split(" | ")[0][2:] for line in rows}
    shown_lineages = {line.split(" | ")[0][2:] for line in rows}
    assert (f"*Showing {len(rows)} of {len(b['lstar_table'])} rows: {len(shown_lineages)} of "
            f"{len(b['families'])} lineages, those with the most new scores (report.json has every row).*") in md
    states = {}
    for x in b["tasks"][0]["lineages"]:
        states[x["state"]] = states.get(x["state"], 0) + 1
    counts = ", ".join(f"{k} {v:,}" for k, v in sorted(states.items()))
    assert (f"*Showing {TOP_ROWS} of {len(b['tasks'][0]['lineages'])} lineages, at risk and emerged first "
            f"({counts}; report.json has every row).*") in md


def test_a_report_folder_renders_a_large_window_summarised(reports, tmp_path: Path):
    from monitor.reports.report import render_plots, report_colours
    from monitor.reports.summary import PLOT_LINEAGES, plotted

    _, b, _, _ = reports
    view = plotted(b)
    assert len({r["lineage"] for r in view["lstar_table"]}) == PLOT_LINEAGES
    assert len(report_colours(view)) == PLOT_LINEAGES
    figures = render_plots(dict(b, _curves={"cloze": _curve_of(tmp_path)}))
    assert set(figures) == {"lstar_over_time.png", "ce_vs_lstar.png", "curve_cloze.png"}


def _curve_of(folder: Path):
    from support.report_state import _fit_curve

    return _fit_curve(folder)
