"""Importers of published training histories into the labels/history CSV (`lstar labels import`).

A history file is a labels CSV (`monitor.curves.labels.read_labels_csv`) whose rows also carry
`lineage` (the training run) and `step` (and `tokens` / `flops` where known): one row per
(checkpoint, task, metric). `write_labels_csv` writes that format so that `read_labels_csv`
reads the same labels back. Every source table is read bounded (`IMPORT_MAX_BYTES`), and a
malformed cell is an error naming the file, the line and the column.

**olmo-ladder** (`olmo-ladder/ladder-runs/*.csv`, Bhagia et al. 2024): lineage = file stem
(`1B-5xC`, `peteish7_eval_full`); family = the model size (`190M` … `3B`, `7B`), because the
unit a forecast must transfer to is a larger model: fitting by size and predicting the next
size is the paper's set-up. checkpoint = `<lineage>@step<_step>`. Tokens and FLOPs: the ladder
files carry them (`throughput/total_tokens`, `throughput/total_training_Gflops`); the 7B files
carry only `batch_size_in_tokens` (4,194,304), so tokens = step × that, and FLOPs = tokens ×
49,412,071,424 FLOPs per token, the 7B's figure in the OLMo-ladder repository
(`src/scripts/other/flops_calculation.py`, `MODEL_FLOPS`; the same table gives the ladder
sizes' figures, which equal the ladder files' own Gflops / tokens exactly). `params` is the
non-embedding count of the same file (`MODEL_PARAMS`). Axes: `raw_ce` = cross-entropy on one
validation corpus (C4 by default, `eval/c4_en-validation/CrossEntropyLoss`); `task_loss` =
the task's `eval/downstream_bpb/<task>_rc_5shot_bpb`. Value: the paper's accuracy column for
the task (`src/scaling/utils.py`, `v2_main`): ranked-classification (rc) format, the split the
paper names (HellaSwag, PIQA, CSQA, Social IQa: val; ARC-Easy, ARC-Challenge, OpenBookQA,
MMLU: test), length-normalised accuracy (metric `acc_norm`), except BoolQ (`acc`, the only
BoolQ accuracy column). MMLU = the plain mean of its four category columns (STEM, humanities,
social sciences, other), as the paper's code averages them; its task loss the plain mean of
their bits per byte.

The paper's `paper-figures/step2_*.csv` "Actual" numbers are NOT values of any row of the 7B
files here: no row (and no mean of the last k rows) of `peteish7_eval_full`, `_anneal`,
`_170k-450k` or the medlr runs equals them, for any split, format or MMLU average; they lie
above every 7B checkpoint (HellaSwag 0.832 vs at most 0.81), and `step1_c4_main.csv`'s
"Actual" C4 loss (2.4379) is near the 13B's (2.4376 in that repository's
`peteish-final-new/13B-5T.csv`), not the 7B's (2.4829 annealed, 2.5158 at step 925000). The
paper's eval targets were the annealed 7B and 13B (`configs/final.json`); the 13B file is not
in this data.

Default lineages: the 30 ladder runs and `peteish7_eval_full` (the 7B target, steps 0 to
925,000). The other 7B files overlap it (`_170k-450k` is a stretch of the same run), are a
different run (`medlr`, peak learning rate 6e-4) or have no step (`_anneal`); they are imported
only when `--lineages` names them. A step twice in one file is refused.

**pythia** (`pythia/pythia-v1-evals.csv`): lineage = the model (`pythia-1.4b`,
`pythia-1.4b-deduped`), family = its size (`1.4b`), checkpoint = `<model>@step<step>`. tokens =
step × 2,097,152 (1,024 sequences of 2,048 tokens per step, the Pythia paper and README), FLOPs
= 6 · N · tokens with N the total parameter count of the Pythia README's table. `raw_ce` =
ln(LAMBADA-OpenAI perplexity) of the same model, step and shots: the per-token cross-entropy
of the LAMBADA target words, in nats. Shots: zero-shot by default. Tasks: ARC-Easy,
ARC-Challenge, PIQA, SciQ, Winogrande, LAMBADA accuracy, and MMLU = the plain mean of the
(up to 57) `hendrycksTest-*` subjects present, n = their items together, stderr = the
standard error of that mean. `stderr` is the file's; n per task is the split size, which the
file's own stderr gives back exactly (lm-eval: stderr² = p(1 − p)/(n − 1)).

**obsscaling** (`obsscaling/base_llm_benchmark_eval.csv`): one checkpoint per model, lineage =
checkpoint = the model, family = the file's `Model Family`; params, tokens and FLOPs from its
columns; the tasks of `OBSSCALING_TASKS` (the same columns, metric names and item counts
`examples/public-evals/make_labels.py` uses). An empty cell is a benchmark not run (skipped).
"""

from __future__ import annotations

import csv
import io
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from monitor.curves.labels import _SCORE_AXIS_COLUMNS, HISTORY_COLUMNS, Label
from monitor.errors import LabelError, PolicyError
from monitor.files import FileKind, read_bounded_bytes

# The largest table read (the Pythia table is 10.6 MB); a bigger file is refused unread.
IMPORT_MAX_BYTES = 64 << 20
TABLE_FILE = FileKind("public evaluation table", "public evaluation tables", "CSV",
                      too_large="split it, or raise max_bytes if the file is trusted")

# -- item counts (published split sizes) -----------------------------------------------------
# HellaSwag val 10,042 (tensorflow.org datasets catalog, huggingface:hellaswag); ARC test:
# Challenge 1,172, Easy 2,376 (huggingface.co/datasets/allenai/ai2_arc card); PIQA val 1,838
# (piqa dataset card, train 16,113 / validation 1,838); CommonsenseQA val 1,221
# (tau/commonsense_qa card); OpenBookQA test 500; BoolQ val 3,270 (super_glue card);
# Winogrande (xl) dev 1,267, SciQ test 1,000, LAMBADA-OpenAI 5,153, MMLU test 14,042: given
# back by the Pythia table's own stderr (tests/test_importers.py checks it). Social IQa val
# 1,954: the dataset's published validation size (not re-derivable from these tables).
SPLIT_ITEMS = {
    "hellaswag_val": 10042, "arc_challenge_test": 1172, "arc_easy_test": 2376, "piqa_val": 1838,
    "csqa_val": 1221, "socialiqa_val": 1954, "openbookqa_test": 500, "mmlu_test": 14042,
    "boolq_val": 3270, "winogrande_val": 1267, "sciq_test": 1000, "lambada_openai_test": 5153,
}


@dataclass(frozen=True)
class _Table:
    path: Path
    columns: list[str]
    rows: list[tuple[int, dict[str, str]]]   # (line number, row)

    def number(self, line: int, row: dict[str, str], column: str) -> float:
        """The finite number in one cell; an error naming file, line and column otherwise."""
        cell = (row.get(column) or "").strip()
        where = f"{self.path}:{line}: column {column!r}"
        if cell == "":
            raise LabelError(f"{where} is empty", hint="fill or drop the row")
        try:
            value = float(cell)
        except ValueError:
            raise LabelError(f"{where}: {cell[:40]!r} is not a number") from None
        if not math.isfinite(value):
            raise LabelError(f"{where} is {cell!r} (not a finite number)", hint="fill or drop the row")
        return value


def read_table(path: str | Path, *, required: Sequence[str] = (), max_bytes: int = IMPORT_MAX_BYTES) -> _Table:
    """A CSV read bounded: at most `max_bytes`, UTF-8, with the `required` columns, every row
    as wide as the header."""
    path = Path(path)
    try:
        raw = read_bounded_bytes(path, str(path), what=TABLE_FILE, limit=max_bytes)
    except PolicyError as exc:
        raise LabelError(exc.message, hint=exc.hint) from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise LabelError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    # StringIO, not splitlines(): a quoted cell may hold a line break, and splitlines() also breaks
    # at form feeds, U+2028 and other characters that are plain text inside a cell.
    reader = csv.DictReader(io.StringIO(text, newline=""))
    columns = [c.strip() for c in (reader.fieldnames or [])]
    missing = [c for c in required if c not in columns]
    if missing:
        raise LabelError(f"{path}: lacks column(s) {', '.join(missing)}",
                         hint="is it the table this format expects?")
    rows = []
    for line, row in enumerate(reader, start=2):
        if None in row or None in row.values():
            raise LabelError(f"{path}:{line}: the row has {'more' if None in row else 'fewer'} cells than the header")
        rows.append((line, {k.strip(): v for k, v in row.items()}))
    if not rows:
        raise LabelError(f"{path}: has a header but no rows")
    return _Table(path, columns, rows)


def _imported(**axes: float | None) -> tuple[str, ...]:
    """The axes a label's file gives, in the order `read_labels_csv` lists them."""
    given = {**axes, "log_params": axes.get("params"), "log_flops": axes.get("flops")}
    return tuple(a for a in (*_SCORE_AXIS_COLUMNS, "log_params", "log_flops") if given.get(a) is not None)


def _selected(name: str, patterns: Sequence[str] | None) -> bool:
    """Whether `name` matches one of the shell globs (RE2, linear in the name: monitor.patterns)."""
    if patterns is None:
        return True
    from monitor.patterns import PatternError, compile_glob

    for pattern in patterns:
        try:
            if compile_glob(pattern).fullmatches(name):
                return True
        except PatternError as exc:
            raise LabelError(f"lineage glob {pattern!r} is not usable: {exc.reason}",
                             hint="write a shell glob such as '1B-*'") from None
    return False


# -- olmo-ladder ------------------------------------------------------------------------------
OLMO_CORPORA = ("c4_en", "dolma_books", "dolma_common-crawl", "dolma_pes2o", "dolma_reddit", "dolma_stack",
                "dolma_wiki", "ice", "m2d2_s2orc", "pile", "wikitext_103")
_MMLU = ("mmlu_stem", "mmlu_humanities", "mmlu_social_sciences", "mmlu_other")


@dataclass(frozen=True)
class OlmoTask:
    parts: tuple[str, ...]    # `<task>_<split>` stems averaged (MMLU: its four categories)
    metric: str               # column suffix: len_norm (acc_norm) or acc
    n: int
    paper: str | None         # the task's name in the paper's figures (paper-figures/*.csv)

    @property
    def metric_name(self) -> str:
        return "acc_norm" if self.metric == "len_norm" else "acc"

    def accuracy_columns(self) -> list[str]:
        return [f"eval/downstream/{p}_rc_5shot_{self.metric}" for p in self.parts]

    def bpb_columns(self) -> list[str]:
        return [f"eval/downstream_bpb/{p}_rc_5shot_bpb" for p in self.parts]


OLMO_TASKS = {
    "mmlu": OlmoTask(tuple(f"{c}_test" for c in _MMLU), "len_norm", SPLIT_ITEMS["mmlu_test"], "mmlu_avg_test_5shot"),
    "hellaswag": OlmoTask(("hellaswag_val",), "len_norm", SPLIT_ITEMS["hellaswag_val"], "hellaswag_val_5shot"),
    "arc_challenge": OlmoTask(("arc_challenge_test",), "len_norm", SPLIT_ITEMS["arc_challenge_test"],
                              "arc_challenge_test_5shot"),
    "arc_easy": OlmoTask(("arc_easy_test",), "len_norm", SPLIT_ITEMS["arc_easy_test"], "arc_easy_test_5shot"),
    "piqa": OlmoTask(("piqa_val",), "len_norm", SPLIT_ITEMS["piqa_val"], "piqa_val_5shot"),
    "csqa": OlmoTask(("csqa_val",), "len_norm", SPLIT_ITEMS["csqa_val"], "csqa_val_5shot"),
    "socialiqa": OlmoTask(("socialiqa_val",), "len_norm", SPLIT_ITEMS["socialiqa_val"], "socialiqa_val_5shot"),
    "openbookqa": OlmoTask(("openbookqa_test",), "len_norm", SPLIT_ITEMS["openbookqa_test"], "openbookqa_test_5shot"),
    "boolq": OlmoTask(("boolq_val",), "acc", SPLIT_ITEMS["boolq_val"], None),
    "winogrande": OlmoTask(("winogrande_val",), "len_norm", SPLIT_ITEMS["winogrande_val"], None),
}
OLMO_PAPER_TASKS = tuple(t for t, spec in OLMO_TASKS.items() if spec.paper)
# allenai/OLMo-ladder src/scripts/other/flops_calculation.py: non-embedding parameters
# (MODEL_PARAMS) and training FLOPs per token (MODEL_FLOPS) of each size.
OLMO_PARAMS = {"190M": 190354176, "370M": 371262464, "760M": 758220288, "1B": 1279395840,
               "3B": 3169537280, "7B": 6887575552}
OLMO_FLOPS_PER_TOKEN = {"190M": 1903391232, "370M": 3443922944, "760M": 6373843968, "1B": 10109071360,
                        "3B": 22970355200, "7B": 49412071424}
DEFAULT_OLMO_LINEAGES = ("*xC", "*xC-rerun", "peteish7_eval_full")
_TOKENS, _GFLOPS, _BATCH = "throughput/total_tokens", "throughput/total_training_Gflops", "batch_size_in_tokens"


def olmo_size(lineage: str) -> str:
    """The model size of a ladder lineage (`1B-5xC` → `1B`; `peteish7…` → `7B`)."""
    if lineage.startswith("peteish7"):
        return "7B"
    match = re.fullmatch(r"(\d+[MB])-.*", lineage)
    if not match:
        raise LabelError(f"cannot tell the model size of OLMo-ladder run {lineage!r}",
                         hint="ladder files are named <size>-<multiple>xC.csv, e.g. 1B-5xC.csv")
    return match.group(1)


def import_olmo_ladder(folder: str | Path, *, corpus: str = "c4_en", lineages: Sequence[str] | None = None,
                       tasks: Sequence[str] | None = None, max_bytes: int = IMPORT_MAX_BYTES) -> list[Label]:
    """History labels of the OLMo ladder runs in `folder` (a folder of `<lineage>.csv`, or one
    file). `lineages`: globs over the file stems (default `DEFAULT_OLMO_LINEAGES`); `tasks`:
    names of `OLMO_TASKS` (default all); `corpus`: the validation corpus of the `raw_ce` axis."""
    folder = Path(folder)
    if corpus not in OLMO_CORPORA:
        raise LabelError(f"unknown OLMo validation corpus {corpus!r}", hint=f"one of {', '.join(OLMO_CORPORA)}")
    chosen = _known(tasks, OLMO_TASKS, "OLMo-ladder")
    if folder.is_dir():
        patterns = list(lineages) if lineages is not None else list(DEFAULT_OLMO_LINEAGES)
        files = [f for f in sorted(folder.glob("*.csv")) if _selected(f.stem, patterns)]
        if not files:
            raise LabelError(f"no OLMo-ladder run in {folder} matches {', '.join(patterns)}",
                             hint="point at olmo-ladder/ladder-runs, or widen --lineages")
    elif folder.is_file():
        files = [folder]
    else:
        raise LabelError(f"no OLMo-ladder runs at {folder}")
    labels: list[Label] = []
    for file in files:
        labels.extend(_olmo_file(file, corpus, chosen, max_bytes))
    return labels


def _olmo_file(path: Path, corpus: str, tasks: Sequence[str], max_bytes: int) -> list[Label]:
    lineage, axis = path.stem, f"eval/{corpus}-validation/CrossEntropyLoss"
    size = olmo_size(lineage)
    needed = ["_step", axis] + [c for t in tasks for c in OLMO_TASKS[t].accuracy_columns() + OLMO_TASKS[t].bpb_columns()]
    table = read_table(path, required=needed, max_bytes=max_bytes)
    has_tokens, has_batch = _TOKENS in table.columns, _BATCH in table.columns
    seen: dict[float, int] = {}
    labels = []
    for line, row in table.rows:
        step = table.number(line, row, "_step")
        if step < 0 or step != int(step):
            raise LabelError(f"{path}:{line}: column '_step': {row['_step']!r} is not a whole step")
        if step in seen:
            raise LabelError(f"{path}:{line}: step {int(step)} again (first on line {seen[step]})",
                             hint="a history has one row per step; drop the repeated row")
        seen[step] = line
        if has_tokens:
            tokens: float | None = table.number(line, row, _TOKENS)
        elif has_batch:
            tokens = step * table.number(line, row, _BATCH)
        else:
            tokens = None
        if _GFLOPS in table.columns:
            flops: float | None = table.number(line, row, _GFLOPS) * 1e9
        else:
            flops = tokens * OLMO_FLOPS_PER_TOKEN[size] if tokens is not None and size in OLMO_FLOPS_PER_TOKEN else None
        flops = flops or None   # step 0: no compute yet (a zero has no log)
        params = float(OLMO_PARAMS[size]) if size in OLMO_PARAMS else None
        ce = table.number(line, row, axis)
        for task in tasks:
            spec = OLMO_TASKS[task]
            value = _mean(table.number(line, row, c) for c in spec.accuracy_columns())
            bpb = _mean(table.number(line, row, c) for c in spec.bpb_columns())
            labels.append(Label(
                checkpoint=f"{lineage}@step{int(step)}", value=value, family=size, task=task,
                metric=spec.metric_name, n=spec.n, raw_ce=ce, task_loss=bpb, params=params, flops=flops,
                lineage=lineage, step=step, tokens=tokens,
                imported=_imported(raw_ce=ce, task_loss=bpb, params=params, flops=flops),
                source="olmo-ladder", source_ref=f"{path}:{line}"))
    return labels


def _mean(values: Iterable[float]) -> float:
    values = list(values)
    return sum(values) / len(values)


def _known(asked: Sequence[str] | None, known: dict[str, Any], what: str) -> list[str]:
    if asked is None:
        return list(known)
    unknown = [t for t in asked if t not in known]
    if unknown:
        raise LabelError(f"unknown {what} task(s) {', '.join(unknown)}", hint=f"known: {', '.join(known)}")
    return list(dict.fromkeys(asked))


# -- pythia -----------------------------------------------------------------------------------
PYTHIA_TOKENS_PER_STEP = 1024 * 2048   # 1,024 sequences of 2,048 tokens (Pythia paper, README)
# Total parameters (EleutherAI/pythia README, "current Pythia suffix / total params" table).
PYTHIA_PARAMS = {"70m": 70426624, "160m": 162322944, "410m": 405334016, "1b": 1011781632,
                 "1.4b": 1414647808, "2.8b": 2775208960, "6.9b": 6857302016, "12b": 11846072320}
# task -> (the file's task name, items); MMLU is the mean of the `hendrycksTest-*` subjects.
PYTHIA_TASKS = {
    "arc_easy": ("arc_easy", SPLIT_ITEMS["arc_easy_test"]),
    "arc_challenge": ("arc_challenge", SPLIT_ITEMS["arc_challenge_test"]),
    "piqa": ("piqa", SPLIT_ITEMS["piqa_val"]), "sciq": ("sciq", SPLIT_ITEMS["sciq_test"]),
    "winogrande": ("winogrande", SPLIT_ITEMS["winogrande_val"]),
    "lambada_openai": ("lambada_openai", SPLIT_ITEMS["lambada_openai_test"]),
    "mmlu": ("hendrycksTest-", SPLIT_ITEMS["mmlu_test"]),
}
PYTHIA_SHOTS = {0: "zero-shot", 5: "five-shot"}
_PYTHIA_COLUMNS = ("model", "shots", "step", "task", "metric", "value", "stderr")


def items_from_stderr(value: float, stderr: float) -> float | None:
    """n from lm-eval's standard error of a mean of 0/1 scores, stderr² = p(1−p)/(n−1)."""
    if stderr <= 0 or not 0 < value < 1:
        return None
    return value * (1 - value) / stderr ** 2 + 1


def import_pythia(csv_path: str | Path, *, shots: int = 0, lineages: Sequence[str] | None = None,
                  tasks: Sequence[str] | None = None, max_bytes: int = IMPORT_MAX_BYTES) -> list[Label]:
    """History labels of the Pythia models (see the module's doc for the joins). `shots`: 0 or
    5; `lineages`: globs over model names; `tasks`: names of `PYTHIA_TASKS`."""
    if shots not in PYTHIA_SHOTS:
        raise LabelError(f"Pythia evaluations exist at 0 or 5 shots, not {shots}")
    chosen = _known(tasks, PYTHIA_TASKS, "Pythia")
    table = read_table(csv_path, required=_PYTHIA_COLUMNS, max_bytes=max_bytes)
    path, want = table.path, PYTHIA_SHOTS[shots]
    cells: dict[tuple[str, int], dict[tuple[str, str], tuple[float, float | None, int]]] = {}
    for line, row in table.rows:
        model = row["model"].strip()
        if row["shots"].strip() != want or not _selected(model, lineages):
            continue
        step = table.number(line, row, "step")
        if step < 0 or step != int(step):
            raise LabelError(f"{path}:{line}: column 'step': {row['step']!r} is not a whole step")
        key = (row["task"].strip(), row["metric"].strip())
        stderr = table.number(line, row, "stderr") if row["stderr"].strip() else None
        got = cells.setdefault((model, int(step)), {})
        if key in got:
            raise LabelError(f"{path}:{line}: {model} step {int(step)} {want} {key[0]} {key[1]} again "
                             f"(first on line {got[key][2]})", hint="drop the repeated row")
        got[key] = (table.number(line, row, "value"), stderr, line)
    if not cells:
        raise LabelError(f"{path}: no {want} rows" + (f" of models matching {', '.join(lineages)}" if lineages else ""))
    subject_items = _mmlu_subject_items(cells)
    labels = []
    for (model, step), got in sorted(cells.items()):
        size = model.removeprefix("pythia-").removesuffix("-deduped")
        params = float(PYTHIA_PARAMS[size]) if size in PYTHIA_PARAMS else None
        tokens = float(step * PYTHIA_TOKENS_PER_STEP)
        flops = 6.0 * params * tokens if params is not None and tokens > 0 else None
        ppl = got.get(("lambada_openai", "ppl"))
        raw_ce = math.log(ppl[0]) if ppl is not None and ppl[0] > 0 else None
        for task in chosen:
            name, n = PYTHIA_TASKS[task]
            for metric in ("acc", "acc_norm"):
                if task == "mmlu":
                    found = _mmlu_mean(got, metric, subject_items)
                else:
                    cell = got.get((name, metric))
                    found = (cell[0], cell[1] if cell[1] else None, n) if cell is not None else None
                if found is None:
                    continue
                value, stderr, items = found
                labels.append(Label(
                    checkpoint=f"{model}@step{step}", value=value, family=size, task=task, metric=metric,
                    n=items, stderr=stderr, raw_ce=raw_ce, params=params, flops=flops,
                    lineage=model, step=float(step), tokens=tokens, repo=f"EleutherAI/{model}",
                    imported=_imported(raw_ce=raw_ce, params=params, flops=flops),
                    source="pythia", source_ref=f"{path}:{got[next(iter(got))][2]}"))
    return labels


def _mmlu_subject_items(cells: dict[Any, dict[tuple[str, str], tuple[float, float | None, int]]]) -> dict[str, int]:
    """Items per MMLU subject, given back by the file's stderr (the commonest value over rows)."""
    votes: dict[str, dict[int, int]] = {}
    for got in cells.values():
        for (task, metric), (value, stderr, _) in got.items():
            if task.startswith("hendrycksTest-") and metric == "acc" and stderr:
                n = items_from_stderr(value, stderr)
                if n is not None:
                    tally = votes.setdefault(task, {})
                    tally[round(n)] = tally.get(round(n), 0) + 1
    return {task: max(tally, key=tally.__getitem__) for task, tally in votes.items()}


def _mmlu_mean(got: dict[tuple[str, str], tuple[float, float | None, int]], metric: str,
               subject_items: dict[str, int]) -> tuple[float, float | None, int] | None:
    subjects = sorted(t for (t, m) in got if t.startswith("hendrycksTest-") and m == metric)
    if not subjects:
        return None
    values = [got[(s, metric)][0] for s in subjects]
    errors = [got[(s, metric)][1] for s in subjects]
    stderr = math.sqrt(sum(e * e for e in errors)) / len(errors) if all(errors) else None
    items = sum(subject_items.get(s, 0) for s in subjects) if all(s in subject_items for s in subjects) else None
    if items is None and stderr is None:
        return None
    return _mean(values), stderr, items   # type: ignore[return-value]


# -- obsscaling -------------------------------------------------------------------------------
@dataclass(frozen=True)
class ObsTask:
    column: str
    metric: str
    n: int


# The ObsScaling benchmark columns read, their metric names and test-set sizes: one
# definition, shared with examples/public-evals/make_labels.py.
OBSSCALING_TASKS = {
    "mmlu": ObsTask("MMLU", "acc", SPLIT_ITEMS["mmlu_test"]),
    "arc_challenge": ObsTask("ARC-C", "acc_norm", SPLIT_ITEMS["arc_challenge_test"]),
    "hellaswag": ObsTask("HellaSwag", "acc_norm", SPLIT_ITEMS["hellaswag_val"]),
    "winogrande": ObsTask("Winograd", "acc", SPLIT_ITEMS["winogrande_val"]),
    "gsm8k": ObsTask("GSM8K", "exact_match", 1319),
    "humaneval": ObsTask("HumanEval", "pass@1", 164),
}
_OBS_COLUMNS = ("Model", "Model Family", "Model Size (B)", "Pretraining Data Size (T)", "FLOPs (1E21)")


def import_obsscaling(csv_path: str | Path, *, lineages: Sequence[str] | None = None,
                      tasks: Sequence[str] | None = None, max_bytes: int = IMPORT_MAX_BYTES) -> list[Label]:
    """One labelled checkpoint per model of ObsScaling's benchmark table (lineage = the model)."""
    chosen = _known(tasks, OBSSCALING_TASKS, "ObsScaling")
    table = read_table(csv_path, required=(*_OBS_COLUMNS, *(OBSSCALING_TASKS[t].column for t in chosen)),
                       max_bytes=max_bytes)
    seen: dict[str, int] = {}
    labels = []
    for line, row in table.rows:
        model = row["Model"].strip()
        if not model:
            raise LabelError(f"{table.path}:{line}: column 'Model' is empty")
        if not _selected(model, lineages):
            continue
        if model in seen:
            raise LabelError(f"{table.path}:{line}: model {model!r} again (first on line {seen[model]})")
        seen[model] = line

        def optional(column: str, scale: float) -> float | None:
            return table.number(line, row, column) * scale if row[column].strip() else None

        params, tokens = optional("Model Size (B)", 1e9), optional("Pretraining Data Size (T)", 1e12)
        flops = optional("FLOPs (1E21)", 1e21)
        for task in chosen:
            spec = OBSSCALING_TASKS[task]
            if not row[spec.column].strip():   # not every model has every benchmark
                continue
            labels.append(Label(
                checkpoint=model, value=table.number(line, row, spec.column), family=row["Model Family"].strip() or None,
                task=task, metric=spec.metric, n=spec.n, params=params, flops=flops, lineage=model, tokens=tokens,
                step=0.0,   # one checkpoint per model: a one-step history (`lstar backtest` needs a step)
                repo=model, imported=_imported(params=params, flops=flops),
                source="obsscaling", source_ref=f"{table.path}:{line}"))
    if not labels:
        raise LabelError(f"{table.path}: no labels" + (f" for models matching {', '.join(lineages)}" if lineages else ""))
    return labels


# -- writing ----------------------------------------------------------------------------------
_ID_COLUMNS = ("checkpoint", "family", "value", "n", "stderr", "task", "metric", "repo", "sha")
_AXIS_FIELDS = (*_SCORE_AXIS_COLUMNS, "params", "flops")


def _label_cells(label: Label) -> dict[str, Any]:
    cells: dict[str, Any] = {c: getattr(label, c) for c in _ID_COLUMNS}
    cells.update({a: getattr(label, a) for a in _AXIS_FIELDS})
    cells.update({f"{a}_se": label.axis_se.get(a) for a in _SCORE_AXIS_COLUMNS if a != "lstar"})
    cells["lstar_se"] = label.lstar_se
    cells.update({h: getattr(label, h) for h in HISTORY_COLUMNS})
    return cells


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value)   # shortest text that reads back as the same float
    return str(value)


def write_labels_csv(labels: Sequence[Label], path: str | Path) -> Path:
    """Write labels in the CSV format `read_labels_csv` reads back to equal labels (all but
    `source`, `source_ref` and `details`): only the columns some label fills, floats exactly."""
    labels = list(labels)
    if not labels:
        raise LabelError("no labels to write")
    rows = []
    for i, label in enumerate(labels):
        where = f"label {i + 1} ({label.checkpoint!r})"
        if label.budget is not None:
            raise LabelError(f"{where} has an inference budget, which a history file has no column for")
        if label.n is None and label.stderr is None:
            raise LabelError(f"{where} has neither n nor stderr", hint="read_labels_csv needs one of them")
        if not label.checkpoint or any(ch in str(v) for v in (label.checkpoint, label.family, label.task,
                                                              label.metric, label.lineage) for ch in "\r\n"):
            raise LabelError(f"{where}: names must be non-empty and on one line")
        rows.append(_label_cells(label))
    columns = [c for c in rows[0] if c in ("checkpoint", "family", "value") or any(r[c] is not None for r in rows)]
    if not any(c in columns for c in _AXIS_FIELDS):
        raise LabelError("the labels have no axis value (raw_ce, task_loss, params, flops, …)",
                         hint="read_labels_csv needs at least one axis column")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(columns)
        writer.writerows([_cell(r[c]) for c in columns] for r in rows)
    return path
