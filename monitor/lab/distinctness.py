"""How distinct two tokenizer families are: the Jaccard index of their token boundaries.

Two families that cut a text at the same places give a model the same prediction problem up to
renaming the tokens, so they count once in the race (docs/lab.md, "Families v3").

Definition. For a text t (UTF-8 bytes b), a tokenizer's *token ends* are the set

    E(t) = { end byte offset of token k : k a token of t, end > 0 },

where a token's end is the byte offset in b just after the last character of its span (the
tokenizer's character offsets converted to bytes). A token that holds only part of a
character (byte-level tokenizers split rare characters into bytes) ends where that
character ends, so boundaries inside a character are not counted and both parts of a split
character share one end. Over several texts the ends are the pairs (text index, offset).

    boundary_jaccard(A, B) = |E_A ∩ E_B| / |E_A ∪ E_B|   (1.0 when both are empty).

1.0 means the two cut every text at exactly the same places; a tokenizer whose boundaries are
a subset of another's (a pruned BPE against its original) gets the ratio of their token counts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from monitor.errors import LabError

# A text's offsets are packed as text_index * STRIDE + byte_offset in one int64.
STRIDE = 1 << 32


def token_ends(tokenizer: Any, texts: Sequence[str]) -> np.ndarray:
    """The sorted, distinct token ends (packed text index and byte offset) of `texts`.

    `tokenizer` is a `tokenizers.Tokenizer` (or a handle with `.tokenizer`); encoding is the
    spec's: no special tokens added, special-token strings in the text matched as usual."""
    tok = getattr(tokenizer, "tokenizer", tokenizer)
    encodings = tok.encode_batch(list(texts), add_special_tokens=False)
    parts = []
    for index, (text, enc) in enumerate(zip(texts, encodings)):
        if len(text.encode("utf-8")) >= STRIDE:
            raise LabError(f"text {index} is longer than {STRIDE} bytes")
        # byte offset of every character boundary: char_to_byte[i] = bytes before character i
        char_to_byte = np.zeros(len(text) + 1, dtype=np.int64)
        if text:
            char_to_byte[1:] = np.cumsum([len(c.encode("utf-8")) for c in text])
        ends = np.fromiter((end for _, end in enc.offsets), dtype=np.int64, count=len(enc.offsets))
        ends = char_to_byte[np.clip(ends, 0, len(text))]
        parts.append(index * STRIDE + ends[ends > 0])
    return np.unique(np.concatenate(parts)) if parts else np.zeros(0, dtype=np.int64)


def jaccard_of_ends(a: np.ndarray, b: np.ndarray) -> float:
    union = np.union1d(a, b).size
    return 1.0 if union == 0 else np.intersect1d(a, b, assume_unique=True).size / union


def boundary_jaccard(tok_a: Any, tok_b: Any, texts: Sequence[str]) -> float:
    """|E_A ∩ E_B| / |E_A ∪ E_B| of the token ends on `texts` (module docstring)."""
    return jaccard_of_ends(token_ends(tok_a, texts), token_ends(tok_b, texts))


def jaccard_matrix(tokenizers: Mapping[str, Any], texts: Sequence[str]) -> tuple[list[str], np.ndarray]:
    """(names, symmetric matrix of boundary Jaccards) over `tokenizers` in their order."""
    names = list(tokenizers)
    ends = {name: token_ends(tok, texts) for name, tok in tokenizers.items()}
    matrix = np.eye(len(names))
    for i, a in enumerate(names):
        for j in range(i + 1, len(names)):
            matrix[i, j] = matrix[j, i] = jaccard_of_ends(ends[a], ends[names[j]])
    return names, matrix


def distinct_families(names: Sequence[str], texts: Sequence[str] | None = None, cutoff: float = 0.96, *,
                      tokenizers: Mapping[str, Any] | None = None,
                      matrix: np.ndarray | None = None) -> dict[str, Any]:
    """Keep families greedily in the pre-registered order of `names`: a family is dropped when
    its boundary Jaccard with a family already kept is ≥ `cutoff` (the reason names the
    closest kept one). Give the tokenizers (and texts) or a precomputed matrix in `names` order.

    Returns {"kept", "dropped": {name: reason}, "names", "matrix", "cutoff"}."""
    if not 0.0 < cutoff <= 1.0:
        raise LabError(f"cutoff {cutoff} must be in (0, 1]")
    if len(set(names)) != len(names):
        raise LabError(f"families are repeated: {', '.join(names)}")
    if matrix is None:
        if tokenizers is None or texts is None:
            raise LabError("distinct_families needs the tokenizers and the texts, or a matrix")
        _, matrix = jaccard_matrix({n: tokenizers[n] for n in names}, texts)
    matrix = np.asarray(matrix, dtype=float)
    if matrix.shape != (len(names), len(names)):
        raise LabError(f"the matrix is {matrix.shape}, expected {len(names)} x {len(names)}")
    kept: list[int] = []
    dropped: dict[str, str] = {}
    for i, name in enumerate(names):
        close = [(matrix[i, k], k) for k in kept if matrix[i, k] >= cutoff]
        if close:
            value, k = max(close)
            dropped[name] = f"boundary Jaccard {value:.3f} with {names[k]} (kept earlier) is at least {cutoff}"
        else:
            kept.append(i)
    return {"kept": [names[i] for i in kept], "dropped": dropped, "names": list(names),
            "matrix": matrix.round(4).tolist(), "cutoff": cutoff}
