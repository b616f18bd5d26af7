"""Tokenization stress test (the L* paper §9): is L* a property of the model, or of its tokenizer?

For each checkpoint the primary corpus is scored under its canonical segmentation ("base")
and under perturbed ones (`monitor.stress.segmentation`):

- `whitespace-collapsed`: runs of spaces and tabs collapsed to one space. This changes the
  bytes: the scored text is the normalised one (`n_bytes` says how many). Skipped, with a note,
  where the tokenizer's own normaliser already makes it a no-op.
- `bpe-dropout-<p>`: seeded BPE-dropout at each rate; the bytes are fixed, the tokens are not.
  CE_uni is re-estimated on the token distribution the dropout induces (the ML unigram of the
  dropout segmentations' scored tokens), so L* compares like with like.
- `pruned-merges-<k>%`: the last k% of merges and the tokens they create removed; the bytes
  are fixed; ids map through the original vocabulary, so the model's rows for kept tokens are
  used. The softmax still spans the whole vocabulary (the mass on pruned tokens is not
  renormalised away): CE is an upper bound on what a pruned-vocabulary head would give.

Each variant reports CE, CE_uni and L* = CE − CE_uni (nats/token) and its token and byte
counts. Across checkpoints each perturbed variant is fitted as L*_perturbed ≈ α·L* + β
(least squares, the paper's diagnostic) with the residual variance Σr²/(n − 2). Per-token
NLLs come from the scoring path (`monitor.scoring.forward.score_token_sequences`), the
unigram from `monitor.scoring.metrics`: no second scorer.
"""

from __future__ import annotations

import gc
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from monitor.errors import SpecError, TokenizerError
from monitor.stress.subject import StressCheckpoint, StressOptions, StressSubject

DEFAULT_PRUNE_FRACTION = 0.10
BASE = "base"


@dataclass
class Variant:
    """One segmentation of the corpus, ready to score."""

    name: str
    token_seqs: list[list[int]]
    n_bytes: int
    note: str | None = None


# -- numbers ---------------------------------------------------------------------------------
def variant_numbers(doc_nll: Sequence[float], token_seqs: Sequence[Sequence[int]],
                    prefix_policy: str) -> dict[str, Any]:
    """CE (mean NLL per scored token), CE_uni (the ML unigram of those same scored tokens)
    and L* of one scored segmentation."""
    from monitor.scoring.metrics import scored_token_counts, unigram_ce

    counts = scored_token_counts(token_seqs, prefix_policy)
    n_tokens = int(counts.sum())
    if n_tokens == 0:
        raise SpecError("a segmentation has no scored tokens", hint="select more documents")
    ce = float(np.sum(np.asarray(doc_nll, dtype=np.float64))) / n_tokens
    ce_uni = unigram_ce(counts)
    return {"ce": ce, "ce_uni": ce_uni, "lstar": ce - ce_uni, "n_tokens": n_tokens}


def fit_alpha_beta(lstar: Sequence[float], perturbed: Sequence[float]) -> dict[str, Any]:
    """Least-squares α, β of perturbed ≈ α·lstar + β, with the residual variance Σr²/(n − 2)
    (None for n = 2, where the line passes through both points). Needs n ≥ 2 distinct L*."""
    x = np.asarray(lstar, dtype=np.float64)
    y = np.asarray(perturbed, dtype=np.float64)
    n = len(x)
    if n < 2 or len(y) != n or float(np.ptp(x)) == 0.0:
        raise SpecError(f"an α/β fit needs at least two checkpoints with different L* (got {n})",
                        hint="stress a lineage of three or more checkpoints")
    design = np.column_stack([x, np.ones(n)])
    (alpha, beta), *_ = np.linalg.lstsq(design, y, rcond=None)
    residuals = y - (alpha * x + beta)
    variance = float(residuals @ residuals) / (n - 2) if n > 2 else None
    return {"alpha": float(alpha), "beta": float(beta), "residual_variance": variance, "n": n}


# -- the perturbed segmentations --------------------------------------------------------------
def build_variants(handle: Any, texts: Sequence[str], options: StressOptions) -> tuple[list[Variant], list[str]]:
    """The base segmentation and every perturbation this tokenizer allows, plus notes on what
    was skipped and why."""
    from monitor.stress.segmentation import (BpeReplay, collapse_whitespace, dropout_segmentations, encode_with,
                                             pruned_tokenizer)

    n_bytes = sum(len(t.encode("utf-8")) for t in texts)
    base = handle.encode_documents(list(texts))
    variants = [Variant(BASE, base, n_bytes)]
    notes: list[str] = []

    collapsed = [collapse_whitespace(t) for t in texts]
    collapsed_ids = handle.encode_documents(collapsed)
    if collapsed == list(texts):
        notes.append("whitespace-collapsed skipped: the selected documents have no run of spaces or tabs")
    elif collapsed_ids == base:
        notes.append("whitespace-collapsed skipped: the tokenizer's normaliser already collapses whitespace")
    else:
        variants.append(Variant("whitespace-collapsed", collapsed_ids,
                                sum(len(t.encode("utf-8")) for t in collapsed),
                                note="scored bytes are the normalised text (spaces/tabs runs → one space)"))

    try:
        replay = BpeReplay.of(handle) if options.dropout_rates else None   # one for every rate
        for rate in options.dropout_rates:
            seqs, info = dropout_segmentations(handle, texts, float(rate), options.seed, replay)
            if not info["reproduces_library"]:
                notes.append(f"bpe-dropout-{rate:g} not reported: the merge replay at rate 0 does not "
                             "reproduce the library's segmentation on this corpus")
                continue
            variants.append(Variant(f"bpe-dropout-{rate:g}", seqs, n_bytes,
                                    note=f"seed {options.seed}; pre-tokens left as cut: {info['words_kept']}"))
        fraction = float(options.extra.get("prune_fraction", DEFAULT_PRUNE_FRACTION))
        tokenizer, info = pruned_tokenizer(handle, fraction)
        variants.append(Variant(f"pruned-merges-{fraction * 100:g}%", encode_with(tokenizer, texts), n_bytes,
                                note=f"{info['merges_dropped']} merges and {info['tokens_dropped']} tokens "
                                     "dropped; softmax not renormalised over kept tokens"))
    except TokenizerError as exc:
        notes.append(f"BPE perturbations skipped: {exc.message}")
    return variants, notes


# -- the test ---------------------------------------------------------------------------------
def _checkpoint_tokenizer_dir(checkpoint: StressCheckpoint, model_dir: Path) -> Path:
    return checkpoint.tokenizer_dir if checkpoint.tokenizer_dir is not None else model_dir


def score_variants(model: Any, resolved: Any, handle: Any, variants: Sequence[Variant],
                   model_vocab: int) -> list[dict[str, Any]]:
    """Each variant scored by the scoring path: its numbers and byte count."""
    from monitor.scoring.forward import score_token_sequences

    rows = []
    for variant in variants:
        top = max((max(s) for s in variant.token_seqs if s), default=-1)
        if top >= model_vocab:
            raise TokenizerError(f"{handle.source}: variant {variant.name} produces id {top}, beyond the "
                                 f"model's {model_vocab} rows", hint="pair the model with its own tokenizer")
        out = score_token_sequences(model, variant.token_seqs, handle.prefix_token_id, resolved,
                                    with_tcb=False, progress=False)
        row = {"name": variant.name, **variant_numbers(out.doc_nll, variant.token_seqs, handle.prefix_policy),
               "n_bytes": variant.n_bytes}
        if variant.note:
            row["note"] = variant.note
        rows.append(row)
    return rows


def tokenization_stress(subject: StressSubject, options: StressOptions) -> dict[str, Any]:
    """The `tokenization` section for every checkpoint of `subject` (shape in
    `monitor.stress.subject`'s contract)."""
    from monitor.scoring.corpus import load_corpus
    from monitor.scoring.engine import resolve_model_ref
    from monitor.scoring.forward import ScoringSpec
    from monitor.scoring.loader import load_checkpoint
    from monitor.scoring.tokenizer import load_tokenizer

    corpus = load_corpus(subject.corpus)
    if options.max_documents is not None:
        corpus = corpus.select(first=min(options.max_documents, len(corpus.documents)))
    texts = [d.text for d in corpus.documents]
    spec = ScoringSpec(max_context=options.extra.get("max_context"), dtype=options.extra.get("dtype", "auto"),
                       device=options.extra.get("device", "auto"), batch_size=int(options.extra.get("batch_size", 8)),
                       tcb_positions=0)
    spec.validate()
    variants_by_tokenizer: dict[str, tuple[list[Variant], list[str]]] = {}
    notes: list[str] = []
    checkpoints = []
    for checkpoint in subject.checkpoints:
        loaded = load_checkpoint(resolve_model_ref(checkpoint.ref), dtype=spec.dtype, device=spec.device)
        handle = load_tokenizer(_checkpoint_tokenizer_dir(checkpoint, loaded.model_dir))
        if handle.fingerprint not in variants_by_tokenizer:   # a lineage shares one tokenizer
            variants_by_tokenizer[handle.fingerprint] = build_variants(handle, texts, options)
            notes.extend(n for n in variants_by_tokenizer[handle.fingerprint][1] if n not in notes)
        variants = variants_by_tokenizer[handle.fingerprint][0]
        rows = score_variants(loaded.model, spec.resolve(loaded.max_positions), handle, variants,
                              loaded.vocab_size)
        entry = {"label": checkpoint.label, "ref": checkpoint.ref, "tokenizer": handle.source,
                 "variants": rows}
        if checkpoint.note:
            entry["note"] = checkpoint.note
        checkpoints.append(entry)
        del loaded
        gc.collect()
    return {"test": "tokenization", "corpus": {"path": str(subject.corpus), "sha256": corpus.sha256,
                                               "n_documents": len(texts), "selection": corpus.selection},
            "checkpoints": checkpoints, "fits": _fits(checkpoints, notes), "notes": notes}


def _fits(checkpoints: list[dict[str, Any]], notes: list[str]) -> list[dict[str, Any]]:
    """α/β of every perturbed variant present at every checkpoint."""
    if len(checkpoints) < 2:
        notes.append(f"no α/β fit: {len(checkpoints)} checkpoint(s); the fit needs a lineage of three or more "
                     "(two give a line with no residual)")
        return []
    by_name = [{v["name"]: v["lstar"] for v in c["variants"]} for c in checkpoints]
    names = [v["name"] for v in checkpoints[0]["variants"] if v["name"] != BASE]
    fits = []
    for name in names:
        if not all(name in row and BASE in row for row in by_name):
            notes.append(f"no fit for {name}: not measured at every checkpoint")
            continue
        base = [row[BASE] for row in by_name]
        try:
            fit = fit_alpha_beta(base, [row[name] for row in by_name])
        except SpecError as exc:
            notes.append(f"no fit for {name}: {exc.message}")
            continue
        fits.append({"variant": name, **fit})
    if len(checkpoints) == 2 and fits:
        notes.append("two checkpoints give α and β but no residual variance")
    if any(not math.isfinite(f["alpha"]) for f in fits):
        notes.append("a fit is not finite: the checkpoints' L* barely differ")
    return fits
