"""Lab v3's primary text (issue 37, correction A): the held-out documents are chosen so their
source mix is the train split's; lab v2's corpus-order prefix is unchanged."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from monitor.errors import LabError

SAMPLE_POOL = Path(__file__).resolve().parent.parent / "data" / "lab-pool-sample"
# The documentation share of the v3 held-out text must lie within this of the train split's
# (the selection is by whole documents, so it cannot be exact; on lab-pool v2 it is 0.001 off).
SHARE_TOLERANCE = 0.02


def _raw(split: str) -> list[dict]:
    """The split's documents read straight from its documents.jsonl (not through the loader)."""
    lines = (SAMPLE_POOL / split / "documents.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def _doc_share(docs: list[dict]) -> float:
    size = {"documentation": 0, "all": 0}
    for d in docs:
        n = len(d["text"].encode("utf-8"))
        size["all"] += n
        size["documentation"] += n if d["slice"] == "documentation" else 0
    return size["documentation"] / size["all"]


@pytest.fixture(scope="module")
def pool():
    from monitor.lab.pool import load_pool

    return load_pool(SAMPLE_POOL)


def test_v3_heldout_text_matches_the_train_splits_documentation_share(pool) -> None:
    from monitor.lab.config import RaceConfigV3
    from monitor.lab.heldout import stratified_heldout

    train_share = _doc_share(_raw("train"))
    sel = stratified_heldout(pool.train.documents, pool.heldout.documents, RaceConfigV3.heldout_bytes)
    by_id = {str(d["id"]): d for d in _raw("heldout")}
    chosen = [by_id[i] for i in sel.ids]
    assert [d["text"] for d in chosen] == list(sel.texts)
    assert abs(_doc_share(chosen) - train_share) <= SHARE_TOLERANCE
    # the corpus-order prefix v2 scores is far from the training mix on the same pool
    from monitor.lab.pool import heldout_texts

    v2 = heldout_texts(pool, RaceConfigV3.heldout_bytes)
    v2_docs = [d for d in _raw("heldout")][:len(v2)]
    assert abs(_doc_share(v2_docs) - train_share) > SHARE_TOLERANCE
    # the provenance records the rule and the bytes per source, as recounted here
    prov = sel.provenance()
    want = {}
    for d in chosen:
        want[d["slice"]] = want.get(d["slice"], 0) + len(d["text"].encode("utf-8"))
    assert prov["bytes_by_source"] == want
    assert prov["selection"].startswith("stratified by source")


def test_each_source_is_walked_in_sha256_order_first_fit() -> None:
    """A hand-worked pool: train 75 % dictionary / 25 % documentation; 100 bytes asked."""
    from monitor.lab.heldout import stratified_heldout

    def doc(i, source, n):
        text = f"{i}" * n
        return SimpleNamespace(id=str(i), slice=source, text=text, n_bytes=n,
                               sha256=hashlib.sha256(text.encode()).hexdigest())

    train = [doc(0, "dictionary", 300), doc(1, "documentation", 100)]
    held = [doc(2, "dictionary", 40), doc(3, "dictionary", 50), doc(4, "dictionary", 30),
            doc(5, "documentation", 30), doc(6, "documentation", 20)]
    sel = stratified_heldout(train, held, 100)
    # quotas 75 and 25; dictionary in sha256 order, first fit; documentation: only the 20 fits
    order = sorted(held[:3], key=lambda d: d.sha256)
    size, want = 0, []
    for d in order:
        if size + d.n_bytes <= 75:
            want.append(d.id)
            size += d.n_bytes
    assert sel.ids == (*want, "6")
    assert sel.bytes_by_source == {"dictionary": size, "documentation": 20}
    # a held-out split too small for its share shrinks the total instead of skewing the mix
    small = stratified_heldout(train, held[:3] + held[4:], 1000)
    assert small.total_target == 80                       # 20 bytes of documentation / 0.25


def test_a_source_missing_from_the_heldout_split_is_refused() -> None:
    from monitor.lab.heldout import stratified_heldout

    d = SimpleNamespace(id="a", slice="dictionary", text="x", n_bytes=1, sha256="0")
    e = SimpleNamespace(id="b", slice="documentation", text="y", n_bytes=1, sha256="1")
    with pytest.raises(LabError, match="documentation"):
        stratified_heldout([d, e], [d], 100)


def test_v2_heldout_selection_is_unchanged(pool) -> None:
    """v2 still scores the held-out split's documents in corpus order up to heldout_bytes."""
    from monitor.lab.pool import heldout_texts

    raw = _raw("heldout")
    want, size = [], 0
    for d in raw:
        if size >= 20_000:
            break
        want.append(d["text"])
        size += len(d["text"].encode("utf-8"))
    assert heldout_texts(pool, 20_000) == want
    assert all(d["slice"] == "dictionary" for d in raw[:len(want)])
