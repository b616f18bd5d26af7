"""Lab v2 end to end: pool → losslessness check → train every (family, size, seed) lineage →
score every checkpoint on the held-out text and the whole of calib-v0 → tasks → lab.json.

Lineages run in worker processes, one per core with one torch thread each (docs/lab.md). A
lineage's results are written to `OUT/<lineage>/scores.json` (atomically) as soon as it is
scored, under a key that pins everything they depend on; a rerun reuses them, and training
itself resumes from the last saved state, so a lab split over several sittings writes the
same `lab.json` byte for byte as one uninterrupted run.

Scoring uses the spec's teacher-forced loop (`monitor.scoring.forward.score_token_sequences`,
window = the model's context, stride half of it) and aggregates (`monitor.scoring.metrics`) on
the compact model, whose log-probabilities equal the saved full-vocabulary checkpoint's (every
unused id has logit −10⁴); `tests/test_lab.py` checks a checkpoint of every family against a
float64 loop over the saved checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import math
import multiprocessing as mp
import os
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from monitor.errors import LabError
from monitor.files import atomic_write_text
from monitor.lab.config import RaceConfig
from monitor.lab.pool import (build_lineage_stream, check_lossless, heldout_texts, load_pool, lossy_reason,
                              split_train, unigram_log_probs)
from monitor.lab.records import LAB_SCHEMA_V2, LabRecordV2, write_lab
from monitor.lab.tasks import ADD_TASK, POOL_CLOZE_TASK, addition_items, pool_cloze_items, write_task
from monitor.lab.text import problems_to_twenty

TASKS_DIR = "tasks"
SCORES_FILE = "scores.json"
KILL_AFTER_ENV = "LSTAR_LAB_KILL_AFTER_LINEAGES"   # resume tests: SIGKILL after this many lineages
OOS_ALPHA = 0.5
ROUND_TRIP_TRAIN_CHUNKS = 200


@dataclass
class RaceInputs:
    """What every lineage shares: the train text, the evaluation texts and the task items."""

    train: Any
    calib: list[str]
    heldout: list[str]
    add_items: list[dict[str, Any]]
    cloze_items: list[dict[str, Any]]
    unigram_slice: list[str]
    provenance: dict[str, Any]
    task_files: dict[str, Path]


def lineage_id(family: str, size: str, seed: int) -> str:
    return f"{family}-{size}-s{seed}"


def prepare_race(config: RaceConfig, out: Path) -> RaceInputs:
    """Load the pool and calib-v0, build and write the task files (under `out/tasks/`)."""
    from monitor.scoring import load_corpus

    pool = load_pool(config.pool)
    train = split_train(pool, chunk_chars=config.chunk_chars, oos_unigram_bytes=config.oos_unigram_bytes)
    calib = load_corpus(config.calib_corpus)
    heldout = heldout_texts(pool, config.heldout_bytes)
    problems = problems_to_twenty()
    add_items = addition_items(problems)
    cloze_items = pool_cloze_items(pool.tasks.documents, n_items=config.n_cloze, seed=config.cloze_seed)
    files = {ADD_TASK: write_task(out / TASKS_DIR / f"{ADD_TASK}.jsonl", add_items),
             POOL_CLOZE_TASK: write_task(out / TASKS_DIR / f"{POOL_CLOZE_TASK}.jsonl", cloze_items)}
    largest = max(s.byte_budget for s in config.sizes)
    for seed in config.seeds:     # refuse a budget the pool cannot give before anything trains
        build_lineage_stream(train, total_bytes=largest, seed=seed, problems=problems,
                             problems_per_doc=config.problems_per_doc)
    provenance = {
        "pool": pool.provenance(),
        "train_text": {"readable_bytes": train.readable_bytes, "chunks": len(train.readable),
                       "note": "each lineage reads the readable chunks of the pool's train split in an order "
                               "drawn from its seed, each at most once, with additions in words spliced in"},
        "unigram_slice": {"bytes": train.unigram_bytes, "chunks": len(train.unigram_slice),
                          "smoothing": f"additive {OOS_ALPHA} over the tokenizer's ids",
                          "note": "chunks of the train split first in sha256('lab-unigram:'+chunk) order, "
                                  "never read by a lineage; lstar_oos = CE - CE of this unigram"},
        "heldout_text": {"documents": len(heldout), "bytes": sum(len(t.encode("utf-8")) for t in heldout)},
        "calib_corpus": {"path": str(config.calib_corpus), "sha256": calib.sha256,
                         "documents": len(calib.documents), "selection": "all"},
        "tasks": {name: {"file": f"{TASKS_DIR}/{p.name}", "items": n,
                         "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
                  for (name, p), n in zip(files.items(), (len(add_items), len(cloze_items)))},
    }
    return RaceInputs(train, [d.text for d in calib.documents], heldout, add_items, cloze_items,
                      list(train.unigram_slice), provenance, files)


def family_checks(config: RaceConfig, inputs: RaceInputs) -> list[dict[str, Any]]:
    """The decode round trip of every family on the lab's texts. A lossy family named for the
    primary race is refused in one line; one named as a stress family is kept, labelled."""
    from monitor.scoring import load_tokenizer

    sample = list(inputs.train.readable[:ROUND_TRIP_TRAIN_CHUNKS])
    rows = []
    for family in config.all_families():
        handle = load_tokenizer(config.tokenizer_dir(family))
        check = check_lossless(handle, family, {"train": sample, "heldout": inputs.heldout, "calib": inputs.calib})
        role = "primary" if family in config.families else "stress"
        reason = None if check["lossless"] else lossy_reason(family, check)
        if role == "primary" and reason:
            raise LabError(reason, hint=f"drop {family} from --families (it may run as a labelled stress test "
                                        "with --stress-families)")
        rows.append({"family": family, "role": role, "tokenizer_fingerprint": handle.fingerprint,
                     "lossless": check["lossless"], "round_trip": check["texts"], "reason": reason})
    return rows


# The settings that say where an input is, not what it is: the key leaves them out (the inputs'
# contents are in it), so a lab resumed with its pool in another folder, or `--shared` spelt
# another way, reuses the lineages it has scored.
LOCATION_SETTINGS = frozenset({"pool", "tokenizers_dir", "calib_corpus"})


def _without_locations(value: Any) -> Any:
    """`value` with every `path` entry of its mappings removed (recursively)."""
    if isinstance(value, dict):
        return {k: _without_locations(v) for k, v in value.items() if k != "path"}
    if isinstance(value, list):
        return [_without_locations(v) for v in value]
    return value


def tokenizer_sha256(folder: Path) -> str:
    """sha256 over a tokenizer folder's files (names and contents, in name order)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in Path(folder).iterdir() if p.is_file()):
        digest.update(path.name.encode("utf-8") + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def lineage_key(config: RaceConfig, family: str, size: str, seed: int, inputs: RaceInputs) -> str:
    """Everything a lineage's results depend on, by content (its scores.json is reused only
    under it): the settings but not where the inputs are, the inputs' hashes, the tokenizer's files."""
    settings = {k: v for k, v in config.as_dict().items() if k not in LOCATION_SETTINGS}
    blob = json.dumps({"config": settings, "family": family, "size": size, "seed": seed,
                       "tokenizer_sha256": tokenizer_sha256(config.tokenizer_dir(family)),
                       "provenance": _without_locations(inputs.provenance)}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def score_text(compact, handle, vocab, texts: list[str], *, window: int, stride: int | None,
               log_q: np.ndarray, n_boot: int) -> dict[str, Any]:
    """CE, the spec's in-sample unigram, the out-of-sample unigram and every axis of one
    compact model on `texts` (each a document after the prefix token)."""
    from monitor.scoring.forward import ScoringSpec, score_token_sequences
    from monitor.scoring.metrics import aggregate, scored_token_counts, unigram_ce

    full = handle.encode_documents(texts)
    compact_seqs = [vocab.to_compact(s).tolist() if s else [] for s in full]
    prefix = None if handle.prefix_token_id is None else int(vocab.to_compact([handle.prefix_token_id])[0])
    spec = ScoringSpec(max_context=window, stride=stride, dtype="float32", device="cpu", tcb_positions=0)
    scored = score_token_sequences(compact, compact_seqs, prefix, spec.resolve(window), with_tcb=False,
                                   progress=False)
    counts = scored_token_counts(full, handle.prefix_policy, minlength=len(log_q))
    n = int(counts.sum())
    if n != int(scored.doc_ntok.sum()):
        raise LabError(f"{n} unigram tokens but {int(scored.doc_ntok.sum())} scored tokens")
    ce_uni = unigram_ce(counts)
    doc_bytes = [len(t.encode("utf-8")) for t in texts]
    agg = aggregate(scored.doc_nll, scored.doc_ntok, doc_bytes, ce_uni, n_boot=n_boot, seed=0)
    ce_uni_oos = float(-(counts.astype(np.float64) * log_q[:len(counts)]).sum() / n)
    ubpb = ce_uni * agg["n_tokens"] / agg["n_bytes"] / math.log(2)
    return {"ce": agg["ce"], "ce_uni": ce_uni, "ce_uni_oos": ce_uni_oos, "lstar": agg["lstar"],
            "lstar_oos": agg["ce"] - ce_uni_oos, "lstar_se": agg["se_ce"], "l_rel": agg["l_rel"],
            "l_gain": agg["l_gain"], "bits_per_byte": agg["bits_per_byte"], "unigram_bits_per_byte": ubpb,
            "bpb_minus_unigram": agg["bits_per_byte"] - ubpb, "n_tokens": agg["n_tokens"],
            "n_bytes": agg["n_bytes"]}


def score_tasks(compact, handle, vocab, inputs: RaceInputs, *, context: int,
                with_logp: bool = False) -> dict[str, Any]:
    """Accuracy, probability of the answer (multiple choice) and string exact match; with
    `with_logp` (lab v3) also `logp_correct` (`monitor.lab.tasks.mean_logp_correct`) and its
    chance level, the mean of log(1/n_options)."""
    from monitor.curves.evaluator import evaluate_multiple_choice, load_mc_task
    from monitor.lab.model import CompactTokenizer
    from monitor.lab.tasks import greedy_exact_match_items, mean_logp_correct

    tok = CompactTokenizer(handle.tokenizer, vocab)
    prefix = None if handle.prefix_token_id is None else int(vocab.to_compact([handle.prefix_token_id])[0])
    out = {}
    for name, items in ((ADD_TASK, inputs.add_items), (POOL_CLOZE_TASK, inputs.cloze_items)):
        task = load_mc_task(inputs.task_files[name])
        res = evaluate_multiple_choice(compact, tok, task, prefix_token_id=prefix, max_length=context)
        hits = greedy_exact_match_items(compact, tok, [(it["context"], it["choices"][it["answer"]].strip())
                                                       for it in items],
                                        prefix_token_id=prefix, max_length=context)
        k = len(items[0]["choices"])
        out[name] = {"acc": res.metrics["acc"][0], "exact_match": sum(hits) / len(hits),
                     "p_correct": res.metrics["prob_correct"][0], "brier": res.metrics["brier"][0],
                     "n": len(items),
                     # chance: a uniform guess among the options; a greedy decode has no chance level
                     "baselines": {"acc": 1.0 / k, "p_correct": 1.0 / k, "exact_match": 0.0}}
        if with_logp:
            out[name]["logp_correct"] = mean_logp_correct(res.loglikelihoods, res.answers)
            out[name]["baselines"]["logp_correct"] = float(np.mean([-math.log(len(it["choices"])) for it in items]))
    return out


def train_race_lineage(config: RaceConfig, family: str, size: str, seed: int, out: Path, inputs: RaceInputs,
                       progress: Any = None) -> tuple[Any, list[dict[str, Any]]]:
    """Train (or resume) one lineage; its family data and checkpoint metadata."""
    from monitor.lab.train import encode_family, train_lineage

    settings = config.lineage_settings(size)
    stream = build_lineage_stream(inputs.train, total_bytes=settings.byte_budget, seed=seed,
                                  problems=problems_to_twenty(), problems_per_doc=config.problems_per_doc)
    task_texts = [it["context"] + c for it in [*inputs.add_items, *inputs.cloze_items] for c in it["choices"]]
    data = encode_family(settings, family, stream, [*inputs.calib, *inputs.heldout, *task_texts])
    metas = train_lineage(settings, family, seed, data, out, progress=progress,
                          name=lineage_id(family, size, seed))
    return data, metas


def _train_worker(args: tuple) -> list[dict[str, Any]]:
    config, family, size, seed, out, inputs = args
    return train_race_lineage(config, family, size, seed, out, inputs)[1]


def train_race(config: RaceConfig, out: str | Path, *, workers: int = 2) -> dict[str, list[dict[str, Any]]]:
    """Train (or resume) every lineage without scoring; {lineage: checkpoint metadata}."""
    config.validate()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    inputs = prepare_race(config, out)
    family_checks(config, inputs)
    jobs = race_jobs(config)
    ctx = mp.get_context("spawn")
    with ctx.Pool(max(1, min(workers, len(jobs))), maxtasksperchild=1) as pool:
        pending = {job: pool.apply_async(_train_worker, ((config, *job, out, inputs),)) for job in jobs}
        return {lineage_id(*job): handle.get() for job, handle in pending.items()}


def run_race_lineage(config: RaceConfig, family: str, size: str, seed: int, out: Path, inputs: RaceInputs,
                     progress: Any = None) -> dict[str, Any]:
    """Train (or resume) and score one lineage; its results, also saved as scores.json."""
    from monitor.lab.model import load_compact
    from monitor.scoring import load_tokenizer

    import torch

    name = lineage_id(family, size, seed)
    key = lineage_key(config, family, size, seed, inputs)
    saved = out / name / SCORES_FILE
    if saved.is_file():
        data = json.loads(saved.read_text(encoding="utf-8"))
        if data.get("key") == key:
            return data
    spec = config.size(size)
    data, metas = train_race_lineage(config, family, size, seed, out, inputs, progress=progress)
    torch.set_num_threads(config.threads)
    handle = load_tokenizer(config.tokenizer_dir(family))
    log_q = unigram_log_probs(handle.encode_documents(inputs.unigram_slice), handle.vocab_size, alpha=OOS_ALPHA)
    checkpoints = []
    for meta in metas:
        path = f"{name}/step{meta['step']}"
        compact = load_compact(out / path, data.vocab, spec.arch)
        texts = {text: score_text(compact, handle, data.vocab, docs, window=spec.arch.context,
                                  stride=config.eval_stride, log_q=log_q, n_boot=config.n_boot)
                 for text, docs in (("heldout", inputs.heldout), ("calib", inputs.calib))}
        checkpoints.append({"family": family, "size": size, "seed": seed, "step": meta["step"],
                            "bytes_seen": meta["bytes_seen"], "tokens_seen": meta["tokens_seen"],
                            "vocab_used": data.vocab.n_used, "path": path, "texts": texts,
                            "tasks": score_tasks(compact, handle, data.vocab, inputs, context=spec.arch.context)})
    text = json.dumps({"key": key, "lineage": name, "checkpoints": checkpoints}, indent=1, sort_keys=True) + "\n"
    atomic_write_text(saved, text)
    # what was saved, not what was computed: a resumed lab reads the same (sorted) structure
    return json.loads(text)


def _worker(args: tuple) -> dict[str, Any]:
    config, family, size, seed, out, inputs = args
    return run_race_lineage(config, family, size, seed, out, inputs)


def race_jobs(config: RaceConfig) -> list[tuple[str, str, int]]:
    """Every lineage, largest budget first (so two workers finish together), then by seed and family."""
    sizes = sorted(config.sizes, key=lambda s: -s.byte_budget)
    return [(f, s.name, seed) for s in sizes for seed in config.seeds for f in config.all_families()]


def run_lineage_jobs(jobs: Sequence[tuple], worker: Callable[[tuple], dict[str, Any]],
                     args_of: Callable[[tuple], tuple], name_of: Callable[[tuple], str], *, workers: int,
                     progress: bool) -> dict[tuple, dict[str, Any]]:
    """Every job's `worker(args_of(job))`, in this process (`workers` <= 1) or in `workers` spawned
    processes, one lineage each, saying each as it finishes. `worker` is a module-level function
    (a spawned process imports it); `KILL_AFTER_ENV` kills this process after that many jobs, so a
    test can interrupt a run between lineages."""
    kill_after = int(os.environ.get(KILL_AFTER_ENV, "0") or 0)
    started = time.monotonic()
    results: dict[tuple, dict[str, Any]] = {}

    def done(job: tuple, result: dict[str, Any]) -> None:
        results[job] = result
        if progress:
            print(f"[{len(results)}/{len(jobs)}] {name_of(job)} done ({time.monotonic() - started:.0f} s)", flush=True)

    if workers <= 1:
        for job in jobs:
            done(job, worker(args_of(job)))
            if kill_after and len(results) == kill_after:
                os.kill(os.getpid(), signal.SIGKILL)
    else:
        ctx = mp.get_context("spawn")
        with ctx.Pool(min(workers, len(jobs)), maxtasksperchild=1) as pool:
            pending = {job: pool.apply_async(worker, (args_of(job),)) for job in jobs}
            for job, handle in pending.items():
                done(job, handle.get())
    return results


def run_race(config: RaceConfig, out: str | Path, *, workers: int = 2, progress: bool = True) -> LabRecordV2:
    """Run (or resume) lab v2 into `out` and write `out/lab.json`."""
    config.validate()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    inputs = prepare_race(config, out)
    families = family_checks(config, inputs)
    jobs = race_jobs(config)
    results = run_lineage_jobs(jobs, _worker, lambda job: (config, *job, out, inputs), lambda job: lineage_id(*job),
                               workers=workers, progress=progress)
    order = {f: i for i, f in enumerate(config.all_families())}
    size_order = {s.name: i for i, s in enumerate(config.sizes)}
    checkpoints = [c for job in sorted(results, key=lambda j: (order[j[0]], size_order[j[1]], j[2]))
                   for c in results[job]["checkpoints"]]
    record = LabRecordV2.model_validate({"schema": LAB_SCHEMA_V2,
                                         "config": {**config.as_dict(), **inputs.provenance},
                                         "families": families, "checkpoints": checkpoints})
    write_lab(record, out / "lab.json")
    return record


__all__ = ["RaceInputs", "train_race", "train_race_lineage", "family_checks", "lineage_id", "prepare_race", "race_jobs", "run_lineage_jobs", "run_race",
           "run_race_lineage", "score_tasks", "score_text"]
