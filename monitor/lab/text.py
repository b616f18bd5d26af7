"""The lab's training byte stream and its task episodes.

Every family trains on the same bytes, in the same order: natural text from the documents of
`calib-v0-alt` that the held-out cloze items do not come from (calib-v0, the scoring corpus,
is never trained on), interleaved with generated key-value recall episodes such as

    k=3 b=7 x=1. b? 7

An episode is an in-context task: the value of the queried key is only in the episode itself,
so a model can answer it only by looking back (the induction/retrieval circuit of Olsson et al.
2022). Episodes are short (one-character keys and values) because longer copy tasks did not
show a transition within a CPU budget (shared/docs/lab-notes.md).

The stream is a list of training documents (a few episodes, a chunk of natural text, a few
more episodes); each family tokenizes each document on its own, after its prefix token, as the
scoring spec does with the calibration corpus. Everything is drawn from `random.Random(seed)`,
whose output is stable across Python versions, so the same seed gives the same bytes.
"""

from __future__ import annotations

import random
import string
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from monitor.errors import LabError
from monitor.scoring import Corpus, load_corpus

KEYS = string.ascii_lowercase
VALUES = string.digits


@dataclass(frozen=True)
class Episode:
    """One key-value recall episode: the pairs, the queried key and its value."""

    pairs: tuple[tuple[str, str], ...]
    key: str
    value: str

    @property
    def prompt(self) -> str:
        """The episode up to the question (what a model reads before answering)."""
        return " ".join(f"{k}={v}" for k, v in self.pairs) + f". {self.key}?"

    @property
    def text(self) -> str:
        """The whole episode as it appears in training text."""
        return f"{self.prompt} {self.value}"


def make_episode(rng: random.Random, n_pairs: int) -> Episode:
    """A random episode with `n_pairs` distinct keys and distinct values."""
    if not 2 <= n_pairs <= len(VALUES):
        raise LabError(f"kv_pairs must be from 2 to {len(VALUES)}, got {n_pairs}")
    keys = _sample(rng, KEYS, n_pairs)
    values = _sample(rng, VALUES, n_pairs)
    pairs = tuple(zip(keys, values))
    key, value = pairs[_below(rng, n_pairs)]
    return Episode(pairs, key, value)


def _below(rng: random.Random, n: int) -> int:
    # random() alone is stable across Python versions (randrange/sample are not guaranteed)
    return min(int(rng.random() * n), n - 1)


def _sample(rng: random.Random, population: str, k: int) -> list[str]:
    pool = list(population)
    out = []
    for _ in range(k):
        out.append(pool.pop(_below(rng, len(pool))))
    return out


@dataclass(frozen=True)
class TextSource:
    """The natural text the lab trains on, and the documents it holds out."""

    corpus: Corpus
    train_ids: tuple[str, ...]
    heldout_ids: tuple[str, ...]
    texts: tuple[str, ...]          # the training documents' texts, in corpus order

    @property
    def n_bytes(self) -> int:
        return sum(len(t.encode("utf-8")) for t in self.texts)


def load_text_source(corpus_dir: str | Path, *, heldout_every: int = 3) -> TextSource:
    """The documents of `corpus_dir` (verified against its manifest), with every
    `heldout_every`-th document (by corpus order, starting with the first) held out of
    training so the cloze items built from it test text the model never saw."""
    if heldout_every < 2:
        raise LabError(f"heldout_every must be at least 2, got {heldout_every}")
    corpus = load_corpus(corpus_dir)
    train, held = [], []
    for i, doc in enumerate(corpus.documents):
        (held if i % heldout_every == 0 else train).append(doc)
    if not train:
        raise LabError(f"corpus {corpus_dir} leaves no training documents")
    return TextSource(corpus, tuple(d.id for d in train), tuple(d.id for d in held),
                      tuple(d.text for d in train))


def _chunks(texts: Sequence[str], size: int):
    """Endless chunks of about `size` characters, cut at line ends, cycling through `texts`."""
    while True:
        for text in texts:
            lines = text.split("\n")
            buf: list[str] = []
            length = 0
            for line in lines:
                buf.append(line)
                length += len(line) + 1
                if length >= size:
                    yield "\n".join(buf).strip("\n")
                    buf, length = [], 0
            if buf and "".join(buf).strip():
                yield "\n".join(buf).strip("\n")


def build_stream(source: TextSource, *, total_bytes: int, seed: int, kv_pairs: int,
                 episodes_per_doc: int = 8, chunk_chars: int = 600) -> list[str]:
    """Training documents adding up to at least `total_bytes` UTF-8 bytes.

    Each document: half of its episodes, a chunk of natural text, the other half. Natural
    text cycles through the training documents; episodes are fresh throughout.
    """
    if total_bytes < 1:
        raise LabError(f"the byte budget must be positive, got {total_bytes}")
    rng = random.Random(seed)
    chunks = _chunks(source.texts, chunk_chars)
    docs: list[str] = []
    seen = 0
    half = episodes_per_doc // 2
    while seen < total_bytes:
        head = [make_episode(rng, kv_pairs).text for _ in range(half)]
        tail = [make_episode(rng, kv_pairs).text for _ in range(episodes_per_doc - half)]
        doc = "\n".join([*head, next(chunks), *tail])
        docs.append(doc)
        seen += len(doc.encode("utf-8"))
    return docs
