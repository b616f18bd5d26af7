"""L* and friends on hand-worked examples (monitor/scoring/metrics.py).

The toy corpus has three documents over a four-word vocabulary, tokenized by a real
word-level tokenizer built here, so every count below can be checked with pencil and paper.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from monitor.errors import SpecError
from monitor.scoring import metrics
from monitor.scoring.corpus import Corpus, Document, manifest_sha256, text_sha256
from monitor.scoring.metrics import (aggregate, bootstrap_se_ce, compute_baseline, get_or_compute_baseline,
                                     scored_token_counts, scored_token_counts_per_document, summarize,
                                     tcb_summary, unigram_ce, weighted_perplexity,
                                     weighted_perplexity_from_ppl)
from monitor.scoring.tokenizer import load_tokenizer

LN2 = math.log(2)

# doc id, slice, text ("a b a" is 5 UTF-8 bytes, the others 3)
TOY = [("d1", "x", "a b a"), ("d2", "y", "b c"), ("d3", "x", "a c")]
TOY_NLL = [2.0, 1.5, 1.2]          # a model's summed NLL per document, nats
TOY_BYTES = [5, 3, 3]


def word_tokenizer(folder: Path, config: dict) -> Path:
    """A real word-level tokenizer: [BOS]=0, a=1, b=2, c=3, [UNK]=4, split on whitespace."""
    folder.mkdir()
    tok = Tokenizer(models.WordLevel({"[BOS]": 0, "a": 1, "b": 2, "c": 3, "[UNK]": 4},
                                     unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return folder


def toy_corpus() -> Corpus:
    docs = tuple(Document(id=i, slice=s, source="toy", text=t, sha256=text_sha256(t)) for i, s, t in TOY)
    sha = manifest_sha256((d.id, d.sha256) for d in docs)
    return Corpus(name="toy", version="v1", path=Path("."), manifest_sha256=sha, sha256=sha,
                  selection="all", documents=docs)


@pytest.fixture()
def bos_handle(tmp_path: Path):
    return load_tokenizer(word_tokenizer(tmp_path / "bos", {"bos_token": "[BOS]"}))


@pytest.fixture()
def bare_handle(tmp_path: Path):
    return load_tokenizer(word_tokenizer(tmp_path / "bare", {}))


# -- unigram baseline -------------------------------------------------------------------------
def test_unigram_ce_small_cases() -> None:
    assert unigram_ce(np.array([0, 2, 2])) == pytest.approx(LN2, rel=1e-15)
    assert unigram_ce(np.array([5])) == 0.0
    assert math.isnan(unigram_ce(np.array([0, 0])))
    # -(1/4) [3 ln(3/4) + 1 ln(1/4)]
    assert unigram_ce(np.array([3, 1])) == pytest.approx(-(3 * math.log(0.75) + math.log(0.25)) / 4)


def test_toy_baseline_with_a_prefix_token(bos_handle) -> None:
    corpus = toy_corpus()
    assert (bos_handle.prefix_policy, bos_handle.prefix_token_id) == ("bos", 0)
    seqs = bos_handle.encode_documents(corpus)
    assert seqs == [[1, 2, 1], [2, 3], [1, 3]]
    # Every token is scored: a=3, b=2, c=2, N=7.
    assert scored_token_counts(seqs, "bos").tolist() == [0, 3, 2, 2]
    assert scored_token_counts_per_document(seqs, "bos").tolist() == [3, 2, 2]
    base = compute_baseline(bos_handle, corpus, seqs)
    ce_uni = (3 * math.log(7 / 3) + 2 * math.log(7 / 2) + 2 * math.log(7 / 2)) / 7
    assert ce_uni == pytest.approx(1.078992, abs=1e-6)
    assert base["n_tokens"] == 7
    assert base["ce_unigram"] == pytest.approx(ce_uni, rel=1e-14)
    assert base["doc_tokens"] == {"d1": 3, "d2": 2, "d3": 2}
    # Slice x = d1 + d3: a=3, b=1, c=1, N=5. Slice y = d2: b=1, c=1, N=2.
    assert base["slices"]["x"]["n_tokens"] == 5
    assert base["slices"]["x"]["ce_unigram"] == pytest.approx((3 * math.log(5 / 3) + 2 * math.log(5)) / 5)
    assert base["slices"]["y"] == {"n_tokens": 2, "ce_unigram": pytest.approx(LN2)}


def test_toy_baseline_without_a_prefix_token(bare_handle) -> None:
    corpus = toy_corpus()
    assert (bare_handle.prefix_policy, bare_handle.prefix_token_id) == ("none", None)
    seqs = bare_handle.encode_documents(corpus)
    # First token of each document unscored: "b a", "c", "c" -> a=1, b=1, c=2, N=4.
    assert scored_token_counts(seqs, "none").tolist() == [0, 1, 1, 2]
    assert scored_token_counts_per_document(seqs + [[]], "none").tolist() == [2, 1, 1, 0]
    base = compute_baseline(bare_handle, corpus, seqs)
    assert base["n_tokens"] == 4
    assert base["doc_tokens"] == {"d1": 2, "d2": 1, "d3": 1}
    # -(1/4)[ln(1/4) + ln(1/4) + 2 ln(2/4)] = (2 ln 4 + 2 ln 2)/4 = 1.5 ln 2
    assert base["ce_unigram"] == pytest.approx(1.5 * LN2, rel=1e-14)
    assert base["slices"]["x"] == {"n_tokens": 3, "ce_unigram": pytest.approx(
        -(math.log(1 / 3) * 2 + math.log(1 / 3)) / 3)}    # "b a" and "c": three singletons: ln 3
    assert base["slices"]["y"] == {"n_tokens": 1, "ce_unigram": 0.0}
    summary = summarize([1.0, 0.5, 0.7], [2, 1, 1], TOY_BYTES, ["x", "y", "x"], base, n_boot=50)
    assert summary["n_tokens"] == 4 and summary["ce"] == pytest.approx(2.2 / 4)
    assert summary["lstar"] == pytest.approx(2.2 / 4 - 1.5 * LN2)
    # Slice y scores a single token, so its unigram CE is 0 and the ratios are undefined.
    assert summary["slices"]["y"]["lstar"] == pytest.approx(0.5)
    assert summary["slices"]["y"]["l_rel"] is None and summary["slices"]["y"]["l_gain"] is None


# -- aggregates ------------------------------------------------------------------------------
def test_toy_aggregates_by_hand(bos_handle) -> None:
    corpus = toy_corpus()
    base = compute_baseline(bos_handle, corpus, bos_handle.encode_documents(corpus))
    ref_tokens = [4, 2, 2]   # a reference tokenizer's scored tokens on the same documents
    out = summarize(TOY_NLL, [3, 2, 2], TOY_BYTES, ["x", "y", "x"], base,
                    reference_doc_tokens=ref_tokens, n_boot=200, seed=3)
    ce_uni = (3 * math.log(7 / 3) + 4 * math.log(7 / 2)) / 7      # 1.078992
    ce = 4.7 / 7                                                  # 0.671429
    assert out["ce"] == pytest.approx(0.671429, abs=1e-6) and out["ce"] == pytest.approx(ce)
    assert out["ce_unigram"] == pytest.approx(ce_uni)
    assert out["lstar"] == pytest.approx(ce - ce_uni) and out["lstar"] == pytest.approx(-0.407563, abs=1e-6)
    assert out["l_rel"] == pytest.approx(ce / ce_uni) and out["l_rel"] == pytest.approx(0.622274, abs=1e-6)
    assert out["l_gain"] == pytest.approx((ce_uni - ce) / ce_uni)
    assert out["l_gain"] == pytest.approx(1 - out["l_rel"])
    assert out["bits_per_byte"] == pytest.approx(4.7 / 11 / LN2)     # 0.616424
    assert out["bits_per_byte"] == pytest.approx(0.616424, abs=1e-6)
    assert out["tokens_per_byte"] == pytest.approx(7 / 11)
    assert (out["n_tokens"], out["n_bytes"], out["n_documents"]) == (7, 11, 3)
    assert out["nll_sum"] == pytest.approx(4.7)
    assert out["weighted_ppl"] == pytest.approx(math.exp(4.7 / 8))
    assert out["se_lstar"] == out["se_ce"] == bootstrap_se_ce(TOY_NLL, [3, 2, 2], 200, 3)

    x, y = out["slices"]["x"], out["slices"]["y"]
    ce_x, ce_uni_x = 3.2 / 5, (3 * math.log(5 / 3) + 2 * math.log(5)) / 5
    assert x["ce"] == pytest.approx(ce_x) and x["ce_unigram"] == pytest.approx(ce_uni_x)
    assert x["lstar"] == pytest.approx(ce_x - ce_uni_x)
    assert x["l_rel"] == pytest.approx(ce_x / ce_uni_x)
    assert x["bits_per_byte"] == pytest.approx(3.2 / 8 / LN2)
    assert x["weighted_ppl"] == pytest.approx(math.exp(3.2 / 6))
    assert (x["n_tokens"], x["n_bytes"]) == (5, 8)
    assert y["ce"] == pytest.approx(0.75) and y["ce_unigram"] == pytest.approx(LN2)
    assert y["l_gain"] == pytest.approx((LN2 - 0.75) / LN2)
    assert y["se_ce"] == 0.0                                          # one document


def test_scored_tokens_must_agree_with_the_baseline(bos_handle) -> None:
    corpus = toy_corpus()
    base = compute_baseline(bos_handle, corpus, bos_handle.encode_documents(corpus))
    with pytest.raises(SpecError, match=r"the corpus: 8 scored tokens, but its unigram baseline counts 7"):
        summarize(TOY_NLL, [4, 2, 2], TOY_BYTES, ["x", "y", "x"], base)
    with pytest.raises(SpecError, match=r"slice 'x': 6 scored tokens"):
        summarize(TOY_NLL, [4, 1, 2], TOY_BYTES, ["x", "y", "x"], base)


@pytest.mark.parametrize("ppl, n_tokens, n_ref, published", [
    (10.801, 294_912, 288_768, 11.362),   # Gemma 3 1B (Weighted Perplexity Benchmark)
    (4.104, 328_704, 288_768, 4.989),     # Mixtral 8x7B, same reference count
])
def test_weighted_perplexity_reproduces_the_published_rows(ppl, n_tokens, n_ref, published) -> None:
    assert round(ppl ** (n_tokens / n_ref), 3) == published                 # the definition
    assert round(weighted_perplexity_from_ppl(ppl, n_tokens, n_ref), 3) == published
    assert round(weighted_perplexity(math.log(ppl) * n_tokens, n_ref), 3) == published
    with pytest.raises(SpecError):
        weighted_perplexity(1.0, 0)


# -- bootstrap ---------------------------------------------------------------------------------
def synthetic_documents(n: int = 300, seed: int = 11) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    ntok = rng.integers(50, 1500, size=n)
    nll = ntok * rng.normal(3.0, 0.4, size=n)
    return nll, ntok


def test_bootstrap_equals_a_naive_loop_with_the_same_indices() -> None:
    nll, ntok = synthetic_documents(n=40)
    rng = np.random.default_rng(7)
    indices = rng.integers(0, len(nll), size=(1000, len(nll)))
    ratios = []
    for row in indices:
        total_nll, total_tok = 0.0, 0
        for i in row:
            total_nll += float(nll[i])
            total_tok += int(ntok[i])
        ratios.append(total_nll / total_tok)
    assert bootstrap_se_ce(nll, ntok, n_boot=1000, seed=7) == pytest.approx(statistics.stdev(ratios),
                                                                              rel=1e-10)
    assert bootstrap_se_ce(nll, ntok, n_boot=1000, seed=8) != bootstrap_se_ce(nll, ntok, 1000, 7)


def test_bootstrap_in_blocks_draws_the_same_resamples(monkeypatch) -> None:
    nll, ntok = synthetic_documents(n=50)
    whole = bootstrap_se_ce(nll, ntok, n_boot=1000, seed=1)
    monkeypatch.setattr(metrics, "_BOOTSTRAP_MAX_CELLS", 50 * 7)      # blocks of 7 resamples
    assert bootstrap_se_ce(nll, ntok, n_boot=1000, seed=1) == pytest.approx(whole, rel=1e-12)


def test_bootstrap_agrees_with_the_delta_method() -> None:
    nll, ntok = synthetic_documents()
    ratio = nll.sum() / ntok.sum()
    # Linearised ratio estimator: SE^2 = Σ (nll_i - R n_i)^2 / (Σ n_i)^2
    delta_se = math.sqrt(float(((nll - ratio * ntok) ** 2).sum())) / float(ntok.sum())
    boot_se = bootstrap_se_ce(nll, ntok, n_boot=4000, seed=0)
    assert boot_se == pytest.approx(delta_se, rel=0.06)


def test_bootstrap_edge_cases() -> None:
    assert bootstrap_se_ce([3.0], [2], n_boot=100) == 0.0
    with pytest.raises(SpecError):
        bootstrap_se_ce([], [], n_boot=100)
    with pytest.raises(SpecError):
        bootstrap_se_ce([1.0, 2.0], [1, 2], n_boot=1)
    # Documents with no scored token only make some resamples undefined; those are skipped.
    assert bootstrap_se_ce([0.0, 0.0, 6.0], [0, 0, 2], n_boot=500) == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(SpecError, match="nothing was scored"):
        aggregate([0.0], [0], [3], 1.0)


# -- cache ---------------------------------------------------------------------------------------
def test_get_or_compute_without_a_store_computes(bos_handle) -> None:
    corpus = toy_corpus()
    base = get_or_compute_baseline(None, bos_handle, corpus)      # tokenizes itself
    assert base["n_tokens"] == 7 and base["doc_tokens"] == {"d1": 3, "d2": 2, "d3": 2}


# -- TCB summary -------------------------------------------------------------------------------------
def test_tcb_summary_by_hand() -> None:
    out = tcb_summary(np.array([4.0, 1.0, 3.0, 2.0, 10.0]), [2.0, 4.0, 6.0, 8.0, 10.0],
                      np.array([0.5, 1.5, 1.0, 1.0, 1.0]))
    # sorted 1, 2, 3, 4, 10: mean 4, median 3, p10 at rank 0.1 * 4 = 0.4 -> 1 + 0.4 * (2 - 1)
    assert out == {"mean": 4.0, "median": 3.0, "p10": pytest.approx(1.4), "v_eff_mean": 6.0,
                   "margin_mean": 1.0, "n_positions": 5}
    empty = {"mean": None, "median": None, "p10": None, "v_eff_mean": None, "margin_mean": None,
             "n_positions": 0}
    assert tcb_summary(np.array([]), np.array([]), np.array([])) == empty
    assert tcb_summary(None, None, None) == empty
