"""The lab's evaluation tasks: files in the `cloze-v0` multiple-choice format, and exact match.

- `kv-recall`: held-out key-value recall episodes (`monitor.lab.text`); the options are the
  episode's own values, so knowing "a digit comes next" is not enough: only retrieving the
  queried key's value beats the 1/n baseline. Also scored by string exact match of a greedy
  decode, which does not depend on how a tokenizer splits the answer.
- `cloze-heldout`: the items of `shared/tasks/cloze-v0.jsonl` whose document the lab holds out
  of training (cloze-v0 is built from calib-v0-alt, which the lab trains on).

Both are scored by the built-in evaluator (`monitor.tasks.evaluate_multiple_choice`).
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from monitor.errors import LabError
from monitor.lab.records import atomic_write_text
from monitor.lab.text import Episode, make_episode

KV_TASK = "kv-recall"
CLOZE_TASK = "cloze-heldout"
MAX_DECODE_TOKENS = 4


def heldout_episodes(*, seed: int, n: int, kv_pairs: int, exclude: Iterable[str] = ()) -> list[Episode]:
    """`n` distinct episodes from their own random stream, none equal to a training episode."""
    rng = random.Random(f"lab-kv-eval-{seed}")
    banned = set(exclude)
    out: list[Episode] = []
    seen: set[str] = set()
    for _ in range(100 * n):
        if len(out) == n:
            break
        ep = make_episode(rng, kv_pairs)
        if ep.text in banned or ep.prompt in seen:
            continue
        seen.add(ep.prompt)
        out.append(ep)
    if len(out) < n:
        raise LabError(f"could not draw {n} held-out kv-recall episodes", hint="use fewer items")
    return out


def episode_items(episodes: Sequence[Episode]) -> list[dict[str, Any]]:
    """Multiple-choice items: the prompt, one option per value of the episode."""
    items = []
    for i, ep in enumerate(episodes):
        values = [v for _, v in ep.pairs]
        items.append({"id": f"{KV_TASK}-{i:04d}", "slice": "kv", "context": ep.prompt,
                      "choices": [f" {v}" for v in values], "answer": values.index(ep.value)})
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


def greedy_exact_match(model: Any, tokenizer: Any, episodes: Sequence[Episode], *,
                       prefix_token_id: int | None, max_new_tokens: int = MAX_DECODE_TOKENS) -> float:
    """Share of episodes whose greedy continuation, decoded to a string, starts with the value
    as a whole word ("7" in " 7\\n..." counts; "72" does not)."""
    import torch

    hits = 0
    device = next(model.parameters()).device
    with torch.inference_mode():
        for ep in episodes:
            ids = ([prefix_token_id] if prefix_token_id is not None else []) \
                + tokenizer.encode(ep.prompt, add_special_tokens=False).ids
            new: list[int] = []
            for _ in range(max_new_tokens):
                x = torch.tensor([ids + new], device=device)
                new.append(int(model(input_ids=x).logits[0, -1].argmax()))
                text = tokenizer.decode(new, skip_special_tokens=False)
                if text.strip() and (text.strip() != text.lstrip() or len(text.split()) > 1):
                    break                    # a whole word is out: nothing more can change it
            words = tokenizer.decode(new, skip_special_tokens=False).split()
            hits += int(bool(words) and words[0] == ep.value)
    return hits / len(episodes)
