"""Identical weights are scored once: two repos (or commits) on the real fake Hub whose weight
files have the same LFS sha256 set, with the same config and tokenizer files, give one scoring
job and two score rows, the second linked to the first. Different files are scored again.

The real poll, gate and verified fetch into a real DuckDB file; the local backend's warm
worker (the daemon's `--scoring-workers 1`) scores, one pool for the module; the backend is
wrapped only to count the jobs handed to it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from monitor.cli import app
from monitor.demo.fakehub import FakeHub
from monitor.demo.hub_repos import tiny_model_files
from monitor.hub.client import HubClient
from monitor.hub.gate import gate_pending
from monitor.hub.poll import poll_once
from monitor.hub.rules import WatchRule
from monitor.scoring.backends import WarmBackend
from monitor.scoring.engine import ScoreRequest
from monitor.scoring.scoring_driver import score_queue_on
from monitor.store import Store
from monitor.store.listings import list_score_runs

pytestmark = pytest.mark.slow


class CountingBackend:
    """The module's warm pool, counting the jobs one test hands it."""

    name = "local"

    def __init__(self, pool: WarmBackend) -> None:
        self.pool = pool
        self.handed: list[str] = []

    def run(self, jobs):
        jobs = list(jobs)
        self.handed.extend(job.repo for job in jobs)
        return self.pool.run(jobs)

    def interrupt(self) -> int:
        return self.pool.interrupt()

    def close(self) -> None:   # the pool outlives a test
        pass


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    """One warm worker for the module's four jobs. A cold child per job imported torch and
    transformers again for each (about 5 CPU-seconds): the file took 55.5 CPU-seconds with
    them. Which jobs the backend is handed, what is deduplicated and linked, is decided
    before the backend (`score_queue_on`), and a warm worker scores what a cold child does
    (tests/test_warm_workers.py)."""
    backend = WarmBackend(workers=1, timeout_s=300, workdir=tmp_path_factory.mktemp("warm"))
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def files() -> dict[str, bytes]:
    return tiny_model_files("gpt2", arch="llama", seed=5)


def gated(hub: FakeHub, root: Path) -> tuple[Path, Path]:
    db, cache = root / "state.duckdb", root / "hf-cache"
    with Store.open(db) as store:
        client = HubClient(hub.url, store=store)
        rules = [WatchRule(name="acme", author="acme")]
        poll_once(store, client, rules)
        outcomes = gate_pending(store, client, rules, cache_dir=cache)
        assert all(o.status == "gated" for o in outcomes), outcomes
    return db, cache


def score(db: Path, cache: Path, hub: FakeHub, backend, corpus: Path, root: Path, limit: int):
    # Three short documents (1,313 tokens; the first three of calib-v0 are 4,886): which jobs
    # run and what is linked does not depend on what a score costs.
    template = ScoreRequest(corpus_dir=corpus, slices=["encyclopedic"], docs=3, max_context=32, device="cpu",
                            dtype="float32", with_tcb=False, n_boot=10, progress=False)
    with Store.open(db) as store:
        return score_queue_on(store, HubClient(hub.url, store=store), backend, template, owner="test",
                              state_dir=root, cache_dir=cache, limit=limit)


def runs_by_repo(db: Path) -> dict[str, dict]:
    with Store.open(db) as store:
        out = {}
        for run in list_score_runs(store, limit=None):
            run["docs"] = [(d.doc_id, d.n_tokens, d.nll) for d in store.score_documents(run["run_id"])]
            stored = store.score_run(run["run_id"])
            run["model"] = json.loads(stored.model)
            run["checkpoint_id"] = stored.checkpoint_id
            assert run["model_repo"] not in out
            out[run["model_repo"]] = run
        return out


@pytest.mark.parametrize("limit", [4, 1], ids=["one-batch", "one-job-per-run"])
def test_two_repos_with_the_same_weights_are_scored_once_and_linked(tmp_path, files, calib_v0, pool, limit):
    backend = CountingBackend(pool)
    with FakeHub() as hub:
        first_sha = hub.add_repo("acme/original", files)
        mirror_sha = hub.add_repo("acme/mirror", files)
        db, cache = gated(hub, tmp_path)
        results = []
        while len(results) < 2:
            got = score(db, cache, hub, backend, calib_v0, tmp_path, limit)
            assert got, "a run scored nothing"
            results.extend(got)
    assert [r.status for r in results] == ["scored", "scored"]
    assert len(backend.handed) == 1                       # one scoring job ran, for the first in the queue
    scored = backend.handed[0]
    linked = ({"acme/original", "acme/mirror"} - {scored}).pop()
    shas = {"acme/original": first_sha, "acme/mirror": mirror_sha}

    runs = runs_by_repo(db)
    first, mirror = runs[scored], runs[linked]
    assert first["model_sha"] == shas[scored] and mirror["model_sha"] == shas[linked]
    assert first["linked_from_run_id"] is None
    assert mirror["linked_from_run_id"] == first["run_id"]            # the second names the first
    assert mirror["linked_from_checkpoint_id"] == first["checkpoint_id"]
    assert mirror["model"]["linked_from"] == {"run_id": first["run_id"], "checkpoint_id": first["checkpoint_id"]}
    assert mirror["model"]["repo"] == linked and mirror["model"]["sha"] == shas[linked]
    assert mirror["run_id"] != first["run_id"]
    assert mirror["lstar"] == first["lstar"] and mirror["se_ce"] == first["se_ce"]
    assert mirror["docs"] == first["docs"] and len(first["docs"]) == 3
    with Store.open(db) as store:
        rows = {r.repo: r for r in store.list_checkpoints()}
        digests = store.query("SELECT * FROM score_digests ORDER BY linked_from_run_id NULLS FIRST")
    assert rows[linked].meta["linked_from_run_id"] == first["run_id"]
    assert rows[linked].meta["weights_digest"] == rows[scored].meta["weights_digest"]
    assert [d["run_id"] for d in digests] == [first["run_id"], mirror["run_id"]]

    # Provenance in the listings: `lstar runs` and `lstar checkpoints` name the source.
    out = CliRunner().invoke(app, ["runs", "--db", str(db)], env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    assert f"linked to run {first['run_id'][:8]}" in out.output
    out = CliRunner().invoke(app, ["checkpoints", "--db", str(db)], env={"COLUMNS": "200"})
    assert f"same weights as checkpoint {first['checkpoint_id']} (run {first['run_id'][:8]})" in out.output


def test_the_same_weights_under_another_config_are_scored_again(tmp_path, files, calib_v0, pool):
    config = json.loads(files["config.json"])
    other = {**files, "config.json": json.dumps({**config, "rms_norm_eps": 1e-3}).encode()}
    backend = CountingBackend(pool)
    with FakeHub() as hub:
        hub.add_repo("acme/original", files)
        hub.add_repo("acme/retuned", other)
        db, cache = gated(hub, tmp_path)
        results = score(db, cache, hub, backend, calib_v0, tmp_path, 4)
    assert sorted(r.status for r in results) == ["scored", "scored"]
    assert sorted(backend.handed) == ["acme/original", "acme/retuned"]
    runs = runs_by_repo(db)
    assert runs["acme/retuned"]["linked_from_run_id"] is None
    with Store.open(db) as store:
        rows = {r.repo: r.meta for r in store.list_checkpoints()}
    assert rows["acme/original"]["weights_digest"] == rows["acme/retuned"]["weights_digest"]
    assert rows["acme/original"]["files_digest"] != rows["acme/retuned"]["files_digest"]
    assert runs["acme/retuned"]["lstar"] != runs["acme/original"]["lstar"]


def test_an_override_tokenizer_is_keyed_by_its_contents_not_its_path(tmp_path, calib_v0, shared_dir):
    """Scoring with `--tokenizer DIR`: the same folder edited in place is another tokenizer (its
    scores are not linked to the old ones); the same files in another folder are the same."""
    import shutil

    from monitor.scoring.scoring_driver import JobBuilder

    folder = tmp_path / "tok"
    shutil.copytree(shared_dir / "tokenizers" / "gpt2", folder)

    def digest(path: Path) -> str:
        template = ScoreRequest(corpus_dir=calib_v0, docs=3, tokenizer_dir=path, device="cpu", dtype="float32")
        with Store.open(tmp_path / "state.duckdb") as store:
            return JobBuilder(store, template, tmp_path).request_digest()

    before = digest(folder)
    shutil.copytree(folder, tmp_path / "moved")
    assert digest(tmp_path / "moved") == before
    config = folder / "tokenizer_config.json"
    config.write_text(config.read_text().rstrip() + "\n\n")   # edited in place
    assert digest(folder) != before
