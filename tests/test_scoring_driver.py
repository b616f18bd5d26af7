"""The daemon's scoring driver against a backend that fails as a whole (docs/reliability.md
row 27): the jobs it had not answered go back to the queue with their attempt refunded and
the reason, and the answered one is written. Real fake Hub, real gate and fetch, real DuckDB,
the daemon's local backend (one warm scoring worker, shared by the module) for the jobs that
are answered."""

from __future__ import annotations

from pathlib import Path

import pytest

from monitor.demo.fakehub import FakeHub
from monitor.demo.hub_repos import tiny_model_files
from monitor.hub.client import HubClient
from monitor.hub.gate import gate_pending
from monitor.hub.poll import poll_once
from monitor.hub.rules import WatchRule
from monitor.scoring.backends import LocalBackend, WarmBackend
from monitor.scoring.engine import ScoreRequest
from monitor.scoring.metrics import aggregate
from monitor.scoring.scoring_driver import score_queue_on
from monitor.store import Store


# The driver's handling of the backend's answers is checked, not the models: the 1,000-id toy
# tokenizer spares their scores most of gpt2's 50,257-id output layer.
TOKENIZER = "spm-unigram-toy"


@pytest.fixture(scope="module")
def warm(tmp_path_factory):
    """One warm scoring worker (the daemon's default backend) for the module's scored jobs: a
    fresh child per job (`LocalBackend`) imported torch once for each test that scores (this
    file 32.2 CPU-seconds before, measured alone under load, 2026-11-30). What is checked is
    the driver's handling of the backend's answers, the same from either. The worker keeps
    the unigram baselines it computed, so a later test's job may find its baseline cached;
    no test here reads where a baseline came from."""
    backend = WarmBackend(workers=1, timeout_s=300, workdir=tmp_path_factory.mktemp("warm"))
    yield backend
    backend.close()


class ClusterLostAfterOne:
    """Scores the first job on `backend`, then loses its cluster."""

    name = "local"
    concurrency = None

    def __init__(self, backend: WarmBackend) -> None:
        self.backend = backend

    def run(self, jobs):
        jobs = list(jobs)
        yield from self.backend.run(jobs[:1])
        raise ConnectionError("lost the connection to the cluster")

    def interrupt(self) -> int:
        return self.backend.interrupt()

    def close(self) -> None:
        """The shared worker outlives the test (the module's fixture closes it)."""


@pytest.mark.slow
def test_a_backend_that_fails_mid_batch_gives_the_unanswered_jobs_back(tmp_path: Path, calib_v0: Path, warm):
    with FakeHub() as hub:
        hub.add_repo("acme/one", tiny_model_files(TOKENIZER, arch="llama", seed=11))
        hub.add_repo("acme/two", tiny_model_files(TOKENIZER, arch="llama", seed=12))
        db, cache = tmp_path / "state.duckdb", tmp_path / "hf-cache"
        template = ScoreRequest(corpus_dir=calib_v0, docs=2, max_context=32, device="cpu", dtype="float32",
                                with_tcb=False, n_boot=10, progress=False)
        with Store.open(db) as store:
            client = HubClient(hub.url, store=store)
            rules = [WatchRule(name="acme", author="acme")]
            poll_once(store, client, rules)
            assert [o.status for o in gate_pending(store, client, rules, cache_dir=cache)] == ["gated", "gated"]
            results = score_queue_on(store, client, ClusterLostAfterOne(warm),
                                     template, owner="test", state_dir=tmp_path, cache_dir=cache, limit=4)
            rows = {r.repo: r for r in store.list_checkpoints()}
            runs = store.score_runs()
            docs = store.score_documents(runs[0].run_id) if runs else []
    # The stored run carries every axis's SE, from the run's one bootstrap (n_boot 10, seed 0).
    again = aggregate([d.nll for d in docs], [d.n_tokens for d in docs], [d.n_bytes for d in docs],
                      runs[0].ce_unigram, n_boot=10, seed=0)
    for column in ("se_ce", "se_bits_per_byte", "se_lstar_per_byte", "se_l_rel", "se_l_gain", "lstar_per_byte"):
        assert getattr(runs[0], column) == pytest.approx(again[column], rel=1e-9), column
    assert runs[0].se_bits_per_byte > 0
    statuses = sorted(r.status for r in results)
    assert statuses == ["fetched", "scored"]
    [lost] = [r for r in results if r.status == "fetched"]
    assert lost.reason.startswith("the scoring backend failed: ConnectionError: lost the connection")
    assert rows[lost.repo].attempts == 0 and rows[lost.repo].lease_owner is None   # refunded
    assert len(runs) == 1 and runs[0].model_repo != lost.repo
    assert not list((tmp_path / "tmp").glob("checkpoint-*"))   # the flat copies are removed


class ClusterAlwaysLost(LocalBackend):
    """A cluster that is gone: every batch fails before any job is answered."""

    concurrency = None

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.batches = 0

    def run(self, jobs):
        self.batches += 1
        raise ConnectionError("lost the connection to the cluster")
        yield  # a generator, as the seam's backends are


def test_the_daemon_does_not_spin_when_every_job_goes_back(tmp_path: Path, calib_v0: Path):
    """A scoring run whose every job was handed back untouched (the backend or the Hub is down)
    ends after one batch: the next scheduled run asks again, instead of the loop asking at once,
    forever, at full speed."""
    from contextlib import nullcontext

    from monitor.service.daemon import Daemon, DaemonConfig

    with FakeHub() as hub:
        hub.add_repo("acme/one", tiny_model_files(TOKENIZER, arch="llama", seed=11))
        cache = tmp_path / "hf-cache"
        template = ScoreRequest(corpus_dir=calib_v0, docs=2, max_context=32, device="cpu", dtype="float32",
                                with_tcb=False, n_boot=10, progress=False)
        (tmp_path / "state").mkdir()
        daemon = Daemon(DaemonConfig(policies_dir=tmp_path, state_dir=tmp_path / "state", endpoint=hub.url,
                                     cache_dir=cache, template=template, cache_keep=None))
        backend = ClusterAlwaysLost(timeout_s=300, workdir=tmp_path / "w")
        daemon.backend = backend
        with Store.open(tmp_path / "state" / "lstar.duckdb") as store:
            client = daemon.hub_client(store)
            rules = [WatchRule(name="acme", author="acme")]
            poll_once(store, client, rules)
            assert [o.status for o in gate_pending(store, client, rules, cache_dir=cache)] == ["gated"]
            daemon.job_store = lambda: nullcontext(store)   # the daemon's own store, without its start-up
            original_run = backend.run

            def run_and_bound(jobs):
                if backend.batches >= 5:        # the old loop would never end: stop it so the test fails
                    daemon.stopping.set()
                return original_run(jobs)

            backend.run = run_and_bound
            done = daemon.job_score()
            (row,) = store.list_checkpoints()
    assert backend.batches == 1
    assert [d["status"] for d in done] == ["fetched"] and done[0]["refunded"] is True
    assert row.attempts == 0 and row.lease_owner is None and "the scoring backend failed" in row.reason


@pytest.mark.slow
def test_a_missing_corpus_on_the_daemon_is_not_the_jobs_fault(tmp_path: Path, calib_v0: Path, warm):
    """The daemon's corpus folder gone (an unmounted share): the leased jobs go back with their
    attempts untouched and the reason; once the folder is back they are scored."""
    import shutil

    corpus = tmp_path / "corpus"
    shutil.copytree(calib_v0, corpus)
    with FakeHub() as hub:
        hub.add_repo("acme/one", tiny_model_files(TOKENIZER, arch="llama", seed=11))
        db, cache = tmp_path / "state.duckdb", tmp_path / "hf-cache"
        template = ScoreRequest(corpus_dir=corpus, docs=2, max_context=32, device="cpu", dtype="float32",
                                with_tcb=False, n_boot=10, progress=False)
        backend = warm
        with Store.open(db) as store:
            client = HubClient(hub.url, store=store)
            rules = [WatchRule(name="acme", author="acme")]
            poll_once(store, client, rules)
            assert [o.status for o in gate_pending(store, client, rules, cache_dir=cache)] == ["gated"]
            corpus.rename(tmp_path / "unmounted")
            for _ in range(4):   # more runs than a job has attempts
                (result,) = score_queue_on(store, client, backend, template, owner="test", state_dir=tmp_path,
                                           cache_dir=cache, limit=4)
                assert result.refunded and result.status == "gated"
                assert "the daemon's scoring corpus is unusable" in result.reason and str(corpus) in result.reason
            (row,) = store.list_checkpoints()
            assert row.attempts == 0 and row.lease_owner is None
            (tmp_path / "unmounted").rename(corpus)
            (result,) = score_queue_on(store, client, backend, template, owner="test", state_dir=tmp_path,
                                       cache_dir=cache, limit=4)
    assert result.status == "scored"
