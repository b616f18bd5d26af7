"""lstar's scorer against lm-evaluation-harness on one model and corpus, in one run.

Scores SmolLM2-135M (or `--model DIR`) on calib-v0 (or `--corpus DIR`) several times, each
in its own subprocess so its peak RSS is its own:

1. `peak`        — this machine's float32 and bf16 matmul peak (benchmarks/matmul_peak.py),
                   measured first and again last; the better of the two counts;
2. `ours`        — monitor.scoring.forward in disjoint mode, float32 (what `lstar score --disjoint` runs);
3. `lm_eval`     — lm-evaluation-harness `loglikelihood_rolling` through the local task
                   benchmarks/lm_eval_task/lstar_calib_rolling.yaml (HFLM, float32, defaults);
4. `lm_eval_f64` — the same with `softmax_dtype=float64` on the first `--f64-docs` documents
                   (lm-eval's float32 log-softmax on the CPU is biased by ~1e-5 relative; this
                   run shows how close the two sides are without that);
5. `bf16`        — monitor.scoring.forward again with bf16 weights, on the first `--bf16-docs` documents;
6. `lm_eval_heap` — lm-eval again with the glibc setting our scorer makes for itself
                   (monitor.scoring.host_memory: freed activations kept for the next batch), so the
                   report also shows how much of the ratio that setting alone accounts for.

`--tune 1,2,4,8` first measures both float32 sides at each batch size on the first
`--tune-docs` documents and runs each with its fastest.

Both float32 sides see the same model directory, the same tokenizer files (the model
directory's), the same prefix token (BOS if the tokenizer defines one, else EOS — our spec;
lm-eval's HFLM gets it explicitly as `prefix_token_id`), the same window (`--max-length`,
disjoint windows = lm-eval's rolling windows) and the same dtype. The script checks that
both sides tokenized every document to the same ids and scored the same number of tokens.

Throughput = scored tokens / seconds from "model loaded" to "per-document NLLs known",
tokenization included on both sides (for lm-eval: the time inside `loglikelihood_rolling`;
its whole `simple_evaluate` time is reported too).

    python benchmarks/score_vs_lm_eval.py --docs 8        # quick check
    python benchmarks/score_vs_lm_eval.py                 # all 216 documents (long on a CPU)

Prints the comparison and a Markdown table; writes JSON and Markdown to benchmarks/out/.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

DEFAULT_CORPUS = REPO_ROOT.parent / "shared" / "corpus" / "calib-v0"
TASK_DIR = REPO_ROOT / "benchmarks" / "lm_eval_task"
TASK_NAME = "lstar_calib_rolling"
# Must match `dataset_kwargs.data_files.test` in the task YAML (relative to REPO_ROOT).
TASK_DATA_FILE = REPO_ROOT / "benchmarks" / "out" / "lm_eval_data" / "documents.jsonl"
OUT_DIR = REPO_ROOT / "benchmarks" / "out"
MIB = 1024.0
# Environment of every worker: offline, no implicit conversion service, same threading.
WORKER_ENV = {
    "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
    "HF_EVALUATE_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1",
    "DISABLE_SAFETENSORS_CONVERSION": "1", "TOKENIZERS_PARALLELISM": "false",
}
TARGETS = {"speedup_fp32": 1.5, "bpb_rel_diff": 1e-5, "speedup_bf16": 3.0}


# --------------------------------------------------------------------------- small shared helpers


def ids_digest(token_seqs: list[list[int]]) -> str:
    """sha256 of the token ids of all documents (order and boundaries included)."""
    digest = hashlib.sha256()
    for seq in token_seqs:
        digest.update(json.dumps(seq, separators=(",", ":")).encode())
        digest.update(b"\n")
    return digest.hexdigest()


def _proc_status_mib(field: str) -> float | None:
    """VmRSS / VmHWM of this process in MiB (Linux), None elsewhere."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / MIB
    except OSError:
        return None
    return None


def window_lengths(n_tokens: int, window: int) -> list[int]:
    """Input lengths of the disjoint passes over `[prefix] + n_tokens tokens` (written from
    the spec, independent of monitor.scoring.forward): the first pass reads min(L, n) tokens, each
    later one L tokens (the last re-reads earlier tokens as context)."""
    if n_tokens < 1:
        return []
    lengths = [min(window, n_tokens)]
    scored = lengths[0]
    while scored < n_tokens:
        lengths.append(window)
        scored += min(window, n_tokens - scored)
    return lengths


def forward_flops(doc_tokens: list[int], window: int, n_params: int, n_layers: int, d_attn: int) -> dict[str, float]:
    """Useful forward FLOPs of scoring the documents in disjoint windows.

    Per pass of T input tokens: 2·n_params·T, with `n_params` the weights used in a matmul
    (the output matrix counted once, the input-embedding lookup not at all), plus the causal
    attention 2·n_layers·d_attn·T(T+1) (2·d_attn FLOPs per query-key pair for each of QKᵀ
    and AV, T(T+1)/2 pairs). Padding and masked-out work are not counted.
    """
    dense = attention = 0.0
    for n in doc_tokens:
        for t in window_lengths(n, window):
            dense += 2.0 * n_params * t
            attention += 2.0 * n_layers * d_attn * t * (t + 1)
    return {"dense": dense, "attention": attention, "total": dense + attention}


# --------------------------------------------------------------------------- workers (subprocesses)
# Job keys beyond this script's own, used by benchmarks/gpu_score.py: `device` (default
# "cpu"), `every` (every k-th document before the first `docs`), `warmup` (one untimed
# forward pass first, so CUDA's one-off start-up cost is timed on neither side).


def warm_up(model: Any, device: str) -> None:
    """One untimed forward pass of 32 tokens (kernel selection, cuBLAS handles)."""
    import torch

    with torch.inference_mode():
        model(input_ids=torch.zeros((1, 32), dtype=torch.long, device=device))
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def worker_peak(job: dict[str, Any]) -> dict[str, Any]:
    sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
    from matmul_peak import measure_matmul_peak

    return {name: measure_matmul_peak(name, budget_s=job["peak_budget_s"]) for name in ("float32", "bfloat16")}


def worker_ours(job: dict[str, Any]) -> dict[str, Any]:
    import torch

    from monitor.scoring.corpus import load_corpus
    from monitor.scoring.forward import ScoringSpec, score_token_sequences
    from monitor.scoring.host_memory import keep_freed_memory
    from monitor.scoring.loader import load_checkpoint
    from monitor.scoring.tokenizer import load_tokenizer

    device = job.get("device", "cpu")
    t_start = time.perf_counter()
    checkpoint = load_checkpoint(job["model_dir"], dtype=job["dtype"], device=device)
    handle = load_tokenizer(job["model_dir"])
    corpus = load_corpus(job["corpus_dir"]).select(every=job.get("every"), first=job["docs"])
    load_s = time.perf_counter() - t_start
    rss_loaded, hwm_loaded = _proc_status_mib("VmRSS"), _proc_status_mib("VmHWM")
    if job.get("warmup"):
        warm_up(checkpoint.model, device)

    spec = ScoringSpec(max_context=job["max_length"], disjoint=True, dtype=job["dtype"], device=device,
                       batch_size=job["batch_size"]).resolve(checkpoint.max_positions)
    t0 = time.perf_counter()
    token_seqs = handle.encode_documents(corpus)
    t_tokenized = time.perf_counter()
    out = score_token_sequences(checkpoint.model, token_seqs, handle.prefix_token_id, spec,
                                with_tcb=False, progress=False)
    wall = time.perf_counter() - t0
    return {
        "doc_ids": [d.id for d in corpus.documents],
        "doc_nll": [float(x) for x in out.doc_nll],
        "doc_ntok": [int(x) for x in out.doc_ntok],
        "doc_bytes": [d.n_bytes for d in corpus.documents],
        "doc_raw_tokens": [len(s) for s in token_seqs],
        "ids_sha256": ids_digest(token_seqs),
        "prefix_token_id": handle.prefix_token_id, "prefix_policy": handle.prefix_policy,
        "prefix_token": handle.bos_token if handle.prefix_policy == "bos" else handle.eos_token,
        "window": spec.window, "stride": spec.stride, "dtype": spec.dtype, "batch_size": spec.batch_size,
        "n_params": checkpoint.n_params, "model_dtype": str(next(checkpoint.model.parameters()).dtype),
        "n_windows": out.n_windows, "n_input_tokens": out.n_input_tokens,
        "load_s": load_s, "tokenize_s": t_tokenized - t0, "score_s": out.wall_s, "wall_s": wall,
        "device": device, "peak_memory_in_scoring_bytes": out.peak_memory_bytes,
        "rss_loaded_mib": rss_loaded, "hwm_loaded_mib": hwm_loaded,
        "threads": torch.get_num_threads(), "torch": torch.__version__,
        "keep_freed_memory": keep_freed_memory(),    # already made by score_token_sequences on the CPU
        "corpus_sha256": corpus.sha256, "corpus_selection": corpus.selection,
    }


def worker_lm_eval(job: dict[str, Any]) -> dict[str, Any]:
    # lm-eval resolves the task's relative data file against the working directory.
    os.chdir(REPO_ROOT)
    import lm_eval
    import torch
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    kept = None
    if job.get("keep_freed_memory"):
        from monitor.scoring.host_memory import keep_freed_memory

        kept = keep_freed_memory()
    device = job.get("device", "cpu")
    t_start = time.perf_counter()
    options = {"softmax_dtype": job["softmax_dtype"]} if job.get("softmax_dtype") else {}
    lm = HFLM(pretrained=job["model_dir"], dtype=job["dtype"], device=device, batch_size=job["batch_size"],
              max_length=job["max_length"], prefix_token_id=job["prefix_token_id"], trust_remote_code=False,
              **options)
    load_s = time.perf_counter() - t_start
    rss_loaded, hwm_loaded = _proc_status_mib("VmRSS"), _proc_status_mib("VmHWM")
    if job.get("warmup"):
        warm_up(lm.model, device)

    # Time the harness's own rolling-loglikelihood call and keep its per-document answers;
    # the evaluator looks the method up on the instance, so wrapping it changes nothing else.
    rolling = lm.loglikelihood_rolling
    calls: list[dict[str, Any]] = []

    def timed_rolling(requests, disable_tqdm: bool = False):
        t0 = time.perf_counter()
        answers = rolling(requests, disable_tqdm=disable_tqdm)
        calls.append({"seconds": time.perf_counter() - t0, "ids": [r.doc["id"] for r in requests],
                      "texts": [r.args[0] for r in requests], "loglikelihoods": [float(a) for a in answers]})
        return answers

    lm.loglikelihood_rolling = timed_rolling
    manager = TaskManager(include_path=str(TASK_DIR), include_defaults=False)
    t0 = time.perf_counter()
    results = simple_evaluate(model=lm, tasks=[TASK_NAME], task_manager=manager, bootstrap_iters=0,
                              log_samples=False)
    evaluate_s = time.perf_counter() - t0
    if len(calls) != 1:
        raise RuntimeError(f"expected one loglikelihood_rolling call, saw {len(calls)}")
    call = calls[0]
    # Corpus order (the data file's), whatever order the harness issued the requests in.
    file_order = [json.loads(line)["id"] for line in TASK_DATA_FILE.read_text(encoding="utf-8").splitlines()]
    position = {doc_id: i for i, doc_id in enumerate(call["ids"])}
    call = {key: [call[key][position[doc_id]] for doc_id in file_order] if key != "seconds" else call[key]
            for key in call}
    # The ids lm-eval scored, from its own tok_encode (what loglikelihood_rolling encodes).
    token_seqs = [lm.tok_encode(text) for text in call["texts"]]
    metrics = results["results"][TASK_NAME]
    return {
        "doc_ids": call["ids"],
        "doc_nll": [-x for x in call["loglikelihoods"]],
        "doc_ntok": [len(s) for s in token_seqs],
        "doc_bytes": [len(t.encode("utf-8")) for t in call["texts"]],
        "ids_sha256": ids_digest(token_seqs),
        "bits_per_byte": metrics.get("bits_per_byte,none"),
        "byte_perplexity": metrics.get("byte_perplexity,none"),
        "word_perplexity": metrics.get("word_perplexity,none"),
        "prefix_token_id": lm.prefix_token_id, "prefix_token": lm.tokenizer.convert_ids_to_tokens(lm.prefix_token_id),
        "tokenizer_bos": lm.tokenizer.bos_token, "tokenizer_eos": lm.tokenizer.eos_token,
        "tokenizer_class": type(lm.tokenizer).__name__,
        "window": lm.max_length, "batch_size": lm.batch_size, "softmax_dtype": str(lm.softmax_dtype),
        "n_params": sum(p.numel() for p in lm.model.parameters()), "model_dtype": str(next(lm.model.parameters()).dtype),
        "load_s": load_s, "score_s": call["seconds"], "wall_s": call["seconds"], "evaluate_s": evaluate_s,
        "device": device,
        "rss_loaded_mib": rss_loaded, "hwm_loaded_mib": hwm_loaded,
        "threads": torch.get_num_threads(), "lm_eval": lm_eval.__version__, "torch": torch.__version__,
        "keep_freed_memory": kept,
    }


WORKERS = {"peak": worker_peak, "ours": worker_ours, "lm_eval": worker_lm_eval}


def run_worker_main(kind: str, job_path: Path) -> int:
    job = json.loads(job_path.read_text())
    if job.get("threads"):
        import torch

        torch.set_num_threads(int(job["threads"]))
    result = WORKERS[kind](job)
    Path(job["result_path"]).write_text(json.dumps(result))
    return 0


# --------------------------------------------------------------------------- orchestration


def run_side(name: str, kind: str, job: dict[str, Any], run_dir: Path, env: dict[str, str], *,
             script: Path | None = None) -> dict[str, Any]:
    """Run one worker subprocess (of this script, or of `script`, which takes the same
    `--worker KIND --job FILE`); return its result plus wall time and peak RSS (wait4)."""
    job = dict(job, result_path=str(run_dir / f"{name}.result.json"))
    job_path = run_dir / f"{name}.job.json"
    job_path.write_text(json.dumps(job, indent=1))
    log_path = run_dir / f"{name}.log"
    print(f"  running {name:8s} ...", end="", flush=True)
    t0 = time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, str(script or Path(__file__).resolve()), "--worker", kind,
                                 "--job", str(job_path)],
                                stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(REPO_ROOT))
        _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    elapsed = time.perf_counter() - t0
    peak_mib = usage.ru_maxrss / MIB  # Linux reports KiB
    if proc.returncode != 0:
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-25:])
        print(f" FAILED (exit {proc.returncode}, {elapsed:.0f} s); log {log_path}\n{tail}")
        return {"error": f"exit {proc.returncode}", "log": str(log_path), "process_s": elapsed}
    result = json.loads(Path(job["result_path"]).read_text())
    result.update(peak_rss_mib=peak_mib, process_s=elapsed, cpu_user_s=usage.ru_utime, cpu_sys_s=usage.ru_stime,
                  log=str(log_path))
    print(f" done in {elapsed:.0f} s, peak RSS {peak_mib:,.0f} MiB", flush=True)
    return result


def tune_batch_sizes(sizes: list[int], docs: int, ours_job: dict[str, Any], lm_eval_job: dict[str, Any],
                     run_dir: Path, env: dict[str, str]) -> dict[str, Any]:
    """tokens/s of each float32 side at each batch size on the first `docs` documents
    (the two sides interleaved, so a change in machine load hits both alike)."""
    print(f"tuning batch sizes {sizes} on the first {docs} documents", flush=True)
    found: dict[str, dict[int, float]] = {"ours": {}, "lm_eval": {}}
    for size in sizes:
        for kind, job in (("ours", ours_job), ("lm_eval", lm_eval_job)):
            result = run_side(f"tune-{kind}-b{size}", kind, dict(job, docs=docs, batch_size=size), run_dir, env)
            if "error" not in result:
                found[kind][size] = sum(result["doc_ntok"]) / result["wall_s"]
    summary = {kind: {"tokens_per_s": rates, "best": max(rates, key=rates.get) if rates else None}
               for kind, rates in found.items()}
    for kind, info in summary.items():
        rates = ", ".join(f"b{k}: {v:.1f}" for k, v in info["tokens_per_s"].items())
        print(f"  {kind}: {rates} tokens/s -> batch size {info['best']}", flush=True)
    return summary


def best_peak(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per dtype, the better of several peak measurements (each run's result kept in `runs`)."""
    good = [run for run in runs if "error" not in run]
    if not good:
        return runs[0]
    best: dict[str, Any] = {dtype: max((run[dtype] for run in good), key=lambda r: r["gflops"])
                            for dtype in ("float32", "bfloat16")}
    best["runs"] = runs
    return best


def write_task_data(corpus, path: Path) -> None:
    """The corpus documents as the JSONL the lm-eval task reads (one row per document)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for d in corpus.documents:
            f.write(json.dumps({"id": d.id, "slice": d.slice, "text": d.text}, ensure_ascii=False) + "\n")


def bits_per_byte(nll: list[float], n_bytes: list[int]) -> float:
    return sum(nll) / sum(n_bytes) / math.log(2)


def rel(a: float, b: float) -> float:
    return abs(a - b) / abs(b) if b else float("nan")


def _reorder(side: dict[str, Any], doc_ids: list[str]) -> None:
    """Put a side's per-document lists in the order of `doc_ids` (the harness may reorder)."""
    where = {doc_id: i for i, doc_id in enumerate(side["doc_ids"])}
    order = [where[doc_id] for doc_id in doc_ids]
    for key in ("doc_ids", "doc_nll", "doc_ntok", "doc_bytes"):
        side[key] = [side[key][i] for i in order]


def _ok(side: dict[str, Any] | None) -> bool:
    return bool(side) and "error" not in side


def add_rates(side: dict[str, Any], name: str, peak: dict[str, Any] | None, model_config: dict[str, Any],
              window: int) -> None:
    """tokens/s, achieved GFLOP/s and its share of the measured peak of the side's dtype."""
    side["n_tokens"] = sum(side["doc_ntok"])
    side.setdefault("bits_per_byte", bits_per_byte(side["doc_nll"], side["doc_bytes"]))
    side["tokens_per_s"] = side["n_tokens"] / side["wall_s"]
    n_layers = int(model_config.get("num_hidden_layers") or model_config.get("n_layer") or 0)
    heads = int(model_config.get("num_attention_heads") or model_config.get("n_head") or 0)
    hidden = int(model_config.get("hidden_size") or model_config.get("n_embd") or 0)
    head_dim = int(model_config.get("head_dim") or (hidden // heads if heads else 0))
    matmul_params = side["n_params"]
    if not model_config.get("tie_word_embeddings", False):
        matmul_params -= int(model_config.get("vocab_size") or 0) * hidden   # the input-embedding table
    flops = forward_flops(side["doc_ntok"], window, matmul_params, n_layers, heads * head_dim)
    side["flops"] = flops
    side["gflops_per_s"] = flops["total"] / side["wall_s"] / 1e9
    if _ok(peak):
        dtype = "bfloat16" if name == "bf16" else "float32"
        side["peak_share"] = side["gflops_per_s"] / peak[dtype]["gflops"]


def compare(sides: dict[str, Any], model_config: dict[str, Any], window: int) -> dict[str, Any]:
    """Every figure the report prints, from the raw side results (missing or failed sides
    leave their figures out)."""
    ours, lm, bf16, peak = (sides.get(k) for k in ("ours", "lm_eval", "bf16", "peak"))
    heap = sides.get("lm_eval_heap")
    for name, side in (("ours", ours), ("lm_eval", lm), ("bf16", bf16), ("lm_eval_heap", heap)):
        if _ok(side):
            add_rates(side, name, peak, model_config, window)
    cmp: dict[str, Any] = {}
    if _ok(ours) and _ok(lm):
        if sorted(ours["doc_ids"]) != sorted(lm["doc_ids"]):
            raise RuntimeError("the two sides scored different documents")
        _reorder(lm, ours["doc_ids"])
        cmp["same_token_ids"] = ours["ids_sha256"] == lm["ids_sha256"]
        cmp["same_scored_tokens"] = ours["doc_ntok"] == lm["doc_ntok"]
        cmp["same_bytes"] = ours["doc_bytes"] == lm["doc_bytes"]
        cmp["same_prefix"] = ours["prefix_token_id"] == lm["prefix_token_id"]
        cmp["same_window"] = ours["window"] == lm["window"]
        cmp["doc_nll_max_rel_diff"] = max(rel(a, b) for a, b in zip(ours["doc_nll"], lm["doc_nll"]))
        cmp["doc_nll_mean_signed_rel_diff"] = sum((a - b) / b for a, b in zip(ours["doc_nll"], lm["doc_nll"])) / len(lm["doc_nll"])
        cmp["bpb_ours"] = bits_per_byte(ours["doc_nll"], ours["doc_bytes"])
        cmp["bpb_lm_eval"] = lm["bits_per_byte"]
        cmp["bpb_lm_eval_from_docs"] = bits_per_byte(lm["doc_nll"], lm["doc_bytes"])
        cmp["bpb_rel_diff"] = rel(cmp["bpb_ours"], cmp["bpb_lm_eval"])
        cmp["speedup_fp32"] = ours["tokens_per_s"] / lm["tokens_per_s"]
        cmp["rss_ratio"] = ours["peak_rss_mib"] / lm["peak_rss_mib"]
    if _ok(heap) and _ok(ours) and sorted(heap["doc_ids"]) == sorted(ours["doc_ids"]):
        _reorder(heap, ours["doc_ids"])
        cmp["speedup_fp32_same_allocator"] = ours["tokens_per_s"] / heap["tokens_per_s"]
        cmp["bpb_rel_diff_same_allocator"] = rel(ours["bits_per_byte"], heap["bits_per_byte"])
        cmp["rss_ratio_same_allocator"] = ours["peak_rss_mib"] / heap["peak_rss_mib"]
    f64 = sides.get("lm_eval_f64")
    if _ok(f64) and _ok(ours):
        _reorder(f64, [doc_id for doc_id in ours["doc_ids"] if doc_id in set(f64["doc_ids"])])
        k = len(f64["doc_ids"])
        if ours["doc_ids"][:k] == f64["doc_ids"]:
            cmp["f64_docs"] = k
            cmp["f64_doc_nll_max_rel_diff"] = max(rel(a, b) for a, b in zip(ours["doc_nll"][:k], f64["doc_nll"]))
            cmp["f64_bpb_rel_diff"] = rel(bits_per_byte(ours["doc_nll"][:k], ours["doc_bytes"][:k]), f64["bits_per_byte"])
            if _ok(lm):
                cmp["f64_vs_f32_lm_eval_bpb_rel_diff"] = rel(bits_per_byte(lm["doc_nll"][:k], lm["doc_bytes"][:k]),
                                                             f64["bits_per_byte"])
    if _ok(bf16):
        if _ok(lm):
            cmp["speedup_bf16_vs_lm_eval_fp32"] = bf16["tokens_per_s"] / lm["tokens_per_s"]
        if _ok(ours):
            cmp["speedup_bf16_vs_ours_fp32"] = bf16["tokens_per_s"] / ours["tokens_per_s"]
            k = len(bf16["doc_ids"])
            if ours["doc_ids"][:k] == bf16["doc_ids"]:
                ref = bits_per_byte(ours["doc_nll"][:k], ours["doc_bytes"][:k])
                cmp["bpb_bf16"] = bits_per_byte(bf16["doc_nll"], bf16["doc_bytes"])
                cmp["bpb_fp32_same_docs"] = ref
                cmp["bpb_bf16_rel_dev"] = (cmp["bpb_bf16"] - ref) / ref
    return cmp


# --------------------------------------------------------------------------- report


def _f(x: Any, spec: str = ",.1f") -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def _cpu(side: dict[str, Any]) -> float | None:
    return side["cpu_user_s"] + side["cpu_sys_s"] if "cpu_user_s" in side else None


def _x(x: Any) -> str:
    return "n/a" if x is None else f"{x:.2f}x"


def _mark(ok: bool | None) -> str:
    return "n/a" if ok is None else ("met" if ok else "MISSED")


def _tuning_text(tuning: dict[str, Any]) -> str:
    return "; ".join(f"{kind} " + ", ".join(f"b{k} {v:.1f}" for k, v in info["tokens_per_s"].items()) + " tok/s"
                     for kind, info in tuning.items())


def render(report: dict[str, Any]) -> tuple[str, str]:
    """(plain-text report, Markdown table)."""
    s, c = report["sides"], report["comparison"]
    ours, lm, bf16, peak = s.get("ours", {}), s.get("lm_eval", {}), s.get("bf16") or {}, s.get("peak") or {}
    p32 = peak.get("float32", {}).get("gflops")
    p16 = peak.get("bfloat16", {}).get("gflops")
    m = report["meta"]
    lines = [
        f"lstar vs lm-evaluation-harness {m.get('lm_eval_version', '?')} — {m['model_name']} on "
        f"{m['corpus']} ({m['n_docs']} docs, {_f(ours.get('n_tokens'), ',d')} scored tokens, {m['n_bytes']:,} bytes)",
        f"window {m['max_length']} disjoint; prefix {ours.get('prefix_token')!r} (id {ours.get('prefix_token_id')}) "
        f"on our side, {lm.get('prefix_token')!r} (id {lm.get('prefix_token_id')}) on lm-eval's; "
        f"CPU, {ours.get('threads', '?')} torch threads; {m['cpu']}",
        "",
        f"{'':34s}{'lstar':>16s}{'lm-eval':>16s}   comparison",
        f"{'batch size':34s}{_f(ours.get('batch_size'), 'd'):>16s}{_f(lm.get('batch_size'), 'd'):>16s}"
        + (f"   tuned: {_tuning_text(m['batch_size_tuning'])}" if m.get("batch_size_tuning") else ""),
        f"{'tokens/s (float32)':34s}{_f(ours.get('tokens_per_s')):>16s}{_f(lm.get('tokens_per_s')):>16s}"
        f"   ratio {_x(c.get('speedup_fp32'))} (target >= {TARGETS['speedup_fp32']}x: "
        f"{_mark(None if 'speedup_fp32' not in c else c['speedup_fp32'] >= TARGETS['speedup_fp32'])})",
        f"{'scoring seconds':34s}{_f(ours.get('wall_s')):>16s}{_f(lm.get('wall_s')):>16s}"
        f"   (lm-eval simple_evaluate: {_f(lm.get('evaluate_s'))} s)",
        f"{'bits/byte':34s}{_f(ours.get('bits_per_byte'), '.8f'):>16s}{_f(lm.get('bits_per_byte'), '.8f'):>16s}"
        f"   rel diff {_f(c.get('bpb_rel_diff'), '.2e')} (target <= {TARGETS['bpb_rel_diff']:.0e}: "
        f"{_mark(None if 'bpb_rel_diff' not in c else c['bpb_rel_diff'] <= TARGETS['bpb_rel_diff'])});"
        f" max per-doc NLL rel diff {_f(c.get('doc_nll_max_rel_diff'), '.2e')}",
        f"{'peak RSS (MiB)':34s}{_f(ours.get('peak_rss_mib'), ',.0f'):>16s}{_f(lm.get('peak_rss_mib'), ',.0f'):>16s}"
        f"   ratio {_f(c.get('rss_ratio'), '.2f')} (target <= 1: "
        f"{_mark(None if 'rss_ratio' not in c else c['rss_ratio'] <= 1.0)})",
        f"{'RSS after model load (MiB)':34s}{_f(ours.get('rss_loaded_mib'), ',.0f'):>16s}"
        f"{_f(lm.get('rss_loaded_mib'), ',.0f'):>16s}",
        f"{'achieved GFLOP/s':34s}{_f(ours.get('gflops_per_s')):>16s}{_f(lm.get('gflops_per_s')):>16s}",
        f"{'share of float32 matmul peak':34s}{_f(ours.get('peak_share'), '.1%'):>16s}{_f(lm.get('peak_share'), '.1%'):>16s}"
        f"   peak {_f(p32)} GFLOP/s",
        f"same token ids: {c.get('same_token_ids')}; same scored tokens per doc: {c.get('same_scored_tokens')}; "
        f"same bytes: {c.get('same_bytes')}; same prefix id: {c.get('same_prefix')}; same window: {c.get('same_window')}",
        f"mean signed per-doc NLL rel diff (lstar - lm-eval)/lm-eval: {_f(c.get('doc_nll_mean_signed_rel_diff'), '+.2e')}; "
        f"lm-eval softmax_dtype: {lm.get('softmax_dtype')} (float32 log_softmax unless set)",
        *([f"lm-eval with softmax_dtype=float64 on the first {c['f64_docs']} docs: bits/byte rel diff vs lstar "
           f"{_f(c.get('f64_bpb_rel_diff'), '.2e')} (max per-doc {_f(c.get('f64_doc_nll_max_rel_diff'), '.2e')}); "
           f"lm-eval float32 vs float64 softmax on those docs: {_f(c.get('f64_vs_f32_lm_eval_bpb_rel_diff'), '.2e')}"]
          if "f64_docs" in c else []),
        f"{'process CPU s, user+sys (incl. load)':34s}{_f(_cpu(ours)):>16s}{_f(_cpu(lm)):>16s}",
        f"{'of which system s':34s}{_f(ours.get('cpu_sys_s')):>16s}{_f(lm.get('cpu_sys_s')):>16s}",
        *([f"lm-eval with our glibc setting (freed memory kept, monitor.scoring.host_memory): "
           f"{_f(s['lm_eval_heap']['tokens_per_s'])} tokens/s, system {_f(s['lm_eval_heap'].get('cpu_sys_s'))} s, "
           f"peak RSS {_f(s['lm_eval_heap']['peak_rss_mib'], ',.0f')} MiB; lstar / that = "
           f"{_x(c['speedup_fp32_same_allocator'])}; bits/byte rel diff {_f(c.get('bpb_rel_diff_same_allocator'), '.2e')}"]
          if "speedup_fp32_same_allocator" in c else []),
        "",
    ]
    if bf16:
        if "error" in bf16:
            lines.append(f"bf16 path: failed ({bf16['error']}, see {bf16.get('log')})")
        else:
            lines += [
                f"bf16 CPU path ({len(bf16['doc_ids'])} first docs, {bf16['n_tokens']:,} tokens, batch {bf16['batch_size']}): "
                f"{_f(bf16['tokens_per_s'])} tokens/s = {_x(c.get('speedup_bf16_vs_lm_eval_fp32'))} lm-eval float32 "
                f"(target >= {TARGETS['speedup_bf16']}x: "
                f"{_mark(None if 'speedup_bf16_vs_lm_eval_fp32' not in c else c['speedup_bf16_vs_lm_eval_fp32'] >= TARGETS['speedup_bf16'])}), "
                f"{_x(c.get('speedup_bf16_vs_ours_fp32'))} ours float32",
                f"  bits/byte {_f(c.get('bpb_bf16'), '.6f')} vs float32 {_f(c.get('bpb_fp32_same_docs'), '.6f')} on the same docs: "
                f"deviation {_f(c.get('bpb_bf16_rel_dev'), '+.2e')}; peak RSS {_f(bf16['peak_rss_mib'], ',.0f')} MiB; "
                f"{_f(bf16.get('gflops_per_s'))} GFLOP/s = {_f(bf16.get('peak_share'), '.1%')} of the bf16 matmul peak",
            ]
    lines += [
        f"matmul peak (torch.matmul, square, best of sizes and layouts): float32 {_f(p32)} GFLOP/s "
        f"(n={peak.get('float32', {}).get('n')}), bf16 {_f(p16)} GFLOP/s (n={peak.get('bfloat16', {}).get('n')})",
        "FLOPs per pass of T input tokens = 2*n_params*T + 2*n_layers*d_attn*T*(T+1) (matmul weights, the "
        f"output matrix once and the embedding lookup not at all; plus causal QK^T and AV); n_params {_f(m.get('n_params'), ',d')}, "
        f"n_layers {m.get('n_layers')}, d_attn {m.get('d_attn')}",
    ]
    text = "\n".join(lines)

    rows = [
        "| metric | lstar (float32) | lm-eval 0.4.13 (float32) | lstar (bf16 CPU) |",
        "|---|---:|---:|---:|",
        f"| tokens/s | {_f(ours.get('tokens_per_s'))} | {_f(lm.get('tokens_per_s'))} | {_f(bf16.get('tokens_per_s'))} |",
        f"| throughput vs lm-eval | {_x(c.get('speedup_fp32'))} | 1.00x | {_x(c.get('speedup_bf16_vs_lm_eval_fp32'))} |",
        *([f"| throughput vs lm-eval with the same glibc setting | {_x(c['speedup_fp32_same_allocator'])} | "
           f"1.00x ({_f(s['lm_eval_heap']['tokens_per_s'])} tokens/s) | — |"] if "speedup_fp32_same_allocator" in c else []),
        f"| bits/byte | {_f(ours.get('bits_per_byte'), '.6f')} | {_f(lm.get('bits_per_byte'), '.6f')} | {_f(bf16.get('bits_per_byte'), '.6f')} |",
        f"| bits/byte rel. diff | {_f(c.get('bpb_rel_diff'), '.1e')} (vs lm-eval) | — | {_f(c.get('bpb_bf16_rel_dev'), '+.1e')} (vs float32) |",
        f"| peak RSS | {_f(ours.get('peak_rss_mib'), ',.0f')} MiB | {_f(lm.get('peak_rss_mib'), ',.0f')} MiB | {_f(bf16.get('peak_rss_mib'), ',.0f')} MiB |",
        f"| achieved GFLOP/s (share of matmul peak) | {_f(ours.get('gflops_per_s'))} ({_f(ours.get('peak_share'), '.0%')}) | "
        f"{_f(lm.get('gflops_per_s'))} ({_f(lm.get('peak_share'), '.0%')}) | {_f(bf16.get('gflops_per_s'))} ({_f(bf16.get('peak_share'), '.0%')} of bf16 peak) |",
    ]
    bf16_note = f"; bf16 column: first {len(bf16['doc_ids'])} docs" if "doc_ids" in bf16 else ""
    caption = (f"\n{m['model_name']}, {m['corpus']} ({m['n_docs']} docs{bf16_note}), "
               f"window {m['max_length']} disjoint, {m['cpu']}, {ours.get('threads', '?')} threads; "
               f"measured matmul peak float32 {_f(p32)} / bf16 {_f(p16)} GFLOP/s; {m['date']}.")
    return text, "\n".join(rows) + caption


# --------------------------------------------------------------------------- main


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()} x{os.cpu_count()}"
    except OSError:
        pass
    return f"{platform.processor() or platform.machine()} x{os.cpu_count()}"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Score a model with lstar and lm-evaluation-harness side by side.")
    parser.add_argument("--model", type=Path, default=None,
                        help="checkpoint folder with tokenizer files (default: SmolLM2-135M from monitor.scoring.smollm2)")
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS, help="corpus folder (default ../shared/corpus/calib-v0)")
    parser.add_argument("--docs", type=int, default=None, help="score only the first K documents")
    parser.add_argument("--max-length", type=int, default=2048, help="window length of both sides")
    parser.add_argument("--batch-size", type=int, default=4, help="our batch size (windows per forward)")
    parser.add_argument("--lm-eval-batch-size", type=int, default=1, help="lm-eval's batch size")
    parser.add_argument("--bf16-docs", type=int, default=2,
                        help="documents for the bf16 run (0 skips it; bf16 matmuls are slow on CPUs without AVX512-BF16/AMX)")
    parser.add_argument("--bf16-batch-size", type=int, default=None, help="batch size of the bf16 run (default: --batch-size)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads on every side (default: torch's choice)")
    parser.add_argument("--peak-budget-s", type=float, default=10.0, help="seconds per dtype for the matmul peak")
    parser.add_argument("--f64-docs", type=int, default=2,
                        help="documents for the lm-eval run with softmax_dtype=float64 (0 skips it)")
    parser.add_argument("--sides", default="peak,ours,lm_eval,lm_eval_heap,lm_eval_f64,bf16",
                        help="which runs to make, comma-separated from peak,ours,lm_eval,lm_eval_heap,lm_eval_f64,bf16")
    parser.add_argument("--lm-eval-softmax-dtype", default=None,
                        help="lm-eval's softmax_dtype model argument (default: lm-eval's, the logits' dtype)")
    parser.add_argument("--tune", default=None, metavar="SIZES",
                        help="try these batch sizes (e.g. 1,2,4,8) on both float32 sides first and use each side's fastest")
    parser.add_argument("--tune-docs", type=int, default=6, help="first documents used by --tune")
    parser.add_argument("--out", type=Path, default=OUT_DIR, help="folder for the JSON, Markdown and logs")
    parser.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    parser.add_argument("--job", type=Path, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def write_report(report: dict[str, Any], render: Any, out: Path, stem: str) -> None:
    """Print the rendered report and its Markdown table; write OUT/STEM.json and OUT/STEM.md."""
    text, table = render(report)
    print("\n" + text + "\n\nMarkdown:\n\n" + table + "\n")
    out.mkdir(parents=True, exist_ok=True)
    json_path = out / f"{stem}.json"
    json_path.write_text(json.dumps(report, indent=1, default=str))
    (out / f"{stem}.md").write_text(text + "\n\n" + table + "\n")
    print(f"wrote {json_path}")


def model_folder(model: str | Path | None) -> tuple[Path, dict[str, Any]]:
    """The model folder to benchmark (default: SmolLM2-135M, converted once and cached) and
    its config.json."""
    if model is None:
        from monitor.scoring.smollm2 import ensure_smollm2

        print("preparing SmolLM2-135M (converted once, then cached) ...", flush=True)
        model = ensure_smollm2()
    folder = Path(model).resolve()
    return folder, json.loads((folder / "config.json").read_text())


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        return run_worker_main(args.worker, args.job)

    from monitor.scoring.corpus import load_corpus

    model_dir, model_config = model_folder(args.model)
    corpus = load_corpus(args.corpus)
    if args.docs is not None:
        corpus = corpus.select(first=args.docs)
    n_docs = len(corpus.documents)
    bf16_docs = min(args.bf16_docs, n_docs)
    f64_docs = min(args.f64_docs, n_docs)

    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    run_dir = (args.out / f"run-{stamp}").resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, **WORKER_ENV, HF_DATASETS_CACHE=str((args.out / "hf_datasets_cache").resolve()),
               PYTHONPATH=os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p))
    if args.threads:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(args.threads)

    from monitor.scoring.tokenizer import load_tokenizer

    handle = load_tokenizer(model_dir)
    base = {"model_dir": str(model_dir), "corpus_dir": str(args.corpus.resolve()), "docs": n_docs,
            "max_length": args.max_length, "threads": args.threads, "peak_budget_s": args.peak_budget_s}
    print(f"model {model_dir}\ncorpus {corpus.name} {corpus.version}: {n_docs} documents, {corpus.n_bytes:,} bytes; "
          f"logs in {run_dir}", flush=True)
    lm_eval_job = dict(base, dtype="float32", prefix_token_id=handle.prefix_token_id,
                       softmax_dtype=args.lm_eval_softmax_dtype)
    tuning = None
    if args.tune:
        tune_corpus = corpus.select(first=min(args.tune_docs, n_docs))
        write_task_data(tune_corpus, TASK_DATA_FILE)
        tuning = tune_batch_sizes([int(x) for x in args.tune.split(",")], len(tune_corpus.documents),
                                  dict(base, dtype="float32"), lm_eval_job, run_dir, env)
        args.batch_size = tuning["ours"]["best"] or args.batch_size
        args.lm_eval_batch_size = tuning["lm_eval"]["best"] or args.lm_eval_batch_size
    write_task_data(corpus, TASK_DATA_FILE)
    sides: dict[str, Any] = {}
    wanted = set(args.sides.split(","))
    if "peak" in wanted:
        peak_runs = [run_side("peak", "peak", base, run_dir, env)]
    if "ours" in wanted:
        sides["ours"] = run_side("ours", "ours", dict(base, dtype="float32", batch_size=args.batch_size), run_dir, env)
    if "lm_eval" in wanted:
        sides["lm_eval"] = run_side("lm_eval", "lm_eval", dict(lm_eval_job, batch_size=args.lm_eval_batch_size),
                                    run_dir, env)
    if "lm_eval_heap" in wanted:
        sides["lm_eval_heap"] = run_side("lm_eval_heap", "lm_eval", dict(
            lm_eval_job, batch_size=args.lm_eval_batch_size, keep_freed_memory=True), run_dir, env)
    if "lm_eval_f64" in wanted and f64_docs:
        write_task_data(corpus.select(first=f64_docs), TASK_DATA_FILE)
        sides["lm_eval_f64"] = run_side("lm_eval_f64", "lm_eval", dict(
            lm_eval_job, docs=f64_docs, batch_size=args.lm_eval_batch_size, softmax_dtype="float64"), run_dir, env)
        write_task_data(corpus, TASK_DATA_FILE)
    if "bf16" in wanted and bf16_docs:
        sides["bf16"] = run_side("bf16", "ours", dict(base, docs=bf16_docs, dtype="bfloat16",
                                                      batch_size=args.bf16_batch_size or args.batch_size), run_dir, env)

    if "peak" in wanted:
        # Measured again at the end: on a shared machine the better of the two is nearer the truth.
        peak_runs.append(run_side("peak-end", "peak", base, run_dir, env))
        sides["peak"] = best_peak(peak_runs)
    comparison = compare(sides, model_config, args.max_length)
    ours, lm = sides.get("ours") or {}, sides.get("lm_eval") or {}
    heads = int(model_config.get("num_attention_heads", 0))
    head_dim = int(model_config.get("head_dim") or (model_config.get("hidden_size", 0) // heads if heads else 0))
    meta = {
        "date": dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "model_dir": str(model_dir), "model_name": model_dir.name,
        "corpus": f"{corpus.name}-{corpus.version}", "corpus_sha256": corpus.sha256, "selection": corpus.selection,
        "n_docs": n_docs, "n_bytes": corpus.n_bytes, "max_length": args.max_length,
        "cpu": _cpu_name(), "python": platform.python_version(),
        "lm_eval_version": lm.get("lm_eval"), "torch": ours.get("torch") or lm.get("torch"),
        "n_params": next((side["n_params"] for side in sides.values() if isinstance(side, dict) and "n_params" in side), None),
        "n_layers": model_config.get("num_hidden_layers"), "d_attn": heads * head_dim,
        "argv": sys.argv[1:], "run_dir": str(run_dir), "batch_size_tuning": tuning,
        "matched": {
            "tokenizer": "both load the tokenizer files of the model folder (ours: tokenizers.Tokenizer from "
                         "tokenizer.json, add_special_tokens=False; lm-eval: AutoTokenizer, its default encode); "
                         "token ids compared by sha256",
            "prefix": "ours: BOS if defined else EOS (spec); lm-eval: prefix_token_id passed explicitly, the same id",
            "windows": f"disjoint windows of {args.max_length} (lm-eval max_length={args.max_length}, rolling windows "
                       "with context_len=1)",
            "dtype": "float32 weights and logits on both sides; log-softmax in float32",
        },
    }
    report = {"meta": meta, "comparison": comparison, "sides": sides}
    write_report(report, render, args.out, f"score_vs_lm_eval-{stamp}")
    failed = [name for name, side in sides.items() if isinstance(side, dict) and "error" in side]
    if failed:
        print(f"failed sides: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
