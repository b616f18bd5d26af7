"""Warm scoring workers: a pool of scoring children kept alive between jobs, forked from one
template process that imported torch once.

A worker killed mid-job loses the job's attempt but never its result (the queue retries it
and it is scored once); a worker is replaced after its quota of jobs; a job over its time
limit kills only its worker; and a warm worker scores exactly what a cold child does. Every
score is a real forward pass of a real tiny checkpoint on calib-v0; the queue is a real
DuckDB file.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

import pytest

from monitor.curves.eval_child import EvalSpec, evaluation_payload, run_evaluation_child
from monitor.hub.poll import Candidate
from monitor.hub.queue import process_pending
from monitor.lab.tiny_models import build_tiny_model
from monitor.scoring import compute_score, prepare
from monitor.scoring.backends import LocalBackend, ScoreJob, WarmBackend, make_backend
from monitor.scoring.child import ScoringInterrupted
from monitor.scoring.engine import ScoreRequest, corpus_selection
from monitor.scoring.process_cache import PrepareCache, folder_digest
from monitor.scoring.scoring_driver import outcome_to_queue
from monitor.scoring.tokenizer import load_tokenizer
from monitor.store import Store

T0 = datetime(2024, 5, 1, tzinfo=timezone.utc)
METRICS = ("lstar", "ce", "ce_unigram", "nll_sum", "bits_per_byte")


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory, shared_dir) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", shared_dir / "tokenizers" / "gpt2",
                            arch="llama", hidden=16, layers=1, heads=2, max_positions=64)


def request_for(model: Path, corpus: Path) -> ScoreRequest:
    # Two short documents (220 and 322 tokens, in windows of 32): what a worker must get right
    # (the same ids, per-document NLLs and baseline as a cold child) does not grow with their
    # length. The first two of calib-v0 (3,547 tokens through gpt2's 50,257-id head) cost
    # about 2 CPU-seconds a job, and the file scores about a dozen.
    return ScoreRequest(model=str(model), corpus_dir=corpus, slices=["encyclopedic"], every=2, docs=2,
                        max_context=32, device="cpu", dtype="float32", with_tcb=False, n_boot=10,
                        progress=False)


def job_for(model: Path, corpus: Path, checkpoint_id: int | None = 7) -> ScoreJob:
    request = replace(request_for(model, corpus), checkpoint_id=checkpoint_id)
    return ScoreJob(checkpoint_id=checkpoint_id, repo="acme/tiny", sha="a" * 40, request=request,
                    corpus_sha256=corpus_selection(request).sha256)


def pid_of(outcome) -> int:
    return int(outcome.worker.rpartition(":")[2])


def assert_same_numbers(got, expected) -> None:
    assert [d[0] for d in got.documents] == [d[0] for d in expected.documents]
    for mine, theirs in zip(got.documents, expected.documents, strict=True):
        assert mine[2] == theirs[2]
        assert mine[3] == pytest.approx(theirs[3], abs=1e-12, rel=0)
    for key in METRICS:
        assert got.result[key] == pytest.approx(expected.result[key], abs=1e-12, rel=0)


@pytest.mark.slow
def test_a_warm_worker_scores_what_a_cold_child_and_the_engine_score(tiny_dir, calib_v0, tmp_path):
    cold_backend = LocalBackend(timeout_s=300, workdir=tmp_path / "cold")
    [cold] = list(cold_backend.run([job_for(tiny_dir, calib_v0)]))
    pool = make_backend("local", workers=1, max_jobs=5, timeout_s=300, workdir=tmp_path / "warm")
    assert isinstance(pool, WarmBackend)
    try:
        # The second job runs on the same worker, from its cached tokenizer, ids and baseline.
        first, second = list(pool.run([job_for(tiny_dir, calib_v0), job_for(tiny_dir, calib_v0)]))
    finally:
        pool.close()
    assert cold.ok and first.ok and second.ok, (cold.error, first.error, second.error)
    assert pid_of(first) == pid_of(second)
    assert (first.scored.baseline_source, second.scored.baseline_source) == ("computed", "job")
    direct = compute_score(prepare(request_for(tiny_dir, calib_v0)), None)   # in this process
    for warm in (first.scored, second.scored):
        assert_same_numbers(warm, cold.scored)
        assert_same_numbers(warm, direct)
        assert warm.baseline == direct.baseline
        assert warm.run_row["tokenizer_fingerprint"] == direct.run_row["tokenizer_fingerprint"]


def gated_row(store: Store, repo: str):
    store.record_discoveries("k", "rule", "http://hub", [Candidate(repo, "b" * 40, ("main",))],
                             watermark=None, boundary=[], now=T0, requests=0, listed=1)
    (row,) = store.list_checkpoints()
    store.set_checkpoint_verdict(row.id, expect_status="discovered", status="gated", reason=None, meta=None, now=T0)
    return row


@pytest.mark.slow
def test_a_warm_worker_killed_mid_job_loses_the_attempt_not_the_result(tmp_path, calib_v0, tiny_dir, monkeypatch):
    """Row 49: the worker is SIGKILLed after taking the job; the lease goes back, the retry
    runs on a fresh worker and the checkpoint is scored exactly once."""
    marker = tmp_path / "killed-once"
    monkeypatch.setenv("LSTAR_FAILPOINT", f"kill_warm_worker={marker}")
    pool = WarmBackend(workers=1, max_jobs=10, timeout_s=300, workdir=tmp_path / "work")
    handed: list[int] = []
    try:
        with Store.open(tmp_path / "state.duckdb") as store:
            row = gated_row(store, "org/tiny")

            def worker(job):
                [outcome] = list(pool.run([job_for(tiny_dir, calib_v0, checkpoint_id=job.id)]))
                handed.append(pid_of(outcome))
                return outcome_to_queue(store, outcome)

            (first,) = process_pending(store, worker, owner="w", now_fn=lambda: T0)
            after_kill = store.get_checkpoint(row.id)
            runs_after_kill = store.query("SELECT count(*) AS n FROM score_runs")[0]["n"]
            (second,) = process_pending(store, worker, owner="w", now_fn=lambda: T0)
            assert process_pending(store, worker, owner="w", now_fn=lambda: T0) == []   # nothing left
            done = store.get_checkpoint(row.id)
            runs = store.query("SELECT checkpoint_id, lstar FROM score_runs")
    finally:
        pool.close()
    assert marker.exists()
    assert (first.status, after_kill.status, after_kill.attempts, after_kill.lease_owner) == ("gated", "gated", 1, None)
    assert "killed by SIGKILL" in after_kill.reason and "without an answer" in after_kill.reason
    assert runs_after_kill == 0
    assert (second.status, done.status, done.attempts) == ("scored", "scored", 2)
    assert len(runs) == 1 and runs[0]["checkpoint_id"] == row.id
    direct = compute_score(prepare(request_for(tiny_dir, calib_v0)), None)
    assert runs[0]["lstar"] == pytest.approx(direct.result["lstar"], abs=1e-12, rel=0)
    assert len(handed) == 2 and handed[0] != handed[1]                  # the retry had a new worker
    assert pool.started == 2 and pool.recycled[0] == (handed[0], "died")


def address_space_limit(pid: int) -> str:
    """The soft 'Max address space' of process `pid`, as /proc/PID/limits writes it."""
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max address space"):
            return line.split()[3]
    raise AssertionError(f"no address-space line in /proc/{pid}/limits")


def mc_task(path: Path) -> Path:
    """A two-option task of eight items (an untrained model's log-likelihoods pick either)."""
    lines = [json.dumps({"id": f"q{i}", "context": f"Question {i}:", "choices": [" yes", " no" * (1 + i % 3)],
                         "answer": i % 2}) for i in range(8)]
    path.write_text("\n".join(lines) + "\n")
    return path


def parent_pid(pid: int) -> int:
    """The parent of process `pid` (/proc/PID/stat's fourth field)."""
    return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])


def wait_until_gone(pid: int, timeout: float = 30.0) -> None:
    """Wait for process `pid` to end (or be a zombie); fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
        except FileNotFoundError:
            return
        if state in ("Z", "X"):
            return
        time.sleep(0.05)
    raise AssertionError(f"process {pid} still runs {timeout:g} s after its template was killed")


@pytest.mark.slow
def test_a_worker_is_replaced_after_its_quota_of_jobs(tmp_path, calib_v0, tiny_dir):
    """Row 50 (recycling): with --worker-max-jobs 2, jobs 1-2 share a worker, job 3 gets a new
    one, which starts under the same address-space limit. Both are forked from the pool's one
    template process (which imported torch once), and die with it. An evaluation before the
    first job (the daemon's observe job at start) is handed the template the pool starts for
    it: the one the jobs' workers are then forked from."""
    limit = 64 << 30
    pool = WarmBackend(workers=1, max_jobs=2, timeout_s=300, memory_bytes=limit, workdir=tmp_path / "work")
    try:
        early = pool.evaluation_template()
        assert early is not None and early.ready() and pool.templates_started == 1
        outcomes = list(pool.run([job_for(tiny_dir, calib_v0, checkpoint_id=i) for i in (1, 2, 3)]))
        pids = [pid_of(o) for o in outcomes]
        assert address_space_limit(pids[2]) == str(limit)     # the replacement, alive and idle
        template_pid = pool._template.proc.pid
        assert parent_pid(pids[2]) == template_pid != os.getpid()
        assert address_space_limit(template_pid) == str(limit)
        # An active evaluation forked from the running template (as the daemon's observe job
        # does) gives what the evaluation gives in this process; the template reaped it.
        template = pool.live_template()
        assert template is early and pool.evaluation_template() is template
        forked_before = len(template._exits)
        spec = EvalSpec(model_dir=str(tiny_dir), kind="multiple_choice", metric="acc",
                        file=str(mc_task(tmp_path / "mc.jsonl")))
        forked = run_evaluation_child(spec, timeout_s=300, memory_bytes=limit, workdir=tmp_path / "eval",
                                      template=template)
        assert len(template._exits) == forked_before + 1
        here = evaluation_payload(spec)
        assert here["ok"] and (forked["value"], forked["n"], forked["k"]) == (here["value"], here["n"], here["k"])
        assert forked["metrics"] == here["metrics"] and forked["task_sha256"] == here["task_sha256"]
        # One more worker forked here, its stdin held open: nothing but the parent-death signal
        # can end it when the template dies (the pool's own worker is stopped by the pool).
        status_read, status_write = os.pipe()
        extra = template.fork(status_write)
        os.close(status_write)
        os.kill(template_pid, signal.SIGKILL)   # the template's death takes its workers with it
        wait_until_gone(extra.pid)
        wait_until_gone(pids[2])
        os.close(status_read)
        extra.stdin.close()
        extra.stdout.close()
    finally:
        pool.close()
    assert all(o.ok for o in outcomes), [o.error for o in outcomes]
    assert pids[0] == pids[1] != pids[2]
    assert pool.recycled[0] == (pids[0], "2 jobs done")
    assert pool.started == 2 and pool.templates_started == 1
    assert {o.scored.result["lstar"] for o in outcomes} == {outcomes[0].scored.result["lstar"]}


def test_an_evaluation_waits_only_so_long_for_a_template_that_does_not_start(tmp_path, monkeypatch):
    """A template that never gets ready (it hangs before its imports) holds an evaluation up to
    the bound it is given, then the evaluation starts a child of its own (None); the shutdown's
    interrupt ends such a wait as an interruption, with no child started; a pool without
    templates hands none and starts nothing for it."""
    monkeypatch.setenv("LSTAR_FAILPOINT", "hang_worker_template")
    pool = WarmBackend(workers=1, timeout_s=300, workdir=tmp_path / "work")
    try:
        started = time.monotonic()
        assert pool.evaluation_template(timeout_s=1.0) is None
        waited = time.monotonic() - started
        assert pool.templates_started == 1 and pool.live_template() is None
        raised: list[BaseException] = []

        def wait_for_template() -> None:
            try:
                pool.evaluation_template(timeout_s=120)
            except BaseException as exc:  # noqa: BLE001 - checked below
                raised.append(exc)

        waiter = threading.Thread(target=wait_for_template)
        waiter.start()
        time.sleep(0.5)   # the evaluation waits for the slot's template, still hung
        assert pool.interrupt() == 1
        waiter.join(timeout=30)
        assert not waiter.is_alive()
        assert [type(e).__name__ for e in raised] == ["ScoringInterrupted"], raised
    finally:
        pool.close()
    assert 1.0 <= waited < 10
    off = WarmBackend(workers=1, timeout_s=300, workdir=tmp_path / "off", use_template=False)
    try:
        assert off.evaluation_template() is None and off._threads == [] and off.started == 0
    finally:
        off.close()


def test_a_shutdown_that_ends_the_template_as_the_evaluation_looks_at_it_is_an_interruption(tmp_path, monkeypatch):
    """The shutdown marks itself, then ends the template: an evaluation that sees that template
    dead must not take it for one that died of its own accord (it would start a child of its own
    importing torch while the daemon stops). The interrupt is made to land inside the
    evaluation's own look at the template, the narrowest window there is."""
    from monitor.scoring.template import WorkerTemplate

    monkeypatch.setenv("LSTAR_FAILPOINT", "hang_worker_template")
    pool = WarmBackend(workers=1, timeout_s=300, workdir=tmp_path / "work")
    evaluation = threading.current_thread()
    interrupted: list[int] = []
    real_ready = WorkerTemplate.ready

    def ready(template: WorkerTemplate) -> bool:
        if threading.current_thread() is evaluation and not interrupted:
            interrupted.append(pool.interrupt())
            deadline = time.monotonic() + 30   # until the template is gone, as after a thread switch
            while template.alive() and time.monotonic() < deadline:
                time.sleep(0.01)
        return real_ready(template)

    monkeypatch.setattr(WorkerTemplate, "ready", ready)
    try:
        with pytest.raises(ScoringInterrupted):
            pool.evaluation_template(timeout_s=60)
    finally:
        pool.close()
    assert interrupted == [1]


@pytest.mark.slow
def test_a_worker_whose_memory_grew_past_the_threshold_is_replaced(tmp_path, calib_v0, tiny_dir):
    """Row 50 (memory): a worker resident above --worker-max-rss after a job is replaced
    before the next one (a threshold of 64 MiB: torch alone is resident above it). Without a
    template: the workers that import on their own (what a pool falls back to when its
    template cannot fork) are covered here."""
    pool = WarmBackend(workers=1, max_jobs=10, max_rss_bytes=64 << 20, timeout_s=300, workdir=tmp_path / "work",
                       use_template=False)
    try:
        first, second = list(pool.run([job_for(tiny_dir, calib_v0, checkpoint_id=i) for i in (1, 2)]))
    finally:
        pool.close()
    assert first.ok and second.ok
    assert pid_of(first) != pid_of(second)
    pid, why = pool.recycled[0]
    assert pid == pid_of(first) and why.startswith("resident memory ") and why.endswith("past 64 MiB")
    assert pool.templates_started == 0


@pytest.mark.slow
def test_a_job_over_its_time_limit_kills_only_its_worker(tmp_path, calib_v0, tiny_dir, monkeypatch):
    """Row 50 (time limit): the hanging job's worker is killed; the other worker's job and the
    next job on a fresh worker are scored."""
    marker = tmp_path / "hung-once"
    monkeypatch.setenv("LSTAR_FAILPOINT", f"hang_warm_worker={marker}")
    # The test waits out the limit once. A job here takes under a second of CPU on a worker
    # that is ready (the limit starts then, not at the template's imports): 20 s leaves room
    # for a loaded machine without waiting a minute for the hung one.
    pool = WarmBackend(workers=2, max_jobs=10, timeout_s=20, workdir=tmp_path / "work")
    try:
        first = list(pool.run([job_for(tiny_dir, calib_v0, checkpoint_id=i) for i in (1, 2)]))
        [after] = list(pool.run([job_for(tiny_dir, calib_v0, checkpoint_id=3)]))
    finally:
        pool.close()
    timed_out = [o for o in first if not o.ok]
    scored = [o for o in first if o.ok]
    assert len(timed_out) == 1 and len(scored) == 1
    assert timed_out[0].error.error_class == "ScoringTimeout"
    assert "killed after the 20 s time limit" in timed_out[0].error.message
    assert after.ok, after.error
    assert pid_of(after) != pid_of(timed_out[0])
    assert pool.recycled == [(pid_of(timed_out[0]), "killed at the time limit")]
    assert after.scored.result["lstar"] == scored[0].scored.result["lstar"]


def test_a_shutdown_while_a_worker_waits_for_its_template_interrupts_the_job(tmp_path, calib_v0, tiny_dir,
                                                                            monkeypatch):
    """The daemon's shutdown after its drain (`interrupt`) while a slot still waits for the
    template to fork its worker: the template ends, the job ends ScoringInterrupted (its attempt
    is given back), and the pool closes at once, with no worker started on its own."""
    monkeypatch.setenv("LSTAR_FAILPOINT", "hang_worker_template")
    pool = WarmBackend(workers=1, timeout_s=300, workdir=tmp_path / "work")
    outcomes: list = []
    runner = threading.Thread(target=lambda: outcomes.extend(pool.run([job_for(tiny_dir, calib_v0)])))
    runner.start()
    deadline = time.monotonic() + 60
    while pool._spawning == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)   # the job is queued behind the slot's wait
    try:
        assert pool.interrupt() == 1
        runner.join(timeout=60)
        assert not runner.is_alive()
    finally:
        started = time.monotonic()
        pool.close()
    assert time.monotonic() - started < 30
    [outcome] = outcomes
    assert outcome.error.error_class == "ScoringInterrupted", outcome.error
    assert pool.started == 0 and pool.templates_started >= 1


def test_the_cache_keys_tokenizers_by_content_and_hands_out_copies(tmp_path, shared_dir):
    gpt2 = shared_dir / "tokenizers" / "gpt2"
    a, b, c = (tmp_path / name for name in "abc")
    for folder in (a, b, c):
        shutil.copytree(gpt2, folder)
        (folder / "model.safetensors").write_bytes(os.urandom(64))   # weights are not part of the key
    edited = json.loads((c / "tokenizer.json").read_text())
    edited["added_tokens"] = [*edited.get("added_tokens", []),
                              {"id": 50257, "content": "<|x|>", "single_word": False, "lstrip": False,
                               "rstrip": False, "normalized": False, "special": True}]
    (c / "tokenizer.json").write_text(json.dumps(edited))
    loads: list[Path] = []

    def load(path):
        loads.append(Path(path))
        return load_tokenizer(path)

    cache = PrepareCache()
    first, same, other = cache.tokenizer(a, load), cache.tokenizer(b, load), cache.tokenizer(c, load)
    assert loads == [a, c]                                   # b has a's bytes: not loaded again
    assert same.tokenizer is first.tokenizer and same.source == str(b.resolve())
    assert same.fingerprint == load_tokenizer(b).fingerprint
    assert other.fingerprint != first.fingerprint
    assert folder_digest(a) == folder_digest(b) != folder_digest(c)

    encoded = []
    ids = cache.token_ids("fp", "sha", lambda: encoded.append(1) or [[1, 2], [3]])
    ids[0].append(99)                                        # a job may not change the next one's ids
    assert cache.token_ids("fp", "sha", lambda: encoded.append(1) or [[0]]) == [[1, 2], [3]]
    assert encoded == [1]
    assert cache.token_ids("fp2", "sha", lambda: [[7]]) == [[7]]

    cache.remember_baseline("fp", "sha", {"ce_unigram": 1.5})
    given = [("fp", "sha", {"ce_unigram": 2.5})]
    assert cache.baselines(given) == given                   # the job's own baseline wins
    assert cache.baselines([]) == [("fp", "sha", {"ce_unigram": 1.5})]
