"""`lstar demo` end to end, as a subprocess: lab-trained checkpoints that learn the additions in
words with a jump, a curve fitted on one seed, the other seed published on the fake Hub one
checkpoint per daemon pass, local webhook and SMTP receivers, a report; then what it produced is
checked in the files and the database."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from email import message_from_bytes, policy as email_policy
from pathlib import Path

import pytest

from monitor.store import Store

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
REPO = "demo-org/gpt2-lab"
ORDER = ("clear", "at_risk", "emerged")


def test_demo_shows_an_emergence_and_closes_the_loop(tmp_path: Path, shared_dir: Path) -> None:
    workdir = tmp_path / "demo"
    proc = subprocess.run([sys.executable, "-m", "monitor.cli", "demo", "--json", "--workdir", str(workdir),
                           "--shared", str(shared_dir)], cwd=ROOT, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads(proc.stdout)
    assert summary["ok"] is True
    assert summary["evaluation"] is None          # until the daemon evaluates tasks itself

    # The curve fitted on seed 0 resolves its threshold: judged again from the artifact's file.
    from monitor.curves import load_curve
    from monitor.curves.artifact import unresolved_warnings

    curve = load_curve(summary["curve"])
    assert curve.task == "add-words" and curve.metric == "acc"
    assert unresolved_warnings(curve) == [] and summary["threshold"]["resolved"] is True
    thr = summary["threshold"]
    assert thr["estimate"] == pytest.approx(curve.threshold.estimate)
    assert thr["lower"] < thr["estimate"] < thr["upper"]
    lo_x, hi_x = curve.x_range
    assert lo_x < thr["lower"] and thr["upper"] < hi_x        # inside the data, not at its edge
    assert {p.family for p in curve.points} == {"gpt2"} and len(curve.points) == 10

    with Store.open(summary["db"], read_only=True) as store:
        runs = store.query("SELECT model_repo, model_sha, lstar FROM score_runs WHERE model_repo LIKE 'demo-org/%'")
        preds = store.query("SELECT commit_sha, state, lstar, se, lo, hi, threshold FROM predictions "
                            "WHERE policy = 'demo' AND repo = ?", [REPO])
        found = store.query("SELECT sha, revision, discovered_at FROM checkpoints WHERE repo = ?", [REPO])
        reports = store.reports(policy="demo")

    # The live lineage (seed 1): ten checkpoints, each published, discovered and scored in its own
    # daemon pass, so discovery times follow the steps.
    steps = summary["lineage"]["states"]
    assert [s["step"] for s in steps] == sorted(s["step"] for s in steps) and len(steps) == 10
    assert {r["model_repo"] for r in runs} == {REPO} and len(runs) == 10
    by_sha = {r["sha"]: r for r in found}
    discovered = [by_sha[s["sha"]]["discovered_at"] for s in steps]
    assert discovered == sorted(discovered) and len(set(discovered)) == 10
    assert [by_sha[s["sha"]]["revision"] for s in steps] == [f"step{s['step']}" for s in steps]

    # Each step's state is what its interval says about the level b + ε (from the database) ...
    pred = {p["commit_sha"]: p for p in preds}
    assert len(pred) == 10
    for s in steps:
        p = pred[s["sha"]]
        expected = "emerged" if p["lo"] >= p["threshold"] else "at_risk" if p["hi"] >= p["threshold"] else "clear"
        assert p["state"] == expected == s["state"]
        assert p["lstar"] == pytest.approx(s["lstar"]) and p["threshold"] == pytest.approx(curve.level)
    # ... and the lineage goes clear → at_risk → emerged, in that order, never back.
    states = [s["state"] for s in steps]
    ranks = [ORDER.index(state) for state in states]
    assert ranks == sorted(ranks) and set(ranks) == {0, 1, 2}, states
    assert summary["lineage"]["in_order"] is True

    # The webhook heard the lineage become at risk, then emerged; the report went out once.
    bodies = json.loads(Path(summary["webhook"]["file"]).read_text())
    assert all(b["groupLabels"] == {"policy": "demo", "lineage": REPO} for b in bodies)
    told = [a["labels"]["state"] for b in bodies for a in b["alerts"] if a["status"] == "firing"]
    assert "at_risk" in told and "emerged" in told
    assert told.index("at_risk") < told.index("emerged")
    for alert in (a for b in bodies for a in b["alerts"]):
        assert "UNRESOLVED" not in alert["annotations"]["description"]
    mails = [message_from_bytes(Path(f).read_bytes(), policy=email_policy.default) for f in summary["email"]["files"]]
    assert len([m for m in mails if m["X-Lstar-Report"] is None]) == summary["email"]["alert_messages"] >= 2
    assert summary["email"]["report_messages"] == 1

    (report,) = reports
    folder = Path(report.folder)
    data = json.loads((folder / "report.json").read_text())
    assert {f["lineage"] for f in data["families"]} == {REPO}
    assert sorted(r["lstar"] for r in data["lstar_table"]) == sorted(r["lstar"] for r in runs)
    assert {d["receiver"]: d["outcome"] for d in report.deliveries} == {"demo-audit": "delivered",
                                                                          "demo-email": "delivered"}

    # The task file beside the policy is what `lstar eval` runs: on the lineage's last checkpoint
    # (predicted emerged) it observes an accuracy above the level, as the prediction says.
    from monitor.cli import main

    task_file = Path(summary["task_file"])
    assert task_file.parent == Path(summary["policy"]).parent / "tasks"
    assert len(task_file.read_text().splitlines()) == 55
    last = Path(summary["workdir"]) / "models" / "gpt2-s1" / f"step{steps[-1]['step']}"
    code = subprocess.run([sys.executable, "-m", "monitor.cli", "eval", str(last), "--task", str(task_file),
                           "--no-store", "--json", "--device", "cpu"], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert code.returncode == 0, code.stderr[-2000:]
    observed = json.loads(code.stdout)
    assert observed["n_items"] == 55 and observed["metrics"]["acc"]["value"] > curve.level

    # The commands the demo ends with read its own state.
    from monitor.commands.demo import next_commands

    assert Path(summary["policy"]).is_file() and Path(summary["state"]) == Path(summary["db"]).parent
    for line in next_commands(summary):
        argv = shlex.split(line)
        assert main(argv[1:]) == 0, line
