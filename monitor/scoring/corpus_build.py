"""Building a new corpus version: slice rules (YAML) map input files to slices and sources,
files are split into documents within the size policy, numbered in the canonical order, and
written with their manifest and SOURCES.md; the result is loaded back and verified."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from monitor.errors import CorpusError, PolicyError
from monitor.escape import markdown_code, markdown_text, terminal_text
from monitor.jsonl import json_lines
from monitor.files import FileKind
from monitor.patterns import LinearPattern, PatternError, compile_glob
from monitor.yamlio import clip, load_yaml_file
from monitor.scoring.corpus import (CANONICALIZATION, DOCUMENTS_FILE, MANIFEST_FILE, ORDER, SHA256_DEFINITION,
                                    SOURCES_FILE, Corpus, Document, canonicalize, decode_strict, load_corpus,
                                    manifest_sha256, normalize_text, slice_counts, text_sha256)

TEXT_SUFFIXES = (".txt", ".md", ".py")
JSONL_SUFFIX = ".jsonl"
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_]*$")
_RULES_KEYS = {"name", "version", "rules", "max_bytes", "unmatched"}
SLICE_RULES_FILE = FileKind("slice rules file", "slice rules files", "YAML or JSON")
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
    pattern: LinearPattern = field(repr=False, compare=False)


@dataclass(frozen=True)
class SliceRules:
    """A parsed slice rules file."""

    name: str
    version: str
    rules: tuple[SliceRule, ...]
    unmatched: str  # "error" | "skip"

    def rule_for(self, relpath: str) -> SliceRule | None:
        """The first rule whose glob matches `relpath`."""
        return next((r for r in self.rules if r.pattern.fullmatches(relpath)), None)


def glob_to_regex(glob: str) -> LinearPattern:
    """Compile a path glob: `*` and `?` stay within a folder, `**/` spans zero or more folders.

    Translated and compiled with RE2 by `monitor.patterns.compile_glob` (linear in the glob
    and in the name): both the glob and the file names are hostile, and on a backtracking
    engine `*a*a*a*a*b` against 200 characters took seconds (each `*` one more power of the
    name's length). Raises PatternError (e.g. a class `[z-a]`)."""
    return compile_glob(glob, paths=True)


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
        data = load_yaml_file(path, what=SLICE_RULES_FILE)
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
        try:
            pattern = glob_to_regex(raw["glob"])
        except PatternError as exc:
            raise CorpusError(f"{where}.glob: {clip(repr(raw['glob']), 80)} is not a glob: {exc.reason}",
                              hint="use *, **, ? and [...] classes such as [a-z] or [!_]") from None
        rules.append(SliceRule(glob=raw["glob"], slice=names["slice"], source=names["source"],
                               max_bytes=max_bytes if max_bytes is not None else default_max,
                               pattern=pattern))
    return SliceRules(name=data["name"].strip(), version=data["version"].strip(),
                      rules=tuple(rules), unmatched=unmatched)


@dataclass(frozen=True)
class Piece:
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


def _pieces_of_file(path: Path, relpath: str, rule: SliceRule) -> list[Piece]:
    text = normalize_text(decode_strict(path.read_bytes(), str(path)))
    if path.suffix == JSONL_SUFFIX:
        return _pieces_of_jsonl(text, relpath, rule, path)
    lines = text.split("\n")
    pieces = []
    for a, b in _split_text(text, rule.max_bytes):
        doc = canonicalize("\n".join(lines[a:b + 1]))
        if doc:
            pieces.append(Piece(rule.slice, rule.source, doc, f"{relpath}:L{a + 1}-L{b + 1}"))
    return pieces


def _pieces_of_jsonl(text: str, relpath: str, rule: SliceRule, path: Path) -> list[Piece]:
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
            pieces.append(Piece(rule.slice, source, doc, f"{relpath}:{lineno}", given_id))
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


def _collect_pieces(src: Path, rules: SliceRules, rules_path: Path) -> tuple[list[Piece], list[str]]:
    pieces: list[Piece] = []
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


def number_documents(pieces: list[Piece]) -> list[tuple[Document, str]]:
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
        "slices": dict(sorted(slice_counts(documents).items())),
        "total": {"documents": len(documents), "bytes": sum(d.n_bytes for d in documents)},
        "sha256_definition": SHA256_DEFINITION,
        "sha256": manifest_sha256((d.id, d.sha256) for d in documents),
    }


def documents_jsonl(docs: Sequence[tuple[Document, str]]) -> str:
    """The documents.jsonl text of documents in corpus order."""
    return "".join(json.dumps({"id": d.id, "slice": d.slice, "source": d.source, "text": d.text},
                              ensure_ascii=False) + "\n" for d, _ in docs)


def manifest_json(manifest: Mapping[str, Any]) -> str:
    """A manifest as written to disk (the bytes are part of a build's reproducibility)."""
    return json.dumps(manifest, indent=1, ensure_ascii=False) + "\n"


def _sources_markdown(manifest: Mapping[str, Any], rules: SliceRules, src: Path,
                      used: Sequence[str], rules_text: str) -> str:
    """SOURCES.md. The corpus name and version and the input files' names are anyone's: each
    is literal text (`markdown_text`; a file name a code span, its `|` escaped for the table).
    The rules file is quoted whole, its control characters but line breaks and tabs made
    visible, in a fence longer than any run of backticks in it."""
    rules_text = terminal_text(rules_text.rstrip())
    fence = "`" * max(3, 1 + max((len(run) for run in re.findall(r"`+", rules_text)), default=0))
    lines = [f"# {markdown_text(rules.name)} {markdown_text(rules.version)}", "",
             f"Built by `lstar corpus build` from {len(used)} file(s). Manifest sha256: "
             f"`{manifest['sha256']}`", "", "## Slice rules", "", fence, rules_text, fence,
             "", "## Input files", "", "| file | sha256 |", "|---|---|"]
    for rel in used:   # GFM splits a table row at every unescaped `|`, inside code spans too
        name = markdown_code(rel).replace("|", "\\|")
        lines.append(f"| {name} | `{hashlib.sha256((src / rel).read_bytes()).hexdigest()}` |")
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
    docs = number_documents(pieces)
    manifest = build_manifest(rules.name, rules.version, docs, _size_policy(rules))
    documents_text = documents_jsonl(docs)
    sources_text = _sources_markdown(manifest, rules, src, used,
                                     rules_path.read_text(encoding="utf-8"))

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent))
    try:
        for name, text in ((DOCUMENTS_FILE, documents_text),
                           (MANIFEST_FILE, manifest_json(manifest)),
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
