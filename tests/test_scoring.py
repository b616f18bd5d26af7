"""Scoring spec lstar-score/1: window plan, and per-document NLLs against a naive reference.

The reference below follows the spec's window rule literally, one window at a time, with the
model's own full logits and a float64 log-softmax; the code under test batches windows of all
documents, pads, and computes the loss in chunks from the final hidden state.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from lanes import fast_first
import torch
import torch.nn.functional as F
from safetensors import safe_open
from tokenizers import Tokenizer

from monitor.errors import SpecError
from monitor.lab.tiny_models import build_tiny_model
from monitor.scoring.forward import OutputHead, ScoringSpec, decoder_body, plan_windows, score_token_sequences
from monitor.scoring.loader import load_checkpoint

MAX_POSITIONS = 64


# --------------------------------------------------------------------------- window plan


def _positions(plan):
    return [q for _, end, first in plan for q in range(first, end + 1)]


@pytest.mark.parametrize("n_seq", [0, 1, 2, 5, 16, 17, 31, 32, 33, 64, 100, 257])
@pytest.mark.parametrize("window,stride", [(16, 8), (16, 16), (16, 1), (16, 5), (1, 1), (7, 3)])
def test_plan_scores_every_position_once_with_enough_context(n_seq, window, stride):
    plan = plan_windows(n_seq, window, stride)
    assert sorted(_positions(plan)) == list(range(1, n_seq))
    assert len(_positions(plan)) == max(0, n_seq - 1)
    for k, (start, end, first) in enumerate(plan):
        assert 0 <= start < first <= end <= n_seq - 1
        assert end - start <= window                       # reads at most L tokens
        if k == 0:
            assert (start, first) == (0, 1)
        else:
            assert end - start == window                   # later passes read exactly L tokens
            assert end - first + 1 <= stride
            # position `first` is predicted from seq[start:first]
            assert first - start >= window - stride + 1


def _lm_eval_rolling_windows(tokens, prefix, max_len):
    """lm-evaluation-harness 0.4.x `get_rolling_token_windows(context_len=1)` followed by
    `make_disjoint_window`, written out: (model input, predicted tokens) per window."""
    out, predicted = [], 0
    first = min(max_len, len(tokens))
    if tokens:
        out.append(([prefix] + tokens[:first - 1], tokens[:first]))
        predicted = first
    while predicted < len(tokens):
        n_pred = min(len(tokens) - predicted, max_len)
        end = predicted + n_pred
        out.append((tokens[end - max_len - 1:end - 1], tokens[end - n_pred:end]))
        predicted += n_pred
    return out


@pytest.mark.parametrize("n_tokens", [1, 5, 16, 17, 40, 100])
def test_disjoint_plan_is_lm_eval_rolling_windows(n_tokens):
    tokens = list(range(1000, 1000 + n_tokens))
    seq = [7] + tokens
    window = 16
    ours = [(seq[s:e], seq[f:e + 1]) for s, e, f in plan_windows(len(seq), window, window)]
    assert ours == _lm_eval_rolling_windows(tokens, 7, window)


def test_disjoint_plan_matches_installed_lm_eval():
    utils = pytest.importorskip("lm_eval.utils")
    tokens = list(range(500, 590))
    for window in (8, 16, 89, 90, 128):
        theirs = [utils.make_disjoint_window(w) for w in
                  utils.get_rolling_token_windows(tokens, prefix_token=3, max_seq_len=window, context_len=1)]
        seq = [3] + tokens
        ours = [(seq[s:e], seq[f:e + 1]) for s, e, f in plan_windows(len(seq), window, window)]
        # lm-eval's context drops the last len(pred)-1 inputs; the model input is context+pred[:-1]
        assert [(a + b[:-1], b) for a, b in theirs] == [(x, y) for x, y in ours]


# --------------------------------------------------------------------------- spec resolution


def test_spec_resolution():
    assert ScoringSpec().resolve(1024).window == 1024
    assert ScoringSpec().resolve(8192).window == 2048
    assert ScoringSpec().resolve(None).window == 2048
    r = ScoringSpec(max_context=64).resolve(256)
    assert (r.window, r.stride, r.disjoint) == (64, 32, False)
    r = ScoringSpec(max_context=64, disjoint=True).resolve(256)
    assert (r.window, r.stride, r.disjoint) == (64, 64, True)
    r = ScoringSpec(max_context=64, stride=10).resolve(None)
    assert (r.window, r.stride) == (64, 10)
    assert ScoringSpec(device="cpu").resolve(None).dtype == "float32"
    assert ScoringSpec(device="cpu", dtype="bf16").resolve(None).dtype == "bfloat16"


def test_spec_errors_name_the_numbers():
    with pytest.raises(SpecError, match=r"window 4096 .* maximum positions 2048"):
        ScoringSpec(max_context=4096).resolve(2048)
    with pytest.raises(SpecError, match="stride 65"):
        ScoringSpec(max_context=64, stride=65).resolve(None)
    with pytest.raises(SpecError, match="at least 1"):
        ScoringSpec(stride=0).validate()
    with pytest.raises(SpecError, match="conflicts with --disjoint"):
        ScoringSpec(max_context=64, stride=8, disjoint=True).resolve(None)
    with pytest.raises(SpecError, match="unknown dtype"):
        ScoringSpec(dtype="int8").validate()
    with pytest.raises(SpecError, match="float16 is not supported on CPU"):
        ScoringSpec(dtype="float16", device="cpu").validate()


# --------------------------------------------------------------------------- naive reference


def _prefix_token(tokenizer_dir: Path, tok: Tokenizer) -> int | None:
    """BOS if the tokenizer defines one, else EOS, else none (the spec's prefix rule). `tok`:
    the folder's tokenizer.json, loaded once per case (a load of llama-3's takes 0.7
    CPU-seconds, of qwen2's 0.4)."""
    config = json.loads((tokenizer_dir / "tokenizer_config.json").read_text())
    for key in ("bos_token", "eos_token"):
        value = config.get(key)
        if isinstance(value, dict):
            value = value.get("content")
        if value:
            return tok.token_to_id(value)
    return None


def _head_bias_from_file(model_dir: Path):
    with safe_open(str(model_dir / "model.safetensors"), framework="pt") as f:
        keys = [k for k in f.keys() if k.endswith(".bias") and ("head" in k or "embed_out" in k)]
        return f.get_tensor(keys[0]).double() if keys else None


def naive_document_nll(model, tokens, prefix, window, stride, head_bias=None):
    """Spec lstar-score/1 taken literally: seq = [prefix] + tokens; the first pass reads
    seq[0:L] and scores 1..L; each later pass scores the next S positions (a, b] reading
    seq[b-L:b]. Full logits, float64 log-softmax, one window at a time."""
    seq = ([prefix] if prefix is not None else []) + list(tokens)
    last = len(seq) - 1
    total, count = 0.0, 0
    if last < 1:
        return total, count
    passes, b = [], min(window, last)
    passes.append((0, b, 1))
    while b < last:
        a, b = b, min(b + stride, last)
        passes.append((b - window, b, a + 1))
    for start, end, first in passes:
        ids = torch.tensor([seq[start:end]])
        with torch.no_grad():
            if head_bias is None:
                logits = model(input_ids=ids).logits[0].double()
            else:  # W h + b with the bias read straight from the checkpoint file
                hidden = model(input_ids=ids, output_hidden_states=True).hidden_states[-1][0].double()
                logits = hidden @ model.get_output_embeddings().weight.double().T + head_bias
        logp = torch.log_softmax(logits, dim=-1)
        for q in range(first, end + 1):
            total -= float(logp[q - 1 - start, seq[q]])
            count += 1
    return total, count


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def documents(calib_v0):
    lines = (calib_v0 / "documents.jsonl").read_text(encoding="utf-8").splitlines()
    docs = [json.loads(line)["text"] for line in lines]
    # code (the longest), encyclopedic, math, prose, technical
    long_docs = [docs[0][:400]] + [docs[i][:200] for i in (45, 90, 140, 200)]
    return long_docs + ["", "a", "Hello world", "x " * 3, docs[100][:90]]


CASES = {
    # name: (arch, tokenizer, tie, bias)   prefix policy follows the tokenizer
    "llama-bos": ("llama", "llama-3", False, False),
    "neox-eos": ("gpt_neox", "qwen2", False, False),
    "llama-none": ("llama", "bert-base-uncased", False, False),
    "neox-tied-bias": ("gpt_neox", "gpt2", True, True),
    "llama-tied-bias": ("llama", "smollm2", True, True),
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, shared_dir, documents):
    """Build and load each case once: (checkpoint, token sequences, prefix id, bias)."""
    built = {}

    def get(name):
        if name not in built:
            arch, tok_name, tie, bias = CASES[name]
            tok_dir = shared_dir / "tokenizers" / tok_name
            out = build_tiny_model(tmp_path_factory.mktemp(name), tok_dir, arch=arch, seed=3,
                                   max_positions=MAX_POSITIONS, tie_embeddings=tie, lm_head_bias=bias)
            ckpt = load_checkpoint(str(out), dtype="float32", device="cpu")
            tok = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
            seqs = [tok.encode(d, add_special_tokens=False).ids for d in documents]
            built[name] = (ckpt, seqs, _prefix_token(tok_dir, tok), _head_bias_from_file(out) if bias else None)
        return built[name]

    return get


_REFERENCE_CACHE: dict = {}


def _reference(ckpt, seqs, prefix, window, stride, bias):
    """Naive per-document (NLL, count), cached: several tests share one reference."""
    key = (str(ckpt.model_dir), window, stride, None if bias is None else float(bias.abs().sum()))
    if key not in _REFERENCE_CACHE:
        pairs = [naive_document_nll(ckpt.model, s, prefix, window, stride, bias) for s in seqs]
        _REFERENCE_CACHE[key] = np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs])
    return _REFERENCE_CACHE[key]


def _assert_close(ours, reference, rel=1e-6):
    np.testing.assert_allclose(ours, reference, rtol=rel, atol=1e-9)


# --------------------------------------------------------------------------- NLL against the reference


@pytest.mark.slow
def test_prefix_policies_are_what_the_cases_claim(tiny):
    assert tiny("llama-bos")[2] == 128000           # <|begin_of_text|>
    assert tiny("neox-eos")[2] == 151643            # <|endoftext|> (qwen2 has no BOS)
    assert tiny("llama-none")[2] is None            # bert: neither BOS nor EOS


@pytest.mark.parametrize("batch_size, disjoint", fast_first([
    pytest.param(3, False, id="3-stride"), pytest.param(8, True, id="8-disjoint"),   # the fast lane's pair
    pytest.param(1, False, id="1-stride"), pytest.param(1, True, id="1-disjoint"),
    pytest.param(3, True, id="3-disjoint"), pytest.param(8, False, id="8-stride")], keep=2))
def test_llama_bos_matches_naive_reference(tiny, batch_size, disjoint):
    ckpt, seqs, prefix, _ = tiny("llama-bos")
    spec = ScoringSpec(max_context=32, disjoint=disjoint, batch_size=batch_size, device="cpu",
                       tcb_positions=0).resolve(ckpt.max_positions)
    out = score_token_sequences(ckpt.model, seqs, prefix, spec, with_tcb=False, progress=False)
    nll, ntok = _reference(ckpt, seqs, prefix, spec.window, spec.stride, None)
    assert max(len(s) for s in seqs) > 2 * spec.window         # documents longer than the window
    np.testing.assert_array_equal(out.doc_ntok, ntok)
    assert out.n_tokens == int(ntok.sum())
    assert out.doc_nll.dtype == np.float64
    _assert_close(out.doc_nll, nll)


@pytest.mark.parametrize("disjoint, case", fast_first([
    pytest.param(False, "neox-eos", id="stride-neox-eos"), pytest.param(True, "llama-none", id="disjoint-llama-none"),
    pytest.param(True, "neox-eos", id="disjoint-neox-eos"), pytest.param(False, "llama-none", id="stride-llama-none")],
    keep=2))
def test_other_architectures_and_prefix_policies(tiny, case, disjoint):
    ckpt, seqs, prefix, _ = tiny(case)
    spec = ScoringSpec(max_context=24, stride=None if disjoint else 9, disjoint=disjoint,
                       batch_size=3, device="cpu").resolve(ckpt.max_positions)
    out = score_token_sequences(ckpt.model, seqs, prefix, spec, with_tcb=False, progress=False)
    nll, ntok = _reference(ckpt, seqs, prefix, spec.window, spec.stride, None)
    expected_ntok = [max(0, len(s) - (0 if prefix is not None else 1)) for s in seqs]
    np.testing.assert_array_equal(out.doc_ntok, expected_ntok)
    np.testing.assert_array_equal(ntok, expected_ntok)
    _assert_close(out.doc_nll, nll)


@pytest.mark.slow
@pytest.mark.parametrize("case", ["neox-tied-bias", "llama-tied-bias"])
def test_lm_head_bias_and_tied_embeddings(tiny, case):
    ckpt, seqs, prefix, bias = tiny(case)
    assert ckpt.lm_head_bias and ckpt.tied_embeddings and bias is not None
    spec = ScoringSpec(max_context=32, batch_size=8, device="cpu").resolve(ckpt.max_positions)
    out = score_token_sequences(ckpt.model, seqs, prefix, spec, with_tcb=False, progress=False)
    nll, _ = _reference(ckpt, seqs, prefix, spec.window, spec.stride, bias)
    _assert_close(out.doc_nll, nll)
    # the bias matters: without it the answer moves well beyond the tolerance
    head = ckpt.model.get_output_embeddings()
    saved, head.bias = head.bias, None
    try:
        no_bias = score_token_sequences(ckpt.model, seqs, prefix, spec, with_tcb=False, progress=False)
    finally:
        head.bias = saved
    assert np.max(np.abs(no_bias.doc_nll - nll) / np.maximum(nll, 1e-9)) > 1e-3


@pytest.mark.slow
def test_loss_in_chunks_of_a_few_positions(tiny):
    """Chunks of 3 positions (and a budget below one vocabulary row, i.e. 1 position)
    give the same NLLs as one chunk per batch."""
    ckpt, seqs, prefix, _ = tiny("llama-bos")
    vocab = ckpt.vocab_size
    base = ScoringSpec(max_context=32, batch_size=4, device="cpu", logits_chunk=64 * 4 * vocab)
    whole = score_token_sequences(ckpt.model, seqs, prefix, base.resolve(64), with_tcb=False, progress=False)
    small = ScoringSpec(max_context=32, batch_size=4, device="cpu", logits_chunk=3 * vocab + 7)
    chunked = score_token_sequences(ckpt.model, seqs, prefix, small.resolve(64), with_tcb=False, progress=False)
    tiny_budget = ScoringSpec(max_context=32, batch_size=4, device="cpu", logits_chunk=vocab // 3)
    single = score_token_sequences(ckpt.model, seqs[:2], prefix, tiny_budget.resolve(64), with_tcb=False,
                                   progress=False)
    nll, _ = _reference(ckpt, seqs, prefix, 32, 16, None)
    _assert_close(single.doc_nll, nll[:2])
    _assert_close(chunked.doc_nll, nll)
    _assert_close(chunked.doc_nll, whole.doc_nll, rel=1e-7)


@pytest.mark.slow
def test_padding_and_batching_do_not_change_results(tiny):
    """A short document scored alone (no padding) and inside a batch of longer windows
    (right-padded) gives the same NLL; TCB samples do not depend on batching either."""
    ckpt, seqs, prefix, _ = tiny("llama-bos")
    short = [s for s in seqs if 3 <= len(s) <= 20][0]
    spec1 = ScoringSpec(max_context=32, batch_size=1, device="cpu", tcb_positions=20).resolve(64)
    spec8 = ScoringSpec(max_context=32, batch_size=8, device="cpu", tcb_positions=20).resolve(64)
    alone = score_token_sequences(ckpt.model, [short], prefix, spec1, progress=False)
    mixed_seqs = seqs[:5] + [short]
    mixed = score_token_sequences(ckpt.model, mixed_seqs, prefix, spec8, progress=False)
    _assert_close(mixed.doc_nll[-1:], alone.doc_nll)
    one_by_one = score_token_sequences(ckpt.model, mixed_seqs, prefix, spec1, progress=False)
    _assert_close(mixed.doc_nll, one_by_one.doc_nll)
    np.testing.assert_array_equal(mixed.tcb_index, one_by_one.tcb_index)
    np.testing.assert_allclose(mixed.tcb, one_by_one.tcb, rtol=1e-5)
    np.testing.assert_allclose(mixed.v_eff, one_by_one.v_eff, rtol=1e-5)
    assert len(mixed.tcb) == 20 and np.all(np.isfinite(mixed.tcb)) and np.all(mixed.margin >= 0)


@pytest.mark.slow
def test_tcb_sample_is_deterministic_and_within_scored_positions(tiny):
    ckpt, seqs, prefix, _ = tiny("llama-bos")
    spec = ScoringSpec(max_context=32, device="cpu", tcb_positions=12, tcb_seed=5).resolve(64)
    a = score_token_sequences(ckpt.model, seqs, prefix, spec, progress=False)
    b = score_token_sequences(ckpt.model, seqs, prefix, spec, progress=False)
    np.testing.assert_array_equal(a.tcb_index, b.tcb_index)
    np.testing.assert_array_equal(a.tcb, b.tcb)
    assert np.all(np.diff(a.tcb_index) > 0) and a.tcb_index[-1] < a.n_tokens
    other = score_token_sequences(ckpt.model, seqs, prefix,
                                  ScoringSpec(max_context=32, device="cpu", tcb_positions=12, tcb_seed=6).resolve(64),
                                  progress=False)
    assert not np.array_equal(a.tcb_index, other.tcb_index)
    assert a.tokens_per_s > 0 and a.wall_s > 0 and a.n_windows > len(seqs) - 3


@pytest.mark.slow
def test_bf16_cpu_path_is_opt_in_and_close_to_float32(tiny):
    ckpt32, seqs, prefix, _ = tiny("llama-bos")
    ckpt16 = load_checkpoint(str(ckpt32.model_dir), dtype="bfloat16", device="cpu")
    assert ckpt16.dtype == "bfloat16" and ckpt16.model.get_output_embeddings().weight.dtype == torch.bfloat16
    spec16 = ScoringSpec(max_context=32, dtype="bfloat16", device="cpu").resolve(64)
    out16 = score_token_sequences(ckpt16.model, seqs, prefix, spec16, with_tcb=True, progress=False)
    nll, _ = _reference(ckpt32, seqs, prefix, 32, 16, None)
    assert out16.doc_nll.dtype == np.float64
    np.testing.assert_allclose(out16.doc_nll, nll, rtol=3e-2)
    assert np.all(np.isfinite(out16.tcb))
    # a model loaded in one dtype is not scored under a spec that records another
    with pytest.raises(SpecError, match="loaded as float32 on cpu but the spec says bfloat16"):
        score_token_sequences(ckpt32.model, seqs, prefix, spec16, progress=False)


def test_progress_bar_reports_tokens_per_second(tiny, capsys):
    ckpt, seqs, prefix, _ = tiny("llama-bos")
    spec = ScoringSpec(max_context=32, device="cpu").resolve(64)
    out = score_token_sequences(ckpt.model, seqs[:3], prefix, spec, with_tcb=False, progress=True)
    err = capsys.readouterr().err
    assert "scoring" in err and "tok/s" in err and f"{out.n_tokens}/{out.n_tokens}" in err


def _tiny_family(family: str, vocab: int):
    """A tiny random model of a family whose logits are transformed after the matmul."""
    import transformers as tf

    common = dict(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    config = {
        "gemma2": lambda: tf.Gemma2Config(**common, head_dim=8, final_logit_softcapping=3.0),
        "granite": lambda: tf.GraniteConfig(**common, logits_scaling=4.0),
        "cohere": lambda: tf.CohereConfig(**common, logit_scale=0.37),
        "llama": lambda: tf.LlamaConfig(**common),
    }[family]()
    torch.manual_seed(11)
    model = tf.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():   # large logits, so the soft-cap and the scale really bite
        model.get_output_embeddings().weight.mul_(40.0)
    return model


@pytest.mark.parametrize("family", ["gemma2", "granite", "cohere", "llama"])
@pytest.mark.parametrize("chunk_rows", [1, 7, 1000])
def test_output_head_nll_equals_the_models_own_cross_entropy(family, chunk_rows):
    """The in-place, buffer-reusing head (scale, soft-cap, several chunks, calls of different
    lengths) against cross-entropy in float64 of the logits the model itself returns."""
    vocab = 301
    model = _tiny_family(family, vocab)
    body, head = decoder_body(model), OutputHead(model)
    for n in (23, 5, 40):       # later calls shorter and longer than the first: the buffer is reused and regrown
        ids = torch.randint(0, vocab, (1, n + 1), generator=torch.Generator().manual_seed(n))
        with torch.inference_mode():
            reference = F.cross_entropy(model(input_ids=ids[:, :-1]).logits[0].double(), ids[0, 1:],
                                        reduction="none")
            hidden = body(input_ids=ids[:, :-1]).last_hidden_state[0]
            ours = head.nll(hidden, ids[0, 1:], chunk_elements=chunk_rows * vocab)
        assert reference.abs().max() > 1.0
        torch.testing.assert_close(ours.double(), reference, rtol=1e-6, atol=1e-6)
