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
    start, pooled = time.perf_counter(), None
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
            result = run_backtest(history_task, spec, resamples=RESAMPLES).as_dict()
            result["curves"] = {f"{k} (without {family})": v for k, v in result["curves"].items()}
            if pooled is None:
                pooled = result
            else:
                pooled["results"] += result["results"]
                pooled["targets"] += result["targets"]
                pooled["curves"].update(result["curves"])
                pooled["not_evaluated"] += result["not_evaluated"]
                pooled["alerts"]["count"] += result["alerts"]["count"]
                pooled["alerts"]["notifications"] += result["alerts"]["notifications"]
                pooled["alerts"]["list"] += result["alerts"]["list"]
    assert pooled is not None
    pooled["targets"] = sorted(set(pooled["targets"]))
    pooled["references"] = ["every other family"]
    pooled["history"] = f"{OBS_LABELS.name}, leave one family out ({len(families)} families)"
    pooled["summary"] = summarise(pooled)
    return [write("obsscaling-lofo-bpc", pooled, time.perf_counter() - start)]


def summarise(data: dict) -> dict:
    """The summary of pooled per-family results, by the same counts `BacktestResult.summary` makes."""
    from monitor.curves.observe import coverage

    results = data["results"]
    checked = sum(r["coverage"]["checked"] for r in results)
    covered = sum(r["coverage"]["covered"] for r in results)
    contradictions = sum(r["coverage"]["contradictions"] for r in results)
    errors = [abs(r["final"]["relative_error"]) for r in results if r["final"] and r["final"]["relative_error"] is not None]
    count = lambda key: sum(r[key] is not None for r in results)  # noqa: E731
    return {"task_lineages": len(results), "crossings": count("crossing"), "crossed_at_start": count("crossed_at_start"),
            "warned_ahead": count("lead"), "misses": count("missed"), "late_warnings": count("late_warning"),
            "false_alarms": count("false_alarm"), "false_emerged": sum(len(r["false_emerged"]) for r in results),
            "mean_abs_relative_error": sum(errors) / len(errors) if errors else None, "median_lead_steps": None,
            "coverage": coverage(checked, covered, contradictions, CONFIDENCE).as_dict(),
            "coverage_inside_references": _coverage_of_points(results, extrapolated=False),
            "coverage_beyond_references": _coverage_of_points(results, extrapolated=True)}


def _coverage_of_points(results: list[dict], *, extrapolated: bool) -> dict:
    from monitor.curves.observe import coverage

    points = [p for r in results for p in r["points"] if p.get("covered") is not None
              and bool(p.get("extrapolated")) is extrapolated]
    return coverage(len(points), sum(bool(p["covered"]) for p in points), 0, CONFIDENCE).as_dict()


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
