"""Lab v3's primary text: held-out documents chosen to match the train split's source mix.

Lab v2 scores the first `heldout_bytes` of the pool's held-out split in corpus order
(`monitor.lab.pool.heldout_texts`, unchanged). That split lists its dictionary documents first,
so on lab-pool v2 the first 200 kB are all dictionary while every v3 family trains on a
mixture with 6.7–45.3 % documentation: not the training distribution the pre-registration
promises. Version 3 therefore stratifies the selection by source (issue 37):

- the target share of each source is its share of the train split's document bytes;
- the total is `max_bytes`, or less when a source of the held-out split is too small to give
  its share of `max_bytes` (the largest total at which every source still can);
- each source's documents are walked in the order of their sha256 (ties by id) and a document
  is taken when it still fits in its source's quota (first fit, so one long document does not
  end the source's walk);
- the chosen documents are scored in sha256 order, sources in name order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from monitor.errors import LabError

HELDOUT_RULE_V3 = ("stratified by source at the train split's byte shares: quota per source = share x total, "
                   "total = min(heldout_bytes, min over sources of held-out bytes / share); each source's documents "
                   "in sha256 order (ties by id), a document taken when it fits in its source's remaining quota; "
                   "sources in name order")


@dataclass(frozen=True)
class HeldoutSelection:
    """The v3 held-out text and how it was chosen."""

    texts: tuple[str, ...]
    ids: tuple[str, ...]
    bytes_by_source: dict[str, int]
    target_share: dict[str, float]     # the train split's byte share of each source
    total_target: int

    @property
    def share_by_source(self) -> dict[str, float]:
        total = sum(self.bytes_by_source.values())
        return {s: (b / total if total else 0.0) for s, b in self.bytes_by_source.items()}

    def provenance(self) -> dict[str, Any]:
        return {"documents": len(self.texts), "bytes": sum(self.bytes_by_source.values()),
                "bytes_by_source": dict(self.bytes_by_source),
                "share_by_source": {s: round(v, 6) for s, v in self.share_by_source.items()},
                "train_share_by_source": {s: round(v, 6) for s, v in self.target_share.items()},
                "target_bytes": self.total_target, "selection": HELDOUT_RULE_V3}


def bytes_by_source(documents: Sequence[Any]) -> dict[str, int]:
    """UTF-8 bytes of `documents` per slice (the pool's sources), in name order."""
    out: dict[str, int] = {}
    for doc in documents:
        out[doc.slice] = out.get(doc.slice, 0) + doc.n_bytes
    return dict(sorted(out.items()))


def stratified_heldout(train_documents: Sequence[Any], heldout_documents: Sequence[Any],
                       max_bytes: int) -> HeldoutSelection:
    """Held-out documents whose source mix is the train split's (see the module doc)."""
    if max_bytes <= 0:
        raise LabError(f"heldout_bytes must be positive, got {max_bytes}", hint="set heldout_bytes in the lab config")
    train = bytes_by_source(train_documents)
    train_total = sum(train.values())
    if train_total <= 0:
        raise LabError("the pool's train split has no text: the held-out text has no source mix to match",
                       hint="use a pool whose train split holds documents")
    share = {s: b / train_total for s, b in train.items()}
    available = bytes_by_source(heldout_documents)
    missing = [s for s in share if available.get(s, 0) == 0]
    if missing:
        raise LabError(f"the pool's held-out split has no document of the source(s) {', '.join(missing)} that the "
                       "train split holds, so it cannot match the training mix",
                       hint="rebuild the pool so that every source has held-out documents")
    total = min([max_bytes] + [int(available[s] / share[s]) for s in share])
    quota = {s: share[s] * total for s in share}
    by_source: dict[str, list[Any]] = {s: [] for s in share}
    for doc in heldout_documents:
        if doc.slice in by_source:
            by_source[doc.slice].append(doc)
    texts: list[str] = []
    ids: list[str] = []
    taken: dict[str, int] = {}
    for source in sorted(by_source):
        size = 0
        for doc in sorted(by_source[source], key=lambda d: (d.sha256, str(d.id))):
            if size + doc.n_bytes <= quota[source]:
                texts.append(doc.text)
                ids.append(str(doc.id))
                size += doc.n_bytes
        taken[source] = size
    if not texts:
        raise LabError(f"no held-out document fits a quota of {total} bytes",
                       hint="raise heldout_bytes (the held-out documents are longer than the quota)")
    return HeldoutSelection(tuple(texts), tuple(ids), taken, share, total)


__all__ = ["HELDOUT_RULE_V3", "HeldoutSelection", "bytes_by_source", "stratified_heldout"]
