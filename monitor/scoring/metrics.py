"""The numbers of scoring spec `lstar-score/1`: unigram baseline, L* and its variants,
bits per byte, weighted perplexity, bootstrap standard errors, and the TCB summary.

Scored tokens are every document token when the tokenizer has a prefix token (BOS or EOS);
with prefix policy "none" the first token of each document has no context and is not
scored. The unigram baseline counts exactly the scored tokens, so N agrees on both sides.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from monitor.errors import CorpusError, SpecError

# Bootstrap index matrices are drawn in blocks of at most this many cells to bound memory.
_BOOTSTRAP_MAX_CELLS = 4_000_000


def scored_token_counts_per_document(token_seqs: Sequence[Sequence[int]],
                                     prefix_policy: str) -> np.ndarray:
    """Scored tokens per document: all of them, or all but the first under policy "none"."""
    lengths = np.fromiter((len(s) for s in token_seqs), dtype=np.int64, count=len(token_seqs))
    return np.maximum(lengths - 1, 0) if prefix_policy == "none" else lengths


def scored_token_counts(token_seqs: Sequence[Sequence[int]], prefix_policy: str,
                        minlength: int = 0) -> np.ndarray:
    """Count of each token id over the scored tokens (index = token id), as int64."""
    skip = 1 if prefix_policy == "none" else 0
    parts = [np.asarray(s[skip:], dtype=np.int64) for s in token_seqs if len(s) > skip]
    ids = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    return np.bincount(ids, minlength=minlength).astype(np.int64)


def unigram_ce(counts: np.ndarray) -> float:
    """Cross-entropy (nats/token) of the ML unigram model on its own counts:
    -(1/N) Σ c log(c/N) over c > 0, in float64. NaN when N = 0."""
    c = np.asarray(counts, dtype=np.float64)
    c = c[c > 0]
    n = c.sum()
    if n == 0:
        return float("nan")
    return float(-(c * (np.log(c) - math.log(n))).sum() / n)


def compute_baseline(handle: Any, corpus: Any, token_seqs: Sequence[Sequence[int]]) -> dict[str, Any]:
    """The unigram baseline of `corpus` under `handle`'s tokenizer and prefix policy.

    Returns `{n_tokens, ce_unigram, slices: {name: {n_tokens, ce_unigram}}, doc_tokens:
    {doc_id: scored tokens}}`; each slice's CE_uni is that slice's own ML unigram model.
    """
    documents = corpus.documents
    if len(token_seqs) != len(documents):
        raise CorpusError(f"{len(token_seqs)} token sequences for {len(documents)} documents of "
                          f"{corpus.name} {corpus.version}")
    policy = handle.prefix_policy
    lengths = scored_token_counts_per_document(token_seqs, policy)
    slices: dict[str, dict[str, Any]] = {}
    for name in dict.fromkeys(d.slice for d in documents):
        seqs = [s for s, d in zip(token_seqs, documents) if d.slice == name]
        slices[name] = _baseline_part(seqs, policy, f"slice {name!r}", corpus)
    overall = _baseline_part(token_seqs, policy, "the selection", corpus)
    return {**overall, "slices": slices,
            "doc_tokens": {d.id: int(n) for d, n in zip(documents, lengths)}}


def _baseline_part(seqs: Sequence[Sequence[int]], policy: str, what: str, corpus: Any) -> dict[str, Any]:
    counts = scored_token_counts(seqs, policy)
    n = int(counts.sum())
    if n == 0:
        raise CorpusError(f"{what} of corpus {corpus.name} {corpus.version} has no scored tokens",
                          hint="select more documents")
    return {"n_tokens": n, "ce_unigram": unigram_ce(counts)}


def get_or_compute_baseline(store: Any, handle: Any, corpus: Any,
                            token_seqs: Sequence[Sequence[int]] | None = None) -> dict[str, Any]:
    """The baseline for (tokenizer fingerprint, corpus sha256): from `store` when cached,
    else computed (tokenizing the corpus if `token_seqs` is None) and cached there.
    `store=None` always computes."""
    if store is not None:
        cached = store.get_baseline(handle.fingerprint, corpus.sha256)
        if cached is not None:
            return cached
    if token_seqs is None:
        token_seqs = handle.encode_documents(corpus)
    baseline = compute_baseline(handle, corpus, token_seqs)
    if store is not None:
        store.put_baseline(handle.fingerprint, corpus.sha256, baseline)
    return baseline


# -- aggregates ------------------------------------------------------------------------------
def weighted_perplexity(nll_sum: float, n_ref_tokens: int) -> float:
    """Perplexity normalised by a reference tokenizer's token count: exp(Σ nll / N_R)."""
    if n_ref_tokens <= 0:
        raise SpecError(f"reference token count must be positive (got {n_ref_tokens})")
    return math.exp(nll_sum / n_ref_tokens)


def weighted_perplexity_from_ppl(ppl: float, n_tokens: int, n_ref_tokens: int) -> float:
    """The same from a published perplexity over `n_tokens`: ppl ** (n_tokens / N_R)."""
    return weighted_perplexity(math.log(ppl) * n_tokens, n_ref_tokens)


def _bootstrap_ratio_sds(doc_nll: np.ndarray, numerators: Sequence[np.ndarray], denominators: Sequence[np.ndarray],
                         n_boot: int, seed: int) -> list[float]:
    """Sample standard deviations (ddof=1) of the ratios Σnum*/Σden* over ONE seeded set of
    document resamples: resample b draws n document indices with replacement (rows of
    `numpy.random.default_rng(seed).integers(0, n, size=(n_boot, n))`, drawn in blocks of rows
    for large corpora), and every ratio is taken on those same indices. A resample whose
    denominator is 0 (no scored token) gives no ratio. One document gives 0."""
    n = len(doc_nll)
    if n == 0 or any(len(a) != n for a in (*numerators, *denominators)):
        raise SpecError(f"bootstrap needs equal, non-empty per-document arrays "
                        f"(got {n} NLLs and lengths {sorted({len(a) for a in (*numerators, *denominators)})})")
    if n_boot < 2:
        raise SpecError(f"bootstrap needs at least 2 resamples (got {n_boot})")
    if n == 1:
        return [0.0] * len(numerators)
    rng = np.random.default_rng(seed)
    rows_per_block = max(1, _BOOTSTRAP_MAX_CELLS // n)
    ratios = np.empty((len(numerators), n_boot), dtype=np.float64)
    for start in range(0, n_boot, rows_per_block):
        rows = min(rows_per_block, n_boot - start)
        idx = rng.integers(0, n, size=(rows, n))          # [rows, n] document indices
        for k, (num, den) in enumerate(zip(numerators, denominators)):
            with np.errstate(invalid="ignore", divide="ignore"):
                ratios[k, start:start + rows] = num[idx].sum(axis=1) / den[idx].sum(axis=1)
    out = []
    for row in ratios:
        row = row[np.isfinite(row)]                       # a resample with no scored token
        out.append(float(row.std(ddof=1)) if len(row) > 1 else 0.0)
    return out


def bootstrap_se_ce(doc_nll: Sequence[float], doc_ntok: Sequence[int], n_boot: int = 1000,
                    seed: int = 0) -> float:
    """Standard error of CE = Σnll/Σn by a seeded bootstrap over documents.

    Each resample draws n document indices with replacement (rows of
    `numpy.random.default_rng(seed).integers(0, n, size=(n_boot, n))`, drawn in blocks of
    rows for large corpora) and takes the ratio Σnll*/Σn*; the SE is the sample standard
    deviation (ddof=1) of those ratios. One document gives 0.
    """
    nll = np.asarray(doc_nll, dtype=np.float64)
    ntok = np.asarray(doc_ntok, dtype=np.float64)
    if len(nll) == 0 or len(ntok) != len(nll):
        raise SpecError(f"bootstrap needs equal, non-empty per-document arrays "
                        f"(got {len(nll)} NLLs and {len(ntok)} token counts)")
    return _bootstrap_ratio_sds(nll, [nll], [ntok], n_boot, seed)[0]


def bootstrap_axis_se(doc_nll: Sequence[float], doc_ntok: Sequence[int], doc_bytes: Sequence[int],
                      ce_unigram: float, n_boot: int = 1000, seed: int = 0) -> dict[str, float | None]:
    """The standard error of every score axis from ONE seeded bootstrap over documents (the
    resamples of `bootstrap_se_ce`, so `se_ce` here equals it), with CE_uni held fixed as a
    property of the tokenizer and corpus (docs/measurement.md §1, §2a):

    - se_ce (and so L* and raw CE): ratio Σnll*/Σn*;
    - se_bits_per_byte: ratio Σnll*/Σbytes* / ln 2;
    - se_lstar_per_byte: ratio Σ(nll − CE_uni·n)*/Σbytes* / ln 2 (L* · tokens/byte / ln 2);
    - se_l_rel, se_l_gain: SE(CE) / CE_uni (None when CE_uni is 0).
    """
    nll = np.asarray(doc_nll, dtype=np.float64)
    ntok = np.asarray(doc_ntok, dtype=np.float64)
    nbytes = np.asarray(doc_bytes, dtype=np.float64)
    se_ce, sd_bpb, sd_lpb = _bootstrap_ratio_sds(
        nll, [nll, nll, nll - float(ce_unigram) * ntok], [ntok, nbytes, nbytes], n_boot, seed)
    rel = se_ce / ce_unigram if ce_unigram > 0 else None
    return {"se_ce": se_ce, "se_lstar": se_ce, "se_bits_per_byte": sd_bpb / math.log(2),
            "se_lstar_per_byte": sd_lpb / math.log(2), "se_l_rel": rel, "se_l_gain": rel}


def aggregate(doc_nll: Sequence[float], doc_ntok: Sequence[int], doc_bytes: Sequence[int],
              ce_unigram: float, *, reference_tokens: int | None = None, n_boot: int = 1000,
              seed: int = 0) -> dict[str, Any]:
    """CE, L* and variants, bits/byte, L* per byte, tokens/byte and every axis's SE over a set
    of documents (`bootstrap_axis_se`).

    `ce_unigram` is the baseline of the same documents; `reference_tokens` (N_R, the
    reference tokenizer's scored tokens on them) adds `weighted_ppl`. `l_rel` and `l_gain`
    are None when `ce_unigram` is 0.
    """
    nll = np.asarray(doc_nll, dtype=np.float64)
    ntok = np.asarray(doc_ntok, dtype=np.int64)
    nbytes = np.asarray(doc_bytes, dtype=np.int64)
    nll_sum, n_tokens, n_bytes = float(nll.sum()), int(ntok.sum()), int(nbytes.sum())
    if n_tokens <= 0 or n_bytes <= 0:
        raise SpecError(f"nothing was scored ({n_tokens} tokens, {n_bytes} bytes)")
    ce = nll_sum / n_tokens
    ses = bootstrap_axis_se(nll, ntok, nbytes, ce_unigram, n_boot, seed)
    # CE_uni is 0 only when the documents repeat a single token; the ratios are then undefined.
    result = {
        "ce": ce, "ce_unigram": float(ce_unigram), "lstar": ce - ce_unigram,
        "l_rel": ce / ce_unigram if ce_unigram > 0 else None,
        "l_gain": (ce_unigram - ce) / ce_unigram if ce_unigram > 0 else None,
        "bits_per_byte": nll_sum / n_bytes / math.log(2), "tokens_per_byte": n_tokens / n_bytes,
        # L* in bits per byte: bits/byte minus the unigram model's bits/byte
        "lstar_per_byte": (ce - ce_unigram) * n_tokens / n_bytes / math.log(2),
        "n_tokens": n_tokens, "n_bytes": n_bytes, "n_documents": len(nll), "nll_sum": nll_sum,
        **ses,  # CE_uni is a constant of the tokenizer and corpus: SE(L*) = SE(CE)
    }
    if reference_tokens is not None:
        result["weighted_ppl"] = weighted_perplexity(nll_sum, int(reference_tokens))
    return result


def summarize(doc_nll: Sequence[float], doc_ntok: Sequence[int], doc_bytes: Sequence[int],
              doc_slices: Sequence[str], baseline: Mapping[str, Any], *,
              reference_doc_tokens: Sequence[int] | None = None, n_boot: int = 1000,
              seed: int = 0) -> dict[str, Any]:
    """Overall `aggregate` keys plus `"slices": {name: the same keys}`.

    The per-document arrays are in corpus order; `baseline` is `compute_baseline`'s result for
    the same documents (its scored-token counts must agree with `doc_ntok`);
    `reference_doc_tokens` are the reference tokenizer's scored tokens per document.
    """
    nll = np.asarray(doc_nll, dtype=np.float64)
    ntok = np.asarray(doc_ntok, dtype=np.int64)
    nbytes = np.asarray(doc_bytes, dtype=np.int64)
    slices_of = np.asarray(list(doc_slices), dtype=object)
    ref = None if reference_doc_tokens is None else np.asarray(reference_doc_tokens, dtype=np.int64)
    sizes = {len(nll), len(ntok), len(nbytes), len(slices_of)} | ({len(ref)} if ref is not None else set())
    if len(sizes) != 1:
        raise SpecError(f"per-document arrays differ in length ({sorted(sizes)})")
    _check_against_baseline("the corpus", int(ntok.sum()), baseline["n_tokens"])
    result = aggregate(nll, ntok, nbytes, baseline["ce_unigram"],
                       reference_tokens=None if ref is None else int(ref.sum()),
                       n_boot=n_boot, seed=seed)
    result["slices"] = {}
    for name in dict.fromkeys(slices_of.tolist()):
        mask = slices_of == name
        part = baseline["slices"].get(name)
        if part is None:
            raise SpecError(f"slice {name!r} is not in the baseline")
        _check_against_baseline(f"slice {name!r}", int(ntok[mask].sum()), part["n_tokens"])
        result["slices"][name] = aggregate(
            nll[mask], ntok[mask], nbytes[mask], part["ce_unigram"],
            reference_tokens=None if ref is None else int(ref[mask].sum()), n_boot=n_boot, seed=seed)
    return result


def _check_against_baseline(what: str, scored: int, baseline_tokens: int) -> None:
    if scored != int(baseline_tokens):
        raise SpecError(f"{what}: {scored} scored tokens, but its unigram baseline counts "
                        f"{baseline_tokens}", hint="score and baseline must use the same tokenizer, "
                        "prefix policy and documents")


def tcb_summary(tcb: Any, v_eff: Any, margin: Any) -> dict[str, Any]:
    """Mean, median and 10th percentile of δ_TCB, mean V_eff and mean top-2 logit margin.

    Empty or missing input gives None values and `n_positions` 0.
    """
    values = _as_float64(tcb)
    if values.size == 0:
        return {"mean": None, "median": None, "p10": None, "v_eff_mean": None,
                "margin_mean": None, "n_positions": 0}
    v_eff_values, margin_values = _as_float64(v_eff), _as_float64(margin)
    return {"mean": float(values.mean()), "median": float(np.median(values)),
            "p10": float(np.percentile(values, 10)),
            "v_eff_mean": float(v_eff_values.mean()) if v_eff_values.size else None,
            "margin_mean": float(margin_values.mean()) if margin_values.size else None,
            "n_positions": int(values.size)}


def _as_float64(values: Any) -> np.ndarray:
    """A flat float64 array from None, a sequence, a numpy array or a (CPU or GPU) tensor."""
    if values is None:
        return np.zeros(0, dtype=np.float64)
    if hasattr(values, "detach"):  # a torch tensor, without importing torch here
        values = values.detach().float().cpu().numpy()
    return np.asarray(values, dtype=np.float64).ravel()
