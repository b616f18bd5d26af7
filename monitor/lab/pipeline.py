"""A lab run end to end: task files → train every lineage → score and label every checkpoint → lab.json.

Lineages run in worker processes, one per core with one torch thread each (faster on this
CPU than two threads per job, see docs/lab.md), each training its lineage and
then scoring its checkpoints: `monitor.scoring.engine` on the calibration corpus (L*, CE, CE_uni,
bits/byte, L_rel, L_gain) and `monitor.curves.evaluator.evaluate_multiple_choice` on every task file
(accuracy, probability of the answer, Brier), plus string exact match on add-words. The
parent shows one progress bar per lineage and writes `lab.json` once everything is scored;
the score runs are also recorded in `OUT/lab.duckdb`.
"""

from __future__ import annotations

import hashlib
import math
import multiprocessing as mp
import queue as queue_mod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from monitor.errors import LabError
from monitor.escape import plain_text
from monitor.lab.config import LabConfig
from monitor.lab.model import UNUSED_BIAS
from monitor.lab.records import LAB_SCHEMA, LabRecord, parse_lab, write_lab
from monitor.lab.tasks import ADD_TASK, CLOZE_TASK, greedy_exact_match, heldout_cloze_items, problem_items, write_task
from monitor.lab.text import Problem, all_problems, build_stream, load_text_source
from monitor.lab.train import encode_family, lineage_name, train_lineage

TASKS_DIR = "tasks"


@dataclass
class LabInputs:
    """Everything every lineage shares: the stream, the task files and the arithmetic problems."""

    stream: list[str]
    problems: list[Problem]
    task_files: dict[str, Path]
    eval_texts: list[str]
    provenance: dict[str, Any]


def _sha256_text(parts: list[str]) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.encode("utf-8"))
        digest.update(b"\x00")
    return digest.hexdigest()


def prepare_inputs(config: LabConfig, out: Path) -> LabInputs:
    """Build the training stream and write the task files under `out/tasks/`."""
    from monitor.scoring import load_corpus

    source = load_text_source(config.text_corpus, heldout_every=config.heldout_every)
    stream = build_stream(source, total_bytes=config.byte_budget, seed=config.data_seed,
                          problems_per_doc=config.problems_per_doc)
    problems = all_problems()
    add_items = problem_items(problems)
    cloze_items = heldout_cloze_items(config.cloze_task, source.heldout_ids)
    tasks_dir = out / TASKS_DIR
    files = {ADD_TASK: write_task(tasks_dir / f"{ADD_TASK}.jsonl", add_items),
             CLOZE_TASK: write_task(tasks_dir / f"{CLOZE_TASK}.jsonl", cloze_items)}
    calib = load_corpus(config.calib_corpus)
    eval_texts = [d.text for d in calib.documents]
    eval_texts += [it["context"] + c for it in [*add_items, *cloze_items] for c in it["choices"]]
    provenance = {
        "text_corpus": {"path": str(config.text_corpus), "sha256": source.corpus.sha256,
                        "trained_documents": len(source.train_ids),
                        "heldout_documents": list(source.heldout_ids),
                        "note": "training text: calib-v0-alt minus the held-out documents, "
                                "interleaved with generated additions in words"},
        "calib_corpus": {"path": str(config.calib_corpus), "sha256": calib.sha256},
        "stream": {"documents": len(stream), "bytes": sum(len(d.encode("utf-8")) for d in stream),
                   "sha256": _sha256_text(stream)},
        "tasks": {name: {"file": f"{TASKS_DIR}/{p.name}", "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
                  for name, p in files.items()},
        "cloze_source": {"path": str(config.cloze_task),
                         "sha256": hashlib.sha256(config.cloze_task.read_bytes()).hexdigest(),
                         "items_kept": len(cloze_items)},
    }
    return LabInputs(stream, problems, files, eval_texts, provenance)


def score_checkpoint_dir(path: Path, config: LabConfig, task_files: dict[str, Path],
                         problems: list[Problem]) -> tuple[dict[str, float], dict[str, dict], Any]:
    """Metrics and task labels of one checkpoint folder, and the engine's ScoredRun."""
    from monitor.curves import evaluate_multiple_choice, load_mc_task
    from monitor.scoring import ScoreRequest, compute_score, prepare

    # every k-th calib-v0 document: a pinned, slice-balanced selection ("every:k")
    request = ScoreRequest(model=str(path), corpus_dir=config.calib_corpus, dtype="float32",
                           device="cpu", with_tcb=False, n_boot=config.n_boot, progress=False,
                           batch_size=8, every=config.score_every if config.score_every > 1 else None)
    prepared = prepare(request)
    scored = compute_score(prepared, None)
    r = scored.result
    ubpb = r["ce_unigram"] * r["n_tokens"] / r["n_bytes"] / math.log(2)
    metrics = {"ce": r["ce"], "ce_uni": r["ce_unigram"], "lstar": r["lstar"], "lstar_se": r["se_ce"],
               "l_rel": r["l_rel"], "l_gain": r["l_gain"], "bits_per_byte": r["bits_per_byte"],
               "unigram_bits_per_byte": ubpb, "bpb_minus_unigram": r["bits_per_byte"] - ubpb}
    model, handle = prepared.checkpoint.model, prepared.handle
    tasks: dict[str, dict] = {}
    for name, file in task_files.items():
        res = evaluate_multiple_choice(model, handle.tokenizer, load_mc_task(file),
                                       prefix_token_id=handle.prefix_token_id,
                                       max_length=config.arch.context)
        tasks[name] = {"acc": res.metrics["acc"][0], "prob_correct": res.metrics["prob_correct"][0],
                       "brier": res.metrics["brier"][0], "n": res.n_items, "baseline": res.baselines["acc"]}
        if name == ADD_TASK:
            tasks[name]["exact_match"] = greedy_exact_match(model, handle.tokenizer, problems,
                                                            prefix_token_id=handle.prefix_token_id)
    return metrics, tasks, scored


def run_lineage(config: LabConfig, family: str, seed: int, out: Path, inputs: LabInputs,
                report: Callable[[str, int, int], None] | None = None, *, score: bool = True) -> dict[str, Any]:
    """Train (or resume) and, with `score`, score one lineage: its family record, checkpoint
    records (metrics and tasks only when scored) and the engine's runs."""
    data = encode_family(config, family, inputs.stream, inputs.eval_texts)
    name = lineage_name(family, seed)

    def on_step(step: int, total: int) -> None:
        if report is not None and (step % 5 == 0 or step == total):
            report(name, step, total)

    metas = train_lineage(config, family, seed, data, out, progress=on_step)
    checkpoints, runs = [], []
    for meta in metas:
        path = out / name / f"step{meta['step']}"
        if not score:
            checkpoints.append({**meta, "path": f"{name}/step{meta['step']}"})
            continue
        metrics, tasks, scored = score_checkpoint_dir(path, config, inputs.task_files, inputs.problems)
        checkpoints.append({"family": family, "seed": seed, "step": meta["step"],
                            "bytes_seen": meta["bytes_seen"], "tokens_seen": meta["tokens_seen"],
                            "path": f"{name}/step{meta['step']}", "metrics": metrics, "tasks": tasks})
        runs.append(scored)
    family_row = {"family": family, "tokenizer": family, "tokenizer_fingerprint": data.handle.fingerprint,
                  "vocab_used": data.vocab.n_used}
    return {"family": family_row, "checkpoints": checkpoints, "runs": runs}


def _worker(args: tuple) -> dict[str, Any]:
    config, family, seed, out, inputs, q, score = args

    def report(name: str, step: int, total: int) -> None:
        q.put((name, step, total))

    return run_lineage(config, family, seed, out, inputs, report, score=score)


def train_lab(config: LabConfig, out: str | Path, *, workers: int = 2, progress: bool = True,
              on_step: Callable[[str, int, int], None] | None = None) -> dict[str, dict[int, dict[str, Any]]]:
    """Train (or resume) every lineage without scoring; {lineage: {step: checkpoint meta}}.
    `on_step(lineage, step, total)` is told of the steps as they are done (every fifth and the last)."""
    config.validate()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    inputs = prepare_inputs(config, out)
    jobs = [(f, s) for s in config.seeds for f in config.families]
    results = _run_jobs(config, out, inputs, jobs, workers=workers, progress=progress, score=False, on_step=on_step)
    return {lineage_name(r["family"]["family"], r["checkpoints"][0]["seed"]):
            {c["step"]: c for c in r["checkpoints"]} for r in results}


def run_lab(config: LabConfig, out: str | Path, *, workers: int = 2, progress: bool = True,
            db: bool = True) -> LabRecord:
    """Run the whole lab into `out` (resuming whatever is there) and write `out/lab.json`."""
    config.validate()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    inputs = prepare_inputs(config, out)
    jobs = [(f, s) for s in config.seeds for f in config.families]
    results = _run_jobs(config, out, inputs, jobs, workers=workers, progress=progress)
    families = {r["family"]["family"]: r["family"] for r in results}
    checkpoints = [c for r in results for c in r["checkpoints"]]
    record = parse_lab({"schema": LAB_SCHEMA,
                        "config": {**config.as_dict(), **inputs.provenance,
                                   "vocab_remap": "compact vocabulary = ids used on the training "
                                                  "stream, calib-v0 and the task files; unused ids are "
                                                  f"saved with zero embedding and output bias {UNUSED_BIAS:g}"},
                        "families": [families[f] for f in config.families],
                        "checkpoints": checkpoints}, where=str(out / "lab.json"))
    if db:
        _record_runs(out / "lab.duckdb", [run for r in results for run in r["runs"]])
    write_lab(record, out / "lab.json")
    return record


def _run_jobs(config: LabConfig, out: Path, inputs: LabInputs, jobs: list[tuple[str, int]], *,
              workers: int, progress: bool, score: bool = True,
              on_step: Callable[[str, int, int], None] | None = None) -> list[dict[str, Any]]:
    from rich.console import Console
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                               TimeRemainingColumn)

    # A lineage is named after its tokenizer's folder: shown as it is, never read as markup. The
    # time left is rich's estimate from the speed it measures; the bars go to stderr (stdout is data).
    bar = Progress(TextColumn("{task.description}", style="bold", markup=False), BarColumn(), MofNCompleteColumn(),
                   TextColumn("steps"), TimeElapsedColumn(), TextColumn("left"), TimeRemainingColumn(),
                   console=Console(stderr=True), disable=not progress, transient=False)
    ids: dict[str, Any] = {}
    with bar:
        for family, seed in jobs:
            ids[lineage_name(family, seed)] = bar.add_task(plain_text(lineage_name(family, seed)), total=None)

        def update(name: str, step: int, total: int) -> None:
            bar.update(ids[name], completed=step, total=total)
            if on_step is not None:
                on_step(name, step, total)

        if workers <= 1:
            return [run_lineage(config, f, s, out, inputs, update, score=score) for f, s in jobs]
        ctx = mp.get_context("spawn")
        with ctx.Manager() as manager, ctx.Pool(min(workers, len(jobs))) as pool:
            q = manager.Queue()
            pending = [pool.apply_async(_worker, ((config, f, s, out, inputs, q, score),)) for f, s in jobs]
            while not all(p.ready() for p in pending):
                try:
                    update(*q.get(timeout=0.5))
                except queue_mod.Empty:
                    pass
            while not q.empty():
                update(*q.get_nowait())
            return [p.get() for p in pending]


def _record_runs(db_path: Path, runs: list[Any]) -> None:
    """Store every score run in a DuckDB file beside lab.json (one transaction)."""
    from monitor.store import Store

    store = Store.open(db_path)
    try:
        with store.transaction() as conn:
            for run in runs:
                run.write(store, conn)
        store.checkpoint()
    finally:
        store.close()


def lab_summary(record: LabRecord) -> list[dict[str, Any]]:
    """One row per checkpoint with the headline numbers (for the CLI's table)."""
    rows = []
    for ck in record.checkpoints:
        add = ck.tasks.get(ADD_TASK)
        rows.append({"lineage": lineage_name(ck.family, ck.seed), "step": ck.step, "bytes": ck.bytes_seen,
                     "lstar": ck.metrics.lstar, "ce": ck.metrics.ce, "bpb": ck.metrics.bits_per_byte,
                     "add_acc": add.acc if add else None, "add_em": add.exact_match if add else None,
                     "cloze_acc": ck.tasks[CLOZE_TASK].acc if CLOZE_TASK in ck.tasks else None})
    return rows


__all__ = ["LabInputs", "LabError", "prepare_inputs", "run_lab", "train_lab", "run_lineage", "score_checkpoint_dir",
           "lab_summary"]
