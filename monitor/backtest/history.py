"""Training histories: lineages of checkpoints in training order, split into references and targets.

A history is a labels CSV (`monitor.curves.labels.read_labels_csv`) whose rows also say where a
checkpoint sits in its training run: `lineage`, `step` (and optionally `tokens`, `flops`). One
row per checkpoint × task × metric. `load_history` groups the rows by lineage, orders each
lineage by step, and splits the lineages by name glob (RE2, `monitor.patterns.compile_glob`)
into references (what curves are fitted on) and targets (what is replayed checkpoint by
checkpoint). A lineage matching both globs is refused: a target the curve was fitted on would
be judged by its own data.
"""

from __future__ import annotations

from typing import Any

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from monitor.curves.axes import get_axis, label_point
from monitor.curves.labels import Label, read_labels_csv
from monitor.errors import LabelError
from monitor.patterns import PatternError, compile_glob

# A history of every OLMo ladder run at every checkpoint × 40 task metrics is ~200k rows
# (~40 MB); beyond this the file is a mistake (or an attack), refused before it is read.
MAX_HISTORY_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class Lineage:
    """One training run: its name and its checkpoints' labels, ordered by step."""

    name: str
    labels: tuple[Label, ...]

    @property
    def steps(self) -> list[float]:
        """The distinct steps of the lineage, in training order."""
        return sorted({float(label.step) for label in self.labels if label.step is not None})

    def task_labels(self, task: str, metric: str) -> list[Label]:
        """The lineage's rows of one task and metric, in training order."""
        rows = [label for label in self.labels if label.task == task and label.metric == metric]
        return sorted(rows, key=lambda label: float(label.step or 0.0))


@dataclass(frozen=True)
class History:
    """A history split into reference and target lineages (each ordered by name)."""

    path: str
    references: tuple[Lineage, ...]
    targets: tuple[Lineage, ...]

    def reference_labels(self) -> list[Label]:
        """Every row of every reference lineage (what the curves are fitted on)."""
        return [label for lineage in self.references for label in lineage.labels]


class _AnyGlob:
    """Several globs (a comma-separated list): a name matches when any of them matches."""

    def __init__(self, globs: Sequence[Any]) -> None:
        self.globs = tuple(globs)

    def fullmatches(self, name: str) -> bool:
        return any(glob.fullmatches(name) for glob in self.globs)


def _glob(pattern: str, flag: str) -> _AnyGlob:
    """`pattern`: one shell glob, or several separated by commas (`pythia-70m*,pythia-160m*`)."""
    parts = [part.strip() for part in pattern.split(",")]
    if not all(parts):
        raise LabelError(f"{flag} {pattern!r} has an empty glob",
                         hint="separate globs by single commas, e.g. 'small-*,medium-*'")
    globs = []
    for part in parts:
        try:
            globs.append(compile_glob(part))
        except PatternError as exc:
            raise LabelError(f"{flag} {part!r} is not a usable glob: {exc.reason}",
                             hint="write a shell glob such as 'ladder-*' (RE2 rules, monitor/patterns.py)") from exc
    return _AnyGlob(globs)


def check_duplicates(labels: Sequence[Label], path: str) -> None:
    """Refuse two rows of the same (lineage, step, task, metric), naming them."""
    seen: dict[tuple[str, float, str, str], int] = {}
    for label in labels:
        key = (label.lineage or "", float(label.step or 0.0), label.task or "", label.metric or "")
        seen[key] = seen.get(key, 0) + 1
    dupes = [k for k, count in seen.items() if count > 1]
    if dupes:
        named = "; ".join(f"lineage {k[0]!r} step {step_text(k[1])} task {k[2]!r} metric {k[3]!r}" for k in dupes[:5])
        raise LabelError(f"{path}: {len(dupes)} (lineage, step, task, metric) listed more than once: {named}",
                         hint="keep one row per checkpoint, task and metric")


def check_history_rows(labels: Sequence[Label], path: str) -> None:
    """Every row of a history names its lineage, step, task and metric."""
    for label in labels:
        where = f"{path}: checkpoint {label.checkpoint!r}"
        if not label.lineage:
            raise LabelError(f"{where} has no lineage", hint="a history needs a lineage column, filled in every row")
        if label.step is None:
            raise LabelError(f"{where} (lineage {label.lineage!r}) has no step",
                             hint="a history needs a step column (the training step), filled in every row")
        if not label.task or not label.metric:
            raise LabelError(f"{where} has no task or metric", hint="fill the task and metric columns in every row")


def check_target_axis(targets: Sequence[Lineage], axis: str, path: str) -> None:
    """Every target checkpoint carries a finite value on `axis` (a replay predicts from it)."""
    ax = get_axis(axis)
    for lineage in targets:
        for label in lineage.labels:
            if label_point(label, axis) is None:
                raise LabelError(f"{path}: target lineage {lineage.name!r}, step {step_text(label.step)}, task "
                                 f"{label.task!r}: no {ax.label} value",
                                 hint=f"give the {ax.column} column for every target checkpoint, or "
                                      "choose an axis the history has (--axis)")


def split_history(labels: Sequence[Label], *, reference: str | None, target: str, axis: str,
                  path: str = "history") -> History:
    """Group `labels` by lineage (each ordered by step), split them by the two globs, validate.
    `reference` None: no references (a replay with given curves fits nothing)."""
    check_history_rows(labels, path)
    check_duplicates(labels, path)
    ref_glob = _glob(reference, "--reference") if reference is not None else None
    target_glob = _glob(target, "--target")
    by_lineage: dict[str, list[Label]] = {}
    for label in labels:
        by_lineage.setdefault(str(label.lineage), []).append(label)
    references, targets = [], []
    for name in sorted(by_lineage):
        rows = tuple(sorted(by_lineage[name], key=lambda label: (float(label.step or 0.0), label.task or "",
                                                               label.metric or "")))
        is_ref = ref_glob is not None and ref_glob.fullmatches(name)
        is_target = target_glob.fullmatches(name)
        if is_ref and is_target:
            raise LabelError(f"{path}: lineage {name!r} matches both --reference {reference!r} and "
                             f"--target {target!r}",
                             hint="a target must not be among the references its curve is fitted on")
        if is_ref:
            references.append(Lineage(name, rows))
        elif is_target:
            targets.append(Lineage(name, rows))
    names = ", ".join(sorted(by_lineage)[:8])
    if not references and reference is not None:
        raise LabelError(f"{path}: no lineage matches --reference {reference!r} (lineages: {names})")
    if not targets:
        raise LabelError(f"{path}: no lineage matches --target {target!r} (lineages: {names})")
    check_target_axis(targets, axis, path)
    return History(path=path, references=tuple(references), targets=tuple(targets))


def load_history(path: str | Path, *, reference: str | None, target: str, axis: str) -> History:
    """Read a history CSV (bounded in size) and split it (`split_history`)."""
    path = Path(path)
    try:
        size = path.stat().st_size
    except FileNotFoundError as exc:
        raise LabelError(f"no history file at {path}") from exc
    except OSError as exc:
        raise LabelError(f"cannot read {path}: {exc.strerror}") from exc
    if not path.is_file():
        raise LabelError(f"{path} is not a regular file")
    if size > MAX_HISTORY_BYTES:
        raise LabelError(f"{path} is {size:,} bytes, more than a history may be ({MAX_HISTORY_BYTES:,})",
                         hint="split it by lineage")
    return split_history(read_labels_csv(path), reference=reference, target=target, axis=axis, path=str(path))


def step_text(step: float | None) -> str:
    """A step written exactly (`1000001`, not `1e+06`): it names checkpoints and their shas."""
    step = float(step or 0.0)
    return str(int(step)) if step.is_integer() and abs(step) < 1e18 else repr(step)


__all__ = ["History", "Lineage", "MAX_HISTORY_BYTES", "check_duplicates", "load_history", "split_history",
           "step_text"]
