"""An active evaluation in a child process, bounded like a score (`monitor.scoring.child`).

The daemon checks a prediction by running the task on the checkpoint. The run loads a model,
so it happens in a child process with the scoring child's limits: wall-clock time (SIGKILL at
the limit), address space (`RLIMIT_AS`), death with the parent (`PR_SET_PDEATHSIG`), and the
same description of a child that died without an answer. The child never opens the
database: it hands its result back as JSON, and the daemon writes it with the job's lease
completion in one transaction.

Protocol: `python -m monitor.curves.eval_child RESULT_FILE` reads `EvalSpec` as JSON on stdin
and writes `{"ok": true, "value", "n", "k", "metrics", "n_params", "dtype", "device",
"tokenizer_fingerprint", "model", "wall_s", "threads"}` or the scoring child's error object to
RESULT_FILE. `threads` is torch's intra-op thread count in the child (set by OMP_NUM_THREADS or
MKL_NUM_THREADS, else the physical cores; Ray sets OMP_NUM_THREADS to a task's CPUs where the
cluster's environment does not): float32 sums are reduced in a different order with a different
count, so the same checkpoint evaluated with 1 and with 2 threads agrees to about 1e-8, not bit
for bit; with the same count on the same kind of CPU it agrees exactly.
Fail point (`LSTAR_FAILPOINT`): `hang_eval_child` sleeps forever before loading.
"""

from __future__ import annotations

import dataclasses
import faulthandler
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from monitor import errors
from monitor.environment import harden_environment
from monitor.failpoints import failpoint_values
from monitor.scoring.child import error_from_payload, failure_payload, run_child_module


@dataclass(frozen=True)
class EvalSpec:
    """One evaluation: the checkpoint folder (regular files), what to run, and how."""

    model_dir: str
    kind: str                  # multiple_choice | lm_eval
    metric: str
    file: str | None = None    # multiple_choice: the JSON-lines task file
    task: str | None = None    # lm_eval: the task name
    dtype: str = "float32"
    device: str = "cpu"
    batch_size: int = 8


def _mc(spec: EvalSpec) -> dict[str, Any]:
    from monitor.curves.evaluator import evaluate_checkpoint

    assert spec.file is not None
    ev = evaluate_checkpoint(spec.model_dir, spec.file, dtype=spec.dtype, device=spec.device,
                             batch_size=spec.batch_size)
    result = ev.result
    value = result.metrics[spec.metric][0]
    n = result.n_items
    return {"value": value, "n": n, "k": round(value * n), "task_sha256": result.task_sha256,
            "metrics": {k: {"value": v, "stderr": se, "baseline": result.baselines[k]}
                        for k, (v, se) in result.metrics.items()},
            "n_params": ev.n_params, "dtype": ev.dtype, "device": ev.device,
            "tokenizer_fingerprint": ev.tokenizer_fingerprint, "model": ev.model_info, "wall_s": ev.wall_s}


def _lm_eval(spec: EvalSpec) -> dict[str, Any]:
    """An lm-evaluation-harness task through its Python API (`simple_evaluate` on an HFLM
    wrapping the checkpoint loaded by the engine's loader: safetensors, no remote code)."""
    try:
        from lm_eval import simple_evaluate
        from lm_eval.models.huggingface import HFLM
    except ImportError:
        raise errors.UnsupportedCheckpointError(
            f"lm_eval task {spec.task!r} needs lm-evaluation-harness, which is not installed",
            hint="pip install 'lstar-monitor[bench]'") from None
    from transformers import PreTrainedTokenizerFast

    from monitor.scoring import load_checkpoint, load_tokenizer

    loaded = load_checkpoint(spec.model_dir, dtype=spec.dtype, device=spec.device)
    handle = load_tokenizer(loaded.model_dir)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(loaded.model_dir))
    lm = HFLM(pretrained=loaded.model, tokenizer=tokenizer, batch_size=spec.batch_size,
              max_length=loaded.max_positions, prefix_token_id=handle.prefix_token_id, trust_remote_code=False)
    started = time.perf_counter()
    results = simple_evaluate(model=lm, tasks=[spec.task], log_samples=False, random_seed=0,
                              numpy_random_seed=0, torch_random_seed=0, fewshot_random_seed=0)
    wall_s = time.perf_counter() - started
    metrics = ((results or {}).get("results") or {}).get(spec.task)
    if not metrics:
        raise errors.LabelError(f"lm-eval returned no results for task {spec.task!r}",
                                hint="check the task name with `lm_eval --tasks list`")
    value = next((v for k, v in metrics.items() if k.split(",")[0] == spec.metric and isinstance(v, (int, float))),
                 None)
    if value is None:
        raise errors.LabelError(f"lm-eval task {spec.task!r} reports no metric {spec.metric!r}",
                                hint=f"reported: {', '.join(sorted(metrics))}")
    counts = (results.get("n-samples") or {}).get(spec.task) or {}
    n = int(counts.get("effective", counts.get("original", 0)) or 0)
    if n <= 0:
        raise errors.LabelError(f"lm-eval task {spec.task!r} reports no item count")
    return {"value": float(value), "n": n, "k": round(float(value) * n), "task_sha256": None,
            "metrics": {k: v for k, v in metrics.items() if isinstance(v, (int, float, str))},
            "n_params": loaded.n_params, "dtype": loaded.dtype, "device": loaded.device,
            "tokenizer_fingerprint": handle.fingerprint, "model": loaded.as_model_info(), "wall_s": wall_s}


def evaluation_payload(spec: EvalSpec) -> dict[str, Any]:
    """Run `spec` here and describe the outcome as the result file's JSON."""
    try:
        if "hang_eval_child" in set(failpoint_values()):
            while True:
                time.sleep(3600)
        out = _mc(spec) if spec.kind == "multiple_choice" else _lm_eval(spec)
        import torch

        return {"ok": True, **out, "threads": torch.get_num_threads()}
    except Exception as exc:  # reported to the parent, which decides whether to retry
        return failure_payload(exc)


def run_evaluation_child(spec: EvalSpec, *, timeout_s: float, memory_bytes: int | None, workdir: Path,
                         log_path: Path | None = None, template: Any = None) -> dict[str, Any]:
    """Run `spec` in a child process; return its result object (nothing is written here).
    With `template` (the warm pool's running template process, under the same memory limit)
    the child is forked from it, torch already imported.

    Raises what `monitor.scoring.child.run_score_child` raises for the same failures: a
    timeout, an interruption by the shutdown, the child's own error class, running out of
    memory, a crash.
    """
    return run_child_module("monitor.curves.eval_child", json.dumps(dataclasses.asdict(spec)),
                            what="evaluation child", prefix="eval-", timeout_s=timeout_s,
                            memory_bytes=memory_bytes, workdir=workdir, log_path=log_path, template=template)


def evaluate_on_worker(spec_data: dict[str, Any], timeout_s: float, memory_bytes: int | None,
                       workdir: str) -> dict[str, Any]:
    """A Ray task's body: run one evaluation in a child process on this node (the same bounds
    as locally) and return its result object, or the error as `{ok: false, error_class,
    message, hint}` for the daemon to classify (`error_from_payload`)."""
    try:
        return run_evaluation_child(EvalSpec(**spec_data), timeout_s=timeout_s, memory_bytes=memory_bytes,
                                    workdir=Path(workdir))
    except Exception as exc:  # noqa: BLE001 - described to the daemon, which retries or fails the job
        return failure_payload(exc)


def evaluate_on_ray(backend: Any, spec: EvalSpec, *, timeout_s: float, memory_bytes: int | None,
                    workdir: Path) -> dict[str, Any]:
    """Run `spec` as one task on the daemon's Ray backend (`RayBackend.call`); its result
    object, or the exception its error stands for. Paths must be on a file system every node
    mounts at the same path, as for scoring."""
    payload = backend.call(evaluate_on_worker, dataclasses.asdict(spec), timeout_s, memory_bytes, str(workdir),
                           what=f"the evaluation of {spec.model_dir}")
    if not payload.get("ok"):
        raise error_from_payload(payload, memory_bytes)
    return payload


def main(argv: list[str] | None = None) -> int:
    """Child entry point: run the evaluation on stdin, write the result file."""
    args = sys.argv[1:] if argv is None else argv
    result_path = Path(args[0])
    faulthandler.enable()
    harden_environment()
    spec = EvalSpec(**json.loads(sys.stdin.read()))
    payload = evaluation_payload(spec)
    tmp = result_path.with_suffix(".part")
    tmp.write_text(json.dumps(payload, default=str))
    os.replace(tmp, result_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
