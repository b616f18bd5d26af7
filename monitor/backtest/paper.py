"""Reference figures of relative error to set beside a backtest's own (`--paper-errors CSV`).

Two layouts are read: `task,rel_error` (a fraction: -0.14 is 14 % below), and the OLMo ladder
paper's `paper-figures/step2_*.csv` (`Task,Actual,Pred,Rel Error`, the error as a fraction
as that file writes it, or in percent where the cell says so: `-14.2%`). A task-name map (`{file name: backtest task}`) joins the paper's names
(`mmlu_avg_test_5shot`) to the backtest's. The file is read bounded, every cell checked.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Mapping
from pathlib import Path

from monitor.errors import LabelError

MAX_PAPER_BYTES = 1024 * 1024


def _number(cell: str, path: Path, line: int, column: str) -> float:
    text = cell.strip().rstrip("%").strip()
    try:
        value = float(text)
    except ValueError:
        raise LabelError(f"{path}:{line}: column {column!r}: {cell!r} is not a number") from None
    if not math.isfinite(value):
        raise LabelError(f"{path}:{line}: column {column!r} is {cell!r} (not a finite number)")
    return value


def read_paper_errors(path: str | Path, task_map: Mapping[str, str] | None = None) -> dict[str, float]:
    """{backtest task: relative error as a fraction} from either layout."""
    path = Path(path)
    try:
        if not path.is_file():
            raise LabelError(f"no paper-errors file at {path}", hint="give a CSV with columns task,rel_error")
        if path.stat().st_size > MAX_PAPER_BYTES:
            raise LabelError(f"{path} is larger than {MAX_PAPER_BYTES:,} bytes; a table of errors is small")
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise LabelError(f"cannot read {path}: {exc}") from exc
    reader = csv.DictReader(io.StringIO(text))
    columns = [c.strip() for c in reader.fieldnames or []]
    if "task" in columns and "rel_error" in columns:
        name_col, error_col = "task", "rel_error"
    elif "Task" in columns and "Rel Error" in columns:
        name_col, error_col = "Task", "Rel Error"
    else:
        raise LabelError(f"{path} has columns {', '.join(columns) or '(none)'}",
                         hint="give task,rel_error (a fraction) or the paper's Task,Actual,Pred,Rel Error")
    mapping = dict(task_map or {})
    out: dict[str, float] = {}
    for line, raw in enumerate(reader, start=2):
        row = {(k or "").strip(): (v or "").strip() for k, v in raw.items()}
        name = row.get(name_col, "")
        if not name:
            raise LabelError(f"{path}:{line}: column {name_col!r} is empty")
        cell = row.get(error_col, "")
        value = _number(cell, path, line, error_col)
        task = mapping.get(name, name)
        if task in out:
            raise LabelError(f"{path}:{line}: task {task!r} listed twice")
        out[task] = value / 100.0 if cell.endswith("%") else value
    return out


def parse_task_map(items: list[str] | None) -> dict[str, str]:
    """`PAPER=TASK` pairs (from `--paper-task`) as a mapping."""
    out = {}
    for item in items or []:
        left, eq, right = item.partition("=")
        if not eq or not left.strip() or not right.strip():
            raise LabelError(f"--paper-task {item!r} is not PAPER_NAME=TASK")
        out[left.strip()] = right.strip()
    return out


__all__ = ["parse_task_map", "read_paper_errors"]
