"""Task-format instability (the L* paper's §9): does a task's ordering of checkpoints survive a
change of surface form that changes nothing a reader would call the task?

Every multiple-choice item of a task file (`monitor.curves.evaluator`'s format: id, context,
choices, answer) is re-encoded under semantically equivalent surface forms of different token
lengths (`FORMATS`: neutral padding before the context, whitespace collapsed, the options
listed with letter labels or with numbered labels and the label scored instead of the text).
Each checkpoint is scored on each format with the project's evaluator
(`evaluate_multiple_choice`, unchanged), and the task metric (`prob_correct` unless
`options.extra["task_format_metric"]` names another of the evaluator's metrics) is read per
(format, checkpoint).

**Format instability.** A checkpoint's L* is measured on the calibration corpus, so it is the
same under every task format: any scalar progress metric (L*, or any other one number per
checkpoint) puts the checkpoints in one order, whatever the format. For a pair of checkpoints
(i, j) and F formats, let w_ij be the number of formats in which i scores above j and
l_ij = F - w_ij the number in which it does not (a tie counts ½ to each). The instability of
the pair is its minority share min(w_ij, l_ij) / F, and the task's **format instability** is
its mean over the n(n-1)/2 pairs:

    instability = mean_{i<j} min(w_ij, l_ij) / F          (0 = every format orders the pairs alike;
                                                            0.5 = formats split evenly on each pair)

**Accuracy upper bound.** A scalar metric predicts one order per pair, so against the
(pair, format) orderings it can be right at most max(w_ij, l_ij) times out of F per pair:
its pairwise prediction accuracy is at most `1 - instability`. No progress coordinate, however
good, can beat this on the task: the task itself does not decide the order.

Two caveats, stated in every result's notes: the measured instability includes the items'
sampling noise (with few items two close checkpoints flip by chance), and it needs at least two
checkpoints (with one, `instability` is None and only the per-item flip rate is reported: the
share of items whose correctness changes between formats).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import combinations
from typing import Any

import numpy as np

from monitor.curves.evaluator import McItem, McResult, McTask, evaluate_multiple_choice, load_mc_task
from monitor.errors import LabelError
from monitor.stress.subject import StressCheckpoint, StressOptions, StressSubject

DEFAULT_METRIC = "prob_correct"
PADDING = "Read the following passage and continue it.\n\n"
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


@dataclass(frozen=True)
class SurfaceFormat:
    """One surface form: `encode` maps an item to the same question, differently written."""

    name: str
    description: str
    encode: Callable[[McItem], McItem]


def _original(item: McItem) -> McItem:
    return item


def _padded(item: McItem) -> McItem:
    return replace(item, context=PADDING + item.context)


def _collapsed(item: McItem) -> McItem:
    # runs of whitespace (newlines, indentation) become one space; the options are unchanged
    return replace(item, context=re.sub(r"\s+", " ", item.context).strip())


def _listed(item: McItem, labels: Sequence[str], opener: str, answer_cue: str,
            scored: Callable[[str], str]) -> McItem:
    lines = [f"{opener}{label}{choice.strip()}" for label, choice in zip(labels, item.choices)]
    context = item.context + "\n\nWhich continuation comes next?\n" + "\n".join(lines) + "\n" + answer_cue
    return replace(item, context=context, choices=tuple(scored(label) for label in labels))


def letter_label(index: int) -> str:
    """A, B, …, Z, then AA, AB, … (spreadsheet columns): an item may have more than 26 options
    (the task file bounds only their number's minimum), and each needs its own label."""
    label = ""
    index += 1
    while index:
        index, rest = divmod(index - 1, 26)
        label = LETTERS[rest] + label
    return label


def _letters(item: McItem) -> McItem:
    labels = [letter_label(i) for i in range(len(item.choices))]
    return _listed(item, [f"{c}. " for c in labels], "", "Answer:", lambda label: " " + label.removesuffix(". "))


def _numbers(item: McItem) -> McItem:
    labels = [f"{i + 1}) " for i in range(len(item.choices))]
    return _listed(item, labels, "(", "Answer: (", lambda label: label.strip())


FORMATS: tuple[SurfaceFormat, ...] = (
    SurfaceFormat("original", "the task file as written", _original),
    SurfaceFormat("padded", f"a neutral instruction line before the context ({PADDING.strip()!r})", _padded),
    SurfaceFormat("collapsed_whitespace", "runs of whitespace in the context collapsed to one space", _collapsed),
    SurfaceFormat("letter_labels", "options listed as 'A. …', the letter scored after 'Answer:'", _letters),
    SurfaceFormat("number_labels", "options listed as '(1) …', the number scored after 'Answer: ('", _numbers),
)


def reformat_task(task: McTask, surface: SurfaceFormat) -> McTask:
    """The task with every item re-encoded in `surface` (same ids and answers)."""
    return replace(task, name=f"{task.name}[{surface.name}]", items=tuple(surface.encode(i) for i in task.items))


def format_instability(values: Mapping[str, Sequence[float]]) -> tuple[float | None, float | None]:
    """(instability, accuracy upper bound) of {format: one value per checkpoint, same order in
    every format} as the module docstring defines them; (None, None) for fewer than 2
    checkpoints. Higher values rank higher (pass -brier for the Brier score)."""
    formats = list(values)
    if not formats:
        raise LabelError("format instability needs at least one format")
    table = np.array([np.asarray(values[f], dtype=np.float64) for f in formats])   # [F, n]
    if table.ndim != 2 or table.shape[1] < 2:
        return None, None
    n_formats = table.shape[0]
    minority = []
    for i, j in combinations(range(table.shape[1]), 2):
        diff = table[:, i] - table[:, j]
        wins = float(np.sum(diff > 0) + 0.5 * np.sum(diff == 0))
        minority.append(min(wins, n_formats - wins) / n_formats)
    instability = float(np.mean(minority))
    return instability, 1.0 - instability


def item_flip_rate(correct: Mapping[str, np.ndarray]) -> float:
    """Share of items whose correctness (argmax option = answer) is not the same in every format."""
    table = np.array([np.asarray(v, dtype=bool) for v in correct.values()])
    return float(np.mean(table.any(axis=0) != table.all(axis=0)))


def _load(checkpoint: StressCheckpoint, options: StressOptions) -> tuple[Any, Any, int | None, int | None]:
    """(model, tokenizer, prefix token, max positions) of a checkpoint, through the engine's loader."""
    from monitor.scoring import load_checkpoint, load_tokenizer
    from monitor.scoring.engine import resolve_model_ref

    loaded = load_checkpoint(resolve_model_ref(checkpoint.ref), dtype=options.extra.get("dtype", "auto"),
                             device=options.extra.get("device", "auto"))
    handle = load_tokenizer(checkpoint.tokenizer_dir or loaded.model_dir)
    return loaded.model, handle.tokenizer, handle.prefix_token_id, loaded.max_positions


def _sign(metric: str) -> float:
    return -1.0 if metric == "brier" else 1.0     # lower Brier is better


def format_stress(subject: StressSubject, options: StressOptions) -> dict[str, Any]:
    """The `task_format` section for `subject`'s checkpoints on `options.task_file` (the first
    `options.extra["task_format_items"]` items when set): per format and checkpoint the metric,
    its standard error, the accuracy and the mean context length in tokens; per task the format
    instability, the accuracy upper bound it implies and each checkpoint's item flip rate.
    `options.extra["task_format_every"]` = k takes every k-th item first (slices spread evenly)."""
    if options.task_file is None:
        raise LabelError("the task_format test needs a task file", hint="pass --task-file PATH (e.g. "
                         "../shared/tasks/cloze-v0.jsonl)")
    if not subject.checkpoints:
        raise LabelError(f"stress subject {subject.name} has no checkpoints")
    metric = str(options.extra.get("task_format_metric", DEFAULT_METRIC))
    limit = options.extra.get("task_format_items")
    every = options.extra.get("task_format_every", 1)
    for key, value in (("task_format_every", every), ("task_format_items", limit)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            # a step of 0 raises in the slice; a negative one reverses the file; a negative
            # count drops items from the end
            raise LabelError(f"{key} {value!r} is not a positive whole number", hint="e.g. 5")
    task = load_mc_task(options.task_file)
    # every k-th item first (a task file is often grouped by slice), then the first `limit` of those
    task = replace(task, items=task.items[::every][:int(limit) if limit is not None else None])
    selection = f"every {every} item(s) of the file, the first {limit if limit is not None else 'all'} of those"
    formats = [f for f in FORMATS if f.name in options.extra.get("task_formats", [f.name for f in FORMATS])]
    loader = options.extra.get("task_format_loader", _load)   # tests pass a loader of tiny models
    per_format: dict[str, list[dict[str, Any]]] = {f.name: [] for f in formats}
    flips: list[dict[str, Any]] = []
    for checkpoint in subject.checkpoints:
        model, tokenizer, prefix, max_positions = loader(checkpoint, options)
        correct = {}
        for surface in formats:
            variant = reformat_task(task, surface)
            result: McResult = evaluate_multiple_choice(model, tokenizer, variant, prefix_token_id=prefix,
                                                        batch_size=int(options.extra.get("batch_size", 8)),
                                                        max_length=max_positions)
            if metric not in result.metrics:
                raise LabelError(f"task_format_metric {metric!r} is not an evaluator metric",
                                 hint="use one of " + ", ".join(result.metrics))
            value, stderr = result.metrics[metric]
            correct[surface.name] = np.array([np.argmax(ll) == a for ll, a in
                                              zip(result.loglikelihoods, result.answers)])
            tokens = [len(tokenizer.encode(item.context, add_special_tokens=False).ids) for item in variant.items]
            per_format[surface.name].append({
                "label": checkpoint.label, "metric": metric, "value": value, "stderr": stderr,
                "acc": result.metrics["acc"][0], "mean_context_tokens": float(np.mean(tokens)),
                **({"note": checkpoint.note} if checkpoint.note else {})})
        flips.append({"label": checkpoint.label, "item_flip_rate": item_flip_rate(correct)})
    sign = _sign(metric)
    instability, bound = format_instability(
        {name: [sign * row["value"] for row in rows] for name, rows in per_format.items()})
    notes = ["instability includes the items' sampling noise: close checkpoints can flip by chance"]
    if instability is None:
        notes.append("one checkpoint: no ordering to compare, only the item flip rate is reported")
    notes += [f"{c.label}: {c.note}" for c in subject.checkpoints if c.note]
    return {"test": "task_format", "metric": metric, "tasks": [{
        "task": task.name, "task_sha256": task.sha256, "n_items": len(task.items), "selection": selection,
        "formats": [{"name": f.name, "description": f.description, "checkpoints": per_format[f.name]}
                    for f in formats],
        "instability": instability, "accuracy_upper_bound": bound, "item_flips": flips}],
        "notes": notes}
