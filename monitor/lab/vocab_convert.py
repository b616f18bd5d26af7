"""Vocabularies from other formats as `tokenizers` JSON: SentencePiece BPE `.model` files and
Tekken (tiktoken ranks) files, as shipped in mistral-common's wheel, and pruned byte-level BPEs.

Each function returns the tokenizer.json content as a dict; `monitor.lab.families` writes it.
No sentencepiece or protobuf is needed: the few fields of a `.model` file that matter are read
by the small protobuf reader below (the file is the `ModelProto` of sentencepiece_model.proto).
The conversions follow transformers' converters (`LlamaConverter` for SentencePiece BPE with
byte fallback, `TikTokenConverter` for ranks): a merge for every split of a token into two
tokens, ranked by the merged token's priority. `tests/test_lab_families.py` checks the ids
against mistral-common's own tokenizers on calib-v0.
"""

from __future__ import annotations

import base64
import json
import struct
from pathlib import Path
from typing import Any

from monitor.errors import LabError

MAX_SOURCE_BYTES = 64 << 20       # the largest vocabulary file read (tekken_240911.json is 19 MB)
SPM_NORMAL, SPM_UNKNOWN, SPM_CONTROL, SPM_USER_DEFINED, SPM_UNUSED, SPM_BYTE = 1, 2, 3, 4, 5, 6
SPM_BPE = 2
METASPACE = "\u2581"


def read_bounded(path: Path) -> bytes:
    path = Path(path)
    if not path.is_file():
        raise LabError(f"vocabulary source {path} does not exist",
                       hint="install mistral-common==1.13.1 (or pass the folder holding its data files)")
    if path.stat().st_size > MAX_SOURCE_BYTES:
        raise LabError(f"{path} is {path.stat().st_size} bytes, more than the {MAX_SOURCE_BYTES} read",
                       hint="this is not one of the pinned vocabulary files")
    return path.read_bytes()


# ------------------------------------------------------------------ SentencePiece .model files
def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise ValueError("truncated varint")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos


def _fields(buf: bytes) -> list[tuple[int, int, Any]]:
    """(field number, wire type, value) of one protobuf message; bytes for length-delimited."""
    out, pos = [], 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 1:
            value, pos = buf[pos:pos + 8], pos + 8
        elif wire == 2:
            size, pos = _varint(buf, pos)
            value, pos = buf[pos:pos + size], pos + size
        elif wire == 5:
            value, pos = buf[pos:pos + 4], pos + 4
        else:
            raise ValueError(f"unsupported wire type {wire}")
        if pos > len(buf):
            raise ValueError("truncated field")
        out.append((field, wire, value))
    return out


def read_spm_model(path: Path) -> dict[str, Any]:
    """pieces [(piece, score, type)], model_type, byte_fallback and the normalizer flags."""
    raw = read_bounded(path)
    try:
        pieces, trainer, normalizer = [], {}, {}
        for field, wire, value in _fields(raw):
            if field == 1 and wire == 2:
                piece, score, kind = "", 0.0, SPM_NORMAL
                for f, w, v in _fields(value):
                    if f == 1 and w == 2:
                        piece = v.decode("utf-8")
                    elif f == 2 and w == 5:
                        score = struct.unpack("<f", v)[0]
                    elif f == 3 and w == 0:
                        kind = v
                pieces.append((piece, score, kind))
            elif field == 2 and wire == 2:
                trainer = {f: v for f, w, v in _fields(value) if w == 0}
            elif field == 3 and wire == 2:
                normalizer = {f: v for f, w, v in _fields(value) if w in (0, 2)}
    except (ValueError, UnicodeDecodeError, struct.error) as exc:
        raise LabError(f"{path} is not a SentencePiece model ({exc})",
                       hint="restore the file from the mistral-common wheel") from None
    return {"pieces": pieces, "model_type": trainer.get(3, 1), "byte_fallback": bool(trainer.get(35, 0)),
            "add_dummy_prefix": bool(normalizer.get(3, 1)), "remove_extra_whitespaces": bool(normalizer.get(4, 1)),
            "normalizer_name": normalizer.get(1, b"").decode("utf-8", "replace")}


def _split_merges(vocab: dict[str, int], targets: list[str], rank_of: dict[str, int]) -> list[list[str]]:
    """A merge (left, right) for every split of each target into two vocabulary entries of lower
    rank, ordered by the target's rank, then by (id of left, id of right) as transformers does."""
    merges = []
    for token in targets:
        rank = rank_of[token]
        local = [(token[:i], token[i:]) for i in range(1, len(token))
                 if rank_of.get(token[:i], rank) < rank and rank_of.get(token[i:], rank) < rank]
        local.sort(key=lambda pair: (vocab[pair[0]], vocab[pair[1]]))
        merges.extend([list(pair) for pair in local])
    return merges


def spm_bpe_tokenizer(path: Path) -> dict[str, Any]:
    """A SentencePiece BPE model with byte fallback (the Llama-style "legacy" pipeline: prepend
    ▁, spaces to ▁, no pre-tokenizer; decode ▁ to space, bytes, strip the one leading space)."""
    spm = read_spm_model(path)
    if spm["model_type"] != SPM_BPE or not spm["byte_fallback"] or not spm["add_dummy_prefix"] \
            or spm["remove_extra_whitespaces"] or spm["normalizer_name"] not in ("identity", ""):
        raise LabError(f"{path}: only SentencePiece BPE with byte fallback, a dummy prefix, kept whitespace "
                       f"and the identity normalizer is converted (model type {spm['model_type']}, "
                       f"normalizer {spm['normalizer_name']!r})", hint="convert this vocabulary another way")
    pieces = spm["pieces"]
    if any(kind == SPM_USER_DEFINED for _, _, kind in pieces):
        raise LabError(f"{path}: user-defined pieces are not converted", hint="convert this vocabulary another way")
    vocab = {piece: i for i, (piece, _, _) in enumerate(pieces)}
    # SentencePiece BPE merges the adjacent pair whose result has the highest score; a rank is
    # the position in that order (ties: the lower id first).
    normal = [(p, s, i) for i, (p, s, kind) in enumerate(pieces) if kind == SPM_NORMAL]
    order = sorted(normal, key=lambda t: (-t[1], t[2]))
    rank_of = {p: r for r, (p, _, _) in enumerate(order)}
    for piece, _, kind in pieces:           # bytes and single characters are never merge results
        if kind != SPM_NORMAL or len(piece) == 1:
            rank_of[piece] = -1
    merges = _split_merges(vocab, [p for p, _, _ in order if len(p) > 1], rank_of)
    specials = [(i, p) for i, (p, _, kind) in enumerate(pieces) if kind in (SPM_CONTROL, SPM_UNKNOWN)]
    unk = next((p for p, _, kind in pieces if kind == SPM_UNKNOWN), None)
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [_added(i, p) for i, p in specials],
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": METASPACE},
            {"type": "Replace", "pattern": {"String": " "}, "content": METASPACE}]},
        "pre_tokenizer": None, "post_processor": None,
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": METASPACE}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": unk, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                  "vocab": vocab, "merges": merges},
    }


def _added(token_id: int, content: str) -> dict[str, Any]:
    return {"id": token_id, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": False, "special": True}


# ------------------------------------------------------------------ byte level
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte → printable character table (the ByteLevel pre-tokenizer's alphabet)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    chars, extra = list(printable), 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars)}


def byte_level_pre_tokenizer(pattern: str) -> dict[str, Any]:
    """Split by `pattern` (kept pieces), then map bytes to the ByteLevel alphabet."""
    return {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Removed", "invert": True},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}


BYTE_LEVEL_DECODER = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}


def tekken_tokenizer(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """A Tekken file (tiktoken ranks, base64 bytes) as a byte-level BPE: token id = rank + the
    number of special tokens, as mistral-common numbers them; <unk>, <s>, </s> are ids 0, 1, 2.
    Returns (tokenizer.json, facts for provenance)."""
    try:
        data = json.loads(read_bounded(path).decode("utf-8"))
        config = data["config"]
        n_special = int(config["default_num_special_tokens"])
        inner = int(config["default_vocab_size"]) - n_special
        ranks = [base64.b64decode(t["token_bytes"]) for t in data["vocab"][:inner]]
        pattern = str(config["pattern"])
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise LabError(f"{path} is not a Tekken vocabulary ({type(exc).__name__}: {exc})",
                       hint="restore the file from the mistral-common wheel") from None
    if len(ranks) != inner or len(set(ranks)) != inner:
        raise LabError(f"{path}: expected {inner} distinct ranked tokens, found {len(set(ranks))}")
    table = bytes_to_unicode()
    tokens = ["".join(table[b] for b in raw) for raw in ranks]
    # <unk>, <s>, </s> sit in the model's vocabulary too, so that tokenizers keeps their ids 0-2
    # (an added token absent from the vocabulary gets the next free id instead).
    specials = ["<unk>", "<s>", "</s>"]
    if set(specials) & set(tokens):
        raise LabError(f"{path}: a ranked token is spelt like a special token ({set(specials) & set(tokens)})")
    vocab = {**{tok: i for i, tok in enumerate(specials)}, **{tok: n_special + r for r, tok in enumerate(tokens)}}
    rank_of = {tok: r for r, tok in enumerate(tokens)}
    merges = _split_merges(vocab, [t for t in tokens if len(t) > 1], rank_of)
    tokenizer = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [_added(i, tok) for i, tok in enumerate(specials)],
        "normalizer": None, "pre_tokenizer": byte_level_pre_tokenizer(pattern), "post_processor": None,
        "decoder": BYTE_LEVEL_DECODER,
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": merges},
    }
    return tokenizer, {"special_tokens": n_special, "ranked_tokens": inner, "merges": len(merges),
                       "pattern": pattern}


def prune_byte_level_bpe(data: dict[str, Any], keep_merges: int) -> dict[str, Any]:
    """The first `keep_merges` merges of a byte-level BPE tokenizer.json and the vocabulary they
    reach (the original's byte characters plus every merge result), each token keeping its id;
    added tokens are kept. Lossless where the original is: every byte it has is still a token."""
    model = data.get("model") or {}
    if model.get("type") != "BPE" or model.get("byte_fallback"):
        raise LabError("only a byte-level BPE can be pruned by merges")
    vocab, merges = model["vocab"], model["merges"]
    # Every byte character the original has stays (a few omit control bytes that never occur):
    # whatever the original can encode, the pruned one can.
    alphabet = set(bytes_to_unicode().values()) & set(vocab)
    if not 0 < keep_merges <= len(merges):
        raise LabError(f"keep_merges {keep_merges} must be from 1 to the {len(merges)} merges")
    kept_tokens, kept_merges = set(alphabet), []
    for merge in merges[:keep_merges]:
        left, right = merge if isinstance(merge, list) else merge.split(" ", 1)
        if left in kept_tokens and right in kept_tokens and left + right in vocab:
            kept_merges.append([left, right])
            kept_tokens.add(left + right)
    pruned = json.loads(json.dumps(data))
    kept = {tok: i for tok, i in vocab.items() if tok in kept_tokens}
    # The added tokens go into the model's vocabulary at their ids: tokenizers gives an added
    # token that the model lacks the next free id (the vocabulary's size), which after pruning
    # is the id of a kept token.
    kept.update({t["content"]: t["id"] for t in data.get("added_tokens") or []})
    pruned["model"]["vocab"] = dict(sorted(kept.items(), key=lambda kv: kv[1]))
    pruned["model"]["merges"] = kept_merges
    return pruned
