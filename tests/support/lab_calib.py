"""A smaller calibration corpus for the lab's end-to-end tests.

A reduced lab lineage spends about half of its CPU scoring the whole of calib-v0 (606 KB) at
each checkpoint (a lineage's timing.json: score_calib 34-37 of 73-82 CPU-seconds). Tests whose
assertions do not depend on which calib text is scored (a resumed run writing the same lab.json,
the record's structure, the family set) run on every k-th document of calib-v0 instead: a real,
verified corpus folder (documents.jsonl and a manifest whose pins are recomputed here), so the
lab loads it through the same `load_corpus` checks as calib-v0 itself.
"""

from __future__ import annotations

import json
from pathlib import Path

from monitor.scoring.corpus import load_corpus, manifest_sha256


def calib_subset(calib_v0: Path, dest: Path, *, every: int) -> Path:
    """Every `every`-th document of `calib_v0`, written as a corpus folder at `dest`."""
    corpus = load_corpus(calib_v0)
    docs = corpus.documents[::every]
    dest.mkdir(parents=True)
    with (dest / "documents.jsonl").open("w", encoding="utf-8") as fh:
        for d in docs:
            fh.write(json.dumps({"id": d.id, "slice": d.slice, "source": d.source, "text": d.text},
                                ensure_ascii=False) + "\n")
    manifest = {"name": f"{corpus.name}-every-{every}", "version": corpus.version,
                "documents": [{"id": d.id, "slice": d.slice, "source": d.source, "sha256": d.sha256} for d in docs],
                "sha256": manifest_sha256((d.id, d.sha256) for d in docs)}
    (dest / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    assert len(load_corpus(dest).documents) == len(docs)      # it passes the lab's own checks
    return dest


def shared_with_small_calib(shared_dir: Path, dest: Path, *, every: int) -> Path:
    """A `--shared` folder for `lstar lab`: the real tokenizers (a link) and, as
    corpus/calib-v0, every `every`-th document of the real calib-v0."""
    dest.mkdir(parents=True)
    (dest / "tokenizers").symlink_to((shared_dir / "tokenizers").resolve(), target_is_directory=True)
    calib_subset(shared_dir / "corpus" / "calib-v0", dest / "corpus" / "calib-v0", every=every)
    return dest
