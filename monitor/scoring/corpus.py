"""Pinned corpora: load and verify a corpus folder, select parts of it, build new versions.

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
import os
import re
import shutil
import tempfile
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from monitor.errors import CorpusError, PolicyError
from monitor.jsonl import json_lines
from monitor.policy import load_yaml_file

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

    def select(self, *, slices: Sequence[str] | None = None, first: int | None = None) -> "Corpus":
        """The documents of `slices` (corpus order kept), then the first `first` of those.

        The selection's `sha256` is the manifest formula over the selected documents, so a
        selection is pinned exactly like a whole corpus.
        """
        if slices is None and first is None:
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
    counts = _slice_counts(documents)
    if "slices" in manifest and manifest["slices"] != counts:
        raise CorpusError(f"{manifest_path}: 'slices' counts {manifest['slices']} differ from the "
                          f"documents ({counts})", hint=_REBUILD_HINT)
    total = {"documents": len(documents), "bytes": sum(d.n_bytes for d in documents)}
    if "total" in manifest and manifest["total"] != total:
        raise CorpusError(f"{manifest_path}: 'total' {manifest['total']} differs from the documents "
                          f"({total})", hint=_REBUILD_HINT)


def _slice_counts(documents: Iterable[Document]) -> dict[str, dict[str, int]]:
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


# -- building -------------------------------------------------------------------------------
TEXT_SUFFIXES = (".txt", ".md", ".py")
JSONL_SUFFIX = ".jsonl"
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_]*$")
_RULES_KEYS = {"name", "version", "rules", "max_bytes", "unmatched"}
_RULE_KEYS = {"glob", "slice", "source", "max_bytes"}


def _check_keys(mapping: dict[Any, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(map(str, mapping)) - allowed)
    if unknown:
        raise CorpusError(f"{where}: unknown key(s) {', '.join(unknown)}",
                          hint=f"allowed: {', '.join(sorted(allowed))}")


@dataclass(frozen=True)
class SliceRule:
    """Files matching `glob` (relative POSIX path; `**` spans folders) go to `slice`."""

    glob: str
    slice: str
    source: str
    max_bytes: int | None
    pattern: re.Pattern[str] = field(repr=False, compare=False)


@dataclass(frozen=True)
class SliceRules:
    """A parsed slice rules file."""

    name: str
    version: str
    rules: tuple[SliceRule, ...]
    unmatched: str  # "error" | "skip"

    def rule_for(self, relpath: str) -> SliceRule | None:
        """The first rule whose glob matches `relpath`."""
        return next((r for r in self.rules if r.pattern.fullmatch(relpath)), None)


def glob_to_regex(glob: str) -> re.Pattern[str]:
    """Compile a path glob: `*` and `?` stay within a folder, `**/` spans zero or more folders."""
    out, i = [], 0
    while i < len(glob):
        if glob.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif glob.startswith("**", i):
            out.append(".*")
            i += 2
        elif glob[i] == "*":
            out.append("[^/]*")
            i += 1
        elif glob[i] == "?":
            out.append("[^/]")
            i += 1
        elif glob[i] == "[" and "]" in glob[i + 2:]:
            end = glob.index("]", i + 2)
            body = glob[i + 1:end]
            out.append("[" + ("^" + body[1:] if body.startswith("!") else body).replace("\\", "\\\\") + "]")
            i = end + 1
        else:
            out.append(re.escape(glob[i]))
            i += 1
    return re.compile("".join(out))


def _positive_int(value: Any, where: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise CorpusError(f"{where} must be a positive integer (got {value!r})")
    return value


def load_slice_rules(path: str | Path) -> SliceRules:
    """Parse and validate a slice rules file (YAML or JSON; unknown keys are errors)::

        name: my-corpus
        version: v1
        max_bytes: 6000          # optional: split text files at blank lines into docs of at most this
        unmatched: error         # or skip: what to do with .txt/.md/.py/.jsonl files no rule matches
        rules:
          - {glob: "code/**/*.py", slice: code, source: stdlib}   # source defaults to the slice
    """
    path = Path(path)
    if not path.is_file():
        raise CorpusError(f"slice rules file {path} does not exist")
    try:  # the policy files' defences: bounded size and nesting, no tags, no alias bombs
        data = load_yaml_file(path)
    except PolicyError as exc:
        raise CorpusError(f"not valid YAML/JSON: {exc.message}", hint=exc.hint) from None
    if not isinstance(data, dict):
        raise CorpusError(f"{path}: expected a mapping with keys name, version, rules")
    _check_keys(data, _RULES_KEYS, f"{path}")
    for key in ("name", "version"):
        if not isinstance(data.get(key), str) or not data[key].strip():
            raise CorpusError(f"{path}: '{key}' must be a non-empty string")
    default_max = _positive_int(data.get("max_bytes"), f"{path}: max_bytes")
    unmatched = data.get("unmatched", "error")
    if unmatched not in ("error", "skip"):
        raise CorpusError(f"{path}: unmatched must be 'error' or 'skip' (got {unmatched!r})")
    raw_rules = data.get("rules")
    if not isinstance(raw_rules, list) or not raw_rules:
        raise CorpusError(f"{path}: 'rules' must be a non-empty list")
    rules = []
    for i, raw in enumerate(raw_rules):
        where = f"{path}: rules[{i}]"
        if not isinstance(raw, dict):
            raise CorpusError(f"{where} must be a mapping with glob and slice")
        _check_keys(raw, _RULE_KEYS, where)
        if not isinstance(raw.get("glob"), str) or not raw["glob"]:
            raise CorpusError(f"{where}.glob must be a non-empty string")
        names = {"slice": raw.get("slice"), "source": raw.get("source", raw.get("slice"))}
        for key, value in names.items():
            if not isinstance(value, str) or not _NAME_RE.match(value):
                raise CorpusError(f"{where}.{key} must be letters, digits and '_' (got {value!r})",
                                  hint="ids are <slice>-<source>-<nnnn>, so no '-' in these names")
        max_bytes = _positive_int(raw.get("max_bytes"), f"{where}.max_bytes")
        rules.append(SliceRule(glob=raw["glob"], slice=names["slice"], source=names["source"],
                               max_bytes=max_bytes if max_bytes is not None else default_max,
                               pattern=glob_to_regex(raw["glob"])))
    return SliceRules(name=data["name"].strip(), version=data["version"].strip(),
                      rules=tuple(rules), unmatched=unmatched)


@dataclass(frozen=True)
class _Piece:
    """A document before numbering: where it came from and its canonical text."""

    slice: str
    source: str
    text: str
    origin: str
    given_id: str | None = None


def _split_text(text: str, max_bytes: int | None) -> list[tuple[int, int]]:
    """Line ranges [a, b] (0-based, inclusive) of the documents of one normalized file.

    Without `max_bytes` the file is one document. Otherwise paragraphs (runs of non-blank
    lines) are packed greedily while the document stays within `max_bytes`; a paragraph
    larger than that becomes a document on its own.
    """
    lines = text.split("\n")
    paragraphs: list[tuple[int, int]] = []
    start = None
    for i, line in enumerate(lines):
        if line.strip() and start is None:
            start = i
        elif not line.strip() and start is not None:
            paragraphs.append((start, i - 1))
            start = None
    if start is not None:
        paragraphs.append((start, len(lines) - 1))
    if not paragraphs:
        return []
    if max_bytes is None:
        return [(paragraphs[0][0], paragraphs[-1][1])]
    def size(a: int, b: int) -> int:
        return len("\n".join(lines[a:b + 1]).rstrip().encode("utf-8"))

    ranges: list[tuple[int, int]] = []
    cur_a, cur_b = paragraphs[0]
    for a, b in paragraphs[1:]:
        if size(cur_a, b) <= max_bytes:
            cur_b = b
        else:
            ranges.append((cur_a, cur_b))
            cur_a, cur_b = a, b
    ranges.append((cur_a, cur_b))
    return ranges


def _pieces_of_file(path: Path, relpath: str, rule: SliceRule) -> list[_Piece]:
    text = normalize_text(decode_strict(path.read_bytes(), str(path)))
    if path.suffix == JSONL_SUFFIX:
        return _pieces_of_jsonl(text, relpath, rule, path)
    lines = text.split("\n")
    pieces = []
    for a, b in _split_text(text, rule.max_bytes):
        doc = canonicalize("\n".join(lines[a:b + 1]))
        if doc:
            pieces.append(_Piece(rule.slice, rule.source, doc, f"{relpath}:L{a + 1}-L{b + 1}"))
    return pieces


def _pieces_of_jsonl(text: str, relpath: str, rule: SliceRule, path: Path) -> list[_Piece]:
    pieces = []
    for lineno, record in json_lines(text.split("\n"), path, CorpusError):
        if not isinstance(record, dict) or not isinstance(record.get("text"), str):
            raise CorpusError(f"{path}:{lineno}: expected an object with a string 'text'")
        source = record.get("source", rule.source)
        if not isinstance(source, str) or not _NAME_RE.match(source):
            raise CorpusError(f"{path}:{lineno}: 'source' must be letters, digits and '_' "
                              f"(got {source!r})")
        given_id = record.get("id")
        if given_id is not None and (not isinstance(given_id, str) or not given_id.strip()
                                     or any(c in given_id for c in "\t\n")):
            raise CorpusError(f"{path}:{lineno}: 'id' must be a non-empty string without tabs "
                              f"or newlines (got {given_id!r})")
        doc = canonicalize(record["text"])
        if doc:
            pieces.append(_Piece(rule.slice, source, doc, f"{relpath}:{lineno}", given_id))
    return pieces


def _input_files(src: Path) -> list[tuple[str, Path]]:
    """(relative POSIX path, path) of the regular files under `src`, sorted, hidden ones skipped."""
    found = []
    for dirpath, dirnames, filenames in os.walk(src):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            if name.startswith("."):
                continue
            path = Path(dirpath) / name
            if path.is_file():
                found.append((path.relative_to(src).as_posix(), path))
    return sorted(found)


def _collect_pieces(src: Path, rules: SliceRules, rules_path: Path) -> tuple[list[_Piece], list[str]]:
    pieces: list[_Piece] = []
    used: list[str] = []
    unmatched: list[str] = []
    for relpath, path in _input_files(src):
        if path.suffix not in TEXT_SUFFIXES and path.suffix != JSONL_SUFFIX:
            continue
        rule = rules.rule_for(relpath)
        if rule is None:
            unmatched.append(relpath)
            continue
        pieces.extend(_pieces_of_file(path, relpath, rule))
        used.append(relpath)
    if unmatched and rules.unmatched == "error":
        shown = ", ".join(unmatched[:5]) + (f" and {len(unmatched) - 5} more" if len(unmatched) > 5 else "")
        raise CorpusError(f"no rule in {rules_path} matches {shown} (under {src})",
                          hint="add a rule for them, or set `unmatched: skip`")
    return pieces, used


def _number_documents(pieces: list[_Piece]) -> list[tuple[Document, str]]:
    """Give ids (<slice>-<source>-<nnnn>, position in the source) and put them in corpus order."""
    position: dict[tuple[str, str], int] = {}
    numbered = []
    for piece in pieces:
        key = (piece.slice, piece.source)
        n = position.get(key, 0)
        position[key] = n + 1
        doc_id = piece.given_id or f"{piece.slice}-{piece.source}-{n:04d}"
        doc = Document(id=doc_id, slice=piece.slice, source=piece.source, text=piece.text,
                       sha256=text_sha256(piece.text))
        numbered.append((key, n, doc, piece.origin))
    numbered.sort(key=lambda item: (item[0], item[1]))
    seen: dict[str, str] = {}
    for _, _, doc, origin in numbered:
        if doc.id in seen:
            raise CorpusError(f"document id {doc.id!r} is used twice ({seen[doc.id]} and {origin})",
                              hint="give JSONL records unique ids, or leave ids out")
        seen[doc.id] = origin
    return [(doc, origin) for _, _, doc, origin in numbered]


def _size_policy(rules: SliceRules) -> str:
    limits = sorted({r.max_bytes for r in rules.rules if r.max_bytes is not None})
    if not limits:
        return "one document per text file and per JSONL line"
    return ("text files split at blank lines into documents of at most "
            + "/".join(f"{n} B" for n in limits)
            + " (per rule) unless one paragraph is larger; one document per JSONL line")


def build_manifest(name: str, version: str, docs: Sequence[tuple[Document, str]],
                   size_policy: str) -> dict[str, Any]:
    """The manifest.json object for documents in corpus order, with their origins."""
    documents = [d for d, _ in docs]
    return {
        "name": name, "version": version, "canonicalization": CANONICALIZATION,
        "document_size_policy": size_policy, "order": ORDER,
        "documents": [{"id": d.id, "slice": d.slice, "source": d.source, "bytes": d.n_bytes,
                       "sha256": d.sha256, "origin": origin} for d, origin in docs],
        "slices": dict(sorted(_slice_counts(documents).items())),
        "total": {"documents": len(documents), "bytes": sum(d.n_bytes for d in documents)},
        "sha256_definition": SHA256_DEFINITION,
        "sha256": manifest_sha256((d.id, d.sha256) for d in documents),
    }


def _sources_markdown(manifest: Mapping[str, Any], rules: SliceRules, src: Path,
                      used: Sequence[str], rules_text: str) -> str:
    lines = [f"# {rules.name} {rules.version}", "",
             f"Built by `lstar corpus build` from {len(used)} file(s). Manifest sha256: "
             f"`{manifest['sha256']}`", "", "## Slice rules", "", "```", rules_text.rstrip(), "```",
             "", "## Input files", "", "| file | sha256 |", "|---|---|"]
    lines += [f"| `{rel}` | `{hashlib.sha256((src / rel).read_bytes()).hexdigest()}` |" for rel in used]
    return "\n".join(lines) + "\n"


def build_corpus(src_dir: str | Path, out_dir: str | Path, slice_rules_file: str | Path) -> Corpus:
    """Turn a folder of .txt/.md/.py/.jsonl files into a new corpus version at `out_dir`.

    Files are visited in sorted order of their relative path (hidden files and folders and
    files of other types are ignored); each goes to the slice of the first matching rule.
    Text files are one document each, or are split at blank lines when the rule has
    `max_bytes`; JSONL files give one document per line (`text`, optional `id` and `source`). Every document is canonicalized as the manifest states. The same inputs
    give byte-identical files. `out_dir` must not exist or be empty; the files are written to
    a temporary folder beside it and renamed into place, so a failed build leaves nothing.
    """
    src, out, rules_path = Path(src_dir), Path(out_dir), Path(slice_rules_file)
    if not src.is_dir():
        raise CorpusError(f"source folder {src} does not exist")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise CorpusError(f"{out} already exists and is not an empty folder",
                          hint="corpus versions are immutable: choose a new output folder")
    if out.resolve().is_relative_to(src.resolve()):
        raise CorpusError(f"output folder {out} is inside the source folder {src}",
                          hint="write the corpus outside the folder it is built from")
    rules = load_slice_rules(rules_path)
    pieces, used = _collect_pieces(src, rules, rules_path)
    if not pieces:
        raise CorpusError(f"no documents built from {src}",
                          hint="check the globs in the slice rules and that the files are not empty")
    docs = _number_documents(pieces)
    manifest = build_manifest(rules.name, rules.version, docs, _size_policy(rules))
    documents_text = "".join(json.dumps({"id": d.id, "slice": d.slice, "source": d.source,
                                         "text": d.text}, ensure_ascii=False) + "\n" for d, _ in docs)
    sources_text = _sources_markdown(manifest, rules, src, used,
                                     rules_path.read_text(encoding="utf-8"))

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent))
    try:
        for name, text in ((DOCUMENTS_FILE, documents_text),
                           (MANIFEST_FILE, json.dumps(manifest, indent=1, ensure_ascii=False) + "\n"),
                           (SOURCES_FILE, sources_text)):
            with (tmp / name).open("w", encoding="utf-8", newline="\n") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
        os.chmod(tmp, 0o755)
        if out.is_dir():
            out.rmdir()  # empty (checked above); rename needs the name free
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return load_corpus(out)
