"""Labels CSVs for `lstar curves validate --axes` from published evaluation tables.

Reads `../shared/data/public-evals/` (see its SOURCES.md) and writes two files:

- `labels/obsscaling-hkust.csv`: MMLU, ARC-C, GSM8K and HumanEval of the 28 base models of
  the hkust compression leaderboard, joined by hand (`JOIN`) with ObsScaling's benchmark
  table. Axes: `bits_per_byte` holds the leaderboard's bits per *character* on the corpus
  matching the task (`CORPUS`); `params` and `flops` come from ObsScaling (the monitor takes
  their log10 as `log_params` / `log_flops`; FLOPs are missing for some models). Family: the
  model series sharing one tokenizer (`SERIES`).
- `labels/obsscaling-hkust-by-release.csv`: the same rows with the release series as the
  family instead (`RELEASES`: Llama-1 and Llama-2 apart, Qwen, Qwen1.5 and Qwen2 apart, ...),
  to measure what the tokenizer grouping changes.
- `labels/pythia-lambada.csv`: zero-shot `lambada_openai` accuracy of the 15 Pythia models at
  every published training step. One tokenizer for all; family: the model. Axes: `raw_ce`
  is ln(perplexity) of the task's target words (the harness's `ppl`), `params` the size in
  the model's name, `flops` ≈ 6 · params · tokens seen (step × 2,097,152 tokens per step;
  absent at step 0).

    python examples/public-evals/make_labels.py [--data DIR] [--out DIR]
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from pathlib import Path

from monitor.curves.importers import OBSSCALING_TASKS

HERE = Path(__file__).resolve().parent
DEFAULT_DATA = HERE.parents[1].parent / "shared" / "data" / "public-evals"

# hkust leaderboard name -> ObsScaling model name (the names differ; joined by hand).
JOIN = {
    "Llama-1-7b": "huggyllama/llama-7b", "Llama-1-13b": "huggyllama/llama-13b",
    "Llama-1-30b": "huggyllama/llama-30b", "Llama-1-65b": "huggyllama/llama-65b",
    "Llama-2-7b": "meta-llama/Llama-2-7b-hf", "Llama-2-13b": "meta-llama/Llama-2-13b-hf",
    "Llama-2-70b": "meta-llama/Llama-2-70b-hf",
    "Llama-3-8b": "meta-llama/Meta-Llama-3-8B", "Llama-3-70b": "meta-llama/Meta-Llama-3-70B",
    "Qwen-7b": "Qwen/Qwen-7B", "Qwen-14b": "Qwen/Qwen-14B", "Qwen-72b": "Qwen/Qwen-72B",
    "Qwen-1.5-7b": "Qwen/Qwen1.5-7B", "Qwen-1.5-14b": "Qwen/Qwen1.5-14B", "Qwen-1.5-32b": "Qwen/Qwen1.5-32B",
    "Qwen-1.5-72b": "Qwen/Qwen1.5-72B", "Qwen1.5-110B": "Qwen/Qwen1.5-110B", "Qwen2-72B": "Qwen/Qwen2-72B",
    "Mistral-7b": "mistralai/Mistral-7B-v0.1", "Mixtral-8x7B": "mistralai/Mixtral-8x7B-v0.1",
    "Mixtral-8x22B-v0.1": "mistralai/Mixtral-8x22B-v0.1",
    "Deepseek-llm-7b": "deepseek-ai/deepseek-llm-7b-base", "Deepseek-llm-67b": "deepseek-ai/deepseek-llm-67b-base",
    "DeepSeek-V2": "deepseek-ai/DeepSeek-V2",
    "Yi-6b": "01-ai/Yi-6B", "Yi-34b": "01-ai/Yi-34B",
    "Falcon-7b": "tiiuae/falcon-7b", "Falcon-40b": "tiiuae/falcon-40b",
}
# Model series sharing one tokenizer (the leaderboard's 7 tokenizer families), by name prefix.
SERIES = (("Llama-3", "llama-3"), ("Llama-", "llama"), ("Qwen", "qwen"), ("Mi", "mistral"),
          ("Deep", "deepseek"), ("Yi-", "yi"), ("Falcon", "falcon"))
# The release series of each model, by name prefix (first match): the grouping the tokenizer
# families are compared with. Several series share a tokenizer (Llama-1 and Llama-2; Qwen,
# Qwen1.5 and Qwen2; Mistral and Mixtral; DeepSeek-LLM and DeepSeek-V2).
RELEASES = (("Llama-1", "Llama-1"), ("Llama-2", "Llama-2"), ("Llama-3", "Llama-3"), ("Qwen-1.5", "Qwen1.5"),
            ("Qwen1.5", "Qwen1.5"), ("Qwen2", "Qwen2"), ("Qwen-", "Qwen"), ("Mistral", "Mistral"),
            ("Mixtral", "Mixtral"), ("Deepseek-llm", "DeepSeek-LLM"), ("DeepSeek-V2", "DeepSeek-V2"),
            ("Yi-", "Yi"), ("Falcon", "Falcon"))
# task -> (hkust corpus column, baseline); the ObsScaling column, metric name and items in the
# test set are the package's (`monitor.curves.importers.OBSSCALING_TASKS`, `lstar labels import`).
_CORPUS_BASELINE = {
    "mmlu": ("bpc_common_crawl", 0.25), "arc_challenge": ("bpc_common_crawl", 0.25),
    "gsm8k": ("bpc_arxiv_math", 0.0), "humaneval": ("bpc_python", 0.0),
}
# task -> (ObsScaling column, metric name, items in the test set, hkust corpus column, baseline)
TASKS = {task: (OBSSCALING_TASKS[task].column, OBSSCALING_TASKS[task].metric, OBSSCALING_TASKS[task].n, *spec)
         for task, spec in _CORPUS_BASELINE.items()}
CORPUS = {task: spec[3] for task, spec in TASKS.items()}
BASELINES = {task: spec[4] for task, spec in TASKS.items()}
PYTHIA_TOKENS_PER_STEP = 1024 * 2048   # batch of 1024 sequences of 2048 tokens
LAMBADA_ITEMS = 5153


def _read(path: Path) -> list[dict[str, str]]:
    try:
        with path.open(encoding="utf-8", newline="") as handle:
            return list(csv.DictReader(handle))
    except FileNotFoundError:
        sys.exit(f"error: no table at {path}; pass --data pointing at shared/data/public-evals")


def series(name: str) -> str:
    """The tokenizer series of a leaderboard model name."""
    for prefix, family in SERIES:
        if name.startswith(prefix):
            return family
    raise ValueError(f"no series for model {name!r}; add its prefix to SERIES")


def release(name: str) -> str:
    """The release series of a leaderboard model name."""
    for prefix, family in RELEASES:
        if name.startswith(prefix):
            return family
    raise ValueError(f"no release series for model {name!r}; add its prefix to RELEASES")


def _number(cell: str) -> float | None:
    cell = (cell or "").strip()
    return float(cell) if cell else None


def obsscaling_hkust(data: Path) -> list[dict[str, object]]:
    """Rows of labels/obsscaling-hkust.csv (one per model and task)."""
    bpc = {r["model"]: r for r in _read(data / "hkust" / "compression-bpc.csv")}
    obs = {r["Model"]: r for r in _read(data / "obsscaling" / "base_llm_benchmark_eval.csv")}
    if set(bpc) != set(JOIN):
        sys.exit(f"error: hkust models and JOIN differ: {sorted(set(bpc) ^ set(JOIN))}")
    absent = sorted(v for v in JOIN.values() if v not in obs)
    if absent:
        sys.exit(f"error: ObsScaling lacks {', '.join(absent)}; fix JOIN in {__file__}")
    rows = []
    for name in sorted(JOIN, key=lambda n: (series(n), n)):
        o = obs[JOIN[name]]
        params_b, flops_e21 = _number(o["Model Size (B)"]), _number(o["FLOPs (1E21)"])
        for task, (column, metric, items, corpus, _) in TASKS.items():
            if not o[column].strip():   # not every model has every benchmark
                continue
            rows.append({"checkpoint": name, "family": series(name), "task": task, "metric": metric,
                         "value": o[column], "n": items, "bits_per_byte": bpc[name][corpus],
                         "params": f"{params_b * 1e9:.6g}" if params_b else "",
                         "flops": f"{flops_e21 * 1e21:.6g}" if flops_e21 else "", "repo": JOIN[name]})
    return rows


def _pythia_params(model: str) -> float:
    size = model.removeprefix("pythia-").removesuffix("-deduped")
    scale = {"m": 1e6, "b": 1e9}[size[-1]]
    return float(size[:-1]) * scale


def pythia_lambada(data: Path) -> list[dict[str, object]]:
    """Rows of labels/pythia-lambada.csv (one per model and training step)."""
    cells: dict[tuple[str, int], dict[str, tuple[str, str]]] = {}
    for r in _read(data / "pythia" / "pythia-v1-evals.csv"):
        if r["task"] == "lambada_openai" and r["shots"] == "zero-shot" and r["metric"] in ("acc", "ppl"):
            cells.setdefault((r["model"], int(r["step"])), {})[r["metric"]] = (r["value"], r["stderr"])
    rows = []
    for (model, step), got in sorted(cells.items()):
        if "acc" not in got or "ppl" not in got:
            continue
        ppl = float(got["ppl"][0])
        params = _pythia_params(model)
        flops = 6.0 * params * step * PYTHIA_TOKENS_PER_STEP
        stderr = float(got["acc"][1])
        rows.append({"checkpoint": f"{model}@step{step}", "family": model, "task": "lambada_openai",
                     "metric": "acc", "value": got["acc"][0], "n": LAMBADA_ITEMS,
                     "stderr": got["acc"][1] if stderr > 0 else "", "raw_ce": f"{math.log(ppl):.6g}",
                     "params": f"{params:.6g}", "flops": f"{flops:.6g}" if flops > 0 else "",
                     "repo": f"EleutherAI/{model}"})
    return rows


def write(rows: list[dict[str, object]], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    columns = list(dict.fromkeys(k for r in rows for k in r))
    with path.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="the public-evals folder")
    parser.add_argument("--out", type=Path, default=HERE / "labels", help="where to write the CSVs")
    args = parser.parse_args(argv)
    hkust = obsscaling_hkust(args.data)
    by_release = [{**row, "family": release(str(row["checkpoint"]))} for row in hkust]
    for name, rows in (("obsscaling-hkust.csv", hkust), ("obsscaling-hkust-by-release.csv", by_release),
                       ("pythia-lambada.csv", pythia_lambada(args.data))):
        print(f"wrote {write(rows, args.out / name)} ({len(rows)} rows)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
