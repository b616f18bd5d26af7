"""`--dtype auto` / `--device auto` resolved once, by one rule (monitor.scoring.precision):
the memory estimate, the load and the dedupe digest agree on the precision scored in."""

from __future__ import annotations

from pathlib import Path
from typing import get_args

import pytest
import torch

from monitor.lab.tiny_models import build_tiny_model
from monitor.scoring import ScoreRequest
from monitor.scoring.backends.placement import RUNTIME_OVERHEAD, activation_bytes, estimate_memory, weight_bytes
from monitor.scoring.forward import resolve_dtype as loader_rule
from monitor.scoring.loader import load_checkpoint
from monitor.scoring.precision import DTYPE_CHOICES, host_precision, resolve_dtype, resolve_precision
from monitor.scoring.scoring_driver import JobBuilder, resolved_precision
from monitor.store import Store


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory, shared_dir) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", shared_dir / "tokenizers" / "gpt2",
                            arch="llama", hidden=16, layers=1, heads=2, max_positions=64)


def _bytes_in_memory(model: torch.nn.Module) -> int:
    """What the loaded weights take, counted tensor by tensor (tied weights once; buffers such
    as the rotary frequencies are computed at load, not read from the file)."""
    seen: dict[int, int] = {}
    for tensor in model.parameters():
        if tensor.is_floating_point():
            seen[tensor.data_ptr()] = tensor.numel() * tensor.element_size()
    return sum(seen.values())


@pytest.mark.parametrize("capability, expected", [((7, 5), "float32"), ((8, 0), "bfloat16"), ((9, 0), "bfloat16")])
def test_the_estimate_and_the_load_agree_on_every_gpu_generation(tiny_dir, monkeypatch, capability, expected):
    """The hardware is the seam: the capability goes into the one resolver. The placement
    estimated bf16 for any CUDA device while the loader gave bf16 only from capability 8."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    got = resolve_precision("auto", "cuda", capability)
    assert got.dtype == expected == loader_rule("auto", "cuda")   # the loader's rule, asking "torch"
    estimate = estimate_memory(tiny_dir, dtype="auto", device="cuda", capability=capability)
    assert estimate == weight_bytes(tiny_dir, got.dtype, "cpu") + 2 * activation_bytes(tiny_dir) + RUNTIME_OVERHEAD
    # a real load in the resolved dtype (on the CPU: the bytes of a tensor do not depend on where it lives)
    model = load_checkpoint(str(tiny_dir), dtype=got.dtype, device="cpu").model
    assert weight_bytes(tiny_dir, "auto", "cuda", capability) == _bytes_in_memory(model)


def test_an_unknown_gpu_is_estimated_at_the_wider_dtype(tiny_dir):
    # a Ray worker's GPU, seen from the daemon: float32, an estimate never too small
    assert weight_bytes(tiny_dir, "auto", "cuda") == weight_bytes(tiny_dir, "float32", "cpu") \
        == 2 * weight_bytes(tiny_dir, "bfloat16", "cpu")


def test_on_a_cpu_auto_resolves_to_float32_and_digests_as_float32(tmp_path, calib_v0, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert host_precision("auto", "auto").dtype == "float32" == resolve_precision("auto", "auto").dtype
    assert host_precision("auto", "auto").device == "cpu"

    def digest(dtype: str, device: str = "auto", **kw) -> str:
        template = ScoreRequest(corpus_dir=calib_v0, docs=3, device=device, dtype=dtype)
        with Store.open(tmp_path / "state.duckdb") as store:
            return JobBuilder(store, template, tmp_path, **kw).request_digest()

    assert digest("auto") == digest("float32", "cpu") == digest("fp32", "cpu")
    assert digest("auto") != digest("bfloat16", "cpu")


def test_workers_elsewhere_leave_auto_open_and_their_scores_unlinked(tmp_path, calib_v0):
    template = ScoreRequest(corpus_dir=calib_v0, docs=3, device="cuda", dtype="auto")
    assert resolved_precision(template, workers_here=False).dtype == "auto"
    with Store.open(tmp_path / "state.duckdb") as store:
        builder = JobBuilder(store, template, tmp_path, workers_here=False)
        assert builder.content_key(1) is None   # no link between a bf16 and a float32 score
    cpu = ScoreRequest(corpus_dir=calib_v0, docs=3, device="cpu", dtype="auto")
    assert resolved_precision(cpu, workers_here=False).dtype == "float32"


def test_the_dtype_choices_are_written_once():
    from monitor.calibrate.campaign import ScoringSpec
    from monitor.commands.options import DType

    assert tuple(d.value for d in DType) == DTYPE_CHOICES
    assert set(get_args(ScoringSpec.model_fields["dtype"].annotation)) == set(DTYPE_CHOICES)
    assert resolve_dtype("bf16", "cpu") == "bfloat16"
