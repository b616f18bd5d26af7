"""lstar's scorer on a GPU: bf16 against float32, and against lm-evaluation-harness, in one run.

Scores SmolLM2-135M (or `--model DIR`) on calib-v0 (or `--corpus DIR`) on `--device`
(default cuda) several times, each in its own subprocess so each peak (GPU memory, RSS)
is its own:

1. `peak`            — this device's bf16 and float32 matmul peak (benchmarks/matmul_peak.py;
                       skipped for a dtype whose peak is given with --peak-tflops*);
2. `ours-<dtype>`    — monitor.scoring.forward in disjoint mode, in `--dtype` (default bfloat16)
                       and in float32: the chunked output head, log-softmax in float32;
3. `lm_eval-<dtype>` — lm-evaluation-harness `loglikelihood_rolling` (HFLM, the local task
                       benchmarks/lm_eval_task/lstar_calib_rolling.yaml) in the same dtypes,
                       lm-eval's defaults otherwise (its log-softmax runs in the logits' dtype).

The workers are benchmarks/score_vs_lm_eval.py's, so both sides see the same model folder,
tokenizer files, prefix token and disjoint windows, and the script checks that every run
tokenized every document to the same ids. Every run starts with one untimed forward pass.

Per run it prints tokens/s (scored tokens / seconds from "model loaded" to "per-document
NLLs known", tokenization included), bits/byte, peak GPU memory
(`torch.cuda.max_memory_allocated` over the whole worker, weights included), achieved
TFLOP/s and MFU: model FLOPs (2·n_params·T + 2·n_layers·d_attn·T·(T+1) per pass of T
tokens, as in score_vs_lm_eval.py) over the seconds, divided by the matmul peak of the
run's dtype. Then, per dtype, lstar/lm-eval throughput and bits/byte difference, and per
side the bits/byte difference of `--dtype` against float32.

    python benchmarks/gpu_score.py                                   # a CUDA machine
    python benchmarks/gpu_score.py --device cpu --dtype float32 --every 24 --max-length 512
                                                                     # smoke run on a CPU

A run on the CPU is labelled a CPU smoke run in every line it prints: its numbers say the
script works, nothing about a GPU. Writes JSON and Markdown to benchmarks/out/.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

BENCHMARKS = Path(__file__).resolve().parent
REPO_ROOT = BENCHMARKS.parent
for entry in (str(REPO_ROOT), str(BENCHMARKS)):
    if entry not in sys.path:
        sys.path.insert(0, entry)

import score_vs_lm_eval as base  # noqa: E402  (a sibling script: the shared workers and helpers)

MIB = float(1 << 20)


# --------------------------------------------------------------------------- worker (subprocess)


def run_worker_main(kind: str, job_path: Path) -> int:
    """One run in this process: base's worker, plus what the GPU says about it."""
    job = json.loads(job_path.read_text())
    import torch

    if job.get("threads"):
        torch.set_num_threads(int(job["threads"]))
    device = job["device"]
    cuda = device.startswith("cuda")
    if kind == "peak":
        from matmul_peak import measure_matmul_peak

        result: dict[str, Any] = {name: measure_matmul_peak(name, budget_s=job["peak_budget_s"], device=device)
                                  for name in job["peak_dtypes"]}
    else:
        result = base.WORKERS[kind](job)
        # per backend: the legacy global reading raises once torch's per-backend settings are used
        result["float32_matmul_precision"] = {"cuda": torch.backends.cuda.matmul.fp32_precision,
                                              "cpu": torch.backends.mkldnn.fp32_precision}
    result["device_name"] = torch.cuda.get_device_name(device) if cuda else base._cpu_name()
    result["cuda"] = torch.version.cuda
    if cuda:
        result["gpu_peak_allocated_mib"] = torch.cuda.max_memory_allocated(device) / MIB
        result["gpu_peak_reserved_mib"] = torch.cuda.max_memory_reserved(device) / MIB
    Path(job["result_path"]).write_text(json.dumps(result))
    return 0


# --------------------------------------------------------------------------- figures


def model_shape(model_config: dict[str, Any], n_params: int) -> dict[str, int]:
    """Weights used in a matmul (the input-embedding table left out unless tied to the
    output layer), layers and attention width, for the FLOP count."""
    heads = int(model_config.get("num_attention_heads") or model_config.get("n_head") or 0)
    hidden = int(model_config.get("hidden_size") or model_config.get("n_embd") or 0)
    head_dim = int(model_config.get("head_dim") or (hidden // heads if heads else 0))
    matmul_params = n_params
    if not model_config.get("tie_word_embeddings", True):   # transformers' default: tied
        matmul_params -= int(model_config.get("vocab_size") or 0) * hidden
    return {"matmul_params": matmul_params, "d_attn": heads * head_dim,
            "n_layers": int(model_config.get("num_hidden_layers") or model_config.get("n_layer") or 0)}


def add_figures(run: dict[str, Any], dtype: str, peaks: dict[str, float | None], model_config: dict[str, Any],
                window: int) -> None:
    """tokens/s, bits/byte, achieved TFLOP/s and MFU of one finished run, in place."""
    run["dtype_name"] = dtype
    run["n_tokens"] = sum(run["doc_ntok"])
    run["tokens_per_s"] = run["n_tokens"] / run["wall_s"]
    # lm-eval's own bits_per_byte metric on its side, ours from the per-document NLLs
    run.setdefault("bits_per_byte", base.bits_per_byte(run["doc_nll"], run["doc_bytes"]))
    run["bits_per_byte_from_docs"] = base.bits_per_byte(run["doc_nll"], run["doc_bytes"])
    shape = model_shape(model_config, run["n_params"])
    flops = base.forward_flops(run["doc_ntok"], window, shape["matmul_params"], shape["n_layers"], shape["d_attn"])
    run["flops"] = flops
    run["tflops_per_s"] = flops["total"] / run["wall_s"] / 1e12
    peak = peaks.get(dtype)
    run["mfu"] = run["tflops_per_s"] / peak if peak else None


def compare(runs: dict[str, dict[str, Any]], dtype: str) -> dict[str, Any]:
    """Cross-run figures: same inputs everywhere, lstar vs lm-eval per dtype, `dtype` vs float32 per side."""
    good = {name: run for name, run in runs.items() if base._ok(run) and "doc_ids" in run}
    cmp: dict[str, Any] = {}
    if not good:
        return cmp
    first = next(iter(good.values()))
    for run in good.values():
        if sorted(run["doc_ids"]) != sorted(first["doc_ids"]):
            raise RuntimeError("two runs scored different documents")
        base._reorder(run, first["doc_ids"])
    cmp["same_token_ids"] = len({run["ids_sha256"] for run in good.values()}) == 1
    cmp["same_scored_tokens"] = all(run["doc_ntok"] == first["doc_ntok"] for run in good.values())
    cmp["same_bytes"] = all(run["doc_bytes"] == first["doc_bytes"] for run in good.values())
    cmp["same_prefix"] = len({run["prefix_token_id"] for run in good.values()}) == 1
    for d in dict.fromkeys([dtype, "float32"]):
        ours, lm = good.get(f"ours-{d}"), good.get(f"lm_eval-{d}")
        if ours and lm:
            cmp[f"speedup_{d}"] = ours["tokens_per_s"] / lm["tokens_per_s"]
            cmp[f"bpb_rel_diff_{d}"] = base.rel(ours["bits_per_byte"], lm["bits_per_byte"])
            cmp[f"doc_nll_max_rel_diff_{d}"] = max(base.rel(a, b) for a, b in zip(ours["doc_nll"], lm["doc_nll"]))
            if ours.get("gpu_peak_allocated_mib") and lm.get("gpu_peak_allocated_mib"):
                cmp[f"gpu_memory_ratio_{d}"] = ours["gpu_peak_allocated_mib"] / lm["gpu_peak_allocated_mib"]
    if dtype != "float32":
        for side in ("ours", "lm_eval"):
            low, ref = good.get(f"{side}-{dtype}"), good.get(f"{side}-float32")
            if low and ref:
                cmp[f"{side}_bpb_minus_float32"] = low["bits_per_byte"] - ref["bits_per_byte"]
                cmp[f"{side}_bpb_rel_dev"] = (low["bits_per_byte"] - ref["bits_per_byte"]) / ref["bits_per_byte"]
                cmp[f"{side}_speedup_vs_float32"] = low["tokens_per_s"] / ref["tokens_per_s"]
    return cmp


# --------------------------------------------------------------------------- report

_f = base._f


def render(report: dict[str, Any]) -> tuple[str, str]:
    """(plain-text report, Markdown table)."""
    m, runs, c = report["meta"], report["runs"], report["comparison"]
    names = [name for name in report["order"] if name in runs]
    label = "" if m["is_gpu"] else "CPU SMOKE RUN (not GPU numbers): "

    def row(title: str, value) -> str:
        return f"{title:30s}" + "".join(f"{value(runs[n]):>18s}" for n in names)

    def ok(fn):
        return lambda run: fn(run) if base._ok(run) else "failed"

    lines = [
        f"{label}lstar vs lm-evaluation-harness {m.get('lm_eval_version') or '?'} — {m['model_name']} on "
        f"{m['corpus']} ({m['n_docs']} docs, {m['n_bytes']:,} bytes), window {m['max_length']} disjoint",
        f"{label}device {m['device']}: {m['device_name']}; torch {m.get('torch')}, CUDA {m.get('cuda')}",
        "",
        f"{'':30s}" + "".join(f"{n:>18s}" for n in names),
        row("batch size", ok(lambda r: _f(r.get("batch_size"), "d"))),
        row("tokens/s", ok(lambda r: _f(r["tokens_per_s"], ",.0f"))),
        row("scoring seconds", ok(lambda r: _f(r["wall_s"], ".2f"))),
        row("bits/byte", ok(lambda r: _f(r["bits_per_byte"], ".8f"))),
        row("peak GPU memory (MiB)", ok(lambda r: _f(r.get("gpu_peak_allocated_mib"), ",.0f"))),
        row("peak RSS (MiB)", ok(lambda r: _f(r.get("peak_rss_mib"), ",.0f"))),
        row("achieved TFLOP/s", ok(lambda r: _f(r["tflops_per_s"], ".3f"))),
        row("MFU", ok(lambda r: _f(r.get("mfu"), ".1%"))),
        "",
    ]
    for d in dict.fromkeys([m["dtype"], "float32"]):
        if f"speedup_{d}" in c:
            lines.append(f"{label}{d}: lstar / lm-eval throughput {c[f'speedup_{d}']:.2f}x; bits/byte rel diff "
                         f"{_f(c[f'bpb_rel_diff_{d}'], '.2e')} (max per-doc NLL {_f(c[f'doc_nll_max_rel_diff_{d}'], '.2e')})"
                         + (f"; GPU memory lstar / lm-eval {c[f'gpu_memory_ratio_{d}']:.2f}"
                            if f"gpu_memory_ratio_{d}" in c else ""))
    for side in ("ours", "lm_eval"):
        if f"{side}_bpb_rel_dev" in c:
            lines.append(f"{label}{side}: bits/byte {m['dtype']} - float32 = {c[f'{side}_bpb_minus_float32']:+.3e} "
                         f"({c[f'{side}_bpb_rel_dev']:+.2e} relative); {m['dtype']} / float32 throughput "
                         f"{c[f'{side}_speedup_vs_float32']:.2f}x")
    peaks = m["peak_tflops"]
    lines += [
        f"same token ids in every run: {c.get('same_token_ids')}; same scored tokens: {c.get('same_scored_tokens')}; "
        f"same bytes: {c.get('same_bytes')}; same prefix id: {c.get('same_prefix')}",
        "matmul peak (TFLOP/s): " + ", ".join(f"{d} {_f(v, '.4g')} ({m['peak_source'][d]})" for d, v in peaks.items()),
        f"FLOPs per pass of T tokens = 2*n_params*T + 2*n_layers*d_attn*T*(T+1); matmul params "
        f"{m['shape']['matmul_params']:,}, n_layers {m['shape']['n_layers']}, d_attn {m['shape']['d_attn']}",
        f"lm-eval softmax_dtype: {m['lm_eval_softmax_dtype'] or 'default (the logits dtype)'}",
    ]
    text = "\n".join(lines)

    header = f"| metric ({'CPU smoke run, not GPU numbers' if not m['is_gpu'] else m['device_name']}) | " + \
        " | ".join(names) + " |"
    md = [header, "|---|" + "---:|" * len(names)]
    for title, fn in (("tokens/s", lambda r: _f(r["tokens_per_s"], ",.0f")),
                      ("bits/byte", lambda r: _f(r["bits_per_byte"], ".6f")),
                      ("peak GPU memory (MiB)", lambda r: _f(r.get("gpu_peak_allocated_mib"), ",.0f")),
                      ("MFU", lambda r: _f(r.get("mfu"), ".1%"))):
        md.append(f"| {title} | " + " | ".join(fn(runs[n]) if base._ok(runs[n]) else "failed" for n in names) + " |")
    caption = (f"\n{label}{m['model_name']}, {m['corpus']} ({m['n_docs']} docs), window {m['max_length']} disjoint, "
               f"{m['device_name']}; MFU against the measured or given matmul peak of each run's dtype; {m['date']}.")
    return text, "\n".join(md) + caption


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="lstar on a GPU: bf16 vs float32, and vs lm-evaluation-harness.")
    parser.add_argument("--model", type=Path, default=None,
                        help="checkpoint folder with tokenizer files (default: SmolLM2-135M from monitor.scoring.smollm2)")
    parser.add_argument("--corpus", type=Path, default=base.DEFAULT_CORPUS, help="corpus folder (default ../shared/corpus/calib-v0)")
    parser.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (default cuda)")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"],
                        help="the dtype measured against float32 (default bfloat16; float32 runs float32 only)")
    parser.add_argument("--every", type=int, default=None, help="every k-th document of the corpus")
    parser.add_argument("--limit", type=int, default=None, help="the first K documents (after --every)")
    parser.add_argument("--max-length", type=int, default=2048, help="window length of both sides")
    parser.add_argument("--batch-size", type=int, default=8, help="our batch size (windows per forward)")
    parser.add_argument("--lm-eval-batch-size", default=None,
                        help="lm-eval's batch size, a number or 'auto' (default: --batch-size)")
    parser.add_argument("--lm-eval-softmax-dtype", default=None,
                        help="lm-eval's softmax_dtype model argument (default: lm-eval's, the logits' dtype)")
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help="matmul peak of --dtype in TFLOP/s (e.g. a datasheet's dense figure) instead of measuring it")
    parser.add_argument("--peak-tflops-float32", type=float, default=None,
                        help="float32 matmul peak in TFLOP/s instead of measuring it")
    parser.add_argument("--peak-budget-s", type=float, default=10.0, help="seconds per dtype for the measured peak")
    parser.add_argument("--skip", default="", help="runs to leave out, comma-separated (e.g. lm_eval-float32,peak)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads in every run (default: torch's)")
    parser.add_argument("--out", type=Path, default=base.OUT_DIR, help="folder for the JSON, Markdown and logs")
    parser.add_argument("--worker", choices=["peak", "ours", "lm_eval"], help=argparse.SUPPRESS)
    parser.add_argument("--job", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.device != "cpu" and not args.device.startswith("cuda"):
        parser.error(f"--device {args.device!r}: use cuda, cuda:N or cpu")
    if args.device == "cpu" and args.dtype == "float16":
        parser.error("--dtype float16 is not supported on the CPU: use float32 or bfloat16")
    for name in ("every", "limit", "max_length", "batch_size"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, got {value}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        return run_worker_main(args.worker, args.job)
    if args.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            print(f"--device {args.device}: no CUDA GPU is visible to torch {torch.__version__}; "
                  "run on a CUDA machine, or smoke-run here with --device cpu --dtype float32", file=sys.stderr)
            return 2

    from monitor.scoring.corpus import load_corpus
    from monitor.scoring.tokenizer import load_tokenizer

    model_dir, model_config = base.model_folder(args.model)
    corpus = load_corpus(args.corpus).select(every=args.every, first=args.limit)
    n_docs = len(corpus.documents)

    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    run_dir = (args.out / f"gpu-run-{stamp}").resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, **base.WORKER_ENV, HF_DATASETS_CACHE=str((args.out / "hf_datasets_cache").resolve()),
               PYTHONPATH=os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p))
    if args.threads:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(args.threads)
    handle = load_tokenizer(model_dir)
    is_gpu = args.device.startswith("cuda")
    print(f"{'' if is_gpu else 'CPU SMOKE RUN (not GPU numbers): '}model {model_dir}\ncorpus {corpus.name} "
          f"{corpus.version} ({corpus.selection}): {n_docs} documents, {corpus.n_bytes:,} bytes; logs in {run_dir}",
          flush=True)
    base.write_task_data(corpus, base.TASK_DATA_FILE)

    common = {"model_dir": str(model_dir), "corpus_dir": str(args.corpus.resolve()), "every": args.every,
              "docs": args.limit, "max_length": args.max_length, "threads": args.threads, "device": args.device,
              "warmup": True}
    script = Path(__file__).resolve()
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    dtypes = list(dict.fromkeys([args.dtype, "float32"]))
    given = {args.dtype: args.peak_tflops, "float32": args.peak_tflops_float32}
    peaks: dict[str, float | None] = {d: given.get(d) for d in dtypes}
    source = {d: "given" if peaks[d] else "not measured" for d in dtypes}
    to_measure = [d for d in dtypes if not peaks[d]]
    if to_measure and "peak" not in skip:
        peak = base.run_side("peak", "peak", dict(common, peak_budget_s=args.peak_budget_s, peak_dtypes=to_measure),
                             run_dir, env, script=script)
        for d in to_measure:
            if base._ok(peak):
                peaks[d], source[d] = peak[d]["gflops"] / 1e3, f"measured, n={peak[d]['n']}"
    runs: dict[str, dict[str, Any]] = {}
    order = [f"{side}-{d}" for d in dtypes for side in ("ours", "lm_eval")]
    lm_batch = args.lm_eval_batch_size or args.batch_size
    lm_batch = lm_batch if str(lm_batch) == "auto" else int(lm_batch)
    for name in order:
        if name in skip:
            continue
        side, d = name.split("-", 1)
        job = dict(common, dtype=d, batch_size=args.batch_size)
        if side == "lm_eval":
            job.update(batch_size=lm_batch, prefix_token_id=handle.prefix_token_id,
                       softmax_dtype=args.lm_eval_softmax_dtype)
        runs[name] = base.run_side(name, side, job, run_dir, env, script=script)
        if base._ok(runs[name]):
            add_figures(runs[name], d, peaks, model_config, args.max_length)

    n_params = next((r["n_params"] for r in runs.values() if base._ok(r)), 0)
    device_name = next((r["device_name"] for r in runs.values() if base._ok(r)), args.device)
    meta = {
        "date": dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "model_dir": str(model_dir), "model_name": model_dir.name, "corpus": f"{corpus.name}-{corpus.version}",
        "corpus_sha256": corpus.sha256, "selection": corpus.selection, "n_docs": n_docs, "n_bytes": corpus.n_bytes,
        "max_length": args.max_length, "device": args.device, "device_name": device_name, "is_gpu": is_gpu,
        "dtype": args.dtype, "peak_tflops": peaks, "peak_source": source, "shape": model_shape(model_config, n_params),
        "lm_eval_softmax_dtype": args.lm_eval_softmax_dtype, "python": platform.python_version(),
        "torch": next((r.get("torch") for r in runs.values() if base._ok(r)), None),
        "cuda": next((r.get("cuda") for r in runs.values() if base._ok(r)), None),
        "lm_eval_version": next((r.get("lm_eval") for r in runs.values() if base._ok(r) and r.get("lm_eval")), None),
        "argv": sys.argv[1:], "run_dir": str(run_dir),
    }
    report = {"meta": meta, "order": order, "runs": runs, "comparison": compare(runs, args.dtype)}
    base.write_report(report, render, args.out, f"gpu_score-{stamp}")
    failed = [name for name, run in runs.items() if not base._ok(run)]
    if failed:
        print(f"failed runs: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
