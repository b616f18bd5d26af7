"""The lab's training byte stream and its arithmetic problems.

Every family trains on the same bytes, in the same order: natural text from the documents of
`calib-v0-alt` that the held-out cloze items do not come from (calib-v0, the scoring corpus,
is never trained on), interleaved with additions of two digits written in words, such as

    seven plus two is nine

(sums up to nine: 55 problems). The operands are in the context and the answer is computed
from both, so a model must combine two earlier words; no single operand, and no unigram or
bigram statistic, gives the answer. Small models learn this table abruptly within the lab's
budget, while key-value recall episodes (an induction task) and a 6-word copy task stayed at
chance on this CPU (docs/lab.md). Number words are one token each in the four
real tokenizers and several pieces in the toy unigram one; exact match is judged on the
decoded string, so it does not depend on how a tokenizer splits the answer.

The stream is a list of training documents (a few problems, a chunk of natural text, a few
more problems); each family tokenizes each document on its own, after its prefix token, as the
scoring spec does with the calibration corpus. Everything is drawn from `random.Random(seed)`,
whose output is stable across Python versions, so the same seed gives the same bytes.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from monitor.errors import LabError
from monitor.scoring import Corpus, load_corpus

NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
# Version 2 of the lab adds up to twenty: 231 problems, 21 possible answers.
NUMBER_WORDS_20 = NUMBER_WORDS + ("ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen",
                                  "seventeen", "eighteen", "nineteen", "twenty")


@dataclass(frozen=True)
class Problem:
    """One addition in words: `a plus b is a+b` (a + b at most nine in version 1, twenty in 2)."""

    a: int
    b: int

    @property
    def answer(self) -> str:
        return NUMBER_WORDS_20[self.a + self.b]

    @property
    def prompt(self) -> str:
        """The problem up to the answer (what a model reads before answering)."""
        return f"{NUMBER_WORDS_20[self.a]} plus {NUMBER_WORDS_20[self.b]} is"

    @property
    def text(self) -> str:
        """The whole problem as it appears in training text."""
        return f"{self.prompt} {self.answer}"


PROBLEMS = tuple(Problem(a, b) for a in range(10) for b in range(10) if a + b <= 9)
PROBLEMS_20 = tuple(Problem(a, b) for a in range(21) for b in range(21) if a + b <= 20)


def all_problems() -> list[Problem]:
    """The 55 problems, in order of (a, b)."""
    return list(PROBLEMS)


def problems_to_twenty() -> list[Problem]:
    """The 231 problems of version 2 (sums up to twenty), in order of (a, b)."""
    return list(PROBLEMS_20)


def make_problem(rng: random.Random) -> Problem:
    """A problem drawn uniformly from the 55."""
    return PROBLEMS[_below(rng, len(PROBLEMS))]


def _below(rng: random.Random, n: int) -> int:
    # random() alone is stable across Python versions (randrange/sample are not guaranteed)
    return min(int(rng.random() * n), n - 1)


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


def _chunk_pool(texts: Sequence[str], size: int) -> list[str]:
    """The training texts cut into chunks of about `size` characters, at line ends."""
    pool: list[str] = []
    for text in texts:
        buf: list[str] = []
        length = 0
        for line in text.split("\n"):
            buf.append(line)
            length += len(line) + 1
            if length >= size:
                pool.append("\n".join(buf).strip("\n"))
                buf, length = [], 0
        if buf and "".join(buf).strip():
            pool.append("\n".join(buf).strip("\n"))
    return [chunk for chunk in pool if chunk]


def _chunks(texts: Sequence[str], size: int, rng: random.Random):
    """Endless chunks of the texts, each pass over them in a new seeded random order.

    The corpus is ordered by slice (all code, then all encyclopedic text, ...); read in that
    order, a model drifts to whichever slice it saw last and its loss on the calibration
    corpus rises and falls with the slice, so L* would not follow training progress.
    """
    pool = _chunk_pool(texts, size)
    if not pool:
        raise LabError("the lab's training texts are empty")
    while True:
        order = list(range(len(pool)))
        for i in range(len(order) - 1, 0, -1):          # Fisher-Yates on rng.random() only
            j = _below(rng, i + 1)
            order[i], order[j] = order[j], order[i]
        for i in order:
            yield pool[i]


def build_stream(source: TextSource, *, total_bytes: int, seed: int, problems_per_doc: int = 8,
                 chunk_chars: int = 600) -> list[str]:
    """Training documents adding up to at least `total_bytes` UTF-8 bytes.

    Each document: half of its problems, a chunk of natural text, the other half. Natural
    text passes over the training documents' chunks again and again, each pass in a new
    seeded order; problems are drawn afresh throughout.
    """
    if total_bytes < 1:
        raise LabError(f"the byte budget must be positive, got {total_bytes}")
    rng = random.Random(seed)
    chunks = _chunks(source.texts, chunk_chars, random.Random(f"lab-text-order-{seed}"))
    docs: list[str] = []
    seen = 0
    half = problems_per_doc // 2
    while seen < total_bytes:
        head = [make_problem(rng).text for _ in range(half)]
        tail = [make_problem(rng).text for _ in range(problems_per_doc - half)]
        doc = "\n".join([*head, next(chunks), *tail])
        docs.append(doc)
        seen += len(doc.encode("utf-8"))
    return docs
