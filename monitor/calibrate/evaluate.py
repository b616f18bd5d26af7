"""Evaluate one loaded checkpoint on a campaign's tasks: the built-in multiple-choice evaluator,
and lm-evaluation-harness through its Python API on the same loaded model.

A checkpoint is loaded once for all its tasks. Each task's result becomes labels
(`monitor.curves.labels.Label`) and an evaluation-run row, written together by the runner.
lm-evaluation-harness is the optional `bench` extra; a campaign that names an lm-eval task
without it installed fails with one line naming the task and the install command.
"""

from __future__ import annotations

import functools
import json
import os
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from monitor.calibrate.campaign import Campaign
from monitor.calibrate.plan import KEY_FIELD, EvalWork
from monitor.curves.evaluator import (CheckpointEvaluation, evaluate_multiple_choice, evaluation_labels,
                                      load_mc_task)
from monitor.curves.labels import Label, read_lm_eval_results
from monitor.errors import CampaignError
from monitor.scoring import TokenizerHandle

INSTALL_HINT = 'install lm-evaluation-harness with `pip install -e ".[bench]"` (or pip install lm-eval==0.4.13)'


@dataclass(frozen=True)
class EvalOutcome:
    """What one evaluation job produced: its run row and its labels (not yet written)."""

    work: EvalWork
    run: dict[str, Any]
    labels: list[Label]


def check_lm_eval_available(campaign: Campaign) -> None:
    """Fail before any work when a task needs lm-evaluation-harness and it is not installed."""
    for i, task in enumerate(campaign.tasks):
        if task.lm_eval is None:
            continue
        try:
            import lm_eval  # noqa: F401 - only its presence is checked here
        except ImportError:
            raise CampaignError(f"{campaign.label}: tasks[{i}]: lm_eval task {task.lm_eval!r} needs "
                                "lm-evaluation-harness, which is not installed", hint=INSTALL_HINT) from None


def _run_row(work: EvalWork, loaded: Any, handle: TokenizerHandle, *, n_items: int, metrics: dict[str, Any],
             wall_s: float) -> dict[str, Any]:
    return {"run_id": f"eval-{work.key[:12]}-{os.urandom(4).hex()}", "model_repo": work.checkpoint.repo,
            "model_sha": work.checkpoint.sha, "model_source": loaded.source, "task": work.task_name,
            "task_sha256": work.task_sha256, "n_items": n_items, "item_limit": work.task.limit,
            "tokenizer_fingerprint": handle.fingerprint, "dtype": loaded.dtype, "device": loaded.device,
            "metrics": metrics, "model": {**loaded.as_model_info(), "repo": work.checkpoint.repo,
                                          "sha": work.checkpoint.sha, KEY_FIELD: work.key},
            "wall_s": wall_s, "finished_at": datetime.now(timezone.utc)}


def evaluate_builtin(campaign: Campaign, work: EvalWork, loaded: Any, handle: TokenizerHandle) -> EvalOutcome:
    """The built-in multiple-choice evaluator (`lstar eval`) on a loaded checkpoint."""
    assert work.task.builtin is not None
    task = load_mc_task(campaign.path(work.task.builtin), limit=work.task.limit)
    started = time.perf_counter()
    result = evaluate_multiple_choice(loaded.model, handle.tokenizer, task, prefix_token_id=handle.prefix_token_id,
                                      batch_size=campaign.scoring.batch_size, max_length=loaded.max_positions)
    wall_s = time.perf_counter() - started
    run = _run_row(work, loaded, handle, n_items=result.n_items, metrics=result.as_dict()["metrics"], wall_s=wall_s)
    evaluation = CheckpointEvaluation(result=result, repo=work.checkpoint.repo, sha=work.checkpoint.sha,
                                      source=loaded.source, n_params=loaded.n_params, dtype=loaded.dtype,
                                      device=loaded.device, tokenizer_fingerprint=handle.fingerprint,
                                      model_info=run["model"], wall_s=wall_s)
    labels = [label.with_(checkpoint=work.checkpoint.name)
              for label in evaluation_labels(evaluation, family=work.checkpoint.family, run_id=run["run_id"])]
    return EvalOutcome(work, run, labels)


@functools.lru_cache(maxsize=8)
def _task_manager(include: str | None) -> Any:
    """lm-eval's task index, built once per campaign run: a folder of one's own tasks alone
    (indexing the harness's thousands of task files takes seconds), else the built-in tasks."""
    from lm_eval.tasks import TaskManager

    if include is None:
        return TaskManager()
    return TaskManager(include_path=include, include_defaults=False)


def evaluate_lm_eval(campaign: Campaign, work: EvalWork, loaded: Any, handle: TokenizerHandle) -> EvalOutcome:
    """An lm-evaluation-harness task through `lm_eval.simple_evaluate`, with an `HFLM` wrapping
    the checkpoint already loaded (the same weights, dtype and device the scores used).

    The harness's results are written as a `results_*.json` file under OUTPUT/lm_eval/ and
    read back with `read_lm_eval_results`, the reader of imported results, so an evaluated
    and an imported lm-eval result become labels the same way."""
    task = work.task
    try:
        from lm_eval import simple_evaluate
        from lm_eval.models.huggingface import HFLM
    except ImportError:
        raise CampaignError(f"lm_eval task {task.lm_eval!r} needs lm-evaluation-harness, which is not installed",
                            hint=INSTALL_HINT) from None
    from transformers import PreTrainedTokenizerFast

    # The checkpoint's own tokenizer files, read by the fast (Rust) tokenizer: no remote code.
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(loaded.model_dir))
    lm = HFLM(pretrained=loaded.model, tokenizer=tokenizer, batch_size=campaign.scoring.batch_size,
              max_length=loaded.max_positions, prefix_token_id=handle.prefix_token_id, trust_remote_code=False)
    manager = _task_manager(str(campaign.path(task.include)) if task.include else None)
    started = time.perf_counter()
    results = simple_evaluate(model=lm, tasks=[task.lm_eval], task_manager=manager, limit=task.limit,
                              num_fewshot=task.num_fewshot, log_samples=False, random_seed=campaign.fit.seed,
                              numpy_random_seed=campaign.fit.seed, torch_random_seed=campaign.fit.seed,
                              fewshot_random_seed=campaign.fit.seed)
    wall_s = time.perf_counter() - started
    if not results or task.lm_eval not in (results.get("results") or {}):
        raise CampaignError(f"lm-eval returned no results for task {task.lm_eval!r}",
                            hint="check the task name with `lm_eval --tasks list`")
    record = {"results": results["results"], "n-samples": results.get("n-samples") or {},
              "n-shot": results.get("n-shot") or {}, "versions": results.get("versions") or {},
              "model_name": work.checkpoint.repo,
              "config": {"model_sha": work.checkpoint.sha, "model_num_parameters": loaded.n_params}}
    folder = campaign.output_dir / "lm_eval" / work.key
    folder.mkdir(parents=True, exist_ok=True)
    file = folder / "results_calibrate.json"
    file.write_text(json.dumps(record, indent=2, sort_keys=True, default=str) + "\n", encoding="utf-8")
    counts = record["n-samples"].get(task.lm_eval) or {}
    n_items = int(counts.get("effective", counts.get("original", 0)) or 0)
    run = _run_row(work, loaded, handle, n_items=n_items, metrics=record["results"][task.lm_eval], wall_s=wall_s)
    labels = [label.with_(checkpoint=work.checkpoint.name, family=work.checkpoint.family, repo=work.checkpoint.repo,
                          sha=work.checkpoint.sha, source_ref=run["run_id"],
                          details={**label.details, "results_file": str(file), "task_sha256": work.task_sha256})
              for label in read_lm_eval_results(file) if label.task == task.lm_eval]
    return EvalOutcome(work, run, labels)


def evaluate(campaign: Campaign, work: EvalWork, loaded: Any, handle: TokenizerHandle) -> EvalOutcome:
    """Run one evaluation job on a checkpoint loaded for all of its tasks."""
    if work.task.kind == "builtin":
        return evaluate_builtin(campaign, work, loaded, handle)
    return evaluate_lm_eval(campaign, work, loaded, handle)

