"""The scoring child: its default memory limit, and the real reason when it fails or dies.

Each test runs the real child process (`python -m monitor.scoring.child`) on a real tiny
checkpoint or fail point; the queue tests use a real DuckDB file.
"""

from __future__ import annotations

import copy
import importlib
import json
from datetime import datetime, timezone
from pathlib import Path

import pytest

from monitor.errors import ModelLoadError, TokenizerError, UnsupportedCheckpointError
from monitor.hub.poll import Candidate
from monitor.hub.queue import process_pending
from monitor.lab.tiny_models import build_tiny_model
from monitor.scoring.child import (ScoringMemoryError, default_memory_limit, error_from_payload, missing_module,
                                   physical_memory, run_score_child)
from monitor.scoring.engine import ScoreRequest
from monitor.store import Store

pytestmark = pytest.mark.slow

T0 = datetime(2024, 5, 1, tzinfo=timezone.utc)
# A pre-tokenizer regex that backtracks exponentially on any run of words not followed by a digit.
CATASTROPHIC_REGEX = r"(\w+\s?)+\d"


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory, shared_dir) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", shared_dir / "tokenizers" / "gpt2",
                            arch="llama", hidden=16, layers=1, heads=2, max_positions=64)


def request_for(model: Path, corpus: Path) -> ScoreRequest:
    return ScoreRequest(model=str(model), corpus_dir=corpus, docs=2, max_context=32, device="cpu",
                        dtype="float32", with_tcb=False, n_boot=10, progress=False)


def variant(tiny_dir: Path, dest: Path, *, config: dict | None = None, tokenizer: dict | None = None) -> Path:
    dest.mkdir()
    for path in tiny_dir.iterdir():
        (dest / path.name).write_bytes(path.read_bytes())
    if config is not None:
        base = json.loads((dest / "config.json").read_text())
        (dest / "config.json").write_text(json.dumps({**base, **config}))
    if tokenizer is not None:
        (dest / "tokenizer.json").write_text(json.dumps(tokenizer))
    return dest


def test_a_child_killed_by_a_signal_reports_the_signal_and_its_last_output(tmp_path, calib_v0, tiny_dir,
                                                                             monkeypatch):
    monkeypatch.setenv("LSTAR_FAILPOINT", "segfault_score_child")
    log = tmp_path / "scoring.log"
    with pytest.raises(ModelLoadError) as failure:
        run_score_child(request_for(tiny_dir, calib_v0), timeout_s=120, memory_bytes=None,
                        workdir=tmp_path / "work", log_path=log)
    message = failure.value.one_line()
    assert "killed by SIGSEGV without an answer" in message
    assert "Fatal Python error: Segmentation fault" in message       # faulthandler's last words
    assert "Segmentation fault" in log.read_text()                    # the whole output is logged
    assert not list((tmp_path / "work").iterdir())                    # no result file left behind


def test_the_regex_engine_limit_in_a_tokenizer_is_the_reason(tmp_path, calib_v0, tiny_dir):
    tokenizer = json.loads((tiny_dir / "tokenizer.json").read_text())
    hostile = copy.deepcopy(tokenizer)
    hostile["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": CATASTROPHIC_REGEX}, "behavior": "Isolated", "invert": False},
        tokenizer["pre_tokenizer"]]}
    model = variant(tiny_dir, tmp_path / "regex", tokenizer=hostile)
    with pytest.raises(TokenizerError) as failure:
        run_score_child(request_for(model, calib_v0), timeout_s=120, memory_bytes=None,
                        workdir=tmp_path / "work", log_path=tmp_path / "scoring.log")
    message = failure.value.one_line()
    assert "the tokenizer hit the regex engine limit" in message
    assert "retry-limit-in-match over" in message


def test_a_missing_quantization_backend_is_skipped_on_the_first_try(tmp_path, calib_v0, tiny_dir):
    model = variant(tiny_dir, tmp_path / "gptq", config={
        "quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False}})
    with Store.open(tmp_path / "state.duckdb") as store:
        store.record_discoveries("k", "rule", "http://hub", [Candidate("org/gptq", "a" * 40, ("main",))],
                                 watermark=None, boundary=[], now=T0, requests=0, listed=1)
        (row,) = store.list_checkpoints()
        store.set_checkpoint_verdict(row.id, expect_status="discovered", status="gated", reason=None,
                                     meta=None, now=T0)

        def worker(job):
            run_score_child(request_for(model, calib_v0), timeout_s=120, memory_bytes=None,
                            workdir=tmp_path / "work")
            raise AssertionError("a checkpoint without its quantization backend was scored")

        (result,) = process_pending(store, worker, owner="w", now_fn=lambda: T0)
        row = store.get_checkpoint(row.id)
        assert process_pending(store, worker, owner="w", now_fn=lambda: T0) == []   # nothing to retry
    assert (result.status, row.status, row.attempts) == ("skipped", "skipped", 1)
    assert "quantization_config (quant_method 'gptq') needs a package that is not installed" in row.reason
    assert "optimum" in row.reason
    assert row.meta["error"] == UnsupportedCheckpointError.__name__


def gated_row(store: Store, repo: str):
    store.record_discoveries("k", "rule", "http://hub", [Candidate(repo, "b" * 40, ("main",))],
                             watermark=None, boundary=[], now=T0, requests=0, listed=1)
    (row,) = store.list_checkpoints()
    store.set_checkpoint_verdict(row.id, expect_status="discovered", status="gated", reason=None, meta=None, now=T0)
    return row


def test_a_limit_too_small_to_load_torch_is_a_retryable_failure_naming_the_limit(tmp_path, calib_v0, tiny_dir):
    """Under 300 MiB of address space torch's shared libraries cannot even be mapped: the
    ImportError that says so is the limit, not a missing package, so the job is retried."""
    limit = 300 << 20
    with Store.open(tmp_path / "state.duckdb") as store:
        row = gated_row(store, "org/tiny")

        def worker(job):
            run_score_child(request_for(tiny_dir, calib_v0), timeout_s=120, memory_bytes=limit,
                            workdir=tmp_path / "work", log_path=tmp_path / "scoring.log")
            raise AssertionError("scored under 300 MiB of address space")

        (result,) = process_pending(store, worker, owner="w", now_fn=lambda: T0, limit=1)
        row = store.get_checkpoint(row.id)
    assert (result.status, row.status, row.attempts) == ("gated", "gated", 1)     # back in the queue
    assert row.reason.startswith("ScoringMemoryError: scoring ran out of memory under the --score-memory "
                                 "limit of 300 MiB (address space): ")
    assert "raise --score-memory" in row.reason
    assert "not installed" not in row.reason


def test_only_a_module_that_is_not_installed_is_a_skip(tmp_path):
    """The child's answer for an ImportError: a module that cannot be found is skipped; the
    same class of error for an installed module, or a library that failed to map, is not."""
    with pytest.raises(ModuleNotFoundError) as absent:
        importlib.import_module("lstar_no_such_package_anywhere")
    payload = {"ok": False, "error_class": "ModuleNotFoundError", "message": str(absent.value),
               "missing_module": missing_module(absent.value)}
    assert payload["missing_module"] == "lstar_no_such_package_anywhere"
    skipped = error_from_payload(payload)
    assert isinstance(skipped, UnsupportedCheckpointError)
    assert "No module named 'lstar_no_such_package_anywhere'" in skipped.one_line()

    installed = ModuleNotFoundError("No module named 'json'", name="json")
    assert missing_module(installed) is None
    failed = error_from_payload({"error_class": "ModuleNotFoundError", "message": str(installed),
                                 "missing_module": missing_module(installed)})
    assert not isinstance(failed, UnsupportedCheckpointError)
    assert "No module named 'json'" in str(failed)

    unmapped = ImportError("libtorch_cpu.so: failed to map segment from shared object")
    assert missing_module(unmapped) is None
    memory = error_from_payload({"error_class": "ImportError", "message": str(unmapped), "missing_module": None},
                                1 << 30)
    assert isinstance(memory, ScoringMemoryError)
    assert "under the --score-memory limit of 1.00 GiB" in str(memory)


def test_a_host_allocation_failure_names_the_limit_and_a_gpu_one_does_not():
    cpu = error_from_payload({"error_class": "RuntimeError", "message": "[enforce fail at alloc_cpu.cpp:117] . "
                              "DefaultCPUAllocator: can't allocate memory: you tried to allocate 1073741824 bytes."},
                             2 << 30)
    assert isinstance(cpu, ScoringMemoryError) and "--score-memory limit of 2.00 GiB" in str(cpu)
    gpu = error_from_payload({"error_class": "OutOfMemoryError", "message": "CUDA out of memory. Tried to allocate "
                              "2.00 GiB"}, 2 << 30)
    assert not isinstance(gpu, (ScoringMemoryError, UnsupportedCheckpointError))
    assert "CUDA out of memory" in str(gpu) and "--score-memory" not in str(gpu)


def test_the_child_has_an_address_space_limit_by_default(tmp_path):
    from monitor.service.daemon import DaemonConfig
    from monitor.service.settings import load_run_settings

    def _score_memory(value: str, device: str) -> int | None:
        return load_run_settings({"policies": "p", "score_memory": value, "device": device}).score_memory_bytes()

    total = physical_memory()
    assert total is not None and total > 0
    expected = max(int(total * 0.75), min(total, 4 << 30))
    assert default_memory_limit("cpu") == expected
    assert DaemonConfig(policies_dir=tmp_path, state_dir=tmp_path).score_memory == default_memory_limit()
    assert _score_memory("auto", "cpu") == expected
    assert _score_memory("50%", "cpu") == total // 2
    assert _score_memory("1500M", "cpu") == 1500 << 20
    assert _score_memory("none", "cpu") is None
