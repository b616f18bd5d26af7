"""Pinned corpora: load and verify a corpus folder, select parts of it (`corpus_build` builds new ones).

A corpus folder holds `documents.jsonl` (one `{"id", "slice", "source", "text"}` object per
line) and `manifest.json` (per document `id`, `slice`, `source`, `bytes`, `sha256`,
`origin`; per-slice and total counts; and `sha256`, the corpus pin). The pin is the sha256
of the UTF-8 text formed by joining, for each document in order, `id + "\\t" + sha256 + "\\n"`
(`sha256` of the document text in UTF-8). Loading recomputes every hash and refuses a corpus
that differs from its manifest in any byte, id, or position.
"""

from __future__ import annotations

import hashlib
import json
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from monitor.errors import CorpusError

DOCUMENTS_FILE = "documents.jsonl"
MANIFEST_FILE = "manifest.json"
SOURCES_FILE = "SOURCES.md"

CANONICALIZATION = (
    "UTF-8 decode (strict); strip U+FEFF BOM; CRLF and lone CR -> LF; Unicode NFC; leading blank "
    "lines removed and trailing whitespace stripped from each document; empty documents dropped. "
    "Document sha256 = sha256 of the document text encoded as UTF-8.")
SHA256_DEFINITION = ("sha256 of the UTF-8 text formed by joining, for each document in order, "
                     "id + '\\t' + sha256 + '\\n'")
ORDER = ("slices alphabetically; within a slice, sources alphabetically; within a source, source "
         "order (the 4-digit number is the document's position in the source's document sequence)")

_REBUILD_HINT = ("the corpus was changed after its manifest was written; restore the original "
                 "files, or make a new version with `lstar corpus build`")


def text_sha256(text: str) -> str:
    """sha256 (hex) of a document's text encoded as UTF-8."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def manifest_sha256(entries: Iterable[tuple[str, str]]) -> str:
    """The corpus pin over `(id, sha256)` pairs in order: sha256 of "".join(id\\tsha\\n)."""
    roll = "".join(f"{doc_id}\t{sha}\n" for doc_id, sha in entries)
    return hashlib.sha256(roll.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class Document:
    """One canonical document of a corpus."""

    id: str
    slice: str
    source: str
    text: str
    sha256: str

    @cached_property
    def n_bytes(self) -> int:
        """Length of the text in UTF-8 bytes."""
        return len(self.text.encode("utf-8"))


@dataclass(frozen=True)
class Corpus:
    """A verified corpus, or a selection of one (`selection` says which part)."""

    name: str
    version: str
    path: Path
    manifest_sha256: str          # pin of the whole corpus, as in manifest.json
    sha256: str                   # pin of these documents (equals manifest_sha256 for "all")
    selection: str                # "all", "first:12", "slices:code,math", "slices:code;first:5"
    documents: tuple[Document, ...] = field(repr=False)

    @property
    def n_bytes(self) -> int:
        """Total UTF-8 bytes of the documents."""
        return sum(d.n_bytes for d in self.documents)

    @property
    def slices(self) -> list[str]:
        """Slice names, in order of first appearance (alphabetical for corpora built here)."""
        return list(dict.fromkeys(d.slice for d in self.documents))

    def select(self, *, slices: Sequence[str] | None = None, every: int | None = None,
               first: int | None = None) -> "Corpus":
        """The documents of `slices` (corpus order kept), then every `every`-th of those
        (starting with the first: a sample that keeps every slice when the corpus is ordered by
        slice), then the first `first` of those.

        The selection's `sha256` is the manifest formula over the selected documents, so a
        selection is pinned exactly like a whole corpus.
        """
        if slices is None and every is None and first is None:
            return self
        docs = self.documents
        parts: list[str] = [] if self.selection == "all" else [self.selection]
        if slices is not None:
            if isinstance(slices, str):
                slices = slices.split(",")
            wanted = list(dict.fromkeys(s.strip() for s in slices if s.strip()))
            if not wanted:
                raise CorpusError("no slice named in the selection",
                                  hint=f"choose from: {', '.join(self.slices)}")
            unknown = [s for s in wanted if s not in set(self.slices)]
            if unknown:
                raise CorpusError(
                    f"unknown slice(s) {', '.join(unknown)} in corpus {self.name} {self.version}",
                    hint=f"available slices: {', '.join(self.slices)}")
            docs = tuple(d for d in docs if d.slice in set(wanted))
            parts.append("slices:" + ",".join(s for s in self.slices if s in set(wanted)))
        if every is not None:
            if isinstance(every, bool) or not isinstance(every, int) or not 1 <= every <= len(docs):
                raise CorpusError(f"cannot select every {every!r}-th document: the selection has "
                                  f"{len(docs)}", hint=f"use a number from 1 to {len(docs)}")
            docs = docs[::every]
            parts.append(f"every:{every}")
        if first is not None:
            if isinstance(first, bool) or not isinstance(first, int) or not 1 <= first <= len(docs):
                raise CorpusError(f"cannot select the first {first!r} documents: the selection has "
                                  f"{len(docs)}", hint=f"use a number from 1 to {len(docs)}")
            docs = docs[:first]
            parts.append(f"first:{first}")
        return replace(self, documents=docs, selection=";".join(parts),
                       sha256=manifest_sha256((d.id, d.sha256) for d in docs))

    def as_row(self) -> dict[str, Any]:
        """The row `Store.upsert_corpus` expects."""
        return {"sha256": self.sha256, "name": self.name, "version": self.version,
                "parent_sha256": self.manifest_sha256, "selection": self.selection,
                "n_documents": len(self.documents), "n_bytes": self.n_bytes}


# -- loading -------------------------------------------------------------------------------
def _read_manifest(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise CorpusError(f"{path} is not UTF-8 (byte {exc.start})", hint=_REBUILD_HINT) from exc
    try:
        manifest = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CorpusError(f"{path}:{exc.lineno}: invalid JSON ({exc.msg}, column {exc.colno})",
                          hint=_REBUILD_HINT) from exc
    if not isinstance(manifest, dict):
        raise CorpusError(f"{path}: expected a JSON object at the top level")
    for key, kind in (("name", str), ("version", str), ("sha256", str), ("documents", list)):
        if not isinstance(manifest.get(key), kind):
            raise CorpusError(f"{path}: key '{key}' is missing or not a {kind.__name__}")
    for i, entry in enumerate(manifest["documents"]):
        if not isinstance(entry, dict) or not all(isinstance(entry.get(k), str)
                                                  for k in ("id", "slice", "source", "sha256")):
            raise CorpusError(f"{path}: documents[{i}] needs string keys id, slice, source, sha256")
    return manifest


def _read_documents(path: Path) -> list[tuple[int, dict[str, str]]]:
    """(line number, record) for each line of documents.jsonl."""
    records: list[tuple[int, dict[str, str]]] = []
    try:
        handle = path.open(encoding="utf-8", newline="\n")
        with handle:
            for lineno, line in enumerate(handle, start=1):
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise CorpusError(f"{path}:{lineno}: invalid JSON ({exc.msg}, column {exc.colno})",
                                      hint=_REBUILD_HINT) from exc
                if not isinstance(record, dict) or not all(
                        isinstance(record.get(k), str) for k in ("id", "slice", "source", "text")):
                    raise CorpusError(f"{path}:{lineno}: expected an object with string fields "
                                      "id, slice, source, text", hint=_REBUILD_HINT)
                records.append((lineno, record))
    except UnicodeDecodeError as exc:
        raise CorpusError(f"{path} is not valid UTF-8 (byte offset {exc.start})",
                          hint=_REBUILD_HINT) from exc
    return records


def load_corpus(path: str | Path, *, verify: bool = True) -> Corpus:
    """Load the corpus folder `path` and, unless `verify=False`, check it against its manifest.

    Checks: every document's sha256, ids, slices, sources, order and count against
    manifest.json, the manifest's own sha256 (recomputed by its formula), and the per-slice
    and total counts. Any difference raises `CorpusError` naming the file, line and document.
    """
    folder = Path(path)
    if not folder.is_dir():
        raise CorpusError(f"corpus folder {folder} does not exist",
                          hint="pass a folder holding documents.jsonl and manifest.json")
    docs_path, manifest_path = folder / DOCUMENTS_FILE, folder / MANIFEST_FILE
    for required in (docs_path, manifest_path):
        if not required.is_file():
            raise CorpusError(f"{required} is missing", hint="a corpus folder holds "
                              "documents.jsonl and manifest.json")
    manifest = _read_manifest(manifest_path)
    records = _read_documents(docs_path)

    documents = [Document(id=r["id"], slice=r["slice"], source=r["source"], text=r["text"],
                          sha256=text_sha256(r["text"])) for _, r in records]
    if verify:
        _verify(documents, [ln for ln, _ in records], manifest, docs_path, manifest_path)
    computed = manifest_sha256((d.id, d.sha256) for d in documents)
    return Corpus(name=manifest["name"], version=manifest["version"], path=folder,
                  manifest_sha256=manifest["sha256"] if verify else computed, sha256=computed,
                  selection="all", documents=tuple(documents))


def _verify(documents: list[Document], linenos: list[int], manifest: Mapping[str, Any],
            docs_path: Path, manifest_path: Path) -> None:
    entries = manifest["documents"]
    seen: dict[str, int] = {}
    for doc, lineno in zip(documents, linenos):
        if doc.id in seen:
            raise CorpusError(f"{docs_path}:{lineno}: document id {doc.id!r} repeats line "
                              f"{seen[doc.id]}", hint=_REBUILD_HINT)
        seen[doc.id] = lineno
    for i, (doc, lineno, entry) in enumerate(zip(documents, linenos, entries)):
        if doc.id != entry["id"]:
            raise CorpusError(
                f"{docs_path}:{lineno}: document {doc.id!r} is at position {i}, where "
                f"{manifest_path.name} lists {entry['id']!r}", hint=_REBUILD_HINT)
        if doc.sha256 != entry["sha256"]:
            raise CorpusError(
                f"document {doc.id!r} ({docs_path}:{lineno}) does not match its sha256 in "
                f"{manifest_path.name} (text hashes to {doc.sha256[:16]}…, manifest says "
                f"{entry['sha256'][:16]}…)", hint=_REBUILD_HINT)
        if (doc.slice, doc.source) != (entry["slice"], entry["source"]):
            raise CorpusError(
                f"{docs_path}:{lineno}: document {doc.id!r} has slice/source "
                f"{doc.slice}/{doc.source}, {manifest_path.name} says "
                f"{entry['slice']}/{entry['source']}", hint=_REBUILD_HINT)
        if "bytes" in entry and entry["bytes"] != doc.n_bytes:
            raise CorpusError(f"{manifest_path}: document {doc.id!r} has {doc.n_bytes} bytes, "
                              f"the manifest says {entry['bytes']}", hint=_REBUILD_HINT)
    if len(documents) != len(entries):
        extra = (f"first missing from {docs_path.name}: {entries[len(documents)]['id']!r}"
                 if len(entries) > len(documents) else
                 f"first not in {manifest_path.name}: {documents[len(entries)].id!r}")
        raise CorpusError(f"{docs_path} has {len(documents)} documents, {manifest_path.name} lists "
                          f"{len(entries)} ({extra})", hint=_REBUILD_HINT)
    computed = manifest_sha256((e["id"], e["sha256"]) for e in entries)
    if computed != manifest["sha256"]:
        raise CorpusError(f"{manifest_path}: its sha256 {manifest['sha256'][:16]}… does not match "
                          f"its documents (the formula gives {computed[:16]}…)", hint=_REBUILD_HINT)
    _verify_counts(documents, manifest, manifest_path)


def _verify_counts(documents: list[Document], manifest: Mapping[str, Any], manifest_path: Path) -> None:
    counts = slice_counts(documents)
    if "slices" in manifest and manifest["slices"] != counts:
        raise CorpusError(f"{manifest_path}: 'slices' counts {manifest['slices']} differ from the "
                          f"documents ({counts})", hint=_REBUILD_HINT)
    total = {"documents": len(documents), "bytes": sum(d.n_bytes for d in documents)}
    if "total" in manifest and manifest["total"] != total:
        raise CorpusError(f"{manifest_path}: 'total' {manifest['total']} differs from the documents "
                          f"({total})", hint=_REBUILD_HINT)


def slice_counts(documents: Iterable[Document]) -> dict[str, dict[str, int]]:
    counts: dict[str, dict[str, int]] = {}
    for doc in documents:
        entry = counts.setdefault(doc.slice, {"documents": 0, "bytes": 0})
        entry["documents"] += 1
        entry["bytes"] += doc.n_bytes
    return counts


# -- canonicalization ------------------------------------------------------------------------
def normalize_text(text: str) -> str:
    """BOM strip, CRLF/CR -> LF and NFC: the steps that apply to a whole input file."""
    if text.startswith("\ufeff"):
        text = text[1:]
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return unicodedata.normalize("NFC", text)


def canonicalize(text: str) -> str:
    """A document's canonical form: `normalize_text`, leading blank lines dropped, trailing
    whitespace stripped. Indentation of the first non-blank line is kept. Idempotent."""
    lines = normalize_text(text).split("\n")
    while lines and not lines[0].strip():
        lines.pop(0)
    return "\n".join(lines).rstrip()


def decode_strict(data: bytes, where: str) -> str:
    """UTF-8 decode that names the file and byte offset on failure."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CorpusError(f"{where} is not valid UTF-8 (byte offset {exc.start})",
                          hint="convert it to UTF-8 or leave it out of the rules") from exc
