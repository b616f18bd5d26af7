"""A sequential or resumed score of one checkpoint: the forward passes of
`monitor.scoring.sequential`'s loop, and the run it records.

`ScoreRequest.sequential` (a plan: the tasks to settle, δ, block size, seed) makes the score
stop once every task's state is settled; the run is then *partial*. `ScoreRequest.resume`
(the per-document rows of an earlier partial run) makes those documents count as scored: they
are not scored again. A score that reaches the end of the selection computes every number
exactly as a full score does (same per-document losses in corpus order, same bootstrap), so a
resumed score equals the full one; only the Token Constraint Bound, which needs one pass over
a fixed sample of every position, is not measured by such a run.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np

from monitor.errors import SpecError


@dataclass
class SequentialScore:
    """What a sequential or resumed score measured: the metrics (`summarize`'s keys), the
    `sequential` record, the per-document rows in corpus order, and the timing."""

    summary: dict[str, Any]
    record: dict[str, Any]
    rows: list[tuple[Any, ...]]
    output: Any

    @property
    def partial(self) -> bool:
        return bool(self.record["partial"])


DEFAULT_BLOCKS = 20        # the selection is scored in about this many blocks at most
DEFAULT_MIN_BLOCKS = 2


def sequential_plan(tasks: Sequence[Mapping[str, Any]], *, delta: float | None = None,
                    block_documents: int | None = None, seed: int = 0,
                    min_blocks: int = DEFAULT_MIN_BLOCKS) -> dict[str, Any]:
    """The JSON-able plan a `ScoreRequest` carries: tasks as made by
    `monitor.alerts.sequential_plan.task_entry` (the curve's numbers, so a scoring worker
    needs no curve file); δ None means 1 − the highest confidence among the tasks' curves."""
    if min_blocks < 2:
        raise SpecError(f"a sequential score looks after at least 2 blocks (got min_blocks={min_blocks})")
    return {"tasks": [dict(t) for t in tasks], "delta": delta, "block_documents": block_documents,
            "seed": seed, "min_blocks": min_blocks}


def _load_tasks(plan: Mapping[str, Any], prepared: Any) -> tuple[list[Any], list[dict[str, str]]]:
    """The plan's tasks as `CurveTask`s, and those left out: a curve pinned to another corpus
    or scoring spec (evaluation would refuse it, so the stop does not wait for it)."""
    from monitor import SCORING_SPEC_VERSION
    from monitor.scoring.sequential import CurveTask

    ours = {"spec_version": SCORING_SPEC_VERSION, "window": prepared.resolved.window,
            "stride": prepared.resolved.stride, "prefix_policy": prepared.handle.prefix_policy}
    tasks, skipped = [], []
    for entry in plan.get("tasks") or ():
        name = f"{entry.get('policy', '')}/{entry['task']}".lstrip("/")
        if entry.get("corpus_sha256") != prepared.corpus.sha256:
            skipped.append({"task": name, "reason": f"its curve is pinned to corpus {str(entry.get('corpus_sha256'))[:12]}, "
                                                    f"not {prepared.corpus.sha256[:12]}"})
            continue
        spec = entry.get("scoring_spec")
        if spec is not None and {k: spec.get(k) for k in ours} != ours:
            skipped.append({"task": name, "reason": f"its curve is pinned to scoring spec {spec}, not {ours}"})
            continue
        tasks.append(CurveTask(name, dict(entry)))
    return tasks, skipped


def _slices_summary(nll: np.ndarray, ntok: np.ndarray, nbytes: np.ndarray, slices: np.ndarray,
                    baseline: Mapping[str, Any], n_boot: int, seed: int) -> dict[str, Any]:
    from monitor.scoring.metrics import aggregate

    out = {}
    for name in dict.fromkeys(slices.tolist()):
        mask = slices == name
        out[name] = aggregate(nll[mask], ntok[mask], nbytes[mask], baseline["slices"][name]["ce_unigram"],
                              n_boot=n_boot, seed=seed)
    return out


def _resumed_documents(resume: Mapping[str, Any], corpus: Any) -> dict[int, tuple[float, int]]:
    """What the partial run being continued already scored: (NLL, tokens) by the document's
    position in this corpus selection; a document outside the selection is refused."""
    index = {d.id: i for i, d in enumerate(corpus.documents)}
    known: dict[int, tuple[float, int]] = {}
    for doc_id, _slice, n_tokens, nll, _bytes in resume.get("documents") or ():
        if doc_id not in index:
            raise SpecError(f"the partial run {resume.get('run_id')} has document {doc_id!r}, which is not "
                            f"in the selection of {corpus.name} {corpus.version}",
                            hint="a score continues only a partial run of the same corpus selection")
        known[index[doc_id]] = (float(nll), int(n_tokens))
    return known


def compute_sequential(prepared: Any, baseline: Mapping[str, Any]) -> SequentialScore:
    """Score `prepared` block by block (see the module's docstring); the engine makes the run
    of what this returns."""
    from monitor.scoring.forward import score_token_sequences
    from monitor.scoring.metrics import aggregate, summarize
    from monitor.scoring.sequential import BOUND_NAME, run_sequential

    p, request = prepared, prepared.request
    documents = p.corpus.documents
    n = len(documents)
    slices = np.asarray([d.slice for d in documents], dtype=object)
    nbytes_all = np.asarray([d.n_bytes for d in documents], dtype=np.int64)
    resume = request.resume or {}
    known = _resumed_documents(resume, p.corpus)
    plan = request.sequential or {}
    tasks, skipped = _load_tasks(plan, p) if request.sequential is not None else ([], [])
    delta = plan.get("delta")
    if delta is None:
        delta = min((1.0 - t.confidence for t in tasks), default=0.05)
    block = plan.get("block_documents") or max(1, math.ceil(n / DEFAULT_BLOCKS))
    if request.sequential is None or not tasks:
        block = n   # a full score (or nothing to settle): one block, the rest of the selection
    timing = {"wall_s": 0.0, "tokens": 0, "peak": None}

    def score_block(idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        start = time.perf_counter()
        out = score_token_sequences(p.checkpoint.model, [p.token_seqs[i] for i in idx], p.handle.prefix_token_id,
                                    p.resolved, with_tcb=False, progress=request.progress)
        timing["wall_s"] += time.perf_counter() - start
        timing["tokens"] += int(np.sum(out.doc_ntok))
        if out.peak_memory_bytes is not None:
            timing["peak"] = max(timing["peak"] or 0, out.peak_memory_bytes)
        return np.asarray(out.doc_nll, dtype=np.float64), np.asarray(out.doc_ntok, dtype=np.int64)

    res = run_sequential(score_block, doc_slices=slices.tolist(), ce_unigram=float(baseline["ce_unigram"]),
                         tasks=tasks, delta=float(delta), block_documents=int(block),
                         seed=int(plan.get("seed", 0)), min_blocks=int(plan.get("min_blocks", DEFAULT_MIN_BLOCKS)),
                         known=known)
    # the scored documents in corpus order: a complete run's arrays are then a full score's
    scored = np.sort(res.scored)
    nll = np.zeros(n, dtype=np.float64)
    ntok = np.zeros(n, dtype=np.int64)
    nll[res.scored], ntok[res.scored] = res.doc_nll, res.doc_ntok
    nll, ntok, nbytes, sl = nll[scored], ntok[scored], nbytes_all[scored], slices[scored]
    if not res.partial:
        summary = summarize(nll, ntok, nbytes, sl.tolist(), baseline, n_boot=request.n_boot, seed=request.seed)
    else:
        summary = aggregate(nll, ntok, nbytes, baseline["ce_unigram"], n_boot=request.n_boot, seed=request.seed)
        # what predictions use: the estimate of the full selection's CE and of the SE the full
        # score would report (docs/measurement.md §4), not the scored subset's own bootstrap
        est = res.estimate
        summary.update(ce=est.ce, lstar=est.ce - float(baseline["ce_unigram"]), se_ce=est.se_full,
                       se_lstar=est.se_full)
        ce_uni = float(baseline["ce_unigram"])
        summary["l_rel"] = est.ce / ce_uni if ce_uni > 0 else None
        summary["l_gain"] = (ce_uni - est.ce) / ce_uni if ce_uni > 0 else None
        summary["slices"] = _slices_summary(nll, ntok, nbytes, sl, baseline, request.n_boot, request.seed)
    tokens_total = int(baseline["n_tokens"])
    record = {
        "partial": res.partial, "reason": res.reason, "mode": "sequential" if request.sequential is not None else "full",
        "documents_scored": len(scored), "documents_total": n,
        "tokens_scored": int(ntok.sum()), "tokens_total": tokens_total,
        "tokens_scored_now": timing["tokens"], "documents_resumed": len(known),
        "resumed_from": resume.get("run_id"), "looks": res.looks, "delta": float(delta),
        "block_documents": int(block), "bound": BOUND_NAME if tasks else None,
        "seed": int(plan.get("seed", 0)), "ce_estimate": res.estimate.ce, "se_estimator": res.estimate.se,
        "box": res.box.as_dict(), "tasks": [o.as_dict() for o in res.tasks], "tasks_skipped": skipped,
    }
    wall = timing["wall_s"]
    output = SimpleNamespace(tokens_per_s=timing["tokens"] / wall if wall > 0 else 0.0, wall_s=wall,
                             peak_memory_bytes=timing["peak"])
    rows = [(documents[i].id, documents[i].slice, int(t), float(v), documents[i].n_bytes)
            for i, t, v in zip(scored, ntok, nll)]
    return SequentialScore(summary, record, rows, output)


def resume_payload(store: Any, result_like: Mapping[str, Any]) -> dict[str, Any] | None:
    """The `ScoreRequest.resume` of the newest partial run matching a checkpoint's model,
    corpus, tokenizer and spec (`result_like` has `model`, `corpus`, `spec` as in a result),
    or None."""
    run = store.partial_score_run(model_repo=result_like["model"]["repo"], model_sha=result_like["model"]["sha"],
                                  corpus_sha256=result_like["corpus"]["sha256"],
                                  tokenizer_fingerprint=result_like["model"]["tokenizer_fingerprint"],
                                  spec=result_like["spec"])
    if run is None:
        return None
    docs = [(d.doc_id, d.slice, d.n_tokens, d.nll, d.n_bytes) for d in store.score_documents(run.run_id)]
    return {"run_id": run.run_id, "documents": docs}

