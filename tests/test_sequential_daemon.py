"""`lstar run --scoring sequential` raises the alerts `--scoring full` raises, on the fake Hub."""

from __future__ import annotations

import subprocess

import pytest

from monitor.curves.artifact import ScoringRef
from monitor.demo.fakehub import FakeHub
from monitor.demo.hub_repos import add_lineage
from monitor.demo.receivers import WebhookReceiver
from monitor.scoring.corpus import load_corpus
from monitor.store import Store
from support.daemon_harness import DaemonProcess
from support.sequential import synthetic_curve
from tests.test_daemon_events import SECRET_ENV, fit_arith_curve

pytestmark = pytest.mark.slow  # two daemons score a lineage in subprocesses

# Documents in the selection. The claim (the sequential daemon stops early, with fewer tokens,
# at the alerts and states of the full one) needs a selection larger than the sequential floor:
# with 8 documents a block is 1 document and the first look comes after 2 (min_blocks), as with
# 20, every document in the one slice `code`. The full daemon scores all of them, twice: 8
# documents (about 8,000 tokens a checkpoint) instead of 20 (18,971) is less than half of those
# forward passes through gpt-neox's 50,277-id output layer.
DOCS = 8


def _run(mode: str, hub: FakeHub, hook_url: str, root, corpus_dir, arith, far) -> dict:
    policies = root / mode / "policies"
    policies.mkdir(parents=True)
    (policies / "watcher.yaml").write_text(f"""\
name: watcher
watch:
  - name: tiny
    author: fake-org
    revisions: {{branches: "step\\\\d+"}}
tasks:
  - name: arith
    curve: {arith}
  - name: far
    curve: {far}
route: {{receiver: hook, group_wait: 0s, group_interval: 0s, repeat_interval: 4h}}
receivers:
  - name: hook
    webhook: {{url: "{hook_url}", secret_env: LSTAR_TEST_WEBHOOK_SECRET, timeout: 5s}}
""")
    daemon = DaemonProcess(policies, root / mode / "state", endpoint=hub.url, env=SECRET_ENV, fast=False,
                           args=["--once", "--cache-dir", str(root / mode / "cache"), "--corpus", str(corpus_dir),
                                 "--docs", str(DOCS), "--max-context", "128", "--n-boot", "50", "--scoring", mode])
    done = subprocess.run(daemon.command(), capture_output=True, text=True, env=daemon.env, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    with Store.open(root / mode / "state" / "lstar.duckdb", read_only=True) as store:
        alerts = store.query("SELECT policy, task, repo, commit_sha, state FROM alerts ORDER BY alert_key")
        states = store.query("SELECT p.task, p.repo, p.commit_sha, p.state, p.detail, r.partial, r.n_tokens "
                             "FROM predictions p JOIN score_runs r USING (run_id) ORDER BY p.repo, p.commit_sha, p.task")
    return {"alerts": [tuple(a.values()) for a in alerts], "states": states}


def test_sequential_daemon_raises_the_alerts_of_the_full_daemon(tmp_path, shared_dir):
    corpus_dir = shared_dir / "corpus" / "calib-v0"
    corpus = load_corpus(corpus_dir).select(first=DOCS).sha256
    arith = fit_arith_curve(corpus, tmp_path / "arith.json")
    spec = ScoringRef(spec_version="lstar-score/1", window=128, stride=64, prefix_policy="bos")
    # clear at any L* above -10: settled as soon as the minimum is scored
    synthetic_curve(tmp_path / "far.json", midpoint=-20.0, corpus_sha256=corpus, task="far", scoring_spec=spec)
    with FakeHub() as hub, WebhookReceiver() as hook:
        add_lineage(hub, "fake-org/tiny", steps=(1000, 2000))
        full = _run("full", hub, hook.url, tmp_path, corpus_dir, arith, tmp_path / "far.json")
        seq = _run("sequential", hub, hook.url, tmp_path, corpus_dir, arith, tmp_path / "far.json")
    assert full["alerts"] and full["alerts"] == seq["alerts"]
    key = [(s["task"], s["repo"], s["commit_sha"], s["state"]) for s in full["states"]]
    assert key == [(s["task"], s["repo"], s["commit_sha"], s["state"]) for s in seq["states"]]
    assert not any(s["partial"] for s in full["states"])
    # the sequential daemon did stop early, with fewer tokens
    assert any(s["partial"] for s in seq["states"])
    assert sum(s["n_tokens"] for s in seq["states"]) < sum(s["n_tokens"] for s in full["states"])
    # a state resting on a partial score says so
    assert {s["state"] for s in seq["states"]} <= {"clear", "at_risk", "emerged"}   # every task evaluated
    for s in seq["states"]:
        assert ("rests on a partial score" in s["detail"]) == bool(s["partial"])
