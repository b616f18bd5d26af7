"""What a warm scoring worker keeps between jobs: loaded tokenizers, the corpus tokenized by
the last tokenizer, and the unigram baselines it has seen.

A cold scoring child loads each of these afresh; a warm worker (`monitor.scoring.warm`)
scores many checkpoints of one lineage, which nearly always share one tokenizer and one
corpus selection. Every entry is keyed by content, never by path: a checkpoint's folder is a
fresh copy per job, and a folder edited in place is another tokenizer.

- a tokenizer by the sha256 of the small files of its folder (`tokenizer.json` and the
  special-token settings `load_tokenizer` reads), so the handle is the one a fresh load of
  those bytes gives (its `source` names the folder asked for);
- the corpus token ids by (tokenizer fingerprint, corpus selection sha256): tokenization is
  a function of exactly these two. Only the latest is kept (a large corpus's ids are
  hundreds of MB of Python ints), and each job gets its own copy of the lists;
- baselines by (tokenizer fingerprint, corpus sha256), the key the store uses.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

# Files of a folder that are weights, not tokenizer settings: never hashed for the key.
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".gguf")
# At most this many tokenizers are kept (a lineage has one; a worker is recycled anyway).
MAX_TOKENIZERS = 4


def folder_digest(path: str | Path) -> str:
    """sha256 over the names and bytes of the non-weight files of a tokenizer folder (or of
    the one file given)."""
    root = Path(path)
    files = [root] if root.is_file() else sorted(p for p in root.iterdir()
                                                 if p.is_file() and not p.name.endswith(_WEIGHT_SUFFIXES))
    digest = hashlib.sha256()
    for file in files:
        digest.update(file.name.encode() + b"\0")
        digest.update(hashlib.sha256(file.read_bytes()).digest())
    return digest.hexdigest()


class PrepareCache:
    """The per-process cache `engine.prepare(request, cache=...)` reads and fills."""

    def __init__(self) -> None:
        self._tokenizers: dict[str, Any] = {}
        self._tokens: tuple[tuple[str, str], list[list[int]]] | None = None
        self._baselines: dict[tuple[str, str], dict[str, Any]] = {}
        self.hits = {"tokenizer": 0, "tokens": 0}

    def tokenizer(self, path: str | Path, load: Callable[[str | Path], Any]) -> Any:
        """The tokenizer of `path`, loaded by `load` unless a folder with the same bytes was (a
        checkpoint's folder is new for every job); its `source` is always `path`'s folder."""
        digest = folder_digest(path)
        handle = self._tokenizers.get(digest)
        if handle is None:
            handle = load(path)
            if len(self._tokenizers) >= MAX_TOKENIZERS:
                self._tokenizers.pop(next(iter(self._tokenizers)))
            self._tokenizers[digest] = handle
            return handle
        self.hits["tokenizer"] += 1
        folder = Path(path) if Path(path).is_dir() else Path(path).parent
        return dataclasses.replace(handle, source=str(folder.resolve()))

    def token_ids(self, fingerprint: str, corpus_sha256: str,
                  encode: Callable[[], list[list[int]]]) -> list[list[int]]:
        """The corpus's token ids under the tokenizer `fingerprint` (a copy per call)."""
        key = (fingerprint, corpus_sha256)
        if self._tokens is not None and self._tokens[0] == key:
            self.hits["tokens"] += 1
        else:
            self._tokens = None   # free the old ids before making the new ones
            self._tokens = (key, encode())
        return [list(ids) for ids in self._tokens[1]]

    def remember_baseline(self, fingerprint: str, corpus_sha256: str, baseline: Mapping[str, Any] | None) -> None:
        """Keep a baseline a job used or computed, for the next job of the same tokenizer and corpus."""
        if baseline is not None:
            self._baselines[(fingerprint, corpus_sha256)] = dict(baseline)

    def baselines(self, given: Sequence[tuple[str, str, Mapping[str, Any]]]) -> list[tuple[str, str, Mapping[str, Any]]]:
        """The job's baselines, then the ones this process has seen (the job's win)."""
        known = {(fp, sha) for fp, sha, _ in given}
        return [*given, *((fp, sha, b) for (fp, sha), b in self._baselines.items() if (fp, sha) not in known)]

