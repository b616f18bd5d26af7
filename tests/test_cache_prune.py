"""Pruning the Hub download cache after scoring: what the policy keeps stays, the rest goes.

A real fake Hub serves a four-step lineage (whose steps share their tokenizer files) and a
repo the watcher does not know; the official client downloads them into a real cache, and
the checkpoint rows live in a real DuckDB file.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from monitor.demo.fakehub import FakeHub
from monitor.demo.hub_repos import add_lineage, tiny_model_files
from monitor.hub.cache_prune import prune_cache
from monitor.hub.client import HubClient, RetryPolicy
from monitor.hub.fetch import fetch_job, fetch_pinned, snapshot_dir
from monitor.hub.gate import gate_pending
from monitor.hub.poll import poll_once
from monitor.hub.queue import Outcome, claim_next, process_pending
from monitor.hub.rules import WatchRule
from monitor.jobs import score
from monitor.store import Store

T0 = datetime(2024, 5, 1, tzinfo=timezone.utc)
RULE = WatchRule(name="steps", author="acme", revisions={"branches": r"step\d+"})
LINEAGE = "acme/steps"
FOREIGN = "elsewhere/not-ours"


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    with FakeHub() as server:
        add_lineage(server, LINEAGE, steps=(1000, 2000, 3000, 4000),
                    build_dir=tmp_path_factory.mktemp("build"))
        server.add_repo(FOREIGN, tiny_model_files("gpt2", arch="llama", seed=7))
        yield server


@pytest.fixture
def world(hub, tmp_path):
    """Three steps fetched and scored one after the other, the fourth fetched and still leased
    (a running job), the foreign repo fetched by someone else into the same cache.

    Yields the store, the cache, the client, the shas of the scored steps (oldest first) and
    the sha of the running one."""
    cache = tmp_path / "hub-cache"
    store = Store.open(tmp_path / "state.duckdb")
    client = HubClient(hub.url, token=False, store=store, policy=RetryPolicy(attempts=1))
    poll_once(store, client, [RULE])
    assert [o.status for o in gate_pending(store, client, [RULE], cache_dir=cache)] == ["gated"] * 4
    clock = iter(T0 + timedelta(minutes=i) for i in range(100))

    def score(job):
        fetch_job(store, job, owner="w", client=client, cache_dir=cache)
        return Outcome("scored")

    done = process_pending(store, score, owner="w", now_fn=lambda: next(clock), limit=3)
    assert [r.status for r in done] == ["scored"] * 3
    running = claim_next(store, "busy", T0 + timedelta(hours=1), lease_s=3600)
    fetch_job(store, running, owner="busy", client=client, cache_dir=cache)
    fetch_pinned(FOREIGN, "main", cache_dir=cache, client=client)
    scored = [store.get_checkpoint(r.id).sha for r in done]
    yield store, cache, client, scored, running.sha
    store.close()


def blob_bytes(cache: Path) -> int:
    return sum(p.stat().st_size for p in cache.glob("models--*/blobs/*") if p.is_file() and not p.is_symlink())


def files_of(cache: Path, repo: str, sha: str) -> dict[str, Path]:
    snap = snapshot_dir(cache, repo, sha)
    return {p.name: p.resolve() for p in snap.iterdir()}


def test_pruning_keeps_the_newest_finished_and_every_pending_checkpoint(world, hub, tmp_path):
    store, cache, client, (first, second, third), running = world
    old_weights = files_of(cache, LINEAGE, first)["model.safetensors"]
    shared_tokenizer = files_of(cache, LINEAGE, first)["tokenizer.json"]
    assert shared_tokenizer == files_of(cache, LINEAGE, running)["tokenizer.json"]
    # hf's own bookkeeping for a branch download, and a link planted to lead outside the cache
    repo_dir = snapshot_dir(cache, LINEAGE, first).parent.parent
    (repo_dir / "refs").mkdir(exist_ok=True)
    (repo_dir / "refs" / "old-branch").write_text(first)
    (repo_dir / "refs" / "main").write_text(running)
    outside = tmp_path / "outside.txt"
    outside.write_text("not the cache's to delete\n")
    os.symlink(outside, snapshot_dir(cache, LINEAGE, second) / "escape.txt")
    before = blob_bytes(cache)

    report = prune_cache(store, cache, keep_last=1, max_bytes=None)

    assert report.removed == [f"{LINEAGE}@{second}", f"{LINEAGE}@{first}"]
    assert report.kept == [f"{LINEAGE}@{third}"]
    assert report.protected == [f"{LINEAGE}@{running}"]
    for sha in (first, second):
        assert not snapshot_dir(cache, LINEAGE, sha).exists()
    assert not old_weights.exists() and shared_tokenizer.exists()   # still linked by the kept steps
    assert not (repo_dir / "refs" / "old-branch").exists() and (repo_dir / "refs" / "main").exists()
    assert outside.read_text() == "not the cache's to delete\n"
    assert report.freed_bytes == before - blob_bytes(cache) > 0
    # What stayed is whole: fetching it again is answered from the cache alone.
    hub.reset_log()
    for repo, revision in ((LINEAGE, third), (LINEAGE, running), (FOREIGN, "main")):
        assert fetch_pinned(repo, revision, cache_dir=cache, client=client).is_dir()
    assert not [r for r in hub.requests if "/resolve/" in r.path]

    again = prune_cache(store, cache, keep_last=1, max_bytes=None)
    assert again.removed == [] and again.freed_bytes == 0


def test_the_byte_budget_prunes_further_but_never_a_pending_checkpoint(world):
    store, cache, client, (first, second, third), running = world

    def size(sha: str) -> int:
        return sum(p.stat().st_size for p in files_of(cache, LINEAGE, sha).values())

    # Room for the running job and one finished checkpoint, though keep_last allows ten.
    report = prune_cache(store, cache, keep_last=10, max_bytes=size(running) + size(third))
    assert report.kept == [f"{LINEAGE}@{third}"]
    assert report.removed == [f"{LINEAGE}@{second}", f"{LINEAGE}@{first}"]

    # A budget the running job alone exceeds removes every finished checkpoint, never the job's.
    report = prune_cache(store, cache, keep_last=10, max_bytes=1)
    assert report.kept == [] and report.removed == [f"{LINEAGE}@{third}"]
    assert snapshot_dir(cache, LINEAGE, running).is_dir()
    assert fetch_pinned(FOREIGN, "main", cache_dir=cache, client=client).is_dir()


@pytest.mark.slow
def test_the_daemon_prunes_the_cache_after_scoring(hub, tmp_path, calib_v0):
    from monitor.scoring.engine import ScoreRequest
    from monitor.service.daemon import Daemon, DaemonConfig

    cache = tmp_path / "hub-cache"
    template = ScoreRequest(corpus_dir=calib_v0, docs=2, max_context=32, device="cpu", dtype="float32",
                            with_tcb=False, n_boot=10, progress=False)
    config = DaemonConfig(policies_dir=tmp_path, state_dir=tmp_path / "state", endpoint=hub.url,
                          cache_dir=cache, cache_keep=0, template=template)
    (tmp_path / "state").mkdir()
    daemon = Daemon(config)
    rule = WatchRule(name="one", author="acme", revisions={"branches": "step1000"})
    with Store.open(tmp_path / "state" / "lstar.duckdb") as store:
        client = daemon.hub_client(store)
        poll_once(store, client, [rule])
        assert [o.status for o in gate_pending(store, client, [rule], cache_dir=cache)] == ["gated"]
        (row,) = store.list_checkpoints()
        assert snapshot_dir(cache, LINEAGE, row.sha).is_dir()       # the gate's config.json
        results = score.score_batch(daemon, store)
        assert [r.status for r in results] == ["scored"]
    assert not snapshot_dir(cache, LINEAGE, row.sha).exists()
    assert not snapshot_dir(cache, LINEAGE, row.sha).parent.parent.exists()   # nothing of it is left
