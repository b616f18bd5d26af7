"""The scoring backend seam: jobs and outcomes cross a process unchanged, the local backend
scores exactly what the in-process engine scores, baselines travel with the jobs, and the
placement estimate is the headers' arithmetic.

Every score here is a real forward pass of a real tiny checkpoint on calib-v0.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from monitor.errors import ModelLoadError, SpecError, TokenizerError
from monitor.lab.tiny_models import build_tiny_model
from monitor.scoring import compute_score, prepare
from monitor.scoring.backends import (LocalBackend, ScoreError, ScoreJob, ScoreOutcome, estimate_memory,
                                      gpus_needed, make_backend)
from monitor.scoring.backends.placement import RUNTIME_OVERHEAD
from monitor.scoring.child import ScoringMemoryError
from monitor.scoring.engine import ScoreRequest, corpus_selection
from monitor.scoring.loader import device_map_options


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory, shared_dir) -> Path:
    # The backends carry jobs and outcomes whatever the vocabulary: the 1,000-id toy tokenizer
    # spares each of the file's five scores (three in children) most of gpt2's 50,257-id output
    # layer. The file went from 55.0 to 42.2 CPU-seconds (measured alone, 2026-11-30).
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", shared_dir / "tokenizers" / "spm-unigram-toy",
                            arch="llama", hidden=16, layers=1, heads=2, max_positions=64)


def request_for(model: Path, corpus: Path, **kw) -> ScoreRequest:
    return ScoreRequest(model=str(model), corpus_dir=corpus, docs=3, max_context=32, device="cpu",
                        dtype="float32", with_tcb=False, n_boot=10, progress=False, **kw)


def job_for(model: Path, corpus: Path, **kw) -> ScoreJob:
    request = request_for(model, corpus)
    return ScoreJob(checkpoint_id=7, repo="acme/tiny", sha="a" * 40, request=request,
                    corpus_sha256=corpus_selection(request).sha256, **kw)


@pytest.fixture(scope="module")
def local_outcome(tiny_dir, calib_v0, tmp_path_factory) -> ScoreOutcome:
    backend = make_backend("local", timeout_s=300, workdir=tmp_path_factory.mktemp("work"))
    try:
        [outcome] = list(backend.run([job_for(tiny_dir, calib_v0)]))
    finally:
        backend.close()
    return outcome


@pytest.mark.slow
def test_the_local_backend_scores_what_the_engine_scores_in_process(local_outcome, tiny_dir, calib_v0):
    assert local_outcome.ok, local_outcome.error
    direct = compute_score(prepare(request_for(tiny_dir, calib_v0)), None)
    got = local_outcome.scored
    assert [d[0] for d in got.documents] == [d[0] for d in direct.documents]
    for mine, theirs in zip(got.documents, direct.documents):
        assert mine[2] == theirs[2]                       # scored tokens
        assert mine[3] == pytest.approx(theirs[3], abs=1e-12, rel=0)
    for key in ("lstar", "ce", "ce_unigram", "nll_sum", "bits_per_byte"):
        assert got.result[key] == pytest.approx(direct.result[key], abs=1e-12, rel=0)
    # The worker had no baseline to reuse: it computed one, and says so.
    assert got.baseline_source == "computed"
    corpus = corpus_selection(request_for(tiny_dir, calib_v0))
    assert got.baseline["ce_unigram"] == direct.baseline["ce_unigram"]
    assert got.run_row["corpus_sha256"] == corpus.sha256


@pytest.mark.slow
def test_an_outcome_round_trips_through_json_bit_for_bit(local_outcome):
    again = ScoreOutcome.from_json(local_outcome.to_json())
    assert again.job == local_outcome.job
    assert again.scored.documents == local_outcome.scored.documents   # float64 equality, not approx
    assert again.scored.run_row == local_outcome.scored.run_row
    assert again.scored.result == local_outcome.scored.result
    assert again.scored.baseline == local_outcome.scored.baseline
    assert json.loads(again.to_json()) == json.loads(local_outcome.to_json())


@pytest.mark.slow
def test_a_job_carrying_the_cached_baseline_does_not_compute_it(local_outcome, tiny_dir, calib_v0, tmp_path,
                                                                 monkeypatch):
    from monitor.scoring.backends import local as local_module

    first = local_outcome.scored
    known = ((first.run_row["tokenizer_fingerprint"], first.run_row["corpus_sha256"], first.baseline),)
    backend = LocalBackend(timeout_s=300, workdir=tmp_path)
    [outcome] = list(backend.run([job_for(tiny_dir, calib_v0, baselines=known)]))
    assert outcome.ok, outcome.error
    assert outcome.scored.baseline_source == "job"
    assert outcome.scored.result["lstar"] == first.result["lstar"]
    # A baseline of another corpus selection is not taken for this one. The job above showed the
    # baselines crossing into the child; which one is taken is the engine's choice, the child's
    # `compute_score(prepare(request), None, baselines=...)`, so that is run here in this process
    # instead of a second child importing torch (the test went from 20.5 to 10.6 CPU-seconds,
    # measured alone, 2026-11-30).
    other = ((first.run_row["tokenizer_fingerprint"], "0" * 64, {"n_tokens": 1, "ce_unigram": 99.0,
                                                                 "slices": {}, "doc_tokens": {}}),)
    given = []

    def child(request, *, baselines, **_):
        given.append(baselines)
        return compute_score(prepare(request), None, baselines=baselines)

    monkeypatch.setattr(local_module, "run_score_child", child)
    [outcome] = list(backend.run([job_for(tiny_dir, calib_v0, baselines=other)]))
    assert given == [other]
    assert outcome.scored.baseline_source == "computed"
    assert outcome.scored.result["ce_unigram"] == first.result["ce_unigram"]


@pytest.mark.slow
def test_a_failing_job_comes_back_as_an_error_of_the_class_the_queue_classifies(tmp_path, calib_v0, tiny_dir):
    broken = tmp_path / "broken"
    broken.mkdir()
    for path in tiny_dir.iterdir():
        (broken / path.name).write_bytes(path.read_bytes())
    (broken / "model.safetensors").write_bytes(b"\x00" * 16)
    [outcome] = list(LocalBackend(timeout_s=300, workdir=tmp_path / "w").run([job_for(broken, calib_v0)]))
    assert not outcome.ok
    assert isinstance(outcome.error.exception(), ModelLoadError)
    again = ScoreOutcome.from_json(outcome.to_json())
    assert again.error == outcome.error
    with pytest.raises(ModelLoadError):
        again.unwrap()


def test_error_classes_survive_the_trip():
    assert isinstance(ScoreError("TokenizerError", "bad", "fix it").exception(), TokenizerError)
    assert ScoreError("TokenizerError", "bad", "fix it").exception().hint == "fix it"
    died = ScoreError("WorkerCrashedError", "the worker died").exception()
    assert type(died) is RuntimeError and "WorkerCrashedError" in str(died)   # retryable
    said = "scoring ran out of memory under the --score-memory limit of 300 MiB (address space): MemoryError: x"
    memory = ScoreError.from_exception(ScoringMemoryError(said)).exception()
    assert type(memory) is ScoringMemoryError and str(memory) == said          # retryable, the same reason
    job = ScoreJob(checkpoint_id=1, repo="r", sha="s", request=ScoreRequest())
    with pytest.raises(ValueError, match="exactly one of scored and error"):
        ScoreOutcome(job)


@pytest.mark.slow
def test_a_score_of_another_corpus_selection_is_refused(local_outcome, tiny_dir, calib_v0, tmp_path, monkeypatch):
    """The refusal is the backend's, in this process, of what the child returned. The child's
    answer to this job's request is the one `local_outcome`'s child gave (the same request; a
    child scores what the engine does, checked above), so that real answer is handed back
    instead of a second child importing torch to compute it again (about 10 CPU-seconds);
    the job's expected corpus selection is the only difference."""
    from monitor.scoring.backends import local as local_module

    assert local_outcome.ok, local_outcome.error
    job = replace(job_for(tiny_dir, calib_v0), corpus_sha256="f" * 64)
    asked = []

    def child(request, **_):
        asked.append(request)
        return local_outcome.scored

    monkeypatch.setattr(local_module, "run_score_child", child)
    [outcome] = list(LocalBackend(timeout_s=300, workdir=tmp_path).run([job]))
    assert asked == [local_outcome.job.request] == [job.request]
    assert outcome.scored is None and outcome.error.error_class == "CorpusError"
    assert "ffffffffffff" in outcome.error.message


def test_an_unknown_backend_names_the_choices():
    with pytest.raises(SpecError, match="unknown scoring backend 'slurm'.*local, ray"):
        make_backend("slurm")


def test_the_memory_estimate_is_the_headers_arithmetic(tiny_dir):
    from safetensors import safe_open

    numel = 0
    with safe_open(tiny_dir / "model.safetensors", "np") as fh:
        for name in fh.keys():
            numel += fh.get_tensor(name).size
    config = json.loads((tiny_dir / "config.json").read_text())
    hidden, ffn = config["hidden_size"], config["intermediate_size"]
    window = min(config["max_position_embeddings"], 4096)
    activations = 4 * window * (4 * hidden + ffn)
    assert estimate_memory(tiny_dir, dtype="float32", device="cpu") == 4 * numel + 2 * activations + RUNTIME_OVERHEAD
    assert estimate_memory(tiny_dir, dtype="bfloat16", device="cpu") == 2 * numel + 2 * activations + RUNTIME_OVERHEAD
    assert estimate_memory(tiny_dir, device="cuda", capability=(8, 0)) == 2 * numel + 2 * activations + RUNTIME_OVERHEAD
    assert estimate_memory(tiny_dir, device="cuda", capability=(7, 0)) == 4 * numel + 2 * activations + RUNTIME_OVERHEAD


def test_gpus_needed_rounds_up():
    assert gpus_needed(10, 80) == 1
    assert gpus_needed(80, 80) == 1
    assert gpus_needed(81, 80) == 2
    assert gpus_needed(0, 80) == 1


def test_device_map_is_for_cuda_only_and_only_auto():
    assert device_map_options(None, "cpu") == {}
    assert device_map_options("auto", "cuda") == {"device_map": "auto"}
    assert device_map_options("auto", "cuda:0") == {"device_map": "auto"}
    with pytest.raises(SpecError, match="device_map 'auto' spreads a model over GPUs but the device is cpu"):
        device_map_options("auto", "cpu")
    with pytest.raises(SpecError, match="device_map 'balanced' is not supported"):
        device_map_options("balanced", "cuda")


def test_a_request_with_device_map_on_cpu_is_refused_before_loading(tiny_dir, calib_v0):
    with pytest.raises(SpecError, match="device_map"):
        prepare(request_for(tiny_dir, calib_v0, device_map="auto"))


def test_without_ray_the_ray_backend_says_how_to_install_it(monkeypatch):
    import sys

    from monitor.errors import LstarError

    monkeypatch.setitem(sys.modules, "ray", None)   # what an install without the extra sees
    with pytest.raises(LstarError, match=r"needs the ray package.*pip install -e \".\[ray\]\""):
        make_backend("ray")


def test_lstar_run_checks_the_backend_options_before_starting(tmp_path, monkeypatch, capsys):
    import sys

    from monitor.cli import main

    base = ["run", "--policies", str(tmp_path), "--state", str(tmp_path / "state"), "--once"]
    assert main([*base, "--scoring-backend", "slurm"]) == 2
    assert "'slurm' is not a scoring backend; use one of: local, ray" in capsys.readouterr().err
    assert main([*base, "--ray-address", "127.0.0.1:6379"]) == 2
    assert "--ray-address is only used with --scoring-backend ray" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "ray", None)
    assert main([*base, "--scoring-backend", "ray"]) == 2
    assert "needs the ray package" in capsys.readouterr().err
    assert not (tmp_path / "state").exists()                # nothing was started or written


@pytest.mark.slow
def test_in_process_the_store_caches_the_baseline_once(tiny_dir, calib_v0, tmp_path):
    from monitor.store import Store

    prepared = prepare(request_for(tiny_dir, calib_v0))
    with Store.open(tmp_path / "state.duckdb") as store:
        first = compute_score(prepared, store)
        second = compute_score(prepared, store)
        assert (first.baseline_source, second.baseline_source) == ("computed", "store")
        assert store.query("SELECT count(*) AS n FROM baselines")[0]["n"] == 1
    assert second.result["ce_unigram"] == first.result["ce_unigram"]
