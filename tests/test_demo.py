"""`lstar demo` end to end, as a subprocess: lab-trained checkpoints of two tokenizer families, fake
Hub, cloze curve, the daemon once, local webhook and SMTP receivers, a report; then what it produced
is checked in the files."""

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


def test_demo_closes_the_loop(tmp_path: Path, shared_dir: Path) -> None:
    workdir = tmp_path / "demo"
    proc = subprocess.run([sys.executable, "-m", "monitor.cli", "demo", "--json", "--workdir", str(workdir),
                           "--shared", str(shared_dir)], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads(proc.stdout)
    assert summary["ok"] is True

    with Store.open(summary["db"], read_only=True) as store:
        runs = store.query("SELECT model_repo, model_sha, lstar, tokenizer_fingerprint FROM score_runs "
                           "WHERE model_repo LIKE 'demo-org/%' ORDER BY model_repo, finished_at")
        preds = store.query("SELECT lineage, state, lstar, lo, hi, threshold FROM predictions WHERE policy = 'demo'")
        reports = store.reports(policy="demo")
    lineages = {"demo-org/gpt2-lab", "demo-org/spm-unigram-toy-lab"}
    # three steps per lineage scored, two tokenizers, one prediction per score
    assert {r["model_repo"] for r in runs} == lineages and len(runs) == 6
    assert len({r["tokenizer_fingerprint"] for r in runs}) == 2
    # trained models: each lineage's last step (main) beats its unigram baseline, as real models do
    for repo, refs in summary["hub"]["lineages"].items():
        (last,) = [r for r in runs if r["model_repo"] == repo and r["model_sha"] == refs["main"]]
        assert last["lstar"] < 0, (repo, last["lstar"])
    assert len(preds) == 6
    # each state is what the interval says about the level b + ε
    for p in preds:
        expected = "emerged" if p["lo"] >= p["threshold"] else "at_risk" if p["hi"] >= p["threshold"] else "clear"
        assert p["state"] == expected
    firing = {p["lineage"] for p in preds if p["state"] in ("at_risk", "emerged")}
    assert firing, "the demo must put at least one lineage at risk"

    # one grouped message per (policy, lineage) with firing alerts, at the webhook and by mail
    bodies = json.loads(Path(summary["webhook"]["file"]).read_text())
    assert sorted(b["groupLabels"]["lineage"] for b in bodies) == sorted(firing)
    assert all(b["groupLabels"]["policy"] == "demo" and b["status"] == "firing" for b in bodies)
    # an unresolved curve says so in every alert it fires
    if summary["fit"]["unresolved_warnings"]:
        for alert in (a for b in bodies for a in b["alerts"]):
            assert "UNRESOLVED" in alert["annotations"]["description"]
            assert summary["fit"]["unresolved_warnings"][0] in alert["annotations"]["curve_warnings"]
    mails = [message_from_bytes(Path(f).read_bytes(), policy=email_policy.default) for f in summary["email"]["files"]]
    alert_mails = [m for m in mails if m["X-Lstar-Report"] is None]
    assert len(alert_mails) == len(firing)
    assert summary["email"]["report_messages"] == 1

    # a report written to the folder, recorded, and delivered to the audit file and by mail
    (report,) = reports
    folder = Path(report.folder)
    data = json.loads((folder / "report.json").read_text())
    assert {f["lineage"] for f in data["families"]} == lineages
    assert sorted(r["lstar"] for r in data["lstar_table"]) == sorted(r["lstar"] for r in runs)
    assert (folder / "report.html").read_text().count("data:image/png;base64,") == 3
    assert {d["receiver"]: d["outcome"] for d in report.deliveries} == {"demo-audit": "delivered",
                                                                          "demo-email": "delivered"}

    # The commands the demo ends with read its own state (the demo's --json summary is what
    # the plain output prints them from).
    from monitor.cli import main
    from monitor.commands.demo import next_commands

    assert Path(summary["policy"]).is_file() and Path(summary["state"]) == Path(summary["db"]).parent
    for line in next_commands(summary):
        argv = shlex.split(line)
        assert main(argv[1:]) == 0, line
