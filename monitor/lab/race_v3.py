"""Lab v3 end to end (issue 37): pool → per-family data assignments → losslessness check →
train every (family, seed) lineage of the one size on its own data → score every checkpoint
on the pool's held-out text (the primary text, in distribution) and calib-v0 (secondary) →
tasks with the continuous `logp_correct` → `lab.json` (`lstar-lab/3`).

It reuses lab v2's machinery (`monitor.lab.race`: the pool's texts, the task items, the round
trip, the scoring of a text, the tasks, training and resume) and changes what issue 37 asks:
the data each lineage reads (`monitor.lab.assignment`), the primary text and metric
(`monitor.lab.records_v3`), one size. A lineage's results are saved as
`OUT/<lineage>/scores.json` under a key that pins its settings, inputs, tokenizer and data
assignment, so a lab split over several sittings writes the same `lab.json`; the CPU seconds of
each phase go to `OUT/<lineage>/timing.json` (not into lab.json, which must not depend on the
machine's load).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from monitor.errors import LabError
from monitor.files import atomic_write_text
from monitor.lab.assignment import DataAssignment, SourcedChunks, assigned_stream, sourced_chunks
from monitor.lab.config import RaceConfigV3, family_folders
from monitor.lab.family_set import FamilySetRule, check_run_families
from monitor.lab.heldout import stratified_heldout
from monitor.lab.pool import TrainText, load_pool, unigram_log_probs
from monitor.lab.race import (LOCATION_SETTINGS, OOS_ALPHA, ROUND_TRIP_TRAIN_CHUNKS, SCORES_FILE,
                              TASKS_DIR, RaceInputs,
                              _without_locations, family_checks, lineage_id, run_lineage_jobs, score_tasks, score_text,
                              tokenizer_sha256)
from monitor.lab.records import write_lab
from monitor.lab.records_v3 import LAB_SCHEMA_V3, PRIMARY_TEXT, SECONDARY_TEXT, LabRecordV3
from monitor.lab.reuse_v3 import reuse_lineages
from monitor.lab.tasks import ADD_TASK, POOL_CLOZE_TASK, addition_items, pool_cloze_items, write_task
from monitor.lab.text import problems_to_twenty

TIMING_FILE = "timing.json"
PROVENANCE_FILE = "provenance.json"
PROVENANCE_MAX_BYTES = 1 << 20
# The pre-registration another part of issue 37 commits; its sha256 goes into lab.json.
PREREGISTRATION = Path(__file__).resolve().parents[2] / "data" / "lab-v3-preregistration.json"
PREREGISTRATION_MAX_BYTES = 4 << 20


@dataclass
class RaceInputsV3(RaceInputs):
    """v2's shared inputs, the train chunks with their sources, and every lineage's assignment."""

    sourced: SourcedChunks
    assignments: dict[tuple[str, int], DataAssignment]


def lineage_stream(config: RaceConfigV3, sourced: SourcedChunks, family: str, seed: int) -> tuple[list[str], DataAssignment]:
    """The training documents of (family, seed) and their pinned assignment."""
    return assigned_stream(sourced, family, seed, total_bytes=config.size_spec.byte_budget,
                           spread=config.mixture_spread, problems=problems_to_twenty(),
                           problems_per_doc=config.problems_per_doc)


def prepare_race_v3(config: RaceConfigV3, out: Path) -> RaceInputsV3:
    """Load the pool and calib-v0, write the task files, and draw every lineage's data (a budget
    the pool cannot give is refused here, before anything trains)."""
    from monitor.scoring import load_corpus

    pool = load_pool(config.pool)
    sourced = sourced_chunks(pool.train.documents, chunk_chars=config.chunk_chars,
                             oos_unigram_bytes=config.oos_unigram_bytes)
    train = TrainText(sourced.chunks, sourced.unigram_slice)
    calib = load_corpus(config.calib_corpus)
    # v3's primary text matches the train split's source mix (v2's corpus-order prefix is all dictionary)
    selection = stratified_heldout(pool.train.documents, pool.heldout.documents, config.heldout_bytes)
    heldout = list(selection.texts)
    add_items = addition_items(problems_to_twenty())
    cloze_items = pool_cloze_items(pool.tasks.documents, n_items=config.n_cloze, seed=config.cloze_seed)
    files = {ADD_TASK: write_task(out / TASKS_DIR / f"{ADD_TASK}.jsonl", add_items),
             POOL_CLOZE_TASK: write_task(out / TASKS_DIR / f"{POOL_CLOZE_TASK}.jsonl", cloze_items)}
    assignments = {(f, s): lineage_stream(config, sourced, f, s)[1] for f in config.all_families() for s in config.seeds}
    provenance = {
        "pool": pool.provenance(),
        "train_text": {"readable_bytes": train.readable_bytes, "chunks": len(train.readable),
                       "bytes_by_source": sourced.bytes_by_source(),
                       "note": "each (family, seed) reads its own mixture and order of the readable chunks, each "
                               "at most once (data: the assignment of each lineage), with additions spliced in"},
        "unigram_slice": {"bytes": train.unigram_bytes, "chunks": len(train.unigram_slice),
                          "smoothing": f"additive {OOS_ALPHA} over the tokenizer's ids",
                          "note": "chunks of the train split first in sha256('lab-unigram:'+chunk) order, "
                                  "never read by a lineage; lstar_oos = CE - CE of this unigram"},
        "texts": {PRIMARY_TEXT: "primary: the pool's held-out split, the training distribution",
                  SECONDARY_TEXT: "secondary: calib-v0, out of distribution"},
        "heldout_text": selection.provenance(),
        "calib_corpus": {"path": str(config.calib_corpus), "sha256": calib.sha256,
                         "documents": len(calib.documents), "selection": "all"},
        "tasks": {name: {"file": f"{TASKS_DIR}/{p.name}", "items": n,
                         "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
                  for (name, p), n in zip(files.items(), (len(add_items), len(cloze_items)))},
        "primary_metric": "logp_correct: mean over items of log p(correct option), option probabilities "
                          "(sums of token log-probabilities) renormalised over the item's options",
    }
    return RaceInputsV3(train, [d.text for d in calib.documents], heldout, add_items, cloze_items,
                        list(train.unigram_slice), provenance, files, sourced, assignments)


def _provenance(folder: Path) -> dict[str, Any] | None:
    """The tokenizer folder's provenance.json (bounded), None when it has none."""
    path = folder / PROVENANCE_FILE
    if not path.is_file():
        return None
    if path.stat().st_size > PROVENANCE_MAX_BYTES:
        raise LabError(f"{path} is larger than {PROVENANCE_MAX_BYTES} bytes", hint="a provenance file is a short JSON object")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise LabError(f"{path} is not valid JSON: {str(exc)[:200]}", hint="fix or remove the family's provenance.json") from None
    if not isinstance(data, dict):
        raise LabError(f"{path} must hold a JSON object", hint="fix or remove the family's provenance.json")
    return data


def family_checks_v3(config: RaceConfigV3, inputs: RaceInputsV3) -> list[dict[str, Any]]:
    """v2's round trip (a lossy primary family is refused) with each family's provenance."""
    rows = family_checks(config, inputs)
    for row in rows:
        folder = config.tokenizer_dir(row["family"])
        row["tokenizer_sha256"] = tokenizer_sha256(folder)
        row["provenance"] = _provenance(folder)
    return rows


def lineage_key_v3(config: RaceConfigV3, family: str, seed: int, inputs: RaceInputsV3) -> str:
    """Everything a lineage's results depend on, by content, as v2's key (settings but not where
    the inputs are, the inputs' hashes, the tokenizer's files) and its data assignment. Unlike
    v2's it leaves out which families and seeds the lab runs: a lab resumed with families added
    reuses the lineages it has scored."""
    skip = LOCATION_SETTINGS | {"families", "stress_families", "seeds"}
    settings = {k: v for k, v in config.as_dict().items() if k not in skip}
    blob = json.dumps({"config": settings, "family": family, "seed": seed,
                       "tokenizer_sha256": tokenizer_sha256(config.tokenizer_dir(family)),
                       "data": inputs.assignments[(family, seed)].order_sha256,
                       "provenance": _without_locations(inputs.provenance)}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def run_race_v3_lineage(config: RaceConfigV3, family: str, seed: int, out: Path,
                        inputs: RaceInputsV3) -> dict[str, Any]:
    """Train (or resume) and score one lineage; its results, also saved as scores.json."""
    import torch

    from monitor.lab.model import load_compact
    from monitor.lab.train import encode_family, train_lineage
    from monitor.scoring import load_tokenizer

    spec = config.size_spec
    name = lineage_id(family, spec.name, seed)
    key = lineage_key_v3(config, family, seed, inputs)
    saved = out / name / SCORES_FILE
    if saved.is_file():
        data = json.loads(saved.read_text(encoding="utf-8"))
        if data.get("key") == key:
            return data
    start = time.process_time()      # CPU seconds of this process: what a lineage costs, whatever the load
    settings = config.lineage_settings(spec.name)
    docs, assignment = lineage_stream(config, inputs.sourced, family, seed)
    task_texts = [it["context"] + c for it in [*inputs.add_items, *inputs.cloze_items] for c in it["choices"]]
    data = encode_family(settings, family, docs, [*inputs.calib, *inputs.heldout, *task_texts])
    timing: dict[str, float] = {"stream_and_tokenize": time.process_time() - start}
    mark = time.process_time()
    metas = train_lineage(settings, family, seed, data, out, name=name)
    timing["train"] = time.process_time() - mark
    torch.set_num_threads(config.threads)
    handle = load_tokenizer(config.tokenizer_dir(family))
    log_q = unigram_log_probs(handle.encode_documents(inputs.unigram_slice), handle.vocab_size, alpha=OOS_ALPHA)
    checkpoints = []
    timing.update(score_heldout=0.0, score_calib=0.0, tasks=0.0)
    for meta in metas:
        path = f"{name}/step{meta['step']}"
        compact = load_compact(out / path, data.vocab, spec.arch)
        texts = {}
        for text, texts_of in ((PRIMARY_TEXT, inputs.heldout), (SECONDARY_TEXT, inputs.calib)):
            mark = time.process_time()
            texts[text] = score_text(compact, handle, data.vocab, texts_of, window=spec.arch.context,
                                     stride=config.eval_stride, log_q=log_q, n_boot=config.n_boot)
            timing[f"score_{text}"] += time.process_time() - mark
        mark = time.process_time()
        tasks = score_tasks(compact, handle, data.vocab, inputs, context=spec.arch.context, with_logp=True)
        timing["tasks"] += time.process_time() - mark
        checkpoints.append({"family": family, "size": spec.name, "seed": seed, "step": meta["step"],
                            "bytes_seen": meta["bytes_seen"], "tokens_seen": meta["tokens_seen"],
                            "vocab_used": data.vocab.n_used, "path": path, "texts": texts, "tasks": tasks,
                            "sample": assignment.sample})
    timing["total"] = time.process_time() - start
    text = json.dumps({"key": key, "lineage": name, "data": assignment.as_record(), "checkpoints": checkpoints},
                      indent=1, sort_keys=True) + "\n"
    atomic_write_text(saved, text)
    atomic_write_text(out / name / TIMING_FILE, json.dumps(
        {"cpu_seconds": timing, "tokens_trained": int(metas[-1]["tokens_seen"]), "torch_threads": config.threads,
         "note": "time.process_time() of the process that ran the lineage"}, indent=1) + "\n")
    return json.loads(text)


def _worker(args: tuple) -> dict[str, Any]:
    return run_race_v3_lineage(*args)


def race_v3_jobs(config: RaceConfigV3) -> list[tuple[str, int]]:
    """Every (family, seed) lineage, by seed and then family in the families' order."""
    return [(f, seed) for seed in config.seeds for f in config.all_families()]


def preregistration_sha256(path: Path = PREREGISTRATION) -> str | None:
    """sha256 of the committed pre-registration, None while it does not exist."""
    if not path.is_file():
        return None
    if path.stat().st_size > PREREGISTRATION_MAX_BYTES:
        raise LabError(f"{path} is larger than {PREREGISTRATION_MAX_BYTES} bytes", hint="is it the pre-registration?")
    return hashlib.sha256(path.read_bytes()).hexdigest()


def family_set_v3(config: RaceConfigV3, inputs: RaceInputsV3, rule: FamilySetRule) -> dict[str, Any]:
    """The family set of the folder `config.tokenizers_dir` on the run's own texts (the round
    trip's texts of `family_checks`), by the pre-registered rule (`monitor.lab.family_set`)."""
    texts = {"train": list(inputs.train.readable[:ROUND_TRIP_TRAIN_CHUNKS]), "heldout": inputs.heldout,
             "calib": inputs.calib}
    return check_run_families(family_folders(config.tokenizers_dir), config.tokenizer_dir, texts, rule)


def run_race_v3(config: RaceConfigV3, out: str | Path, *, workers: int = 2, progress: bool = True,
                preregistration: Path = PREREGISTRATION, family_set: FamilySetRule | None = None,
                reuse: Sequence[dict[str, Any]] = ()) -> LabRecordV3:
    """Run (or resume) lab v3 into `out` and write `out/lab.json`. With `family_set` the
    families of `config.tokenizers_dir` are checked first (`family_set_v3`) and the run races
    the families it keeps (or those chosen, each of them kept). Each record of `reuse` (a v3
    lab.json as read by `reuse_v3.read_reusable_record`) gives the folder the lineages whose
    inputs are this run's by content (`reuse_v3.reuse_lineages`): a sitting on another machine."""
    config.validate()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    inputs = prepare_race_v3(config, out)
    checked = None
    if family_set is not None:
        checked = family_set_v3(config, inputs, family_set)
        missing = [f for f in checked["raced"] for s in config.seeds if (f, s) not in inputs.assignments]
        if missing:
            inputs.assignments.update({(f, s): lineage_stream(config, inputs.sourced, f, s)[1]
                                       for f in checked["raced"] for s in config.seeds})
        config = config.with_(families=tuple(checked["raced"])).validate()
        if progress:
            print(f"family set: {len(checked['kept'])} kept of {len(checked['candidates'])} at cut-off "
                  f"{checked['cutoff']:g}; racing {', '.join(checked['raced'])}", flush=True)
    for earlier in reuse:
        outcome = reuse_lineages(config, inputs, earlier, out, lambda f, s: lineage_key_v3(config, f, s, inputs))
        if progress:
            for name, what in outcome.items():
                print(f"{name}: {what}", flush=True)
    families = family_checks_v3(config, inputs)
    jobs = race_v3_jobs(config)
    results = run_lineage_jobs(jobs, _worker, lambda job: (config, *job, out, inputs),
                               lambda job: lineage_id(job[0], config.size_spec.name, job[1]),
                               workers=workers, progress=progress)
    order = {f: i for i, f in enumerate(config.all_families())}
    ordered = sorted(results, key=lambda j: (order[j[0]], j[1]))
    record = LabRecordV3.model_validate({
        "schema": LAB_SCHEMA_V3, "config": {**config.as_dict(), **inputs.provenance},
        "preregistration_sha256": preregistration_sha256(preregistration),
        "families": families, "data": [results[j]["data"] for j in ordered],
        "checkpoints": [c for j in ordered for c in results[j]["checkpoints"]], "family_set": checked})
    write_lab(record, out / "lab.json")
    return record


__all__ = ["PREREGISTRATION", "RaceInputsV3", "family_checks_v3", "family_set_v3", "lineage_key_v3", "lineage_stream",
           "preregistration_sha256", "prepare_race_v3", "race_v3_jobs", "run_race_v3", "run_race_v3_lineage"]
