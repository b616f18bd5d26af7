"""Perturbed segmentations of the same text for the tokenization stress test.

Three ways to cut a corpus into the ids of one BPE tokenizer other than its canonical
segmentation, each keeping the ids of the original vocabulary so a model trained on that
tokenizer can score them:

- `collapse_whitespace`: a normalisation variant (runs of spaces and tabs become one space).
  It changes the bytes: what is scored is then the normalised text.
- `dropout_segmentations`: BPE-dropout (Provilkov et al. 2020): at every merge step each
  applicable merge is skipped with probability p, and the best remaining one is applied. The
  `tokenizers` library has a `dropout` on its BPE model, but its random draws cannot be
  seeded, so the merges are replayed here with `random.Random`, seeded per (seed, rate,
  document): the same seed gives the same segmentations, whichever checkpoint scores them.
- `pruned_tokenizer`: the vocabulary without its rarest merges (the last k% of the merge
  list) and the tokens they create; ids of kept tokens are unchanged.

Only byte-level-style BPE tokenizers (every character of a pre-token is a vocabulary symbol,
no continuing-subword prefix or end-of-word suffix) are replayed; anything else raises
`TokenizerError` naming the tokenizer file, so the test can note the skip.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from monitor.errors import TokenizerError
from monitor.scoring.tokenizer import TokenizerHandle

_HORIZONTAL_WHITESPACE_RUN = re.compile(r"[ \t]{2,}|\t")


def collapse_whitespace(text: str) -> str:
    """Every run of spaces and tabs becomes one space; line breaks are kept."""
    return _HORIZONTAL_WHITESPACE_RUN.sub(" ", text)


def _tokenizer_json(handle: TokenizerHandle) -> dict[str, Any]:
    """The tokenizer's JSON as the library serialises it (the loaded object, not the file)."""
    return json.loads(handle.tokenizer.to_str())


@dataclass
class BpeReplay:
    """The merges, vocabulary and added tokens of a BPE tokenizer, to replay its segmentation."""

    tokenizer: Tokenizer
    vocab: dict[str, int]
    ranks: dict[tuple[str, str], int]
    added_ids: frozenset[int]
    ignore_merges: bool
    id_to_token: dict[int, str]

    @classmethod
    def of(cls, handle: TokenizerHandle) -> "BpeReplay":
        data = _tokenizer_json(handle)
        where = f"{handle.source}/tokenizer.json"
        model = _replayable_model(data, where)
        vocab = model["vocab"]
        ranks = {pair: rank for rank, pair in enumerate(_merge_pairs(model.get("merges") or [], where))}
        added = frozenset(int(t["id"]) for t in data.get("added_tokens") or [] if isinstance(t, dict))
        return cls(handle.tokenizer, vocab, ranks, added, bool(model.get("ignore_merges")),
                   {i: s for s, i in vocab.items()})

    def merge_word(self, word: str, rate: float, rng: random.Random | None) -> list[int] | None:
        """Ids of one pre-token (in the model's alphabet) after BPE with dropout `rate`, or None
        when a character is not a vocabulary symbol (the caller keeps the library's ids)."""
        if self.ignore_merges and word in self.vocab:
            return [self.vocab[word]]
        symbols = list(word)
        if any(s not in self.vocab for s in symbols):
            return None
        ranks = self.ranks
        while len(symbols) > 1:
            best_rank, best_at = None, -1
            for i in range(len(symbols) - 1):
                rank = ranks.get((symbols[i], symbols[i + 1]))
                if rank is None:
                    continue
                if rate > 0.0 and rng.random() < rate:   # this merge is dropped at this step
                    continue
                if best_rank is None or rank < best_rank:
                    best_rank, best_at = rank, i
            if best_rank is None:
                break
            symbols[best_at:best_at + 2] = [symbols[best_at] + symbols[best_at + 1]]
        return [self.vocab[s] for s in symbols]

    def segment(self, text: str, rate: float, rng: random.Random | None) -> tuple[list[int], int]:
        """(ids, words kept as the library cut them) of one document. The library's own
        encoding supplies the pre-tokens (its normaliser, pre-tokenizer and added tokens); each
        pre-token's merges are replayed. Added tokens are kept as they are."""
        encoding = self.tokenizer.encode(text, add_special_tokens=False)
        ids: list[int] = []
        kept = 0
        for group in _word_groups(encoding.ids, encoding.word_ids):
            if any(i in self.added_ids for i in group):
                ids.extend(group)
                continue
            word = "".join(self.id_to_token.get(i, "") for i in group)
            merged = self.merge_word(word, rate, rng)
            if merged is None:
                ids.extend(group)
                kept += 1
            else:
                ids.extend(merged)
        return ids, kept


def _replayable_model(data: dict[str, Any], where: str) -> dict[str, Any]:
    """The `model` object of a tokenizer's JSON, refused (TokenizerError naming `where`) unless
    it is a BPE the merges can be replayed on: what the replay and the pruning both require."""
    model = data.get("model") or {}
    if model.get("type") != "BPE":
        raise TokenizerError(f"{where}: model type {model.get('type')!r} is not BPE",
                             hint="BPE-dropout and merge pruning apply to BPE tokenizers only")
    if model.get("continuing_subword_prefix") or model.get("end_of_word_suffix"):
        raise TokenizerError(f"{where}: a BPE with a subword prefix or word suffix is not replayed",
                             hint="use a byte-level BPE tokenizer (GPT-2 style)")
    if not isinstance(model.get("vocab"), dict):
        raise TokenizerError(f"{where}: model.vocab is not an object")
    return model


def _merge_pairs(merges: Sequence[Any], where: str) -> list[tuple[str, str]]:
    pairs = []
    for k, merge in enumerate(merges):
        if isinstance(merge, str):
            parts = merge.split(" ")
        elif isinstance(merge, (list, tuple)):
            parts = list(merge)
        else:
            parts = []
        if len(parts) != 2 or not all(isinstance(p, str) for p in parts):
            raise TokenizerError(f"{where}: merges[{k}] is not a pair of symbols",
                                 hint="restore the tokenizer file from its source")
        pairs.append((parts[0], parts[1]))
    return pairs


def _word_groups(ids: Sequence[int], word_ids: Sequence[int | None]) -> list[list[int]]:
    """Consecutive ids of the same pre-token (a None word id is a group of its own)."""
    groups: list[list[int]] = []
    previous: object = object()
    for token_id, word in zip(ids, word_ids):
        if word is None or word != previous or not groups:
            groups.append([token_id])
        else:
            groups[-1].append(token_id)
        previous = word if word is not None else object()
    return groups


def document_rng(seed: int, rate: float, index: int) -> random.Random:
    """The random stream of one document at one rate: a string seed, hashed the same way in
    every Python process (unlike `hash()`), so runs and checkpoints share segmentations."""
    return random.Random(f"lstar-stress/bpe-dropout:{seed}:{rate!r}:{index}")


def dropout_segmentations(handle: TokenizerHandle, texts: Sequence[str], rate: float,
                          seed: int, replay: BpeReplay | None = None) -> tuple[list[list[int]], dict[str, Any]]:
    """Ids of each text under BPE-dropout at `rate`, seeded per document, and facts about the
    replay: `reproduces_library` (rate 0 gives exactly the library's ids on these texts; checked
    on every call so a replay that drifts from the library is never reported silently) and
    `words_kept` (pre-tokens left as the library cut them). `replay`: `BpeReplay.of(handle)`
    made once by a caller with several rates (reading a large vocabulary's merges is most of a
    call's time); made here when not given."""
    if not 0.0 <= rate < 1.0:
        raise TokenizerError(f"BPE-dropout rate {rate} is outside [0, 1)", hint="use rates like 0.05,0.1")
    if replay is None:
        replay = BpeReplay.of(handle)
    seqs, kept = [], 0
    for index, text in enumerate(texts):
        ids, k = replay.segment(text, rate, document_rng(seed, rate, index))
        seqs.append(ids)
        kept += k
    canonical = handle.encode_documents(list(texts))
    reproduced = all(replay.segment(t, 0.0, None)[0] == c for t, c in zip(texts, canonical))
    return seqs, {"reproduces_library": reproduced, "words_kept": kept}


def pruned_tokenizer(handle: TokenizerHandle, fraction: float) -> tuple[Tokenizer, dict[str, Any]]:
    """The tokenizer without the last `fraction` of its merges and the tokens only they create
    (added tokens and the base alphabet stay). Kept tokens keep their ids, so the model's rows
    for them are used unchanged; the pruned ids are simply never produced."""
    if not 0.0 < fraction < 1.0:
        raise TokenizerError(f"merge-pruning fraction {fraction} is outside (0, 1)", hint="use e.g. 0.1")
    data = _tokenizer_json(handle)
    where = f"{handle.source}/tokenizer.json"
    model = _replayable_model(data, where)     # the same refusals as the replay
    pairs = _merge_pairs(model.get("merges") or [], where)
    keep = len(pairs) - int(round(len(pairs) * fraction))
    made_by_kept = {a + b for a, b in pairs[:keep]}
    added = {t.get("content") for t in data.get("added_tokens") or [] if isinstance(t, dict)}
    dropped = {a + b for a, b in pairs[keep:]} - made_by_kept - added
    model["merges"] = [list(p) for p in pairs[:keep]]
    model["vocab"] = {tok: i for tok, i in model["vocab"].items() if tok not in dropped}
    try:
        pruned = Tokenizer.from_str(json.dumps(data, ensure_ascii=False))
    except Exception as exc:  # the Rust side raises a plain Exception
        raise TokenizerError(f"{where}: the pruned vocabulary does not load ({str(exc)[:200]})") from exc
    pruned.no_truncation()
    pruned.no_padding()
    return pruned, {"merges_kept": keep, "merges_dropped": len(pairs) - keep, "tokens_dropped": len(dropped),
                    "dropped_ids": sorted(handle.tokenizer.token_to_id(t) for t in dropped)}


def encode_with(tokenizer: Tokenizer, texts: Sequence[str]) -> list[list[int]]:
    """Ids of each text, as the spec encodes (no special tokens added)."""
    return [e.ids for e in tokenizer.encode_batch(list(texts), add_special_tokens=False)]

