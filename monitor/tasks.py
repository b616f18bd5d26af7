"""Task labels: lm-evaluation-harness results, CSV tables, and a built-in multiple-choice evaluator.

A label is one (checkpoint, task, metric) measurement, optionally with the checkpoint's
predictors (L*, raw CE, parameters, FLOPs) when the source has them. `monitor.curve_fit` fits
curves on labels; `lstar eval` stores the evaluator's labels in the database.

Multiple-choice scoring (the `cloze-v0` format: context, choices, answer index) follows
lm-evaluation-harness 0.4 for causal models: whitespace at the end of the context moves to
the front of the continuation; the continuation's tokens are the tail of
encode(context + continuation) after the len(encode(context)) leading tokens, so an option is
tokenized the way it would appear in running text. The model reads
[prefix] + encode(context) + continuation tokens, where the prefix is the tokenizer's BOS
(else EOS) token as in the scoring spec (design §1), and the option's log-likelihood is the
sum of its tokens' log-probabilities. Reported per task:

- acc: share of items whose highest-likelihood option is the answer;
- acc_norm: the same with log-likelihoods divided by the option's length in characters;
- prob_correct: the probability of the answer under a softmax over the options of the
  length-normalised log-likelihoods;
- brier: the multi-class Brier score Σ_k (p_k - [k = answer])² of those probabilities (lower is
  better; 1 - 1/k for uniform guessing);
- the random baseline 1/k; standard errors: binomial for accuracies, the sample standard
  error of the per-item values for prob_correct and brier.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from monitor.errors import LabelError

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
                params=params, source="lm-eval", source_ref=str(file),
                details={"revision": revision, "n_shot": (data.get("n-shot") or {}).get(task)}))
    return labels


# -- CSV tables ---------------------------------------------------------------------------------
CSV_REQUIRED = ("checkpoint", "family", "lstar", "lstar_se", "raw_ce", "value", "n")
CSV_OPTIONAL = ("params", "flops", "stderr", "task", "metric", "repo", "sha")


def read_labels_csv(path: str | Path) -> list[Label]:
    """Labels with predictors from a CSV table: columns checkpoint, family, lstar, lstar_se,
    raw_ce, value, n (n may be empty where stderr is given), optionally params, flops, stderr,
    task, metric, repo, sha. Errors name the line and column."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except FileNotFoundError as exc:
        raise LabelError(f"no labels file at {path}") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise LabelError(f"cannot read {path}: {exc}") from exc
    reader = csv.DictReader(text.splitlines())
    columns = [c.strip() for c in (reader.fieldnames or [])]
    missing = [c for c in CSV_REQUIRED if c not in columns]
    if missing:
        raise LabelError(f"{path} lacks column(s) {', '.join(missing)}",
                         hint=f"the header must include {','.join(CSV_REQUIRED)}")
    unknown = [c for c in columns if c not in CSV_REQUIRED + CSV_OPTIONAL]
    if unknown:
        raise LabelError(f"{path} has unknown column(s) {', '.join(unknown)}",
                         hint=f"allowed: {','.join(CSV_REQUIRED + CSV_OPTIONAL)}")
    labels = []
    for line, raw in enumerate(reader, start=2):
        row = {k.strip(): (v or "").strip() for k, v in raw.items() if k is not None}

        def number(col: str, *, required: bool = False, integer: bool = False) -> Any:
            cell = row.get(col, "")
            if cell == "":
                if required:
                    raise LabelError(f"{path}:{line}: column {col!r} is empty")
                return None
            try:
                value = float(cell)
            except ValueError as exc:
                raise LabelError(f"{path}:{line}: column {col!r}: {cell!r} is not a number") from exc
            if not math.isfinite(value):
                raise LabelError(f"{path}:{line}: column {col!r} is {cell!r} (not a finite number)",
                                 hint="drop or fix the row")
            if integer:
                if value != int(value) or value <= 0:
                    raise LabelError(f"{path}:{line}: column {col!r}: {cell!r} is not a positive whole number")
                return int(value)
            return value

        if not row.get("checkpoint"):
            raise LabelError(f"{path}:{line}: column 'checkpoint' is empty")
        n = number("n", integer=True)
        stderr = number("stderr")
        if n is None and stderr is None:
            raise LabelError(f"{path}:{line}: row has neither n nor stderr",
                             hint="give the number of items (n) or the metric's standard error")
        labels.append(Label(
            checkpoint=row["checkpoint"], value=number("value", required=True),
            family=row.get("family") or None, task=row.get("task") or None,
            metric=row.get("metric") or None, n=n, stderr=stderr,
            repo=row.get("repo") or None, sha=row.get("sha") or None,
            lstar=number("lstar", required=True), lstar_se=number("lstar_se"),
            raw_ce=number("raw_ce"), params=number("params"), flops=number("flops"),
            source="csv", source_ref=str(path)))
    if not labels:
        raise LabelError(f"{path} has a header but no rows")
    return labels


# -- multiple-choice tasks ----------------------------------------------------------------------
@dataclass(frozen=True)
class McItem:
    id: str
    context: str
    choices: tuple[str, ...]
    answer: int
    slice: str | None = None


@dataclass(frozen=True)
class McTask:
    name: str
    path: Path
    sha256: str
    items: tuple[McItem, ...]


def load_mc_task(path: str | Path, *, limit: int | None = None) -> McTask:
    """A multiple-choice task file (JSON lines of id, context, choices, answer[, slice]).
    The task's name is the file's stem; sha256 is of the whole file's bytes."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError as exc:
        raise LabelError(f"no task file at {path}") from exc
    items = []
    ids: set[str] = set()
    for number, line in enumerate(raw.decode("utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise LabelError(f"{path}:{number}: not JSON ({exc.msg})") from exc
        where = f"{path}:{number}"
        if not isinstance(obj, dict):
            raise LabelError(f"{where}: expected an object")
        for key in ("id", "context", "choices", "answer"):
            if key not in obj:
                raise LabelError(f"{where}: missing {key!r}")
        choices = obj["choices"]
        if not isinstance(choices, list) or len(choices) < 2 or not all(isinstance(c, str) and c for c in choices):
            raise LabelError(f"{where} ({obj['id']}): 'choices' must be a list of at least 2 non-empty strings")
        answer = obj["answer"]
        if not isinstance(answer, int) or isinstance(answer, bool) or not 0 <= answer < len(choices):
            raise LabelError(f"{where} ({obj['id']}): 'answer' must index 'choices' (0..{len(choices) - 1})")
        if not isinstance(obj["context"], str) or not obj["context"].strip():
            raise LabelError(f"{where} ({obj['id']}): 'context' must be a non-empty string")
        if obj["id"] in ids:
            raise LabelError(f"{where}: duplicate id {obj['id']!r}")
        ids.add(obj["id"])
        items.append(McItem(str(obj["id"]), obj["context"], tuple(choices), answer, obj.get("slice")))
        if limit is not None and len(items) >= limit:
            break
    if not items:
        raise LabelError(f"{path} holds no items")
    return McTask(path.stem, path, hashlib.sha256(raw).hexdigest(), tuple(items))


def encode_pair(tokenizer: Any, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """Context and continuation token ids, as lm-evaluation-harness 0.4 does for causal models
    (trailing whitespace of the context moves to the continuation; the continuation is the
    tail of the encoding of the whole text). `tokenizer` is a `tokenizers.Tokenizer`."""
    spaces = len(context) - len(context.rstrip())
    if spaces:
        continuation = context[-spaces:] + continuation
        context = context[:-spaces]
    whole = tokenizer.encode(context + continuation, add_special_tokens=False).ids
    ctx = tokenizer.encode(context, add_special_tokens=False).ids
    return ctx, whole[len(ctx):]


def option_loglikelihoods(model: Any, requests: Sequence[tuple[Sequence[int], Sequence[int]]], *,
                          batch_size: int = 8, max_length: int | None = None) -> np.ndarray:
    """Summed log-probabilities (float64) of each request's continuation given its context.

    Requests are batched longest first, padded on the right (causal attention never sees the
    padding of later positions), and only the continuation positions' logits are
    log-softmaxed, in at least float32. Inputs longer than `max_length` lose tokens from the
    left of the context, as lm-evaluation-harness does.
    """
    import torch

    if batch_size < 1:
        raise LabelError(f"batch size must be at least 1, got {batch_size}")
    seqs: list[list[int]] = []
    cont_lens: list[int] = []
    for ctx, cont in requests:
        if not cont:
            raise LabelError("a continuation encodes to no tokens")
        seq = list(ctx) + list(cont)
        if max_length is not None and len(seq) > max_length:
            if len(cont) >= max_length:
                raise LabelError(f"a continuation of {len(cont)} tokens does not fit the model's "
                                 f"{max_length} positions")
            seq = seq[-max_length:]
        if len(seq) - len(cont) < 1:
            raise LabelError("a request has no context token to predict the continuation from",
                             hint="give the model a prefix token or a non-empty context")
        seqs.append(seq)
        cont_lens.append(len(cont))
    out = np.zeros(len(seqs), dtype=np.float64)
    order = sorted(range(len(seqs)), key=lambda i: -len(seqs[i]))
    device = next(model.parameters()).device
    with torch.inference_mode():
        for start in range(0, len(order), batch_size):
            batch = order[start:start + batch_size]
            width = len(seqs[batch[0]])
            ids = torch.zeros((len(batch), width), dtype=torch.long)
            mask = torch.zeros((len(batch), width), dtype=torch.long)
            rows, cols, targets, owner = [], [], [], []
            for r, i in enumerate(batch):
                seq = seqs[i]
                ids[r, :len(seq)] = torch.tensor(seq)
                mask[r, :len(seq)] = 1
                first = len(seq) - cont_lens[i]
                for pos in range(first, len(seq)):
                    rows.append(r)
                    cols.append(pos - 1)          # position pos is predicted from pos - 1
                    targets.append(seq[pos])
                    owner.append(i)
            logits = model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits  # [b, T, V]
            picked = logits[torch.tensor(rows, device=device), torch.tensor(cols, device=device)]  # [P, V]
            picked = picked.to(torch.promote_types(picked.dtype, torch.float32))
            logp = torch.log_softmax(picked, dim=-1)
            token_lp = logp.gather(1, torch.tensor(targets, device=device)[:, None]).squeeze(1)
            np.add.at(out, np.asarray(owner), token_lp.double().cpu().numpy())
    return out


@dataclass(frozen=True)
class McResult:
    """Per-item log-likelihoods and the task's metrics: {name: (value, stderr)}."""

    task: str
    task_sha256: str
    item_ids: tuple[str, ...]
    loglikelihoods: tuple[np.ndarray, ...]      # per item, one float64 per option
    answers: np.ndarray
    metrics: dict[str, tuple[float, float]]
    baselines: dict[str, float]
    n_items: int

    def as_dict(self) -> dict[str, Any]:
        return {"task": self.task, "task_sha256": self.task_sha256, "n_items": self.n_items,
                "metrics": {k: {"value": v, "stderr": se, "baseline": self.baselines[k]}
                            for k, (v, se) in self.metrics.items()}}


def _mc_metrics(lls: Sequence[np.ndarray], lengths: Sequence[np.ndarray],
                answers: np.ndarray) -> tuple[dict[str, tuple[float, float]], dict[str, float]]:
    n = len(lls)
    acc = np.array([float(np.argmax(ll) == a) for ll, a in zip(lls, answers)])
    acc_norm = np.array([float(np.argmax(ll / ln) == a) for ll, ln, a in zip(lls, lengths, answers)])
    prob = np.empty(n)
    brier = np.empty(n)
    for i, (ll, ln, a) in enumerate(zip(lls, lengths, answers)):
        s = ll / ln
        p = np.exp(s - np.max(s))
        p /= p.sum()
        onehot = np.zeros(len(p))
        onehot[a] = 1.0
        prob[i] = p[a]
        brier[i] = float(np.sum((p - onehot) ** 2))
    k = np.array([len(ll) for ll in lls], dtype=np.float64)

    def binom(v: np.ndarray) -> tuple[float, float]:
        m = float(v.mean())
        return m, math.sqrt(m * (1.0 - m) / n)

    def sample(v: np.ndarray) -> tuple[float, float]:
        return float(v.mean()), float(v.std(ddof=1) / math.sqrt(n)) if n > 1 else math.nan

    metrics = {"acc": binom(acc), "acc_norm": binom(acc_norm), "prob_correct": sample(prob),
               "brier": sample(brier)}
    chance = float(np.mean(1.0 / k))
    baselines = {"acc": chance, "acc_norm": chance, "prob_correct": chance,
                 "brier": float(np.mean((k - 1.0) / k))}
    return metrics, baselines


def evaluate_multiple_choice(model: Any, tokenizer: Any, task: McTask, *,
                             prefix_token_id: int | None = None, batch_size: int = 8,
                             max_length: int | None = None) -> McResult:
    """Score every option of every item in batched forward passes and compute the metrics.

    `tokenizer` is a `tokenizers.Tokenizer`; `prefix_token_id` is put before each context
    (the scoring spec's BOS-else-EOS token; None for none).
    """
    requests: list[tuple[list[int], list[int]]] = []
    owners: list[int] = []
    for i, item in enumerate(task.items):
        for choice in item.choices:
            ctx, cont = encode_pair(tokenizer, item.context, choice)
            if not cont:
                raise LabelError(f"{task.name} item {item.id}: option {choice!r} encodes to no tokens "
                                 f"after the context")
            prefix = [prefix_token_id] if prefix_token_id is not None else []
            requests.append((prefix + ctx, cont))
            owners.append(i)
    flat = option_loglikelihoods(model, requests, batch_size=batch_size, max_length=max_length)
    lls: list[np.ndarray] = []
    offset = 0
    for item in task.items:
        lls.append(flat[offset:offset + len(item.choices)])
        offset += len(item.choices)
    lengths = [np.array([len(c) for c in item.choices], dtype=np.float64) for item in task.items]
    answers = np.array([item.answer for item in task.items])
    metrics, baselines = _mc_metrics(lls, lengths, answers)
    return McResult(task=task.name, task_sha256=task.sha256, item_ids=tuple(it.id for it in task.items),
                    loglikelihoods=tuple(lls), answers=answers, metrics=metrics, baselines=baselines,
                    n_items=len(task.items))


@dataclass(frozen=True)
class CheckpointEvaluation:
    """The result of `lstar eval`: the evaluated checkpoint and its metrics."""

    result: McResult
    repo: str
    sha: str
    source: str
    n_params: int
    dtype: str
    device: str
    tokenizer_fingerprint: str
    model_info: dict[str, Any]
    wall_s: float


def evaluate_checkpoint(ref: str, task_path: str | Path, *, limit: int | None = None,
                        dtype: str = "auto", device: str = "auto", batch_size: int = 8,
                        cache_dir: str | Path | None = None) -> CheckpointEvaluation:
    """Load a checkpoint (local folder or `org/name[@revision]`) with the engine's loader and
    its own tokenizer, and run the multiple-choice evaluator on a task file."""
    import time

    from monitor.loader import load_checkpoint
    from monitor.tokenizer import load_tokenizer

    task = load_mc_task(task_path, limit=limit)
    loaded = load_checkpoint(ref, dtype=dtype, device=device, cache_dir=cache_dir)
    handle = load_tokenizer(loaded.model_dir)
    started = time.perf_counter()
    result = evaluate_multiple_choice(loaded.model, handle.tokenizer, task,
                                      prefix_token_id=handle.prefix_token_id, batch_size=batch_size,
                                      max_length=loaded.max_positions)
    return CheckpointEvaluation(result=result, repo=loaded.repo, sha=loaded.sha, source=loaded.source,
                                n_params=loaded.n_params, dtype=loaded.dtype, device=loaded.device,
                                tokenizer_fingerprint=handle.fingerprint,
                                model_info=loaded.as_model_info(),
                                wall_s=time.perf_counter() - started)


def evaluation_labels(evaluation: CheckpointEvaluation, *, family: str | None = None,
                      run_id: str | None = None) -> list[Label]:
    """One label per metric of an evaluation, keyed by the checkpoint's (repo, sha)."""
    result = evaluation.result
    return [Label(checkpoint=f"{evaluation.repo}@{evaluation.sha[:12]}", value=value, family=family,
                  task=result.task, metric=name, n=result.n_items, stderr=stderr,
                  repo=evaluation.repo, sha=evaluation.sha, params=float(evaluation.n_params),
                  source="builtin", source_ref=run_id,
                  details={"baseline": result.baselines[name], "task_sha256": result.task_sha256})
            for name, (value, stderr) in result.metrics.items()]


# -- labels and the store -----------------------------------------------------------------------
def labels_from_rows(rows: Sequence[dict[str, Any]], *, latest_only: bool = True) -> list[Label]:
    """Labels from `Store.labels()` rows (oldest first). With `latest_only`, a checkpoint
    evaluated several times on a task metric keeps only its newest row."""
    if latest_only:
        newest: dict[tuple[Any, ...], dict[str, Any]] = {}
        for row in rows:
            newest[(row["repo"], row["sha"], row["task"], row["metric"])] = row
        rows = list(newest.values())
    return [Label(checkpoint=row["checkpoint"], value=float(row["value"]), family=row["family"],
                  task=row["task"], metric=row["metric"],
                  n=int(row["n"]) if row["n"] is not None else None, stderr=row["stderr"],
                  repo=row["repo"], sha=row["sha"] or None, source=row["source"],
                  source_ref=row["source_ref"], details=dict(row.get("details") or {}))
            for row in rows]


def label_rows(labels: Sequence[Label], *, source_ref: str, eval_run_id: str | None = None) -> list[dict[str, Any]]:
    """Rows for `Store.record_labels`; labels need a repo (or their checkpoint name is used)."""
    return [{"repo": label.repo or label.checkpoint, "sha": label.sha or "", "checkpoint": label.checkpoint,
             "family": label.family, "task": label.task, "metric": label.metric, "value": label.value,
             "stderr": label.stderr, "n": label.n, "source": label.source, "source_ref": source_ref,
             "eval_run_id": eval_run_id, "score_run_id": label.details.get("score_run_id"),
             "details": label.details}
            for label in labels]


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
        if label.sha is None and len({r["model_sha"] for r in runs}) > 1:
            raise LabelError(f"checkpoint {label.checkpoint!r} names no commit and repo {repo!r} has "
                             f"scores of {len({r['model_sha'] for r in runs})} commits",
                             hint="use results that record config.model_sha")
        run = runs[0]
        key = (run["corpus_sha256"], run["spec_version"], int(run["window_len"]), int(run["stride"]),
               run["prefix_policy"])
        used.setdefault(key, []).append(label.checkpoint)
        params = label.params if label.params is not None else run["model"].get("n_params")
        joined.append(label.with_(repo=repo, sha=run["model_sha"], lstar=float(run["lstar"]),
                                  lstar_se=float(run["se_ce"]), raw_ce=float(run["ce"]),
                                  params=float(params) if params else None,
                                  details={**label.details, "score_run_id": run["run_id"]}))
    if len(used) > 1:
        described = "; ".join(f"corpus {k[0][:12]} {k[1]} window {k[2]} stride {k[3]} prefix {k[4]} "
                              f"({len(v)} checkpoints)" for k, v in used.items())
        raise LabelError(f"the labels' score runs differ in corpus or scoring spec: {described}",
                         hint="choose one corpus with --corpus-sha, and rescore so all share one spec")
    (corpus, version, window, stride, prefix), = used
    return joined, {"corpus_sha256": corpus, "spec_version": version, "window": window,
                    "stride": stride, "prefix_policy": prefix}
