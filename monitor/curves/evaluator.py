"""The built-in multiple-choice task evaluator (`lstar eval`).

Multiple-choice scoring (the `cloze-v0` format: context, choices, answer index) follows
lm-evaluation-harness 0.4 for causal models: whitespace at the end of the context moves to
the front of the continuation; the continuation's tokens are the tail of
encode(context + continuation) after the len(encode(context)) leading tokens, so an option is
tokenized the way it would appear in running text. The model reads
[prefix] + encode(context) + continuation tokens, where the prefix is the tokenizer's BOS
(else EOS) token as in the scoring spec (docs/measurement.md §1), and the option's log-likelihood is the
sum of its tokens' log-probabilities. Reported per task:

- acc: share of items whose highest-likelihood option is the answer;
- acc_norm: the same with log-likelihoods divided by the option's length in characters;
- prob_correct: the probability of the answer under a softmax over the options of the
  length-normalised log-likelihoods;
- brier: the multi-class Brier score Σ_k (p_k - [k = answer])² of those probabilities (lower is
  better; 1 - 1/k for uniform guessing);
- the random baseline 1/k; standard errors: binomial for accuracies, the sample standard
  error of the per-item values for prob_correct and brier.

Its results become labels (`monitor.curves.labels`).
"""

from __future__ import annotations

import hashlib
import inspect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from monitor.curves.labels import Label
from monitor.errors import LabelError, PolicyError
from monitor.files import TASK_FILE, TASK_FILE_MAX_BYTES, read_bounded_bytes
from monitor.jsonl import json_lines, split_lines
from monitor.scoring import load_checkpoint, load_tokenizer
from monitor.yamlio import clip


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


def read_task_file(path: str | Path) -> bytes:
    """A task file's bytes, read bounded (`monitor.files`): a regular file of at most
    `TASK_FILE_MAX_BYTES`, else a LabelError naming the file and the fix (a FIFO cannot block
    the reader, a huge file is refused before it is read)."""
    try:
        return read_bounded_bytes(Path(path), str(path), what=TASK_FILE, limit=TASK_FILE_MAX_BYTES)
    except PolicyError as exc:
        raise LabelError(exc.message, hint=exc.hint) from None


def load_mc_task(path: str | Path, *, limit: int | None = None) -> McTask:
    """A multiple-choice task file (JSON lines of id, context, choices, answer[, slice]), read
    bounded (`read_task_file`). The task's name is the file's stem; sha256 is of the whole
    file's bytes."""
    path = Path(path)
    if not path.exists():
        raise LabelError(f"no task file at {path}")
    return parse_mc_task(read_task_file(path), path, limit=limit)


def parse_mc_task(raw: bytes, path: Path, *, limit: int | None = None) -> McTask:
    """The task held by `raw`, the bytes of the task file at `path` (named in errors).

    Every way the bytes can be wrong is a LabelError on one line naming the file and the line
    (never a TypeError, RecursionError or ValueError from a hostile shape): lines are split
    on '\\n' only, as JSON lines are, and each field's type is checked before it is used."""
    items = []
    ids: set[str] = set()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise LabelError(f"{path}: not UTF-8 text (byte {exc.start})", hint="save the file as UTF-8") from None
    for number, obj in json_lines(split_lines(text), path, LabelError, not_json="not JSON"):
        where = f"{path}:{number}"
        if not isinstance(obj, dict):
            raise LabelError(f"{where}: expected an object")
        for key in ("id", "context", "choices", "answer"):
            if key not in obj:
                raise LabelError(f"{where}: missing {key!r}")
        item_id = obj["id"]
        if isinstance(item_id, bool) or not isinstance(item_id, (str, int)) or item_id == "":
            raise LabelError(f"{where}: 'id' must be a non-empty string or an integer")
        item_id = str(item_id)
        where = f"{where} ({clip(repr(item_id), 60)})"
        choices = obj["choices"]
        if not isinstance(choices, list) or len(choices) < 2 or not all(isinstance(c, str) and c for c in choices):
            raise LabelError(f"{where}: 'choices' must be a list of at least 2 non-empty strings")
        answer = obj["answer"]
        if not isinstance(answer, int) or isinstance(answer, bool) or not 0 <= answer < len(choices):
            raise LabelError(f"{where}: 'answer' must index 'choices' (0..{len(choices) - 1})")
        if not isinstance(obj["context"], str) or not obj["context"].strip():
            raise LabelError(f"{where}: 'context' must be a non-empty string")
        slice_name = obj.get("slice")
        if slice_name is not None and not isinstance(slice_name, str):
            raise LabelError(f"{where}: 'slice' must be a string when given")
        if item_id in ids:
            raise LabelError(f"{where}: duplicate id")
        ids.add(item_id)
        items.append(McItem(item_id, obj["context"], tuple(choices), answer, slice_name))
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
    keep = _takes_logits_to_keep(model)
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
            picked, keep = _continuation_logits(model, ids.to(device), mask.to(device), rows, cols, keep)  # [P, V]
            picked = picked.to(torch.promote_types(picked.dtype, torch.float32))
            logp = torch.log_softmax(picked, dim=-1)
            token_lp = logp.gather(1, torch.tensor(targets, device=device)[:, None]).squeeze(1)
            np.add.at(out, np.asarray(owner), token_lp.double().cpu().numpy())
    return out


def _takes_logits_to_keep(model: Any) -> bool:
    """Whether the model's forward takes `logits_to_keep` (transformers' causal LMs do). Not a
    model spread over several devices: a mask of positions made beside the inputs would index
    hidden states on another device."""
    if len(set((getattr(model, "hf_device_map", None) or {}).values())) > 1:
        return False
    try:
        return "logits_to_keep" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False


def _continuation_logits(model: Any, ids: Any, mask: Any, rows: list[int], cols: list[int],
                         keep: bool) -> tuple[Any, bool]:
    """The logits [P, V] of the positions (rows[k], cols[k]), in that order (row-major, as the
    caller lists them), and whether to ask the same way next time. Where the model takes
    `logits_to_keep`, a boolean mask of those positions makes it apply its output layer to them
    alone: the continuation is a few of a request's positions, and the output layer over the
    whole vocabulary at every position is most of an evaluation's arithmetic. A model that
    answers with every position's logits anyway is indexed; one that refuses the mask (a
    transformers whose slicing takes only a count of last positions) is asked for every
    position, then and for the rest of the evaluation."""
    import torch

    index = (torch.tensor(rows, device=ids.device), torch.tensor(cols, device=ids.device))
    if keep:
        wanted = torch.zeros(ids.shape, dtype=torch.bool, device=ids.device)
        wanted[index] = True
        try:
            logits = model(input_ids=ids, attention_mask=mask, logits_to_keep=wanted).logits
        except (TypeError, IndexError, RuntimeError):
            logits = None
        if logits is not None and logits.ndim == 2 and logits.shape[0] == len(rows):
            return logits, True
        if logits is not None and logits.ndim == 3 and tuple(logits.shape[:2]) == tuple(ids.shape):
            return logits[index], True      # the argument taken but every position answered
    logits = model(input_ids=ids, attention_mask=mask).logits   # [b, T, V]
    return logits[index], False


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
                        cache_dir: str | Path | None = None, endpoint: str | None = None) -> CheckpointEvaluation:
    """Load a checkpoint (local folder, or `org/name[@revision]` from `endpoint` into `cache_dir`)
    with the engine's loader and its own tokenizer, and run the multiple-choice evaluator on a
    task file."""
    import time

    task = load_mc_task(task_path, limit=limit)
    loaded = load_checkpoint(ref, dtype=dtype, device=device, cache_dir=cache_dir, endpoint=endpoint)
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
