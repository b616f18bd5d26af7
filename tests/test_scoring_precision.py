"""Numerics that differ by device and dtype, checked on the CPU through the same code the
GPU path runs: the chunked output head in float64 and in bf16, full float32 matmuls under a
float32 spec, CUDA device names, and what a CPU run reports for GPU memory.

No GPU is needed; the CUDA-only calls (synchronize, peak memory) are exercised by
`benchmarks/gpu_score.py` on a CUDA machine.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer

from monitor.errors import ModelLoadError, SpecError
from monitor.lab.tiny_models import build_tiny_model
from monitor.scoring.forward import (OutputHead, ScoringSpec, decoder_body, resolve_device,
                                     score_token_sequences)
from monitor.scoring.loader import load_checkpoint

# bits/byte of bf16 scoring against float32 on the tiny model below (docs/measurement.md):
# measured 5.2e-5 relative; a bf16 log-softmax over the same bf16 logits is 2.1e-4 off.
BF16_BPB_REL_TOLERANCE = 1.2e-4


def _tiny_family(family: str, vocab: int) -> torch.nn.Module:
    """A tiny random model; gemma2 soft-caps its logits and granite scales them."""
    import transformers as tf

    common = dict(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    config = {
        "llama": lambda: tf.LlamaConfig(**common),
        "gemma2": lambda: tf.Gemma2Config(**common, head_dim=8, final_logit_softcapping=3.0),
        "granite": lambda: tf.GraniteConfig(**common, logits_scaling=4.0),
    }[family]()
    torch.manual_seed(5)
    model = tf.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():   # large logits, so the log-sum-exp's max shift matters
        model.get_output_embeddings().weight.mul_(40.0)
    return model


@pytest.mark.parametrize("family", ["llama", "gemma2", "granite"])
def test_chunked_head_equals_unchunked_to_1e10_in_float64(family):
    """In float64 the head accumulates in float64: the NLLs do not depend on the chunk size
    and equal the model's own cross-entropy in float64 to 1e-10."""
    vocab = 301
    model = _tiny_family(family, vocab).double()
    body, head = decoder_body(model), OutputHead(model)
    assert head.accumulator_dtype == torch.float64
    ids = torch.randint(0, vocab, (1, 49), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        reference = F.cross_entropy(model(input_ids=ids[:, :-1]).logits[0], ids[0, 1:], reduction="none")
        hidden = body(input_ids=ids[:, :-1]).last_hidden_state[0]
        whole = head.nll(hidden, ids[0, 1:], chunk_elements=1 << 24)
        chunked = {rows: head.nll(hidden, ids[0, 1:], chunk_elements=rows * vocab) for rows in (1, 7, 20)}
    assert reference.dtype == whole.dtype == torch.float64
    assert reference.max() > 5.0            # far from uniform (log 301 = 5.7): the shift matters
    torch.testing.assert_close(whole, reference, rtol=0, atol=1e-10)
    for rows, nll in chunked.items():
        assert nll.dtype == torch.float64
        assert float((nll - whole).abs().max()) <= 1e-10, rows


@pytest.fixture(scope="module")
def llama3_tiny(tmp_path_factory, shared_dir, calib_v0):
    """A tiny llama with the 128k-token llama-3 vocabulary, and every 20th calib-v0 document (11)."""
    tok_dir = shared_dir / "tokenizers" / "llama-3"
    out = build_tiny_model(tmp_path_factory.mktemp("llama3"), tok_dir, arch="llama", seed=3,
                           hidden=64, max_positions=64)
    lines = (calib_v0 / "documents.jsonl").read_text(encoding="utf-8").splitlines()
    texts = [json.loads(line)["text"] for line in lines][::20][:12]
    tok = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    seqs = [tok.encode(t, add_special_tokens=False).ids for t in texts]
    prefix = tok.token_to_id("<|begin_of_text|>")
    return out, seqs, prefix, sum(len(t.encode("utf-8")) for t in texts)


def _bits_per_byte(nll_sum: float, n_bytes: int) -> float:
    return nll_sum / n_bytes / math.log(2)


@pytest.mark.slow
def test_bf16_through_the_chunked_head_is_within_tolerance_of_float32(llama3_tiny):
    out, seqs, prefix, n_bytes = llama3_tiny
    ckpt32 = load_checkpoint(str(out), dtype="float32", device="cpu")
    ckpt16 = load_checkpoint(str(out), dtype="bfloat16", device="cpu")
    vocab = ckpt16.vocab_size
    # The deviation from float32 is a sum of per-token rounding errors of either sign (single
    # documents here are up to 2e-4 off), so it is measured on all the documents. Chunking
    # changes no row's arithmetic, only which rows share a matmul, so its equality holds per
    # document and the chunked run scores one: the second, 651 tokens in 20 windows, batches of
    # 288, 256 and 107 scored rows, whose last 3-row chunks are full, 1 row and 2 rows. (On
    # this CPU a bf16 token costs about five float32 ones.)
    scored = {}
    for name, ckpt, chunk, docs in (("float32", ckpt32, 1 << 24, seqs), ("bf16", ckpt16, 1 << 24, seqs),
                                    ("bf16-chunked", ckpt16, 3 * vocab + 7, seqs[1:2])):
        spec = ScoringSpec(max_context=64, dtype=ckpt.dtype, device="cpu", logits_chunk=chunk).resolve(64)
        scored[name] = score_token_sequences(ckpt.model, docs, prefix, spec, with_tcb=False, progress=False)
        assert scored[name].peak_memory_bytes is None             # GPU memory: not on the CPU
    bpb = {name: _bits_per_byte(float(scored[name].doc_nll.sum()), n_bytes) for name in ("float32", "bf16")}
    assert OutputHead(ckpt16.model).accumulator_dtype == torch.float32
    chunked = scored["bf16-chunked"]
    assert chunked.n_windows == 20 and len(chunked.doc_nll) == 1
    assert float(chunked.doc_nll[0]) == pytest.approx(float(scored["bf16"].doc_nll[1]), rel=1e-9)
    deviation = abs(bpb["bf16"] - bpb["float32"]) / bpb["float32"]
    assert deviation <= BF16_BPB_REL_TOLERANCE

    # The tolerance tells accumulators apart: the same bf16 logits with a bf16 log-softmax
    # (first windows only, computed here independently of the head) miss it.
    nll16 = nll32 = 0.0
    with torch.inference_mode():
        for seq in seqs:
            ids = torch.tensor([[prefix] + seq[:63]])
            targets = ids[0, 1:, None]
            logits16 = ckpt16.model(input_ids=ids).logits[0, :-1]
            logits32 = ckpt32.model(input_ids=ids).logits[0, :-1].double()
            nll16 -= float(torch.log_softmax(logits16, -1).gather(1, targets).double().sum())
            nll32 -= float(torch.log_softmax(logits32, -1).gather(1, targets).sum())
    assert abs(nll16 - nll32) / nll32 > BF16_BPB_REL_TOLERANCE


def _precision() -> tuple[str, str]:
    """The float32 matmul precision of the CUDA and CPU (oneDNN) backends, as torch applies it."""
    return torch.backends.cuda.matmul.fp32_precision, torch.backends.mkldnn.fp32_precision


@pytest.mark.slow
@pytest.mark.parametrize("setting", ["legacy", "per-backend"])
def test_float32_spec_runs_full_float32_matmuls_and_restores_the_setting(llama3_tiny, setting):
    """A process-wide lower precision (TF32 on CUDA, bf16 passes on the CPU), set with the
    legacy global call or torch's per-backend settings (after which the legacy getter raises),
    is lifted while a float32 score runs and put back afterwards; a bf16 score leaves it alone."""
    out, seqs, prefix, _ = llama3_tiny
    # The first 100 tokens of three documents: nine windows of 64 in two batches, so the
    # setting is seen at every batch's forward; more tokens would only repeat the same calls.
    docs = [seq[:100] for seq in seqs[:3]]
    seen: list[tuple[str, str]] = []
    saved, saved_legacy = _precision(), torch.get_float32_matmul_precision()
    if setting == "legacy":
        torch.set_float32_matmul_precision("medium")
    else:
        torch.backends.cuda.matmul.fp32_precision = "tf32"
        torch.backends.mkldnn.fp32_precision = "bf16"
    lowered = _precision()
    assert lowered != ("ieee", "ieee")
    try:
        for dtype in ("float32", "bfloat16"):
            ckpt = load_checkpoint(str(out), dtype=dtype, device="cpu")
            hook = ckpt.model.get_output_embeddings().register_forward_pre_hook(lambda *_: seen.append(_precision()))
            body_hook = decoder_body(ckpt.model).layers[0].register_forward_pre_hook(
                lambda *_: seen.append(_precision()))
            spec = ScoringSpec(max_context=64, dtype=dtype, device="cpu").resolve(64)
            scored = score_token_sequences(ckpt.model, docs, prefix, spec, with_tcb=False, progress=False)
            assert scored.n_windows == 9                  # two batches of the default 8
            hook.remove()
            body_hook.remove()
            assert _precision() == lowered
            if dtype == "float32":
                assert seen and set(seen) == {("ieee", "ieee")}
            else:
                assert set(seen) == {lowered}
            seen.clear()
        if setting == "legacy":
            assert torch.get_float32_matmul_precision() == "medium"   # the legacy reading still works
    finally:   # each API puts back what it changed
        if setting == "legacy":
            torch.set_float32_matmul_precision(saved_legacy)
        else:
            torch.backends.cuda.matmul.fp32_precision, torch.backends.mkldnn.fp32_precision = saved


def test_cuda_device_names_are_checked_against_the_devices_present(monkeypatch):
    # the hardware is the seam: pretend to be a host without a GPU, then one with two
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SpecError, match="'cuda:0' requested but no CUDA GPU is available"):
        resolve_device("cuda:0")
    assert resolve_device("auto") == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("auto") == "cuda"
    assert resolve_device("cuda") == "cuda"
    assert resolve_device("cuda:1") == "cuda:1"
    for bad in ("cuda:2", "cuda:x", "cuda:-1", "cuda:"):
        with pytest.raises(SpecError, match=r"does not exist: this host has 2 CUDA device"):
            resolve_device(bad)


def test_auto_dtype_is_bf16_only_where_the_gpu_computes_in_bf16(monkeypatch):
    """The hardware is the seam: an Ampere-or-later GPU scores in bf16 by default; an older
    one (which emulates bf16, slowly) and the CPU in float32; an explicit dtype is kept."""
    from monitor.scoring.forward import resolve_dtype

    seen: list[str] = []

    def capability(device):
        seen.append(device)
        return (8, 0) if device == "cuda:1" else (7, 5)

    monkeypatch.setattr(torch.cuda, "get_device_capability", capability)
    assert resolve_dtype("auto", "cuda:1") == "bfloat16"
    assert resolve_dtype("auto", "cuda:0") == "float32"
    assert resolve_dtype("bfloat16", "cuda:0") == "bfloat16"
    assert resolve_dtype("auto", "cpu") == "float32"
    assert seen == ["cuda:1", "cuda:0"]


def test_a_model_partly_offloaded_is_refused_with_where_its_layers_are(llama3_tiny):
    """device_map="auto" puts what the GPUs cannot hold on the CPU or disk ("meta"): such a
    model is refused by name, not scored with a confusing error mid-way."""
    out, seqs, prefix, _ = llama3_tiny
    ckpt = load_checkpoint(str(out), dtype="float32", device="cpu")
    decoder_body(ckpt.model).layers[-1].to("meta")
    spec = ScoringSpec(max_context=64, dtype="float32", device="cpu").resolve(64)
    with pytest.raises(ModelLoadError, match="parts of the model are on meta, not on cpu: it does not fit"):
        score_token_sequences(ckpt.model, seqs[:2], prefix, spec, with_tcb=False, progress=False)
