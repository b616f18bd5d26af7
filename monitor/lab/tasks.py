"""The lab's evaluation tasks: files in the `cloze-v0` multiple-choice format, and exact match.

- `add-words`: the 55 additions of `monitor.lab.text` (`seven plus two is` → ` nine`), with
  the ten number words as options (chance 1/10). The table is the skill being learned, so
  every problem also occurs in training, as a fact of arithmetic would; the items test whether
  the model computes the answer from the two operands in its context. Also scored by string
  exact match of a greedy decode, which does not depend on how a tokenizer splits the answer.
- `cloze-heldout`: the items of `shared/tasks/cloze-v0.jsonl` whose document the lab holds out
  of training (cloze-v0 is built from calib-v0-alt, which the lab trains on).

Both are scored by the built-in evaluator (`monitor.curves.evaluator.evaluate_multiple_choice`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from monitor.errors import LabError
from monitor.files import atomic_write_text
from monitor.lab.text import NUMBER_WORDS, Problem, all_problems

ADD_TASK = "add-words"
CLOZE_TASK = "cloze-heldout"
MAX_DECODE_TOKENS = 6


def problem_items(problems: Sequence[Problem] | None = None) -> list[dict[str, Any]]:
    """Multiple-choice items: the prompt, one option per number word."""
    items = []
    for problem in all_problems() if problems is None else problems:
        items.append({"id": f"{ADD_TASK}-{problem.a}{problem.b}", "slice": "arithmetic",
                      "context": problem.prompt, "choices": [f" {w}" for w in NUMBER_WORDS],
                      "answer": NUMBER_WORDS.index(problem.answer)})
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
    import torch

    hits = 0
    device = next(model.parameters()).device
    with torch.inference_mode():
        for problem in problems:
            ids = ([prefix_token_id] if prefix_token_id is not None else []) \
                + tokenizer.encode(problem.prompt, add_special_tokens=False).ids
            new: list[int] = []
            for _ in range(max_new_tokens):
                x = torch.tensor([ids + new], device=device)
                new.append(int(model(input_ids=x).logits[0, -1].argmax()))
                text = tokenizer.decode(new, skip_special_tokens=False)
                if text.strip() and (text.strip() != text.lstrip() or len(text.split()) > 1):
                    break                    # a whole word is out: nothing more can change it
            words = tokenizer.decode(new, skip_special_tokens=False).split()
            hits += int(bool(words) and words[0] == problem.answer)
    return hits / len(problems)
