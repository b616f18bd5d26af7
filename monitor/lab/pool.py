"""The lab's natural text (version 2): a pool of pinned corpora, read once, in a seeded order.

A pool is a folder with `manifest.json` and three ordinary pinned corpora (`train`,
`heldout`, `tasks`), each loaded and verified by `monitor.scoring.load_corpus`. The lab uses
them as follows:

- `train`: its documents are cut into chunks at line ends. A fixed part of them (the first
  chunks in the order of sha256("lab-unigram:" + chunk), up to `oos_unigram_bytes`) is the
  *unigram slice*: no lineage reads it, and the out-of-sample unigram behind `lstar_oos` is
  fitted on it. Every lineage reads the remaining chunks in an order drawn from its seed and
  reads each at most once (a budget larger than the readable text is refused).
- `heldout`: evaluation text of the same distribution, never trained on (a fixed selection
  of its documents, up to `heldout_bytes`).
- `tasks`: the source of the held-out cloze items (`monitor.lab.tasks.pool_cloze_items`).

Additions in words (`monitor.lab.text`, sums up to twenty) are spliced into the training
documents as in version 1: half of a document's problems, a chunk of text, the other half.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from monitor.errors import LabError

POOL_SPLITS = ("train", "heldout", "tasks")


@dataclass(frozen=True)
class Pool:
    """A loaded pool: its three corpora (verified) and the pins the lab records."""

    path: Path
    train: object
    heldout: object
    tasks: object

    def provenance(self) -> dict[str, object]:
        manifest = self.path / "manifest.json"
        return {"path": str(self.path),
                "manifest_sha256": hashlib.sha256(manifest.read_bytes()).hexdigest() if manifest.is_file() else None,
                **{name: {"sha256": getattr(self, name).sha256, "documents": len(getattr(self, name).documents),
                          "bytes": getattr(self, name).n_bytes} for name in POOL_SPLITS}}


def load_pool(path: str | Path, *, pins: str | Path | None = None) -> Pool:
    """Load and verify the three corpora of a pool folder, each against the pool manifest
    (`monitor.scoring.pool_load`; with `pins`, against a committed manifest too); one
    `LabError` line per problem."""
    from monitor.errors import CorpusError
    from monitor.scoring.pool_load import load_pool_corpora

    root = Path(path).resolve()
    if not root.is_dir():
        raise LabError(f"pool {path} is not a folder", hint="pass --pool DIR (a lab pool: train/, heldout/, tasks/)")
    missing = [name for name in POOL_SPLITS if not (root / name / "manifest.json").is_file()]
    if missing:
        raise LabError(f"pool {root} has no {', '.join(f'{m}/manifest.json' for m in missing)}",
                       hint="a lab pool holds the corpora train/, heldout/ and tasks/")
    try:
        corpora = dict(zip(POOL_SPLITS, load_pool_corpora(root, pins=pins)))
    except CorpusError as exc:
        raise LabError(exc.message, hint=exc.hint) from None
    for name, corpus in corpora.items():
        if not corpus.documents:
            raise LabError(f"pool {root}: the {name} split has no documents")
    return Pool(root, **corpora)


def _lines(text: str, size: int) -> list[str]:
    """The lines of `text`, a line longer than `size` cut after a space (or at `size`)."""
    out: list[str] = []
    for line in text.split("\n"):
        while len(line) > size:
            cut = line.rfind(" ", 0, size) + 1 or size
            out.append(line[:cut])
            line = line[cut:]
        out.append(line)
    return out


def chunk_texts(texts: Sequence[str], size: int) -> list[str]:
    """The texts cut into chunks of about `size` characters at line ends (corpus order); a
    line longer than `size` is cut after a space, so no chunk is much longer than `size`."""
    pool: list[str] = []
    for text in texts:
        buf: list[str] = []
        length = 0
        for line in _lines(text, size):
            buf.append(line)
            length += len(line) + 1
            if length >= size:
                chunk = "\n".join(buf).strip("\n")
                if chunk.strip():
                    pool.append(chunk)
                buf, length = [], 0
        chunk = "\n".join(buf).strip("\n")
        if chunk.strip():
            pool.append(chunk)
    return pool


@dataclass(frozen=True)
class TrainText:
    """The train split's chunks, divided into the unigram slice and the readable chunks."""

    readable: tuple[str, ...]        # corpus order
    unigram_slice: tuple[str, ...]   # never read by a lineage

    @property
    def readable_bytes(self) -> int:
        return sum(len(c.encode("utf-8")) for c in self.readable)

    @property
    def unigram_bytes(self) -> int:
        return sum(len(c.encode("utf-8")) for c in self.unigram_slice)


def unigram_reserved(chunks: Sequence[str], oos_unigram_bytes: int) -> set[int]:
    """The indices of the unigram slice: the first chunks in sha256("lab-unigram:" + chunk)
    order until `oos_unigram_bytes` are set apart (lab v2 and v3 alike)."""
    order = sorted(range(len(chunks)),
                   key=lambda i: hashlib.sha256(b"lab-unigram:" + chunks[i].encode("utf-8")).digest())
    reserved: set[int] = set()
    size = 0
    for i in order:
        if size >= oos_unigram_bytes:
            break
        reserved.add(i)
        size += len(chunks[i].encode("utf-8"))
    return reserved


def split_train(pool: Pool, *, chunk_chars: int, oos_unigram_bytes: int) -> TrainText:
    """Cut the train split into chunks and set the unigram slice apart (see the module doc)."""
    chunks = chunk_texts([d.text for d in pool.train.documents], chunk_chars)
    reserved = unigram_reserved(chunks, oos_unigram_bytes)
    readable = tuple(c for i, c in enumerate(chunks) if i not in reserved)
    if not readable:
        raise LabError(f"pool {pool.path}: the unigram slice ({oos_unigram_bytes} bytes) takes the whole train split",
                       hint="lower oos_unigram_bytes or use a larger pool")
    return TrainText(readable, tuple(c for i, c in enumerate(chunks) if i in reserved))


def _below(rng: random.Random, n: int) -> int:
    # random() alone is stable across Python versions (randrange/sample are not guaranteed)
    return min(int(rng.random() * n), n - 1)


def reading_order(n: int, seed: int) -> list[int]:
    """A seeded permutation of range(n) (Fisher-Yates on `random.Random.random` only)."""
    rng = random.Random(f"lab-v2-text-order-{seed}")
    order = list(range(n))
    for i in range(n - 1, 0, -1):
        j = _below(rng, i + 1)
        order[i], order[j] = order[j], order[i]
    return order


def splice_additions(rng: random.Random, problems: Sequence, chunk: str, problems_per_doc: int) -> str:
    """One training document: half of its problems (drawn uniformly with `rng`), the chunk,
    the other half, one per line."""
    half = problems_per_doc // 2
    head = [problems[_below(rng, len(problems))].text for _ in range(half)]
    tail = [problems[_below(rng, len(problems))].text for _ in range(problems_per_doc - half)]
    return "\n".join([*head, chunk, *tail])


def build_lineage_stream(text: TrainText, *, total_bytes: int, seed: int, problems: Sequence,
                         problems_per_doc: int) -> list[str]:
    """Training documents of one lineage adding up to at least `total_bytes` UTF-8 bytes.

    The readable chunks are taken in the seed's order, each at most once; each document is
    half of its problems, one chunk, the other half. Problems are drawn uniformly from
    `problems` (the trained additions) with a generator of the same seed.
    """
    rng = random.Random(f"lab-v2-problems-{seed}")
    order = reading_order(len(text.readable), seed)
    docs: list[str] = []
    seen = 0
    for index in order:
        if seen >= total_bytes:
            break
        doc = splice_additions(rng, problems, text.readable[index], problems_per_doc)
        docs.append(doc)
        seen += len(doc.encode("utf-8"))
    if seen < total_bytes:
        raise LabError(f"a byte budget of {total_bytes} needs more text than the pool's readable train split "
                       f"({text.readable_bytes} bytes of text, {seen} bytes with the additions): "
                       "the lab reads no byte twice",
                       hint="lower the budget or use a larger pool")
    return docs


def heldout_texts(pool: Pool, max_bytes: int) -> list[str]:
    """The held-out evaluation text: the heldout split's documents in corpus order, up to
    `max_bytes` (the whole split when it is smaller)."""
    out: list[str] = []
    size = 0
    for doc in pool.heldout.documents:
        if size >= max_bytes:
            break
        out.append(doc.text)
        size += doc.n_bytes
    return out


def unigram_log_probs(token_seqs: Sequence[Sequence[int]], vocab_size: int, *, alpha: float = 0.5) -> np.ndarray:
    """log q(t) of the out-of-sample unigram: counts of `token_seqs` plus `alpha` on every id
    of the tokenizer's id space (additive smoothing, so an id the slice never shows keeps a
    finite probability), in float64."""
    counts = np.zeros(vocab_size, dtype=np.float64)
    for seq in token_seqs:
        counts += np.bincount(np.asarray(seq, dtype=np.int64), minlength=vocab_size)[:vocab_size]
    counts += alpha
    return np.log(counts) - np.log(counts.sum())


def round_trip_failures(handle, texts: Sequence[str]) -> int:
    """How many texts do not decode back to themselves after encoding (spec tokenization)."""
    ids = handle.encode_documents(list(texts))
    return sum(handle.tokenizer.decode(i, skip_special_tokens=False) != t for i, t in zip(ids, texts))


def check_lossless(handle, family: str, texts_by_name: dict[str, Sequence[str]]) -> dict[str, object]:
    """The decode round trip of `family` on each named text: {name: {documents, failing}} and
    `lossless` (no document fails anywhere)."""
    result: dict[str, object] = {}
    lossless = True
    for name, texts in texts_by_name.items():
        failing = round_trip_failures(handle, texts)
        result[name] = {"documents": len(texts), "failing": failing}
        lossless = lossless and failing == 0
    return {"lossless": lossless, "texts": result}


def lossy_reason(family: str, check: dict[str, object]) -> str:
    """One line saying why `family` cannot count in the primary race."""
    texts = check["texts"]
    total = sum(t["documents"] for t in texts.values())
    failing = sum(t["failing"] for t in texts.values())
    parts = ", ".join(f"{name} {t['failing']}/{t['documents']}" for name, t in texts.items())
    return (f"family {family!r} is lossy: decoding its tokens reproduces the text of only "
            f"{total - failing} of {total} documents ({100.0 * failing / max(1, total):.1f}% fail: {parts}); "
            "a lossy tokenizer measures less information than the text holds and cannot count in the race")
