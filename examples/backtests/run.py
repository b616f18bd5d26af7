"""Run the committed backtests on the public training histories in ../shared/data/public-evals.

    python examples/backtests/run.py [--shared ../shared] [--only olmo|pythia|obsscaling]

Writes, for each backtest, `results/<name>/` (backtest.md, index.html with one plot per task ×
target lineage, result.json) and `results/summary.md`, the table the README of this folder
quotes. Every choice (references, targets, tasks, baselines, levels, curve family) is fixed here
before any target is looked at; the curve family is chosen per task by forward validation on
the references alone (`--family auto`, `monitor.curves.forward`).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

from monitor.backtest import BacktestSpec, BacktestTask, History, Lineage, run_backtest, split_history
from monitor.backtest.html import write_html
from monitor.backtest.render import markdown
from monitor.curves.importers import import_obsscaling, import_olmo_ladder, import_pythia
from monitor.curves.labels import read_labels_csv

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
CONFIDENCE = 0.9
MARGIN = 0.1          # the low level: chance + 0.1 for every task
RESAMPLES = 1000

# Backtest 1: the OLMo ladder (references) → the OLMo-2 7B run (target), the paper's 8 tasks.
OLMO_TASKS = {"mmlu": 0.25, "hellaswag": 0.25, "arc_challenge": 0.25, "arc_easy": 0.25, "piqa": 0.5,
              "csqa": 0.2, "socialiqa": 1 / 3, "openbookqa": 0.25}
# `paper-figures/variance.csv`, column "7B Accuracy Rel Error": the paper's own relative error of
# its 7B accuracy prediction, by the paper's task name.
OLMO_PAPER_NAMES = {"MMLU": "mmlu", "HellaSwag": "hellaswag", "ARC-Challenge": "arc_challenge",
                    "ARC-Easy": "arc_easy", "PIQA": "piqa", "CommonsenseQA": "csqa", "Social IQa": "socialiqa",
                    "OpenBookQA": "openbookqa"}
OLMO_REFERENCES = "*xC"                  # the 25 ladder runs (the 1xC reruns left out)
OLMO_TARGET = "peteish7_eval_full"

# Backtest 2: Pythia, references up to 1.4B, targets 2.8B, 6.9B, 12B (standard and deduplicated).
PYTHIA_TASKS = {"arc_easy": 0.25, "arc_challenge": 0.25, "piqa": 0.5, "sciq": 0.25, "winogrande": 0.5,
                "lambada_openai": 0.0, "mmlu": 0.25}
PYTHIA_REFERENCES = "pythia-70m*,pythia-160m*,pythia-410m*,pythia-1b*,pythia-1.4b*"
PYTHIA_TARGETS = "pythia-2.8b*,pythia-6.9b*,pythia-12b*"

# Backtest 3: the cross-family table of examples/public-evals, leave one tokenizer family out.
OBS_LABELS = HERE.parent / "public-evals" / "labels" / "obsscaling-hkust.csv"
OBS_TASKS = {"mmlu": 0.25, "arc_challenge": 0.25, "gsm8k": 0.0, "humaneval": 0.0}


def tasks_at_low_level(baselines: dict[str, float], metric: str | None = None) -> tuple[BacktestTask, ...]:
    return tuple(BacktestTask(t, t, metric, b, MARGIN, CONFIDENCE) for t, b in baselines.items())


def tasks_at_frontier(baselines: dict[str, float], history: History) -> tuple[BacktestTask, ...]:
    """The frontier level: each task's level is the best value any reference checkpoint reached
    (a release better than every reference on the task), known before any target is read."""
    out = []
    for task, baseline in baselines.items():
        best = max(label.value for label in history.reference_labels() if label.task == task)
        out.append(BacktestTask(task, task, None, baseline, best - baseline, CONFIDENCE))
    return tuple(out)


def olmo_paper_errors(shared: Path) -> dict[str, float]:
    path = shared / "data/public-evals/olmo-ladder/paper-figures/variance.csv"
    with path.open(newline="") as handle:
        return {OLMO_PAPER_NAMES[row["Task"]]: float(row["7B Accuracy Rel Error"])
                for row in csv.DictReader(handle) if row["Task"] in OLMO_PAPER_NAMES}


def write(name: str, result: dict, seconds: float) -> dict:
    folder = RESULTS / name
    write_html(result, folder)
    (folder / "backtest.md").write_text(markdown(result), encoding="utf-8")
    s = result["summary"]
    print(f"{name}: {seconds:.0f} s; crossings {s['crossings']}, warned ahead {s['warned_ahead']}, misses "
          f"{s['misses']}, false alarms {s['false_alarms']}, false emerged {s['false_emerged']}, coverage "
          f"{s['coverage']['coverage']:.3f}, mean |rel. error| {s['mean_abs_relative_error']:.4f}", flush=True)
    return {"name": name, "seconds": seconds, **s}


def backtest(name: str, history: History, spec: BacktestSpec, **kwargs) -> dict:
    start = time.perf_counter()
    result = run_backtest(history, spec, resamples=RESAMPLES, **kwargs).as_dict()
    return write(name, result, time.perf_counter() - start)


def run_olmo(shared: Path) -> list[dict]:
    labels = import_olmo_ladder(shared / "data/public-evals/olmo-ladder/ladder-runs", tasks=list(OLMO_TASKS))
    errors = olmo_paper_errors(shared)
    out = []
    for axis in ("raw_ce", "task_loss"):
        history = split_history(labels, reference=OLMO_REFERENCES, target=OLMO_TARGET, axis=axis, path="olmo-ladder")
        label = "c4" if axis == "raw_ce" else "task-loss"
        for level, tasks in (("low", tasks_at_low_level(OLMO_TASKS)),
                             ("frontier", tasks_at_frontier(OLMO_TASKS, history))):
            spec = BacktestSpec(tasks=tasks, axis=axis, family="auto", source=f"examples/backtests/run.py ({level})")
            out.append(backtest(f"olmo-{label}-{level}", history, spec, paper_errors=errors))
    return out


def run_pythia(shared: Path) -> list[dict]:
    labels = import_pythia(shared / "data/public-evals/pythia/pythia-v1-evals.csv", tasks=list(PYTHIA_TASKS))
    history = split_history([l for l in labels if l.metric == "acc"], reference=PYTHIA_REFERENCES,
                            target=PYTHIA_TARGETS, axis="raw_ce", path="pythia")
    spec = BacktestSpec(tasks=tasks_at_low_level(PYTHIA_TASKS, "acc"), axis="raw_ce", family="auto",
                        source="examples/backtests/run.py (low)")
    return [backtest("pythia-lambada-low", history, spec)]


def run_obsscaling() -> list[dict]:
    """Leave one family out: each family's models are the targets (one checkpoint each), every
    other family the references; the per-family results are pooled into one table."""
    labels = [l.with_(lineage=f"{l.family}/{l.checkpoint}", step=0.0) for l in read_labels_csv(OBS_LABELS)]
    families = sorted({l.family for l in labels if l.family})
    start, parts = time.perf_counter(), []
    for family in families:
        refs = [l for l in labels if l.family != family]
        targets = [l for l in labels if l.family == family]
        lineages = lambda rows: tuple(Lineage(name, tuple(r for r in rows if r.lineage == name))  # noqa: E731
                                      for name in sorted({r.lineage for r in rows}))
        history = History(path=f"{OBS_LABELS.name} (target family {family})", references=lineages(refs),
                          targets=lineages(targets))
        for task, baseline in OBS_TASKS.items():
            if not any(l.task == task for l in targets) or len({l.family for l in refs if l.task == task}) < 2:
                continue
            spec = BacktestSpec(tasks=(BacktestTask(task, task, None, baseline, MARGIN, CONFIDENCE),),
                                axis="bits_per_byte", family="auto", source="examples/backtests/run.py (low)")
            history_task = replace(history, targets=tuple(
                Lineage(t.name, tuple(l for l in t.labels if l.task == task)) for t in history.targets
                if any(l.task == task for l in t.labels)))
            result = run_backtest(history_task, spec, resamples=RESAMPLES)
            parts.append(replace(result, curves={f"{k} (without {family})": v for k, v in result.curves.items()}))
    # One BacktestResult over every family's rows: its own summary() pools them.
    pooled = replace(parts[0], history=f"{OBS_LABELS.name}, leave one family out ({len(families)} families)",
                     references=["every other family"],
                     targets=sorted({t for r in parts for t in r.targets}),
                     curves={k: v for r in parts for k, v in r.curves.items()},
                     results=[x for r in parts for x in r.results], alerts=[a for r in parts for a in r.alerts],
                     notifications=sum(r.notifications for r in parts),
                     not_evaluated=[n for r in parts for n in r.not_evaluated])
    return [write("obsscaling-lofo-bpc", pooled.as_dict(), time.perf_counter() - start)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shared", type=Path, default=HERE.parents[1].parent / "shared")
    parser.add_argument("--only", choices=("olmo", "pythia", "obsscaling"))
    args = parser.parse_args(argv)
    RESULTS.mkdir(parents=True, exist_ok=True)
    rows = []
    if args.only in (None, "olmo"):
        rows += run_olmo(args.shared)
    if args.only in (None, "pythia"):
        rows += run_pythia(args.shared)
    if args.only in (None, "obsscaling"):
        rows += run_obsscaling()
    (RESULTS / f"summary-{args.only or 'all'}.json").write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
