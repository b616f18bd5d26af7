"""The lab's evaluation tasks: files in the `cloze-v0` multiple-choice format, and exact match.

- `add-words`: the 55 additions of `monitor.lab.text` (`seven plus two is` → ` nine`), with
  the ten number words as options (chance 1/10). The table is the skill being learned, so
  every problem also occurs in training, as a fact of arithmetic would; the items test whether
  the model computes the answer from the two operands in its context. Also scored by string
  exact match of a greedy decode, which does not depend on how a tokenizer splits the answer.
- `cloze-heldout`: the items of `shared/tasks/cloze-v0.jsonl` whose document the lab holds out
  of training (cloze-v0 is built from calib-v0-alt, which the lab trains on).

Both are scored by the built-in evaluator (`monitor.curves.evaluator.evaluate_multiple_choice`).

Version 2 of the lab (`monitor.lab.race`) uses `addition_items` (the 231 sums up to twenty,
21 options) and `pool_cloze_items` (cloze items cut from the pool's `tasks` split, which no
lineage trains on), both also scored by string exact match of a greedy decode
(`greedy_exact_match_items`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from monitor.errors import LabError
from monitor.files import atomic_write_text
import random
import re

from monitor.lab.text import NUMBER_WORDS, NUMBER_WORDS_20, Problem, all_problems

ADD_TASK = "add-words"
CLOZE_TASK = "cloze-heldout"
POOL_CLOZE_TASK = "cloze"
CLOZE_CHOICES = 4
CLOZE_CONTEXT_CHARS = 240
_WORD = re.compile(r"(?<![A-Za-z'])([a-z]{4,14})(?![A-Za-z'])")
_TRAILING = ".,;:!?\"')]}"
MAX_DECODE_TOKENS = 6


def problem_items(problems: Sequence[Problem] | None = None) -> list[dict[str, Any]]:
    """Multiple-choice items: the prompt, one option per number word."""
    items = []
    for problem in all_problems() if problems is None else problems:
        items.append({"id": f"{ADD_TASK}-{problem.a}{problem.b}", "slice": "arithmetic",
                      "context": problem.prompt, "choices": [f" {w}" for w in NUMBER_WORDS],
                      "answer": NUMBER_WORDS.index(problem.answer)})
    return items


def addition_items(problems: Sequence[Problem]) -> list[dict[str, Any]]:
    """Multiple-choice items of additions up to twenty: the prompt, one option per number
    word from zero to twenty (chance 1/21)."""
    return [{"id": f"{ADD_TASK}-{p.a}-{p.b}", "slice": "arithmetic", "context": p.prompt,
             "choices": [f" {w}" for w in NUMBER_WORDS_20], "answer": NUMBER_WORDS_20.index(p.answer)}
            for p in problems]


def pool_cloze_items(documents: Sequence[Any], *, n_items: int, seed: int = 0) -> list[dict[str, Any]]:
    """Cloze items cut from documents no lineage trains on (the pool's `tasks` split).

    An item is up to `CLOZE_CONTEXT_CHARS` characters of a document (starting after a space)
    and the lower-case word of 4-14 letters that follows it; its options are that word and
    three other words of the same split of about the same length, drawn with `seed`. Items are
    taken round-robin over the documents (a few per document, spread along each), so the task
    is not dominated by one text. `n_items` more than the split allows is refused.
    """
    rng = random.Random(f"lab-cloze-{seed}")
    by_length: dict[int, list[str]] = {}
    candidates: list[list[tuple[str, str, str]]] = []
    for doc in documents:
        found = []
        for match in _WORD.finditer(doc.text):
            start = match.start()
            if start < 80 or doc.text[start - 1] != " ":
                continue
            lo = doc.text.find(" ", max(0, start - 1 - CLOZE_CONTEXT_CHARS)) + 1
            context = doc.text[lo:start - 1]
            if len(context) < 60 or not context.strip():
                continue
            found.append((doc.id, context, match.group(1)))
        for _, _, word in found:
            by_length.setdefault(len(word), []).append(word)
        # positions spread along the document, at least 100 characters apart
        spread, last_end = [], -10**9
        for doc_id, context, word in found:
            pos = doc.text.find(context) + len(context)
            if pos - last_end >= 100:
                spread.append((doc_id, context, word))
                last_end = pos
        if spread:
            candidates.append(spread)
    vocab = {n: sorted(set(words)) for n, words in by_length.items()}
    items: list[dict[str, Any]] = []
    depth = 0
    while len(items) < n_items and any(depth < len(c) for c in candidates):
        for spread in candidates:
            if depth >= len(spread) or len(items) >= n_items:
                continue
            doc_id, context, word = spread[depth]
            pool = [w for n in (len(word) - 1, len(word), len(word) + 1) for w in vocab.get(n, []) if w != word]
            if len(pool) < CLOZE_CHOICES - 1:
                continue
            others: list[str] = []
            while len(others) < CLOZE_CHOICES - 1:
                w = pool[min(int(rng.random() * len(pool)), len(pool) - 1)]
                if w not in others:
                    others.append(w)
            answer = min(int(rng.random() * CLOZE_CHOICES), CLOZE_CHOICES - 1)
            options = others[:answer] + [word] + others[answer:]
            items.append({"id": f"{POOL_CLOZE_TASK}-{len(items):04d}", "slice": "cloze", "doc_id": doc_id,
                          "context": context, "choices": [f" {w}" for w in options], "answer": answer})
        depth += 1
    if len(items) < n_items:
        raise LabError(f"the pool's tasks split gives only {len(items)} cloze items, {n_items} asked",
                       hint="lower n_cloze or use a larger pool")
    return items


def heldout_cloze_items(cloze_path: str | Path, heldout_doc_ids: Iterable[str]) -> list[dict[str, Any]]:
    """The items of a cloze-v0 file whose `doc_id` is held out of training."""
    path = Path(cloze_path)
    held = set(heldout_doc_ids)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise LabError(f"cannot read the cloze task {path}: {exc}",
                       hint="point --cloze at shared/tasks/cloze-v0.jsonl") from exc
    items = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise LabError(f"{path}:{number}: not JSON ({exc.msg})") from exc
        if not isinstance(obj, dict) or "doc_id" not in obj:
            raise LabError(f"{path}:{number}: a cloze item needs a 'doc_id'",
                           hint="the lab holds out items by the document they come from")
        if obj["doc_id"] in held:
            items.append(obj)
    if not items:
        raise LabError(f"{path} has no items from the held-out documents",
                       hint="is it built from the lab's text corpus (calib-v0-alt)?")
    return items


def write_task(path: Path, items: Sequence[dict[str, Any]]) -> Path:
    """Write items as JSON lines, atomically."""
    atomic_write_text(path, "".join(json.dumps(it, ensure_ascii=False) + "\n" for it in items))
    return path


def greedy_exact_match(model: Any, tokenizer: Any, problems: Sequence[Problem], *,
                       prefix_token_id: int | None, max_new_tokens: int = MAX_DECODE_TOKENS) -> float:
    """Share of problems whose greedy continuation, decoded to a string, starts with the answer
    as a whole word ("nine" in " nine\\n..." counts; "ninety" does not)."""
    hits = greedy_exact_match_items(model, tokenizer, [(p.prompt, p.answer) for p in problems],
                                    prefix_token_id=prefix_token_id, max_new_tokens=max_new_tokens,
                                    strip_punctuation=False)
    return sum(hits) / len(problems)


def greedy_exact_match_items(model: Any, tokenizer: Any, items: Sequence[tuple[str, str]], *,
                             prefix_token_id: int | None, max_new_tokens: int = MAX_DECODE_TOKENS,
                             max_length: int | None = None, strip_punctuation: bool = True) -> list[bool]:
    """For each (prompt, answer): does the greedy continuation, decoded to a string, start with
    the answer as a whole word (trailing punctuation aside with `strip_punctuation`, so a
    cloze word that ends a sentence counts)? `max_length` keeps the last tokens of a longer
    prompt (the model's context)."""
    import torch

    from monitor.curves.evaluator import _takes_logits_to_keep

    hits: list[bool] = []
    device = next(model.parameters()).device
    # the next token needs the last position's logits alone: the output layer over the whole
    # vocabulary at every position would be most of a decode step's arithmetic
    last_only = {"logits_to_keep": 1} if _takes_logits_to_keep(model) else {}
    with torch.inference_mode():
        for prompt, answer in items:
            ids = ([prefix_token_id] if prefix_token_id is not None else []) \
                + tokenizer.encode(prompt, add_special_tokens=False).ids
            if max_length is not None:
                ids = ids[-(max_length - max_new_tokens):]
            new: list[int] = []
            for _ in range(max_new_tokens):
                x = torch.tensor([ids + new], device=device)
                new.append(int(model(input_ids=x, **last_only).logits[0, -1].argmax()))
                text = tokenizer.decode(new, skip_special_tokens=False)
                if text.strip() and (text.strip() != text.lstrip() or len(text.split()) > 1):
                    break                    # a whole word is out: nothing more can change it
            words = tokenizer.decode(new, skip_special_tokens=False).split()
            first = words[0] if words else ""
            hits.append(bool(first) and (first.rstrip(_TRAILING) if strip_punctuation else first) == answer)
    return hits


def mean_logp_correct(loglikelihoods: Sequence[Sequence[float]], answers: Sequence[int]) -> float:
    """Lab v3's continuous task metric: the mean over items of log p(correct option), the
    model's probability of each option's tokens (the sum of their log-probabilities, not
    length-normalised) renormalised over the item's options. Chance: mean log(1/n_options)."""
    from scipy.special import logsumexp

    import numpy as np

    if len(loglikelihoods) != len(answers) or not len(answers):
        raise LabError(f"{len(loglikelihoods)} items of log-likelihoods for {len(answers)} answers")
    values = [float(np.asarray(ll, dtype=np.float64)[a] - logsumexp(np.asarray(ll, dtype=np.float64)))
              for ll, a in zip(loglikelihoods, answers)]
    return float(np.mean(values))
