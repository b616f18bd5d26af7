"""The `ray` scoring backend on a real local Ray cluster (2 CPUs on this machine).

Checkpoints come from the fake Hub through the real poll, gate and verified fetch into a
real DuckDB file; the daemon's driver (`score_queue_on`) leases them and scores them as Ray
tasks. Scores must equal the local backend's to 1e-12; a Ray worker SIGKILLed mid-job (the
`kill_score_worker` fail point) must lead to a retry through the queue's lease, and exactly
one stored score; a job whose worker dies at every attempt is failed after three with the
reason. One cluster serves the whole module.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from monitor.demo.fakehub import FakeHub
from monitor.demo.hub_repos import tiny_model_files
from monitor.hub.client import HubClient
from monitor.hub.gate import gate_pending
from monitor.hub.poll import poll_once
from monitor.hub.rules import WatchRule
from monitor.scoring.backends import LocalBackend, ScoreJob, make_backend
from monitor.scoring.engine import ScoreRequest
from monitor.scoring.scoring_driver import score_queue_on
from monitor.store import Store

pytestmark = pytest.mark.slow

ray = pytest.importorskip("ray", reason='the ray extra is not installed (pip install -e ".[ray]")')

REPOS = {"acme/tiny-a": 3, "acme/tiny-b": 4}


@pytest.fixture(scope="module")
def cluster():
    """A real local Ray cluster for the module: 2 CPUs, no dashboard."""
    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=2, address="local", include_dashboard=False, _node_ip_address="127.0.0.1",
             log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def backend(cluster):
    backend = make_backend("ray", timeout_s=300)
    yield backend
    backend.close()


def template(corpus: Path) -> ScoreRequest:
    return ScoreRequest(corpus_dir=corpus, docs=3, max_context=32, device="cpu", dtype="float32",
                        with_tcb=False, n_boot=10, progress=False)


@pytest.fixture(scope="module")
def hub():
    with FakeHub() as hub:
        for repo, seed in REPOS.items():
            hub.add_repo(repo, tiny_model_files("gpt2", arch="llama", seed=seed))
        yield hub


def gated_state(hub: FakeHub, root: Path, repos: list[str]) -> tuple[Path, Path]:
    """A fresh state file with `repos` polled and gated, and its Hub cache."""
    db, cache = root / "state.duckdb", root / "hf-cache"
    with Store.open(db) as store:
        client = HubClient(hub.url, store=store)
        rules = [WatchRule(name=repo.split("/")[1], author="acme", name_glob=repo) for repo in repos]
        poll_once(store, client, rules)
        outcomes = gate_pending(store, client, rules, cache_dir=cache)
        assert sorted(o.status for o in outcomes) == ["gated"] * len(repos), outcomes
    return db, cache


def run_queue(db: Path, cache: Path, hub: FakeHub, backend, corpus: Path, root: Path):
    with Store.open(db) as store:
        return score_queue_on(store, HubClient(hub.url, store=store), backend, template(corpus), owner="test",
                              state_dir=root, cache_dir=cache, limit=4)


def scores(db: Path) -> dict[str, dict]:
    with Store.open(db) as store:
        out = {}
        for run in store.score_runs(limit=100):
            docs = store.score_documents(run.run_id)
            assert run.model_repo not in out, f"{run.model_repo} scored twice"
            out[run.model_repo] = {"lstar": run.lstar, "nll_sum": run.nll_sum,
                                   "docs": [(d.doc_id, d.nll) for d in docs]}
        return out


def test_a_queue_scored_on_the_cluster_equals_the_local_backend(tmp_path, hub, backend, calib_v0):
    db, cache = gated_state(hub, tmp_path / "ray", list(REPOS))
    shutil.copytree(tmp_path / "ray", tmp_path / "local")

    results = run_queue(db, cache, hub, backend, calib_v0, tmp_path / "ray")
    assert sorted((r.repo, r.status) for r in results) == [(repo, "scored") for repo in sorted(REPOS)]
    local = LocalBackend(timeout_s=300, workdir=tmp_path / "local" / "tmp")
    results = run_queue(tmp_path / "local" / "state.duckdb", tmp_path / "local" / "hf-cache", hub, local,
                        calib_v0, tmp_path / "local")
    assert sorted(r.status for r in results) == ["scored", "scored"]

    on_ray, on_local = scores(db), scores(tmp_path / "local" / "state.duckdb")
    assert set(on_ray) == set(on_local) == set(REPOS)
    assert on_ray["acme/tiny-a"]["lstar"] != on_ray["acme/tiny-b"]["lstar"]   # two different models
    for repo in REPOS:
        assert on_ray[repo]["lstar"] == pytest.approx(on_local[repo]["lstar"], abs=1e-12, rel=0)
        assert on_ray[repo]["nll_sum"] == pytest.approx(on_local[repo]["nll_sum"], abs=1e-12, rel=0)
        ids = [d for d, _ in on_ray[repo]["docs"]]
        assert ids == [d for d, _ in on_local[repo]["docs"]] and len(ids) == 3
        for (_, mine), (_, theirs) in zip(on_ray[repo]["docs"], on_local[repo]["docs"]):
            assert mine == pytest.approx(theirs, abs=1e-12, rel=0)
        # and the stored per-document NLLs add up to the run's sum
        assert sum(n for _, n in on_ray[repo]["docs"]) == pytest.approx(on_ray[repo]["nll_sum"], abs=1e-9)

    with Store.open(db) as store:
        rows = {r["repo"]: r for r in store.query_json("SELECT repo, attempts, meta FROM checkpoints",
                                                       (), ("meta",))}
        # the second job's worker reused the baseline the first one computed, or computed its own
        # (the two ran at once); the store holds exactly one for the shared tokenizer and corpus
        assert store.query("SELECT count(*) AS n FROM baselines")[0]["n"] == 1
    assert all(row["attempts"] == 1 for row in rows.values())


def test_the_cached_baseline_travels_with_the_job(tmp_path, hub, backend, calib_v0):
    db, cache = gated_state(hub, tmp_path, list(REPOS))

    def one_job():
        with Store.open(db) as store:
            [result] = score_queue_on(store, HubClient(hub.url, store=store), backend, template(calib_v0),
                                      owner="test", state_dir=tmp_path, cache_dir=cache, limit=1)
            assert result.status == "scored"
            return store.get_checkpoint(result.id).meta["baseline"]

    # The first worker computes the (tokenizer, corpus) baseline and the daemon caches it with
    # the score; the second job (same tokenizer and corpus) carries it, and its worker uses it.
    assert [one_job(), one_job()] == ["computed", "job"]
    with Store.open(db) as store:
        assert store.query("SELECT count(*) AS n FROM baselines")[0]["n"] == 1


def test_a_worker_killed_mid_job_is_retried_by_the_queue_and_scored_once(tmp_path, hub, backend, calib_v0,
                                                                          monkeypatch):
    db, cache = gated_state(hub, tmp_path, ["acme/tiny-a"])
    marker = tmp_path / "killed-once"
    monkeypatch.setenv("LSTAR_FAILPOINT", f"kill_score_worker={marker}")

    [first] = run_queue(db, cache, hub, backend, calib_v0, tmp_path)
    assert marker.exists()                                  # the first attempt's worker died
    assert first.status == "fetched" and first.attempt == 1
    assert "WorkerCrashedError" in first.reason and "died without an answer" in first.reason
    with Store.open(db) as store:
        assert store.score_runs() == []

    [second] = run_queue(db, cache, hub, backend, calib_v0, tmp_path)
    assert second.status == "scored"
    with Store.open(db) as store:
        row = store.get_checkpoint(second.id)
        assert row.attempts == 2 and row.status == "scored"
        runs = store.score_runs()
        assert len(runs) == 1 and runs[0].checkpoint_id == second.id
        assert store.query("SELECT count(*) AS n FROM score_documents")[0]["n"] == 3


def test_a_job_whose_worker_dies_at_every_attempt_fails_after_three_with_the_reason(tmp_path, hub, backend,
                                                                                      calib_v0, monkeypatch):
    db, cache = gated_state(hub, tmp_path, ["acme/tiny-b"])
    monkeypatch.setenv("LSTAR_FAILPOINT", "kill_score_worker")
    statuses = [run_queue(db, cache, hub, backend, calib_v0, tmp_path)[0].status for _ in range(3)]
    assert statuses == ["fetched", "fetched", "failed"]
    with Store.open(db) as store:
        [row] = store.query("SELECT id, status, attempts, reason FROM checkpoints")
        assert row["attempts"] == 3
        assert row["reason"].startswith("gave up after 3 attempts:")
        assert "Ray worker scoring acme/tiny-b" in row["reason"]
        assert store.score_runs() == []
    assert run_queue(db, cache, hub, backend, calib_v0, tmp_path) == []   # nothing left to run


def test_a_job_no_node_can_hold_fails_at_once_with_the_numbers(backend, calib_v0):
    job = ScoreJob(checkpoint_id=1, repo="acme/huge", sha="b" * 40, request=template(calib_v0),
                   memory_bytes=1 << 50)
    [outcome] = list(backend.run([job]))
    assert outcome.error.error_class == "ModelLoadError"
    assert "needs about 1048576.0 GiB" in outcome.error.message and "largest node" in outcome.error.message


def test_a_gpu_job_on_a_cluster_without_gpus_fails_at_once_with_the_numbers(backend, calib_v0):
    """Ray would keep such a task pending for ever; the job fails at once and says why."""
    job = ScoreJob(checkpoint_id=1, repo="acme/x", sha="d" * 40,
                   request=replace(template(calib_v0), device="cuda"), memory_bytes=10 << 20)
    [outcome] = list(backend.run([job]))
    assert outcome.error.error_class == "ModelLoadError"
    assert "needs 1 GPU(s) on one node, but the Ray cluster has no GPU" in outcome.error.message


def test_placement_asks_for_the_gpus_a_model_needs_and_spreads_it_with_device_map(backend, calib_v0):
    base = ScoreJob(checkpoint_id=1, repo="acme/x", sha="c" * 40,
                    request=replace(template(calib_v0), device="cuda"), memory_bytes=100 << 30)
    backend.gpu_bytes = 80 << 30
    try:
        options, sent = backend.task_options(base)
        assert options["num_gpus"] == 2 and options["memory"] == 100 << 30 and options["max_retries"] == 0
        assert sent.request.device_map == "auto"
        small = replace(base, memory_bytes=10 << 30)
        options, sent = backend.task_options(small)
        assert options["num_gpus"] == 1 and sent.request.device_map is None
        options, sent = backend.task_options(replace(small, request=template(calib_v0)))
        assert "num_gpus" not in options and options["num_cpus"] == 1
    finally:
        backend.gpu_bytes = None


def test_the_shutdown_cancels_a_running_task_and_its_job_is_not_at_fault(tmp_path, backend, calib_v0,
                                                                         monkeypatch):
    import threading

    from monitor.lab.tiny_models import build_tiny_model

    model = build_tiny_model(tmp_path / "model", calib_v0.parent.parent / "tokenizers" / "gpt2", arch="llama",
                             hidden=16, layers=1, heads=2, max_positions=64)
    monkeypatch.setenv("LSTAR_FAILPOINT", "hang_score_child")    # the child never finishes
    job = ScoreJob(checkpoint_id=9, repo="acme/hangs", sha="d" * 40,
                   request=replace(template(calib_v0), model=str(model)))
    outcomes = []
    runner = threading.Thread(target=lambda: outcomes.extend(backend.run([job])))
    runner.start()
    while backend.interrupt() == 0:          # until the task is submitted and running
        assert runner.is_alive(), outcomes
        threading.Event().wait(0.1)
    runner.join()
    [outcome] = outcomes
    assert outcome.error.error_class == "ScoringInterrupted"
    assert "cancelled by the shutdown" in outcome.error.message


def test_the_daemon_scores_on_the_cluster_given_by_its_address(tmp_path, cluster, shared_dir):
    """`lstar run --scoring-backend ray --ray-address ...` end to end: the daemon connects to
    the module's cluster, a Ray worker scores, the daemon writes the score."""
    from monitor.demo.hub_repos import add_lineage
    from support.daemon_harness import WATCHER_POLICY, DaemonProcess, wait_for

    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "watcher.yaml").write_text(WATCHER_POLICY)
    address = cluster.get_runtime_context().gcs_address
    args = ["--cache-dir", str(tmp_path / "cache"), "--corpus", str(shared_dir / "corpus" / "calib-v0"),
            "--docs", "2", "--max-context", "64", "--n-boot", "10",
            "--scoring-backend", "ray", "--ray-address", address]
    with FakeHub() as server:
        add_lineage(server, "fake-org/tiny", steps=(1000,))
        with DaemonProcess(tmp_path / "policies", tmp_path / "state", endpoint=server.url, args=args) as daemon:
            wait_for(lambda: daemon.status()["checkpoints"].get("scored") == 1, timeout=300,
                     what=f"the score on the cluster\n{daemon.log()}")
            pid = daemon.proc.pid
            assert daemon.stop() == 0, daemon.log()
            # The daemon's SIGTERM reaches its own handler, not Ray's failure-signal handler
            # (which aborted a daemon under load once, exit -6).
            assert "SIGTERM received" not in daemon.log()
    with Store.open(tmp_path / "state" / "lstar.duckdb", read_only=True) as store:
        [row] = store.list_checkpoints(repo="fake-org/tiny")
        assert store.query("SELECT count(*) AS n FROM score_runs")[0]["n"] == 1
    worker_pid = int(row.meta["worker"].rsplit(":", 1)[1])
    assert worker_pid != pid                       # scored in a Ray worker, not in the daemon


def test_an_address_nothing_answers_on_is_refused_at_once():
    import socket

    from monitor.errors import LstarError
    from monitor.scoring.backends.ray import check_reachable

    with socket.socket() as sock:     # a port that was free a moment ago: nothing listens on it
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(LstarError, match=f"nothing answers at the Ray address 127.0.0.1:{port}"):
        check_reachable(f"127.0.0.1:{port}")
    with pytest.raises(LstarError, match="is not host:port"):
        check_reachable("127.0.0.1:http")
    check_reachable("auto")           # left to Ray


def test_an_active_evaluation_on_the_cluster_equals_the_local_child(tmp_path, backend, monkeypatch):
    """The daemon's evaluations go to the cluster with `--scoring-backend ray`
    (`RayBackend.call`): the same child, the same numbers as the local one at the same thread
    count."""
    from monitor.curves.eval_child import EvalSpec, evaluate_on_ray, run_evaluation_child
    from tests.test_daemon_observe import mc_task

    model = tmp_path / "model"
    model.mkdir()
    for name, data in tiny_model_files("gpt2", arch="llama", seed=3).items():
        (model / name).write_bytes(data)
    task = mc_task(tmp_path / "mc.jsonl", right=True, items=6)
    spec = EvalSpec(model_dir=str(model), kind="multiple_choice", metric="acc", file=str(task))
    remote = evaluate_on_ray(backend, spec, timeout_s=300, memory_bytes=None, workdir=tmp_path / "work")
    assert (remote["value"], remote["n"], remote["k"]) == (1.0, 6, 6)
    # Ray gives a task reserving one CPU one thread (it sets OMP_NUM_THREADS where the cluster's
    # environment does not); float32 sums depend on the thread count, so the local child is run
    # with the count the remote one reports (torch reads MKL_NUM_THREADS first, so both are set)
    if not {"OMP_NUM_THREADS", "MKL_NUM_THREADS"} & set(os.environ):
        assert remote["threads"] == 1
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.setenv(name, str(remote["threads"]))
    local = run_evaluation_child(spec, timeout_s=300, memory_bytes=None, workdir=tmp_path / "work")
    assert local["threads"] == remote["threads"]
    assert remote["metrics"] == local["metrics"] and remote["task_sha256"] == local["task_sha256"]
    # with another thread count the same sums come out in another order: equal to float32 rounding
    other = 2 if remote["threads"] != 2 else 1
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.setenv(name, str(other))
    other_run = run_evaluation_child(spec, timeout_s=300, memory_bytes=None, workdir=tmp_path / "work")
    assert other_run["threads"] == other
    for name, entry in remote["metrics"].items():
        assert other_run["metrics"][name]["value"] == pytest.approx(entry["value"], rel=1e-6, abs=1e-7), name
    # a task file that does not load comes back as the evaluator's own error, not a crash
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n")
    from monitor.errors import LabelError

    with pytest.raises(LabelError):
        evaluate_on_ray(backend, EvalSpec(model_dir=str(model), kind="multiple_choice", metric="acc", file=str(bad)),
                        timeout_s=300, memory_bytes=None, workdir=tmp_path / "work")
