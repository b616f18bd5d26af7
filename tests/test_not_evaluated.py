"""Scores a policy cannot evaluate are never dropped in silence: the daemon checks its scoring
settings against every curve's pin at start (degraded /health, one log line per task; refusal
when no task can be evaluated), and each (score, task) refused is recorded `not_evaluated` with
its reason, shown by `lstar checkpoints`, `lstar status` and the report's problems, with one
operator alert per episode."""

from __future__ import annotations

import json
import subprocess
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pytest

from monitor.alerts import evaluate_pending
from monitor.policy import load_policy
from monitor.reports.report import build_report
from monitor.store import Store
from support.cli_run import lstar_in_process
from support.daemon_harness import DaemonProcess, wait_for
from support.scores import CALIB_V0_SHA256, fake_sha, record_fake_score

T0 = datetime(2025, 5, 1, 12, tzinfo=timezone.utc)


def fit(path: Path, *, corpus: str, window: int, stride: int, prefix: str = "bos") -> str:
    """A real curve artifact pinned to `corpus` and the spec (window, stride, prefix); its id."""
    from monitor.curves.artifact import ScoringRef, save_curve
    from monitor.curves.fit import fit_curve
    from monitor.curves.labels import Label

    xs = np.linspace(0.0, 3.0, 12)
    labels = [Label(checkpoint=f"h{i}", value=float(0.25 + 0.6 / (1 + np.exp(4 * (x - 1.2)))),
                    family="f1" if i % 2 else "f2", task="cloze", metric="acc", n=200, lstar=float(x))
              for i, x in enumerate(xs)]
    spec = ScoringRef(spec_version="lstar-score/1", window=window, stride=stride, prefix_policy=prefix)
    curve = fit_curve(labels, task="cloze", metric="acc", baseline=0.25, margin=0.05, resamples=50,
                      lofo=False, corpus_sha256=corpus, scoring_spec=spec)
    save_curve(curve, path)
    return curve.curve_id


def write_policy(folder: Path, tasks: dict[str, str], *, watch: bool = False) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    task_lines = "".join(f"  - name: {name}\n    curve: {curve}\n" for name, curve in tasks.items())
    rules = ("watch:\n  - name: tiny\n    author: fake-org\n    revisions: {branches: \"step\\\\d+\"}\n"
             if watch else "")
    (folder / "gov.yaml").write_text(
        f"name: gov\n{rules}tasks:\n{task_lines}route: {{receiver: log, group_wait: 0s, group_interval: 0s}}\n"
        f"receivers:\n  - name: log\n    file: {{path: {folder / 'alerts.jsonl'}}}\n")
    return folder / "gov.yaml"


def lstar(*args: str) -> subprocess.CompletedProcess[str]:
    """`lstar ARGS` in this process (`support.cli_run`), 400 columns wide."""
    return lstar_in_process(*args, env={"COLUMNS": "400"})


def meta_gap_alerts(store: Store) -> list[dict]:
    return store.query("SELECT alert_key, annotations FROM alerts WHERE kind = 'meta' AND state = 'not-evaluated'")


def test_a_spec_mismatch_is_recorded_shown_and_alerted_once_per_episode(tmp_path: Path) -> None:
    curve = tmp_path / "policies" / "cloze.json"
    fit(curve, corpus=CALIB_V0_SHA256, window=64, stride=32)
    policy = load_policy(write_policy(tmp_path / "policies", {"cloze": "cloze.json"}))
    store = Store.open(tmp_path / "state" / "lstar.duckdb")
    shas = [fake_sha(f"s{i}") for i in range(3)]
    for i, sha in enumerate(shas):   # scored with window 128, the curve wants 64
        record_fake_score(store, repo="org/m", sha=sha, lstar=2.0 - i / 2, se=0.02,
                          finished_at=T0 + timedelta(hours=i))
        evaluate_pending(store, [policy], now=T0 + timedelta(hours=i, minutes=1))

    rows = store.not_evaluated("gov")
    assert [(r.task, r.commit_sha) for r in rows] == [("cloze", sha) for sha in shas]
    assert all("fitted with scoring spec lstar-score/1:window=64,stride=32,prefix=bos, but the score used "
               "scoring spec lstar-score/1:window=128" in r.reason for r in rows)
    # Handled: a later pass does not try them again, and the episode raised exactly one alert.
    again = evaluate_pending(store, [policy], now=T0 + timedelta(hours=5))
    assert (again.predictions, again.skipped) == (0, [])
    alerts = meta_gap_alerts(store)
    assert len(alerts) == 1
    summary = json.loads(alerts[0]["annotations"])["summary"]
    assert "policy gov cannot evaluate 1 checkpoint(s) for task(s) cloze" in summary and "window=64" in summary

    # The report names them among its problems; its task table has no point from them.
    report = build_report(store, policy, now=T0 + timedelta(hours=6), period_start=T0)
    problems = [p for p in report["problems"] if "not evaluated" in p]
    assert len(problems) == 1 and problems[0].startswith("task cloze: 3 checkpoint(s) not evaluated (org/m")
    assert problems[0].endswith(f"): {rows[0].reason}")
    assert report["tasks"][0]["lineages"] == []
    store.close()

    db = str(tmp_path / "state" / "lstar.duckdb")
    status = lstar("status", "--db", db)
    assert status.returncode == 0, status.stderr
    assert f"NOT EVALUATED: policy gov, task cloze: 3 checkpoint(s): {rows[0].reason}" in status.stdout

    # A curve refitted for the scores' spec evaluates them again, and the episode ends.
    new_id = fit(curve, corpus=CALIB_V0_SHA256, window=128, stride=64)
    store = Store.open(tmp_path / "state" / "lstar.duckdb")
    evaluate_pending(store, [load_policy(tmp_path / "policies" / "gov.yaml")], now=T0 + timedelta(hours=7))
    assert store.not_evaluated() == []
    states = store.query("SELECT state, curve_id FROM predictions ORDER BY run_id")
    assert len(states) == 3 and all(s["curve_id"] == new_id and s["state"] != "not_evaluated" for s in states)
    assert store.open_evaluation_gap("gov") is None and len(meta_gap_alerts(store)) == 1
    store.close()


def gap_alerts_sent(sink: Path) -> list[dict]:
    """The not-evaluated operator alerts the file receiver got."""
    if not sink.exists():
        return []
    sent = [json.loads(line)["message"] for line in sink.read_text().splitlines()]
    return [a for body in sent for a in body["alerts"] if a["labels"].get("state") == "not-evaluated"]


@pytest.fixture(scope="module")
def hub():
    from monitor.demo.fakehub import FakeHub
    from monitor.demo.hub_repos import add_lineage

    with FakeHub() as server:
        add_lineage(server, "fake-org/tiny", steps=(1000, 2000), tokenizer=TOKENIZER)
        yield server


# The tiny models' tokenizer. What is checked is which scores a curve's pin refuses, not the
# vocabulary: the 1,000-id toy tokenizer spares the daemon's two scores most of gpt-neox's
# 50,277-id output layer.
TOKENIZER = "spm-unigram-toy"


def daemon_corpus(shared_dir: Path) -> tuple[list[str], str, str]:
    """The daemon's scoring flags, its corpus selection's sha256 and the tiny models' prefix policy."""
    from monitor.demo.hub_repos import tokenizer_dir
    from monitor.scoring import ScoreRequest, load_tokenizer
    from monitor.scoring.engine import corpus_selection

    corpus = shared_dir / "corpus" / "calib-v0"
    sha = corpus_selection(ScoreRequest(corpus_dir=corpus, docs=2)).sha256
    prefix = load_tokenizer(tokenizer_dir(TOKENIZER, None)).prefix_policy
    return ["--corpus", str(corpus), "--docs", "2", "--n-boot", "10"], sha, prefix


@pytest.mark.slow
def test_the_daemon_refuses_to_start_when_no_task_can_be_evaluated(tmp_path: Path, shared_dir: Path) -> None:
    flags, sha, prefix = daemon_corpus(shared_dir)
    fit(tmp_path / "policies" / "narrow.json", corpus=sha, window=64, stride=32, prefix=prefix)
    write_policy(tmp_path / "policies", {"narrow": "narrow.json"})
    daemon = DaemonProcess(tmp_path / "policies", tmp_path / "state", args=[*flags, "--max-context", "128"])
    daemon.start(wait=False)
    try:
        assert daemon.wait(timeout=60) != 0
    finally:
        daemon.kill()
    log = daemon.log()
    assert ("policy gov, task narrow: can never be evaluated: curve" in log
            and "needs window 64, the daemon scores with window 128 (--max-context 128); "
                "run with --max-context 64" in log)
    assert "no task of any policy can be evaluated with these scoring settings" in log
    assert "Traceback" not in log


@pytest.mark.slow
def test_the_daemon_starts_degraded_and_records_each_checkpoint_it_cannot_evaluate(
        hub, tmp_path: Path, shared_dir: Path) -> None:
    flags, sha, prefix = daemon_corpus(shared_dir)
    policies = tmp_path / "policies"
    fit(policies / "narrow.json", corpus=sha, window=64, stride=32, prefix=prefix)
    fit(policies / "wide.json", corpus=sha, window=128, stride=64, prefix=prefix)
    write_policy(policies, {"narrow": "narrow.json", "wide": "wide.json"}, watch=True)
    state = tmp_path / "state"
    daemon = DaemonProcess(policies, state, endpoint=hub.url,
                           args=[*flags, "--max-context", "128", "--cache-dir", str(tmp_path / "cache")])
    with daemon:
        # At start: one line naming the task (not the one that matches), and /health degraded.
        assert "policy gov, task narrow: can never be evaluated" in daemon.log()
        assert "task wide" not in daemon.log()
        code, body = daemon.request("/health")
        reasons = json.loads(body)["reasons"]
        assert code == 503 and len(reasons) == 1 and reasons[0].startswith("degraded: policy gov, task narrow")

        def both_recorded() -> bool:
            rows = daemon.get_json("/checkpoints")["items"]
            return len(rows) == 2 and all(r["not_evaluated"] for r in rows)
        # Asked once a second, not five times: each ask is a page of the checkpoints, five
        # queries in the daemon, for the 10 to 60 s its scores take.
        wait_for(both_recorded, timeout=240, every=1.0,
                 what=f"two checkpoints recorded not_evaluated\n{daemon.log()}")
        wait_for(lambda: gap_alerts_sent(policies / "alerts.jsonl"), timeout=60,
                 what=f"the operator alert delivered\n{daemon.log()}")

        listed = lstar("checkpoints", "--state", str(state))
        assert listed.returncode == 0, listed.stderr
        assert listed.stdout.count("not evaluated: gov/narrow: curve") == 2
        status = lstar("status", "--state", str(state))
        assert status.returncode == 0, status.stderr
        assert "DEGRADED: policy gov, task narrow: can never be evaluated" in status.stdout
        assert "NOT EVALUATED: policy gov, task narrow: 2 checkpoint(s): curve" in status.stdout
        assert daemon.stop() == 0

    with Store.open(state / "lstar.duckdb", read_only=True) as store:
        assert sorted({(r.task, r.repo) for r in store.not_evaluated()}) == [("narrow", "fake-org/tiny")]
        assert len(store.not_evaluated()) == 2
        wide = store.query("SELECT state FROM predictions WHERE task = 'wide'")
        assert len(wide) == 2 and all(r["state"] != "not_evaluated" for r in wide)   # the other task works
        assert len(meta_gap_alerts(store)) == 1                                       # one per episode
        report = build_report(store, load_policy(policies / "gov.yaml"), now=datetime.now(timezone.utc),
                              period_start=T0)
        assert any(p.startswith("task narrow: 2 checkpoint(s) not evaluated") for p in report["problems"])
    assert len(gap_alerts_sent(policies / "alerts.jsonl")) == 1
