"""Lab v3's per-family data: which chunks of the pool's train split each (family, seed) reads.

In lab v2 every family of a seed read the same bytes in the same order, so bytes seen was a
clock (issue 37). In v3 each family reads its own mixture of the pool's sources, and each
(family, seed) its own order:

- The train split is cut into chunks exactly as in v2 (`monitor.lab.pool.chunk_texts`), each
  chunk keeping its document's slice (the pool's sources: `dictionary`, `documentation`); the
  unigram slice (`monitor.lab.pool.unigram_reserved`) stays excluded.
- **Mixture** (per family, the same for its seeds, which are replicates): each source's weight
  is its natural byte share times a factor spread**(2u − 1), u = sha256("lab-v3-mixture:" +
  family + ":" + source) read as a fraction of 2^256, then normalised. A family keeps its
  mixture across seeds; its seeds differ by initial weights, additions drawn and the chunks
  themselves (each seed draws its own, see `shared_chunk_share`).
- **Chunks and order** (per family and seed, so a seed draws its own chunks, not an order of a
  sample shared by the family's seeds): every source's chunks are shuffled (Fisher-Yates on
  `random.Random` seeded with the integer sha256("lab-v3-data:" + family + ":" + seed), sources
  in name order), then interleaved by bytes: the next chunk comes from the source furthest
  below its weight (bytes read ÷ weight smallest; ties by name). Each chunk is read at most
  once; a budget that would need more of a source than the pool holds is refused.
- **Additions** are spliced around each chunk as in v2, drawn with
  `random.Random("lab-v3-problems:" + family + ":" + seed)`.

The assignment is pinned in lab.json by its parameters and the sha256 of the chunks read, in
order (over the sha256 of each chunk's text, so it does not depend on where the pool is).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from monitor.errors import LabError
from monitor.lab.pool import _below, chunk_texts, splice_additions, unigram_reserved

ASSIGNMENT_RULE = ("per family: source weights = natural byte share x spread**(2u-1), "
                   "u = sha256('lab-v3-mixture:<family>:<source>')/2**256, normalised; per (family, seed): "
                   "each source's chunks shuffled with random.Random(int(sha256('lab-v3-data:<family>:<seed>'))), "
                   "interleaved by bytes (next from the source with the least bytes read / weight), each chunk "
                   "at most once, the unigram slice excluded; additions drawn with "
                   "random.Random('lab-v3-problems:<family>:<seed>')")


@dataclass(frozen=True)
class SourcedChunks:
    """The readable chunks of the train split (corpus order) with the source of each."""

    chunks: tuple[str, ...]
    sources: tuple[str, ...]
    unigram_slice: tuple[str, ...]

    def bytes_by_source(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for chunk, source in zip(self.chunks, self.sources):
            out[source] = out.get(source, 0) + len(chunk.encode("utf-8"))
        return dict(sorted(out.items()))


def sourced_chunks(documents: Sequence[Any], *, chunk_chars: int, oos_unigram_bytes: int) -> SourcedChunks:
    """The train split's chunks (the same as `monitor.lab.pool.split_train`'s: each document is
    chunked on its own there too), each with its document's slice, the unigram slice set apart."""
    chunks: list[str] = []
    sources: list[str] = []
    for doc in documents:
        for chunk in chunk_texts([doc.text], chunk_chars):
            chunks.append(chunk)
            sources.append(doc.slice)
    reserved = unigram_reserved(chunks, oos_unigram_bytes)
    keep = [i for i in range(len(chunks)) if i not in reserved]
    if not keep:
        raise LabError(f"the unigram slice ({oos_unigram_bytes} bytes) takes the whole train split",
                       hint="lower oos_unigram_bytes or use a larger pool")
    return SourcedChunks(tuple(chunks[i] for i in keep), tuple(sources[i] for i in keep),
                         tuple(chunks[i] for i in sorted(reserved)))


def _unit(text: str) -> float:
    """A fraction in [0, 1) from sha256(text)."""
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest(), "big") / 2 ** 256


def mixture_weights(family: str, natural_bytes: dict[str, int], spread: float) -> dict[str, float]:
    """The family's weight of each source (see the module doc); they sum to 1."""
    total = sum(natural_bytes.values())
    if total <= 0:
        raise LabError("the train split has no readable text to mix")
    raw = {s: (b / total) * spread ** (2.0 * _unit(f"lab-v3-mixture:{family}:{s}") - 1.0)
           for s, b in sorted(natural_bytes.items())}
    norm = sum(raw.values())
    return {s: w / norm for s, w in raw.items()}


def _data_rng(family: str, seed: int) -> random.Random:
    digest = hashlib.sha256(f"lab-v3-data:{family}:{seed}".encode("utf-8")).digest()
    return random.Random(int.from_bytes(digest, "big"))


@dataclass(frozen=True)
class DataAssignment:
    """What one (family, seed) lineage reads: its mixture, the chunks in order, and their pin."""

    family: str
    seed: int
    spread: float
    weights: dict[str, float]
    order: tuple[int, ...]              # indices into SourcedChunks.chunks, in reading order
    bytes_by_source: dict[str, int]     # text bytes read per source (additions not counted)
    stream_bytes: int                   # bytes of the training documents, additions included
    order_sha256: str

    @property
    def sample(self) -> str:
        """The assignment's id, as race rows carry it."""
        return f"{self.family}-s{self.seed}-{self.order_sha256[:12]}"

    def as_record(self) -> dict[str, Any]:
        text = sum(self.bytes_by_source.values())
        return {"family": self.family, "seed": self.seed, "sample": self.sample, "spread": self.spread,
                "weights": dict(self.weights), "bytes_by_source": dict(self.bytes_by_source),
                "share_by_source": {s: b / text for s, b in self.bytes_by_source.items()} if text else {},
                "chunks": len(self.order), "stream_bytes": self.stream_bytes, "order_sha256": self.order_sha256,
                "rule": ASSIGNMENT_RULE}


def assigned_stream(text: SourcedChunks, family: str, seed: int, *, total_bytes: int, spread: float,
                    problems: Sequence, problems_per_doc: int) -> tuple[list[str], DataAssignment]:
    """The training documents of (family, seed), adding up to at least `total_bytes` UTF-8
    bytes, and the assignment that pins them. Refused when a source the mixture needs runs out."""
    available = text.bytes_by_source()
    weights = mixture_weights(family, available, spread)
    rng = _data_rng(family, seed)
    queues: dict[str, list[int]] = {}
    for source in weights:
        idx = [i for i, s in enumerate(text.sources) if s == source]
        for i in range(len(idx) - 1, 0, -1):          # Fisher-Yates, random() only (stable)
            j = _below(rng, i + 1)
            idx[i], idx[j] = idx[j], idx[i]
        queues[source] = idx
    problem_rng = random.Random(f"lab-v3-problems:{family}:{seed}")
    taken = {s: 0 for s in weights}
    used = {s: 0 for s in weights}
    order: list[int] = []
    docs: list[str] = []
    seen = 0
    digest = hashlib.sha256()
    while seen < total_bytes:
        source = min(weights, key=lambda s: (taken[s] / weights[s], s))
        if used[source] >= len(queues[source]):
            raise LabError(f"family {family!r} seed {seed}: a byte budget of {total_bytes} needs more of the "
                           f"source {source!r} ({available[source]} readable bytes, weight {weights[source]:.3f}) "
                           f"than the pool's train split holds: the lab reads no chunk twice",
                           hint="lower the budget or the mixture spread, or use a larger pool")
        index = queues[source][used[source]]
        used[source] += 1
        chunk = text.chunks[index]
        order.append(index)
        n = len(chunk.encode("utf-8"))
        taken[source] += n
        digest.update(hashlib.sha256(chunk.encode("utf-8")).digest())
        doc = splice_additions(problem_rng, problems, chunk, problems_per_doc)
        docs.append(doc)
        seen += len(doc.encode("utf-8"))
    return docs, DataAssignment(family, seed, float(spread), weights, tuple(order), dict(taken), seen,
                                digest.hexdigest())


def shared_chunk_share(lineage: DataAssignment, others: Sequence[DataAssignment]) -> float:
    """The share of `lineage`'s chunks that at least one of `others` reads too.

    Seeds of a family do not read one sample in different orders: each seed draws its own
    chunks from the family's mixture, so two seeds share only the chunks their draws happen to
    have in common, and so do two families (the pre-registration states both overlaps)."""
    if not lineage.order:
        return 0.0
    read_by_others: set[int] = set()
    for other in others:
        read_by_others.update(other.order)
    return sum(1 for i in set(lineage.order) if i in read_by_others) / len(set(lineage.order))


__all__ = ["ASSIGNMENT_RULE", "DataAssignment", "SourcedChunks", "assigned_stream", "mixture_weights",
           "shared_chunk_share", "sourced_chunks"]
