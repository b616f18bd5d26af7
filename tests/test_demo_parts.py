"""The demo's parts that need no training: the order of a lineage's states, the policy it writes
for its daemon passes (loaded by the real policy loader, its evaluation block included), and the
shipped history curve (its pins checked against the corpus the demo scores)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from monitor.demo.history import SHIPPED_CURVE, curve_facts, shipped_curve
from monitor.demo.run import (CURVE_FILE, EVALUATIONS_PER_DAY, POLICY, POLICY_WITHOUT_REPORTS, TASK_FILE,
                              WORKDIR_MARKER, _score_request, states_in_order)
from monitor.errors import LstarError
from support.cli_run import lstar_in_process

ROOT = Path(__file__).resolve().parents[1]
FIELDS = dict(org="demo-org", corpus="0" * 64, curve=CURVE_FILE, task_file=TASK_FILE, per_day=EVALUATIONS_PER_DAY,
              webhook="http://127.0.0.1:1/hook", smtp_port=25, audit="/tmp/audit.jsonl")


@pytest.mark.parametrize(("states", "expected"), [
    (["clear", "at_risk", "emerged"], True),
    (["clear", "clear", "at_risk", "at_risk", "emerged", "emerged"], True),
    (["clear", "at_risk", "clear", "at_risk", "emerged"], False),      # a step back
    (["clear", "emerged"], False),                                     # at_risk never seen
    (["at_risk", "emerged"], False),                                   # clear never seen
    (["clear", "at_risk", "emerged", "at_risk"], False),
    (["clear", None, "at_risk", "emerged"], False),                    # a checkpoint with no prediction
    ([], False),
])
def test_states_in_order(states: list, expected: bool) -> None:
    assert states_in_order(states) is expected


def test_the_passes_before_the_last_write_no_report() -> None:
    full = yaml.safe_load(POLICY.format(**FIELDS))
    partial = yaml.safe_load(POLICY_WITHOUT_REPORTS.format(**FIELDS))
    assert [r["name"] for r in full["reports"]] == ["demo-report"]
    assert "reports" not in partial
    assert {k: v for k, v in full.items() if k != "reports"} == partial
    # an at_risk alert and the emerged one minutes later are both told as they happen
    assert full["route"]["group_interval"] == "0s"


def test_the_demo_policy_loads_with_its_curve_and_evaluation(tmp_path: Path) -> None:
    """The policy the demo writes, loaded by the daemon's loader with the shipped curve and a
    task file beside it: the task is evaluated directly on at-risk and emerged checkpoints."""
    from monitor.policy.load import load_policy

    (tmp_path / "curves").mkdir()
    shutil.copyfile(SHIPPED_CURVE, tmp_path / CURVE_FILE)
    (tmp_path / "tasks").mkdir()
    item = {"id": "a", "context": "two plus two is", "choices": [" four", " five"], "answer": 0}
    (tmp_path / TASK_FILE).write_text(json.dumps(item) + "\n")
    curve = json.loads(SHIPPED_CURVE.read_text())
    path = tmp_path / "demo.yaml"
    path.write_text(POLICY.format(**{**FIELDS, "corpus": curve["corpus_sha256"]}))
    policy = load_policy(path)
    (task,) = policy.tasks
    assert task.name == "add-words" and task.evaluate is not None
    assert (task.evaluate.kind, task.evaluate.file, task.evaluate.metric) == ("multiple_choice", TASK_FILE, "acc")
    assert task.evaluate.on == ["at_risk", "emerged"]
    assert policy.evaluations.per_day == EVALUATIONS_PER_DAY


def test_the_shipped_curve_is_the_demo_history_with_a_resolved_threshold(shared_dir: Path) -> None:
    """The curve shipped with the package: additions accuracy on L*, fitted on seed 0 of the
    demo's lab (its provenance says so), its threshold resolved inside the data, and pinned to
    the documents the demo scores (recomputed here from ../shared)."""
    from monitor.lab.demo import demo_config
    from monitor.scoring.scoring_driver import corpus_selection

    sha = corpus_selection(_score_request(shared_dir / "corpus" / "calib-v0")).sha256
    curve = shipped_curve(sha)
    assert (curve.task, curve.metric, curve.axis) == ("add-words", "acc", "lstar")
    config = demo_config(shared_dir)
    assert curve.provenance["seed"] == 0 and curve.provenance["byte_budget"] == config.byte_budget
    assert curve.provenance["checkpoints"] == len(config.fractions) == len(curve.points)
    assert {p.family for p in curve.points} == {"gpt2"}
    # b = chance over the ten number words; ε = half the fitted rise above it
    assert curve.baseline == pytest.approx(0.1)
    assert curve.margin == pytest.approx(round((max(curve.band.fit) - curve.baseline) / 2, 4))
    facts = curve_facts(curve)
    assert facts["threshold"]["resolved"] is True and facts["fit"]["unresolved_warnings"] == []
    thr = curve.threshold
    lo_x, hi_x = curve.x_range
    assert lo_x < thr.lower < thr.estimate < thr.upper < hi_x
    # the history reaches the plateau: its last points lie well above the level
    best = max(p.value for p in curve.points)
    assert best > curve.level + 0.2


def test_the_shipped_curve_refuses_another_corpus() -> None:
    with pytest.raises(LstarError) as err:
        shipped_curve("f" * 64)
    assert "add-words-curve.json" in str(err.value) and "ffffffffffffffff" in str(err.value)
    assert "--fit-history" in err.value.hint


def _demo(workdir: Path, shared_dir: Path) -> "subprocess.CompletedProcess[str]":
    """`lstar demo` in this process (`support.cli_run`): these calls are refused before any work."""
    return lstar_in_process("demo", "--workdir", str(workdir), "--shared", str(shared_dir), cwd=ROOT)


def test_a_folder_the_demo_did_not_make_is_refused_and_left_intact(tmp_path: Path, shared_dir: Path) -> None:
    """The demo empties its folder first: a folder with files it did not make is refused in one
    line before anything is touched, whatever the files are."""
    workdir = tmp_path / "mine"
    workdir.mkdir()
    (workdir / "thesis.tex").write_text("years of work")
    (workdir / "sub").mkdir()
    (workdir / "sub" / "data.csv").write_text("1,2\n")
    proc = _demo(workdir, shared_dir)
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("demo failed at prepare:") and str(workdir) in last
    assert "sub, thesis.tex, which the demo does not make" in last
    assert (workdir / "thesis.tex").read_text() == "years of work" and (workdir / "sub" / "data.csv").is_file()
    assert sorted(p.name for p in workdir.iterdir()) == ["sub", "thesis.tex"]
    # a file given as the folder: refused too, untouched
    (tmp_path / "file").write_text("x")
    proc = _demo(tmp_path / "file", shared_dir)
    assert proc.returncode == 1 and "is not a folder" in proc.stderr
    assert (tmp_path / "file").read_text() == "x"
    # --save-history-curve inside the folder the next demo empties: refused before any work
    proc = lstar_in_process("demo", "--workdir", str(tmp_path / "new"), "--shared", str(shared_dir),
                            "--fit-history", "--save-history-curve", str(tmp_path / "new" / "curve.json"), cwd=ROOT)
    assert proc.returncode == 1 and "inside the demo's folder" in proc.stderr
    assert not (tmp_path / "new").exists()
    # --save-history-curve without --fit-history: a usage error
    proc = lstar_in_process("demo", "--save-history-curve", str(tmp_path / "c.json"), cwd=ROOT)
    assert proc.returncode == 2 and "--fit-history" in proc.stderr


def test_a_demo_folder_is_emptied_of_its_own_entries_only(tmp_path: Path) -> None:
    from monitor.demo.run import prepare_workdir

    workdir = tmp_path / "demo"
    prepare_workdir(workdir)                       # new: made and marked
    assert [p.name for p in workdir.iterdir()] == [WORKDIR_MARKER]
    inode = workdir.stat().st_ino
    (workdir / "state").mkdir()
    (workdir / "state" / "old.duckdb").write_text("old")
    (workdir / "received").mkdir()
    prepare_workdir(workdir)                       # an earlier demo's: emptied, marked again, kept
    assert [p.name for p in workdir.iterdir()] == [WORKDIR_MARKER] and workdir.stat().st_ino == inode
    # a file the demo never makes, even in a marked folder: refused, nothing removed
    (workdir / "state").mkdir()
    (workdir / "notes.txt").write_text("mine")
    with pytest.raises(LstarError, match="notes.txt, which the demo does not make"):
        prepare_workdir(workdir)
    assert sorted(p.name for p in workdir.iterdir()) == [WORKDIR_MARKER, "notes.txt", "state"]
    # a folder an older demo left (no marker, its layout): emptied
    older = tmp_path / "older"
    (older / "state").mkdir(parents=True)
    (older / "state" / "lstar.duckdb").write_text("db")
    (older / "policies").mkdir()
    (older / "policies" / "demo.yaml").write_text("name: demo\n")
    prepare_workdir(older)
    assert [p.name for p in older.iterdir()] == [WORKDIR_MARKER]
    # the demo's entry names without its marker or layout: refused
    lookalike = tmp_path / "lookalike"
    (lookalike / "models").mkdir(parents=True)
    with pytest.raises(LstarError, match="not laid out as a demo's folder"):
        prepare_workdir(lookalike)
    assert (lookalike / "models").is_dir()
    empty = tmp_path / "empty"
    empty.mkdir()
    prepare_workdir(empty)                         # empty: used
    assert [p.name for p in empty.iterdir()] == [WORKDIR_MARKER]


@pytest.mark.parametrize("target", ["demo-folder", "mine", "nowhere"])
def test_a_symlinked_workdir_is_refused_and_neither_it_nor_its_target_touched(tmp_path: Path, target: str) -> None:
    """The demo empties its folder: named through a symbolic link (to an earlier demo's folder,
    to a folder of someone's files, or to nothing), it refuses at `prepare` in one line naming
    the link, and the link and its target are left as they were. (No shared folder is given:
    a demo that got past `prepare` stops at its next stage instead of training.)"""
    from monitor.demo.failure import DemoFailed
    from monitor.demo.run import prepare_workdir, run_demo

    folder = tmp_path / target
    if target == "demo-folder":
        prepare_workdir(folder)
        (folder / "state").mkdir()
        (folder / "state" / "lstar.duckdb").write_text("an earlier demo's state")
    elif target == "mine":
        folder.mkdir()
        (folder / "thesis.tex").write_text("years of work")
    before = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    link = tmp_path / "link"
    link.symlink_to(folder, target_is_directory=True)
    with pytest.raises(DemoFailed) as err:
        run_demo(link, shared_dir=tmp_path / "no-shared-folder")
    assert err.value.stage == "prepare"
    assert f"--workdir {link} is a symbolic link (to {folder})" in err.value.reason
    assert "\n" not in str(err.value)
    assert link.is_symlink() and os.readlink(link) == str(folder)
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p != link) == before
    # the link's target named as itself is the demo's own folder: prepared as before
    if target == "demo-folder":
        prepare_workdir(folder)
        assert [p.name for p in folder.iterdir()] == [WORKDIR_MARKER]


@pytest.mark.parametrize(("lstar", "se"), [(0.254, 0.084), (0.336, 0.090), (0.545, 0.149), (0.40, 0.05), (1.70, 0.10), (0.79, 0.0)])
def test_the_emerged_margin_is_the_distance_to_the_band_meeting_the_level(lstar: float, se: float) -> None:
    """The margin the demo reports: where the shipped curve's lower band edge meets the level
    (recomputed here by linear interpolation on the band's grid), less L* + z·SE, z the normal
    quantile of the curve's confidence; the state is emerged exactly when it is ≥ 0, and a score
    moved by the margin sits on the edge."""
    import numpy as np
    from scipy.stats import norm

    from monitor.curves import load_curve, predict
    from monitor.demo.history import emerged_margin

    curve = load_curve(SHIPPED_CURVE)
    x, lower = np.asarray(curve.band.x), np.asarray(curve.band.lower)
    i = int(np.flatnonzero(lower < curve.level)[0])                   # the band falls as L* rises
    edge = x[i - 1] + (curve.level - lower[i - 1]) * (x[i] - x[i - 1]) / (lower[i] - lower[i - 1])
    z = norm.ppf(0.95)                                                  # confidence 0.9, two-sided
    assert curve.confidence == pytest.approx(0.9)
    margin = emerged_margin(curve, lstar, se)
    assert margin["edge"] == pytest.approx(edge, abs=1e-9)
    assert margin["lstar"] == pytest.approx(edge - (lstar + z * se), abs=1e-9)
    assert margin["se_units"] == (None if se == 0 else pytest.approx((edge - (lstar + z * se)) / se, abs=1e-8))
    assert (predict(curve, lstar, se).state == "emerged") is (margin["lstar"] >= 0)
    # the demo's last checkpoint on its 78 documents (L* 0.254 ± 0.084), by hand: the edge is the
    # curve's threshold lower bound 0.49853, less 0.254 + 1.64485 · 0.084 = 0.39217: 0.1064 in
    # L*, 1.266 SE; step 1045 (0.336 ± 0.090): 0.0145, 0.161 SE, emerged by a hair
    if (lstar, se) == (0.254, 0.084):
        assert margin["lstar"] == pytest.approx(0.1064, abs=1e-4)
        assert margin["se_units"] == pytest.approx(1.266, abs=1e-3)
    if (lstar, se) == (0.336, 0.090):
        assert margin["lstar"] == pytest.approx(0.0145, abs=1e-4)
        assert margin["se_units"] == pytest.approx(0.161, abs=1e-3)
