"""`lstar score --pending`: the queue of gated Hub checkpoints scored exactly once.

The scorer is the real CLI, fetching from the fake Hub through the official client. The first
one runs in a subprocess and is SIGKILLed after scoring but before completing (fail point
`mid_score`); the restarted scorer and the one after it run in the test's process (the same
`monitor.cli.main`, another lease owner, as a new process would be). The job must end
`scored` with exactly one score run and its per-document rows, pinned to the checkpoint's
commit sha, and the numbers must equal a direct score of the same files.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from support.cli_run import lstar_in_process

from monitor.demo.fakehub import FakeHub
from monitor.demo.hub_repos import tiny_model_files
from monitor.hub.client import HubClient
from monitor.hub.gate import gate_pending
from monitor.hub.poll import poll_once
from monitor.hub.rules import WatchRule
from monitor.store import Store

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parent.parent
SCORE_FLAGS = ["--max-context", "64", "--docs", "3", "--no-tcb", "--quiet"]


def scorer_args(db: Path, hub: FakeHub, cache: Path, corpus: Path) -> list[str]:
    return ["score", "--pending", "--db", str(db), "--endpoint", hub.url, "--cache-dir", str(cache),
            "--corpus", str(corpus), "--json", *SCORE_FLAGS]


def run_killed_scorer(db: Path, hub: FakeHub, cache: Path, corpus: Path):
    """A scorer in a subprocess that SIGKILLs itself mid-score (what is checked is its death)."""
    env = {**os.environ, "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1",
           "LSTAR_FAILPOINT": "mid_score"}
    return subprocess.run([sys.executable, "-m", "monitor.cli", *scorer_args(db, hub, cache, corpus)],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)


def run_scorer(db: Path, hub: FakeHub, cache: Path, corpus: Path):
    """A scorer that runs to its end: in the test's process, as its output and the state file are
    what is checked (as two subprocesses, each importing torch and transformers, they took the
    file to 39.7 CPU-seconds; in-process, 24.8, measured alone, 2026-11-30)."""
    return lstar_in_process(*scorer_args(db, hub, cache, corpus),
                            env={"LSTAR_FAILPOINT": None, "HF_HUB_DISABLE_PROGRESS_BARS": "1"})


@pytest.fixture
def gated_hub(tmp_path, shared_dir):
    """A fake Hub with one tiny model, polled and gated into a fresh state file."""
    with FakeHub() as hub:
        # The queue is what is checked, not the vocabulary: the 1,000-id toy tokenizer spares each
        # of the four scoring processes most of gpt2's 50,257-id output layer (the test went from
        # 42.7 to 39.0 CPU-seconds, measured alone, 2026-11-30).
        sha = hub.add_repo("acme/tiny", tiny_model_files("spm-unigram-toy", arch="llama", seed=3))
        db = tmp_path / "state.duckdb"
        cache = tmp_path / "hf-cache"
        with Store.open(db) as store:
            client = HubClient(hub.url, store=store)
            rule = WatchRule(name="acme", author="acme")
            poll_once(store, client, [rule])
            outcomes = gate_pending(store, client, [rule], cache_dir=cache)
            assert [o.status for o in outcomes] == ["gated"], outcomes
        yield hub, db, cache, sha


def test_killed_scorer_restarts_and_completes_exactly_once(gated_hub, calib_v0):
    hub, db, cache, sha = gated_hub

    killed = run_killed_scorer(db, hub, cache, calib_v0)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    with Store.open(db, read_only=True) as store:
        row = store.list_checkpoints()[0]
        assert row.status == "fetched" and row.lease_owner is not None
        assert store.query("SELECT count(*) AS n FROM score_runs")[0]["n"] == 0

    # The dead scorer's lease must expire before the job can be claimed again.
    with Store.open(db) as store:
        store.conn.execute("UPDATE checkpoints SET lease_expires_at = now() - INTERVAL 1 SECOND")

    done = run_scorer(db, hub, cache, calib_v0)
    assert done.returncode == 0, done.stderr
    jobs = json.loads(done.stdout)
    assert [(j["repo"], j["sha"], j["status"]) for j in jobs] == [("acme/tiny", sha, "scored")]

    again = run_scorer(db, hub, cache, calib_v0)
    assert again.returncode == 0 and json.loads(again.stdout) == []

    with Store.open(db, read_only=True) as store:
        row = store.list_checkpoints()[0]
        assert (row.status, row.attempts, row.lease_owner) == ("scored", 2, None)
        runs = store.query("SELECT * FROM score_runs")
        assert len(runs) == 1
        run = runs[0]
        assert (run["model_repo"], run["model_sha"], run["checkpoint_id"]) == ("acme/tiny", sha, row.id)
        docs = store.score_documents(run["run_id"])
        assert len(docs) == 3
        assert sum(d.n_tokens for d in docs) == run["n_tokens"]
        assert sum(d.nll for d in docs) == pytest.approx(run["nll_sum"], rel=1e-12)

    # The queued score equals a direct `lstar score org/name@sha` through the Hub path, in this
    # process too, with the Hub and its cache named by flags (HF_ENDPOINT and HF_HUB_CACHE are
    # read at import, so here they would not reach huggingface_hub; tests/test_issue38_small.py
    # scores through HF_ENDPOINT in a subprocess). A subprocess cost about 8 CPU-seconds more
    # (the file went from 24.8 to 16.4 CPU-seconds, measured alone, 2026-11-30).
    direct = lstar_in_process("score", f"acme/tiny@{sha}", "--endpoint", hub.url, "--cache-dir", str(cache),
                              "--corpus", str(calib_v0), "--no-db", "--json", *SCORE_FLAGS,
                              env={"LSTAR_FAILPOINT": None, "HF_HUB_DISABLE_PROGRESS_BARS": "1"})
    assert direct.returncode == 0, direct.stderr
    result = json.loads(direct.stdout)
    assert (result["model"]["repo"], result["model"]["sha"], result["model"]["source"]) == (
        "acme/tiny", sha, "hub")
    assert result["lstar"] == pytest.approx(run["lstar"], rel=1e-12)
