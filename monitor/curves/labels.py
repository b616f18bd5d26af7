"""Task labels: lm-evaluation-harness results, CSV tables, and rows of the database.

A label is one (checkpoint, task, metric) measurement, optionally with the checkpoint's
predictors (L*, raw CE, parameters, FLOPs) when the source has them. `monitor.curves.fit` fits
curves on labels; `lstar eval` stores the labels of the multiple-choice evaluator
(`monitor.curves.evaluator`) in the database.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

from monitor.errors import LabelError
from monitor.store.rows import LabelRow

MC_METRICS = ("acc", "acc_norm", "prob_correct", "brier")


# -- labels -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Label:
    """One measurement of one checkpoint on one task metric."""

    checkpoint: str
    value: float
    family: str | None = None
    task: str | None = None
    metric: str | None = None
    n: int | None = None
    stderr: float | None = None
    repo: str | None = None
    sha: str | None = None
    lstar: float | None = None
    lstar_se: float | None = None
    raw_ce: float | None = None
    params: float | None = None
    flops: float | None = None
    source: str = "csv"
    source_ref: str | None = None
    details: dict[str, Any] = field(default_factory=dict, compare=False)
    # The other score axes (monitor.curves.axes), their standard errors by axis name (L*'s is
    # lstar_se), and the axes whose value the label's file gave directly rather than a score
    # run of the store (an imported point: a published bits/byte, a parameter count).
    bits_per_byte: float | None = None
    lstar_per_byte: float | None = None
    l_rel: float | None = None
    l_gain: float | None = None
    axis_se: dict[str, float] = field(default_factory=dict)
    imported: tuple[str, ...] = ()
    # The inference budget the value was measured at (samples per question, majority-of-k, an
    # ordered level such as chain of thought off/on), from a labels file's budget column.
    budget: float | None = None
    # Where the checkpoint sits in a training run (a history file, `monitor.backtest`): the
    # run it belongs to, its training step, and the tokens seen so far; `flops` is its compute.
    lineage: str | None = None
    step: float | None = None
    tokens: float | None = None
    # The task loss (`monitor.curves.axes`, "task_loss"): bits per byte of this task's correct
    # answers at this checkpoint.
    task_loss: float | None = None

    def with_(self, **changes: Any) -> "Label":
        """A copy with some fields changed."""
        return replace(self, **changes)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def select_labels(labels: Sequence[Label], *, task: str | None, metric: str | None) -> tuple[list[Label], str]:
    """The rows of one task and metric, and the metric's name.

    Rows without a task (or metric) match any; when rows name tasks or metrics, an unknown
    one is an error listing those available. With no metric asked for and exactly one
    present, that one is used.
    """
    labels = list(labels)
    if not labels:
        raise LabelError("no labels to select from")
    tasks = sorted({label.task for label in labels if label.task is not None})
    if task is not None and tasks and task not in tasks:
        raise LabelError(f"unknown task {task!r} in the labels", hint=f"available: {', '.join(tasks)}")
    rows = [label for label in labels if task is None or label.task in (None, task)]
    metrics = sorted({label.metric for label in rows if label.metric is not None})
    if metric is None:
        if len(metrics) > 1:
            raise LabelError(f"task {task!r} has several metrics ({', '.join(metrics)})",
                             hint="choose one with --metric")
        metric = metrics[0] if metrics else "value"
    elif metrics and metric not in metrics:
        raise LabelError(f"unknown metric {metric!r} for task {task!r}", hint=f"available: {', '.join(metrics)}")
    return [label for label in rows if label.metric in (None, metric)], metric


# -- lm-evaluation-harness results --------------------------------------------------------------
def _model_args(config: dict[str, Any]) -> dict[str, str]:
    args = config.get("model_args")
    if isinstance(args, dict):
        return {str(k): str(v) for k, v in args.items()}
    if isinstance(args, str):
        pairs = (part.split("=", 1) for part in args.split(",") if "=" in part)
        return {k.strip(): v.strip() for k, v in pairs}
    return {}


def read_lm_eval_results(path: str | Path, *, family: str | None = None) -> list[Label]:
    """Labels from lm-evaluation-harness `results_*.json` files (a file, or a folder searched
    recursively). Every task and metric in `results` becomes a label; `<metric>_stderr,<filter>`
    is its standard error and `n-samples[task].effective` its count. The checkpoint is the
    model (`model_name`, else `pretrained=` of `config.model_args`) at `config.model_sha`
    (else the revision). A metric under a filter other than `none` is named `<metric>,<filter>`.
    `family` defaults to the model's repo id.
    """
    path = Path(path)
    if path.is_dir():
        files = sorted(path.rglob("results_*.json"))
        if not files:
            raise LabelError(f"no results_*.json files under {path}")
    elif path.is_file():
        files = [path]
    else:
        raise LabelError(f"no lm-eval results at {path}")
    labels: list[Label] = []
    for file in files:
        labels.extend(_read_one_results_file(file, family))
    return labels


def _read_one_results_file(file: Path, family: str | None) -> list[Label]:
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise LabelError(f"{file} is not a JSON results file: {' '.join(str(exc).split())}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("results"), dict):
        raise LabelError(f"{file} has no 'results' object; is it an lm-eval results file?")
    config = data.get("config") if isinstance(data.get("config"), dict) else {}
    args = _model_args(config)
    repo = data.get("model_name") or args.get("pretrained") or args.get("model") or config.get("model")
    if not repo or not isinstance(repo, str):
        raise LabelError(f"{file} names no model (model_name, or pretrained= in config.model_args)")
    sha = config.get("model_sha") or None
    revision = config.get("model_revision") or args.get("revision")
    if revision and revision != "main":
        checkpoint = f"{repo}@{revision}"
    elif sha:
        checkpoint = f"{repo}@{sha[:12]}"
    else:
        checkpoint = repo
    params = config.get("model_num_parameters")
    params = float(params) if isinstance(params, (int, float)) and params > 0 else None
    n_samples = data.get("n-samples") if isinstance(data.get("n-samples"), dict) else {}
    labels = []
    for task, metrics in data["results"].items():
        if not isinstance(metrics, dict):
            continue
        counts = n_samples.get(task) if isinstance(n_samples.get(task), dict) else {}
        n = counts.get("effective", counts.get("original"))
        for key, value in metrics.items():
            name, sep, filt = key.partition(",")
            if not sep or name.endswith("_stderr") or not isinstance(value, (int, float)) \
                    or isinstance(value, bool):
                continue
            stderr = metrics.get(f"{name}_stderr,{filt}")
            stderr = float(stderr) if isinstance(stderr, (int, float)) and not isinstance(stderr, bool) \
                and math.isfinite(stderr) else None
            labels.append(Label(
                checkpoint=checkpoint, value=float(value), family=family or repo, task=task,
                metric=name if filt == "none" else f"{name},{filt}",
                n=int(n) if isinstance(n, int) else None, stderr=stderr, repo=repo, sha=sha,
                params=params, imported=("log_params",) if params is not None else (),
                source="lm-eval", source_ref=str(file),
                details={"revision": revision, "n_shot": (data.get("n-shot") or {}).get(task)}))
    return labels


# -- CSV tables ---------------------------------------------------------------------------------
# A column per axis, named as the axis (monitor.curves.axes.AXES), with `<axis>_se` for its
# standard error; `params`/`flops` are raw counts (log_params/log_flops their log10).
CSV_REQUIRED = ("checkpoint", "family", "value")
_SCORE_AXIS_COLUMNS = ("lstar", "bits_per_byte", "lstar_per_byte", "l_rel", "l_gain", "raw_ce", "task_loss")
CSV_AXIS_COLUMNS = (*_SCORE_AXIS_COLUMNS, "log_params", "log_flops", "params", "flops")
# lineage, step and tokens place a checkpoint in its training run (a history: `lstar backtest`).
HISTORY_COLUMNS = ("lineage", "step", "tokens")
CSV_OPTIONAL = ("n", "stderr", "task", "metric", "repo", "sha", *CSV_AXIS_COLUMNS,
                *(f"{a}_se" for a in _SCORE_AXIS_COLUMNS), *HISTORY_COLUMNS)


def read_labels_csv(path: str | Path, *, budget_column: str | None = None) -> list[Label]:
    """Labels with axis values from a CSV table: columns checkpoint, family, value, and per row
    n or stderr; then one column per axis it gives (lstar, bits_per_byte, lstar_per_byte, l_rel,
    l_gain, raw_ce, log_params, log_flops, or raw params / flops), each score axis optionally
    with `<axis>_se`; optionally task, metric, repo, sha. Every axis value read from the file
    is marked imported (not measured by a score run of the store). `budget_column` names one
    more column, required in every row: the inference budget of the value (a number; ordered
    levels such as chain of thought off/on as 0/1). Errors name the line and column."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except FileNotFoundError as exc:
        raise LabelError(f"no labels file at {path}") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise LabelError(f"cannot read {path}: {exc}") from exc
    reader = csv.DictReader(text.splitlines())
    _check_header(path, [c.strip() for c in (reader.fieldnames or [])], budget_column)
    labels = []
    for line, raw in enumerate(reader, start=2):
        row = {k.strip(): (v or "").strip() for k, v in raw.items() if k is not None}
        number = partial(_cell_number, row, where=f"{path}:{line}")
        if not row.get("checkpoint"):
            raise LabelError(f"{path}:{line}: column 'checkpoint' is empty")
        n = number("n", integer=True)
        stderr = number("stderr")
        if n is None and stderr is None:
            raise LabelError(f"{path}:{line}: row has neither n nor stderr",
                             hint="give the number of items (n) or the metric's standard error")
        params, flops = number("params"), number("flops")
        if number("log_params") is not None:
            params = 10.0 ** number("log_params")
        if number("log_flops") is not None:
            flops = 10.0 ** number("log_flops")
        values = {a: number(a) for a in _SCORE_AXIS_COLUMNS}
        ses = {a: number(f"{a}_se") for a in _SCORE_AXIS_COLUMNS}
        for a, se in ses.items():
            if se is not None and se < 0:
                raise LabelError(f"{path}:{line}: column {a + '_se'!r} is negative")
        given = {**values, "log_params": params, "log_flops": flops}
        labels.append(Label(
            checkpoint=row["checkpoint"], value=number("value", required=True),
            family=row.get("family") or None, task=row.get("task") or None,
            metric=row.get("metric") or None, n=n, stderr=stderr,
            repo=row.get("repo") or None, sha=row.get("sha") or None,
            lstar=values["lstar"], lstar_se=ses["lstar"], raw_ce=values["raw_ce"], params=params, flops=flops,
            bits_per_byte=values["bits_per_byte"], lstar_per_byte=values["lstar_per_byte"],
            l_rel=values["l_rel"], l_gain=values["l_gain"], task_loss=values["task_loss"],
            lineage=row.get("lineage") or None, step=number("step"), tokens=number("tokens"),
            axis_se={a: se for a, se in ses.items() if se is not None and a != "lstar"},
            imported=tuple(a for a, v in given.items() if v is not None),
            budget=number(budget_column, required=True) if budget_column is not None else None,
            source="csv", source_ref=str(path)))
    if not labels:
        raise LabelError(f"{path} has a header but no rows")
    return labels


def _check_header(path: Path, columns: list[str], budget_column: str | None) -> None:
    """The labels file's header: the required columns (and the budget column, when one is named),
    no unknown one, at least one axis, and not both a raw and a log count."""
    if budget_column is not None and budget_column in CSV_REQUIRED + CSV_OPTIONAL:
        raise LabelError(f"the budget column {budget_column!r} is one of the labels file's own columns",
                         hint="name the column that holds the inference budget, e.g. samples")
    required = CSV_REQUIRED + ((budget_column,) if budget_column is not None else ())
    missing = [c for c in required if c not in columns]
    if missing:
        raise LabelError(f"{path} lacks column(s) {', '.join(missing)}",
                         hint=f"the header must include {','.join(CSV_REQUIRED)} and at least one axis column")
    unknown = [c for c in columns if c not in required + CSV_OPTIONAL]
    if unknown:
        raise LabelError(f"{path} has unknown column(s) {', '.join(unknown)}",
                         hint=f"allowed: {','.join(CSV_REQUIRED + CSV_OPTIONAL)}")
    if not any(c in columns for c in CSV_AXIS_COLUMNS):
        raise LabelError(f"{path} has no axis column",
                         hint=f"give at least one of {', '.join(CSV_AXIS_COLUMNS)}")
    for raw_col, log_col in (("params", "log_params"), ("flops", "log_flops")):
        if raw_col in columns and log_col in columns:
            raise LabelError(f"{path} has both {raw_col!r} and {log_col!r}", hint="keep one of the two")


def _cell_number(row: dict[str, str], col: str, *, where: str, required: bool = False,
                 integer: bool = False) -> Any:
    """The number in column `col` of a labels row (None when empty and not required); `where`
    (`path:line`) starts every error."""
    cell = row.get(col, "")
    if cell == "":
        if required:
            raise LabelError(f"{where}: column {col!r} is empty")
        return None
    try:
        value = float(cell)
    except ValueError as exc:
        raise LabelError(f"{where}: column {col!r}: {cell!r} is not a number") from exc
    if not math.isfinite(value):
        raise LabelError(f"{where}: column {col!r} is {cell!r} (not a finite number)",
                         hint="drop or fix the row")
    if integer:
        if value != int(value) or value <= 0:
            raise LabelError(f"{where}: column {col!r}: {cell!r} is not a positive whole number")
        return int(value)
    return value


# -- labels and the store -----------------------------------------------------------------------
def labels_from_rows(rows: Sequence[LabelRow], *, latest_only: bool = True) -> list[Label]:
    """Labels from `Store.labels()` rows (oldest first). With `latest_only`, a checkpoint
    evaluated several times on a task metric keeps only its newest row."""
    if latest_only:
        newest: dict[tuple[Any, ...], LabelRow] = {}
        for row in rows:
            newest[(row.repo, row.sha, row.task, row.metric)] = row
        rows = list(newest.values())
    return [Label(checkpoint=row.checkpoint, value=float(row.value), family=row.family,
                  task=row.task, metric=row.metric,
                  n=int(row.n) if row.n is not None else None, stderr=row.stderr,
                  repo=row.repo, sha=row.sha or None, source=row.source,
                  source_ref=row.source_ref, details=dict(row.details or {}))
            for row in rows]


def label_rows(labels: Sequence[Label], *, source_ref: str, eval_run_id: str | None = None) -> list[dict[str, Any]]:
    """Rows for `Store.record_labels`; labels need a repo (or their checkpoint name is used)."""
    return [{"repo": label.repo or label.checkpoint, "sha": label.sha or "", "checkpoint": label.checkpoint,
             "family": label.family, "task": label.task, "metric": label.metric, "value": label.value,
             "stderr": label.stderr, "n": label.n, "source": label.source, "source_ref": source_ref,
             "eval_run_id": eval_run_id, "score_run_id": label.details.get("score_run_id"),
             "details": label.details}
            for label in labels]


def _measured_axes(run: Any) -> dict[str, tuple[float | None, float | None]]:
    """(value, SE) of every score axis a stored run has (SE None where it was not stored)."""
    from monitor.curves.axes import SCORE_AXES, axis_value

    out: dict[str, tuple[float | None, float | None]] = {}
    for name in SCORE_AXES:
        got = axis_value(run, name)
        if isinstance(got, str):
            value = getattr(run, {"raw_ce": "ce"}.get(name, name), None)
            out[name] = (float(value) if value is not None else None, None)
        else:
            out[name] = got
    return out


def with_score_axes(label: Label, run: Any) -> Label:
    """The label with every axis read from a stored score run (a ScoreRunRow or a
    CheckpointScoreRow): L*, raw CE, bits/byte, L* per byte, L_rel, L_gain with their SEs, and
    the parameter count of the run's weights where the label gives none. Axes now measured by
    the run are no longer marked imported."""
    model = run.model if isinstance(run.model, dict) else json.loads(run.model or "{}")
    params = label.params if label.params is not None else model.get("n_params")
    measured = _measured_axes(run)
    imported = tuple(a for a in label.imported if a not in measured)
    if label.params is None:
        imported = tuple(a for a in imported if a != "log_params")
    return label.with_(sha=run.model_sha, lstar=float(run.lstar), lstar_se=float(run.se_ce),
                       raw_ce=float(run.ce), params=float(params) if params else None,
                       bits_per_byte=measured["bits_per_byte"][0],
                       lstar_per_byte=measured["lstar_per_byte"][0],
                       l_rel=measured["l_rel"][0], l_gain=measured["l_gain"][0],
                       axis_se={**label.axis_se, **{a: v[1] for a, v in measured.items()
                                                    if v[1] is not None and a != "lstar"}},
                       imported=imported, details={**label.details, "score_run_id": run.run_id})


def join_scores(labels: Sequence[Label], store: Any, *, corpus_sha256: str | None = None
                ) -> tuple[list[Label], dict[str, Any]]:
    """Fill L*, its SE, raw CE and the parameter count of each label from the newest score run
    of its checkpoint (repo and, where known, commit sha) in the store.

    Returns the labels and the pins shared by every run used: {corpus_sha256, spec_version,
    window, stride, prefix_policy}. Runs on different corpora or specs are an error, as is a
    checkpoint without a score.
    """
    joined: list[Label] = []
    used: dict[tuple[str, str, int, int, str], list[str]] = {}
    for label in labels:
        repo = label.repo or label.checkpoint
        runs = store.score_runs_for_checkpoint(repo, label.sha, corpus_sha256=corpus_sha256)
        where = f" on corpus {corpus_sha256[:12]}" if corpus_sha256 else ""
        if not runs:
            raise LabelError(f"no score run for checkpoint {label.checkpoint!r} (repo {repo!r}"
                             f"{', sha ' + label.sha[:12] if label.sha else ''}){where}",
                             hint="score it first with `lstar score`, or give a CSV with an lstar column")
        if label.sha is None and len({r.model_sha for r in runs}) > 1:
            raise LabelError(f"checkpoint {label.checkpoint!r} names no commit and repo {repo!r} has "
                             f"scores of {len({r.model_sha for r in runs})} commits",
                             hint="use results that record config.model_sha")
        run = runs[0]
        key = (run.corpus_sha256, run.spec_version, int(run.window_len), int(run.stride), run.prefix_policy)
        used.setdefault(key, []).append(label.checkpoint)
        joined.append(with_score_axes(label.with_(repo=repo), run))
    if len(used) > 1:
        described = "; ".join(f"corpus {k[0][:12]} {k[1]} window {k[2]} stride {k[3]} prefix {k[4]} "
                              f"({len(v)} checkpoints)" for k, v in used.items())
        raise LabelError(f"the labels' score runs differ in corpus or scoring spec: {described}",
                         hint="choose one corpus with --corpus-sha, and rescore so all share one spec")
    (corpus, version, window, stride, prefix), = used
    return joined, {"corpus_sha256": corpus, "spec_version": version, "window": window,
                    "stride": stride, "prefix_policy": prefix}
