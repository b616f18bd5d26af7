"""The lab's natural-text pool: pinned Debian packages -> plain text -> documents, minus
anything in the calibration corpora, split by a hash of each document into three pinned
corpora (`train`, `heldout`, `tasks`) with one manifest (schema `lstar-pool/1`).

The same .debs give byte-identical folders: nothing depends on time, on the machine, on
the cache path or on the order of the command line; every decision (which file is read, how
markup is stripped, which document goes where) is a function of the package bytes.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from monitor.errors import CorpusError
from monitor.scoring.corpus import DOCUMENTS_FILE, MANIFEST_FILE, SOURCES_FILE, Corpus, load_corpus
from monitor.scoring.corpus_build import (Piece, build_manifest, documents_jsonl, manifest_json,
                                          number_documents)
from monitor.scoring.debs import Deb, check_package_name, check_pin, fetch_deb, read_deb
from monitor.scoring.pool_text import Unit, dictd_units, is_prose, rest_units

SCHEMA = "lstar-pool/1"
SPLITS = ("train", "heldout", "tasks")
SPLIT_RULE = ("bucket = int(sha256('lstar-pool/1 split\\n' + text).hexdigest()[:16], 16) % 1000; "
              "train if bucket < 900, heldout if bucket < 950, else tasks")
SHINGLE_WORDS = 12
SHINGLE_DEFINITION = (f"a document (or unit) overlaps a calibration corpus when any run of "
                      f"{SHINGLE_WORDS} consecutive words (\\w+ after lower-casing) occurs in one "
                      "of its documents")
MAX_DOC_BYTES = 4000
SIZE_POLICY = (f"consecutive units of one source file (dictionary entries, documentation "
               f"sections) packed into documents of at most {MAX_DOC_BYTES} B, units joined by a "
               f"blank line; a longer unit is cut at blank lines")
SAMPLE_BYTES = {"train": 260_000, "heldout": 40_000, "tasks": 40_000}
SAMPLE_RULE = ("per split, documents in order of sha256('lstar-pool/1 sample\\n' + text) while the "
               "split stays within its byte budget, then put back in corpus order")
SLICE_OF_READER = {"dictd": "dictionary", "rest": "documentation"}
_DICTD = re.compile(r"^usr/share/dictd/([^/]+)\.dict(\.dz)?$")
_REST = re.compile(r"^usr/share/doc/[^/]+/html/_sources/.+\.rst\.txt$")


def reader_of(path: str) -> str | None:
    """Which reader takes a file of a package ("dictd", "rest"), or None."""
    if _DICTD.match(path) or (path.startswith("usr/share/dictd/") and path.endswith(".index")):
        return "dictd"
    if _REST.match(path):
        return "rest"
    return None


@dataclass
class Counts:
    """What the build dropped, for the manifest."""

    units: int = 0
    units_not_prose: int = 0
    units_duplicate: int = 0
    units_calib_exact: int = 0
    units_calib_shingle: int = 0
    documents: int = 0
    documents_calib_shingle: int = 0
    documents_duplicate: int = 0
    by_exclusion: dict[str, int] = field(default_factory=dict)


# -- calibration overlap -----------------------------------------------------------------------
def _words(text: str) -> list[str]:
    return re.findall(r"\w+", text.lower())


def shingles(text: str, n: int = SHINGLE_WORDS) -> set[str]:
    """The runs of `n` consecutive words of a text (a shorter text gives none)."""
    words = _words(text)
    return {" ".join(words[i:i + n]) for i in range(len(words) - n + 1)}


class CalibFilter:
    """Exact and long-shingle overlap with the documents of some corpora."""

    def __init__(self, corpora: Sequence[Corpus]) -> None:
        self.corpora = corpora
        self.exact = {" ".join(d.text.split()) for c in corpora for d in c.documents}
        self.grams: dict[str, str] = {}
        for corpus in corpora:
            for doc in corpus.documents:
                for gram in shingles(doc.text):
                    self.grams.setdefault(gram, f"{corpus.name} {corpus.version}")

    def is_exact(self, text: str) -> bool:
        """The text is, up to whitespace, a document of one of the corpora."""
        return " ".join(text.split()) in self.exact

    def overlap(self, text: str) -> str | None:
        """'name version' of a corpus sharing a shingle with `text`, or None."""
        words = _words(text)
        for i in range(len(words) - SHINGLE_WORDS + 1):
            hit = self.grams.get(" ".join(words[i:i + SHINGLE_WORDS]))
            if hit is not None:
                return hit
        return None


# -- units to documents ------------------------------------------------------------------------
def _cut(text: str, max_bytes: int) -> list[str]:
    """A unit longer than `max_bytes` cut at blank lines (a longer paragraph stays whole)."""
    if len(text.encode("utf-8")) <= max_bytes:
        return [text]
    out, cur = [], ""
    for para in text.split("\n\n"):
        joined = f"{cur}\n\n{para}" if cur else para
        if cur and len(joined.encode("utf-8")) > max_bytes:
            out.append(cur)
            cur = para
        else:
            cur = joined
    if cur:
        out.append(cur)
    return out


def pack_units(units: Iterable[tuple[Unit, str]], max_bytes: int = MAX_DOC_BYTES) -> list[Piece]:
    """Documents from consecutive units of one group, each within `max_bytes` where the units
    allow. `units` gives (unit, source name) in source order."""
    pieces: list[Piece] = []
    cur: list[str] = []
    cur_first: Unit | None = None
    cur_source = ""

    def flush() -> None:
        if cur and cur_first is not None:
            pieces.append(Piece(cur_first.slice, cur_source, "\n\n".join(cur), cur_first.origin))

    for unit, source in units:
        for part in _cut(unit.text, max_bytes):
            same = cur_first is not None and cur_first.group == unit.group
            size = len("\n\n".join([*cur, part]).encode("utf-8"))
            if cur and same and size <= max_bytes:
                cur.append(part)
                continue
            flush()
            cur, cur_first, cur_source = [part], unit, source
    flush()
    return pieces


def split_of(text: str) -> str:
    """train / heldout / tasks by a hash of the document text (see SPLIT_RULE)."""
    bucket = int(hashlib.sha256(("lstar-pool/1 split\n" + text).encode("utf-8")).hexdigest()[:16], 16) % 1000
    return "train" if bucket < 900 else "heldout" if bucket < 950 else "tasks"


def _sample(pieces: list[Piece], budget: int) -> list[Piece]:
    order = sorted(range(len(pieces)), key=lambda i: hashlib.sha256(
        ("lstar-pool/1 sample\n" + pieces[i].text).encode("utf-8")).hexdigest())
    keep, total = set(), 0
    for i in order:
        size = len(pieces[i].text.encode("utf-8"))
        if total + size <= budget:
            keep.add(i)
            total += size
    return [p for i, p in enumerate(pieces) if i in keep]


def source_name(package: str) -> str:
    """A package name as a corpus source id (letters, digits, '_')."""
    return re.sub(r"[^A-Za-z0-9]", "_", package)


# -- pins ---------------------------------------------------------------------------------------
def load_pins(path: Path) -> tuple[dict[str, tuple[str, str]], dict[str, Any]]:
    """package -> (version, deb sha256) from a pool manifest, and the manifest itself."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CorpusError(f"pins file {path} is not a readable JSON pool manifest ({exc})") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or not isinstance(data.get("packages"), list):
        raise CorpusError(f"pins file {path} is not a {SCHEMA} manifest",
                          hint="pass the manifest.json of a pool built by `lstar corpus build-pool`")
    pins = {}
    for i, entry in enumerate(data["packages"]):
        if not isinstance(entry, dict) or not all(isinstance(entry.get(k), str)
                                                  for k in ("package", "version", "deb_sha256")):
            raise CorpusError(f"pins file {path}: packages[{i}] needs string package, version, deb_sha256")
        pins[check_package_name(entry["package"])] = (entry["version"], entry["deb_sha256"])
    return pins, data


# -- the build ----------------------------------------------------------------------------------
def _units_of_package(deb: Deb, files: Mapping[str, bytes]) -> tuple[list[Unit], list[dict]]:
    units: list[Unit] = []
    used: list[dict] = []
    for path in sorted(files):
        reader = reader_of(path)
        match = _DICTD.match(path)
        if reader == "dictd" and match:
            index_path = f"usr/share/dictd/{match.group(1)}.index"
            if index_path not in files:
                raise CorpusError(f"{deb.path.name}: {path} has no {index_path}")
            units.extend(dictd_units(path, files[path], files[index_path], SLICE_OF_READER["dictd"]))
            used += [_source_entry(deb, p, files[p], "dictd") for p in (path, index_path)]
        elif reader == "rest":
            units.extend(rest_units(path, files[path], SLICE_OF_READER["rest"]))
            used.append(_source_entry(deb, path, files[path], "rest"))
    if not used:
        raise CorpusError(f"package {deb.package} has no file the pool can read",
                          hint="the pool reads dictd dictionaries (usr/share/dictd/*.dict[.dz]) and "
                               "Sphinx reST sources (usr/share/doc/*/html/_sources/**/*.rst.txt)")
    return units, used


def _source_entry(deb: Deb, path: str, data: bytes, reader: str) -> dict:
    return {"package": deb.package, "version": deb.version, "deb_sha256": deb.sha256, "path": path,
            "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data), "reader": reader}


def _filter_units(units: Iterable[tuple[Unit, str]], calib: CalibFilter, counts: Counts) -> list[tuple[Unit, str]]:
    kept, seen = [], set()
    for unit, source in units:
        counts.units += 1
        if unit.slice == SLICE_OF_READER["rest"] and not is_prose(unit.text):
            counts.units_not_prose += 1
            continue
        key = hashlib.sha256(unit.text.encode("utf-8")).digest()
        if key in seen:
            counts.units_duplicate += 1
            continue
        seen.add(key)
        if calib.is_exact(unit.text):
            counts.units_calib_exact += 1
            continue
        hit = calib.overlap(unit.text)
        if hit is not None:
            counts.units_calib_shingle += 1
            counts.by_exclusion[hit] = counts.by_exclusion.get(hit, 0) + 1
            continue
        kept.append((unit, source))
    return kept


def _filter_documents(pieces: list[Piece], calib: CalibFilter, counts: Counts) -> list[Piece]:
    kept, seen = [], set()
    for piece in pieces:
        key = hashlib.sha256(piece.text.encode("utf-8")).digest()
        if key in seen:
            counts.documents_duplicate += 1
            continue
        seen.add(key)
        hit = calib.overlap(piece.text) if not calib.is_exact(piece.text) else "exact"
        if hit is not None:  # a run of words across two units
            counts.documents_calib_shingle += 1
            continue
        kept.append(piece)
    counts.documents = len(kept)
    return kept


@dataclass(frozen=True)
class PoolBuild:
    """What `build_pool` wrote."""

    path: Path
    manifest: dict[str, Any]


def check_empty_output(out: Path, what: str) -> None:
    """`out` must not exist or be an empty folder: a built corpus is immutable."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise CorpusError(f"{out} already exists and is not an empty folder",
                          hint=f"{what} is immutable: choose a new output folder")


def load_exclusions(exclude: Sequence[str | Path]) -> tuple[list[Corpus], CalibFilter]:
    """The corpora a build must not overlap (in a fixed order), and their filter."""
    if not exclude:
        raise CorpusError("no corpus to exclude given", hint="pass the calibration corpora with --exclude")
    excluded = sorted((load_corpus(Path(p)) for p in exclude), key=lambda c: (c.name, c.version, c.sha256))
    return excluded, CalibFilter(excluded)


def exclusion_manifest(excluded: Sequence[Corpus], counts: Counts) -> dict[str, Any]:
    """The manifest's account of what the exclusion dropped, up to the units' shingle matches
    (each build adds its own document counts after it)."""
    return {"corpora": [{"name": c.name, "version": c.version, "sha256": c.sha256,
                         "documents": len(c.documents)} for c in excluded],
            "rule": SHINGLE_DEFINITION + "; a unit equal to one of their documents "
                    "(up to whitespace) is dropped too",
            "units_read": counts.units, "units_not_prose": counts.units_not_prose,
            "units_duplicate": counts.units_duplicate,
            "units_calib_exact": counts.units_calib_exact,
            "units_calib_shingle": counts.units_calib_shingle}


def checked_package_names(packages: Sequence[str] | None, pinned: Mapping[str, Any], pins: str | Path | None,
                          *, building: str) -> list[str]:
    """The packages to build the pool or a register (`building`) from: those given, else the
    pinned ones, sorted; each a valid Debian name and, with `pins`, pinned there."""
    names = sorted(set(packages or pinned))
    if not names:
        raise CorpusError(f"no package to build the {building} from", hint="pass --packages or --pins")
    for package in names:
        check_package_name(package)
        if pins is not None and package not in pinned:
            raise CorpusError(f"package {package} is not pinned in {pins}",
                              hint=f"pinned packages: {', '.join(sorted(pinned))}")
    return names


def build_pool(out_dir: str | Path, packages: Sequence[str] | None, *, cache: str | Path,
               exclude: Sequence[str | Path], pins: str | Path | None = None,
               sample: bool = False, name: str | None = None, version: str | None = None) -> PoolBuild:
    """Build a pool folder at `out_dir` (which must not exist or be empty) from `packages`.

    `cache` holds the .debs (missing ones are fetched with `apt-get download`); `exclude`
    names corpus folders whose documents the pool must not contain; `pins` (a pool
    manifest) fixes each package's version and sha256 and, for a build of the same kind,
    the resulting corpora, so that a rebuild either reproduces the pool exactly or fails.
    `name` and `version` default to those of `pins` (a rebuild labelled otherwise would hash
    differently and escape the check), else lab-pool v1.
    """
    out, cache = Path(out_dir), Path(cache)
    check_empty_output(out, "a pool")
    pinned, pins_data = (load_pins(Path(pins)) if pins is not None else ({}, {}))
    names = checked_package_names(packages, pinned, pins, building="pool")
    name, version = _label(name, version, pins_data)
    excluded, calib = load_exclusions(exclude)

    debs, sources, units = _read_packages(names, cache, pinned, pins)

    counts = Counts()
    pieces = _filter_documents(pack_units(_filter_units(units, calib, counts)), calib, counts)
    by_split: dict[str, list[Piece]] = {s: [] for s in SPLITS}
    for piece in pieces:
        by_split[split_of(piece.text)].append(piece)
    if sample:
        by_split = {s: _sample(p, SAMPLE_BYTES[s]) for s, p in by_split.items()}
    full_name = f"{name}-sample" if sample else name
    texts, split_info = _split_corpora(by_split, full_name, version)
    manifest = {
        "schema": SCHEMA, "name": full_name, "version": version,
        "built_by": "lstar corpus build-pool",
        "rebuild": (f"lstar corpus build-pool OUT --pins manifest.json"
                    + (" --sample" if sample else "") + " --exclude CALIB... (see docs/lab.md)"),
        "packages": debs, "sources": sources,
        "readers": {"dictd": "dictd dictionary: one unit per index entry in file order; "
                             "00-database entries dropped; lines that only cite a source "
                             "([1913 Webster], [WordNet 1.5], ...), cross-reference braces and "
                             "syllabified headwords (\\Ben`e*fi\"ci*a*ry\\) dropped; "
                             "whitespace runs collapsed",
                    "rest": "Sphinx reST source: one unit per section; code, literal, doctest, "
                            "table, comment and bookkeeping blocks dropped; directive headers "
                            "dropped, bodies kept; inline markup reduced to its text; sections "
                            "that are not mostly words dropped"},
        "normalization": "UTF-8 (Latin-1 fallback per file), NFC, LF, control and invisible "
                         "format characters removed, tabs as spaces, trailing spaces stripped, "
                         "at most one blank line in a row",
        "document_size_policy": SIZE_POLICY,
        "excluded": {**exclusion_manifest(excluded, counts),
                     "units_calib_shingle_by_corpus": dict(sorted(counts.by_exclusion.items())),
                     "documents_duplicate": counts.documents_duplicate,
                     "documents_calib_shingle": counts.documents_calib_shingle,
                     "documents_kept": counts.documents},
        "split": {"rule": SPLIT_RULE, **({"sample": SAMPLE_RULE, "sample_bytes": SAMPLE_BYTES} if sample else {})},
        "splits": split_info,
    }
    if pins is not None and pins_data.get("name") == full_name and pins_data.get("version") == version:
        _check_rebuild(split_info, pins_data, pins)
    _write(out, texts, manifest_json(manifest))
    return PoolBuild(path=out, manifest=manifest)


def _label(name: str | None, version: str | None, pins_data: Mapping[str, Any]) -> tuple[str, str]:
    """The pool's name and version: as given, else the pins' (a sample's pins name NAME-sample)."""
    pinned_name = str(pins_data.get("name") or "lab-pool").removesuffix("-sample")
    return name or pinned_name, version or str(pins_data.get("version") or "v1")


def _read_packages(names: Sequence[str], cache: Path, pinned: Mapping[str, Any],
                   pins: str | Path | None) -> tuple[list[dict], list, list]:
    """Each package's .deb (fetched into `cache` when missing, checked against its pin), read into
    text units tagged with their source: the packages' manifest entries, the sources used, the units."""
    debs: list[dict] = []
    sources: list = []
    units: list = []
    for package in names:
        deb = fetch_deb(package, cache, pinned[package][0] if package in pinned else None)
        if pins is not None:
            check_pin(deb, pinned, Path(pins))
        files = read_deb(deb, lambda p: reader_of(p) is not None)
        package_units, used = _units_of_package(deb, files.files)
        units += [(u, source_name(package)) for u in package_units]
        sources += used
        debs.append({"package": deb.package, "version": deb.version, "deb_sha256": deb.sha256,
                     "deb_bytes": deb.path.stat().st_size, "links_skipped": len(files.skipped_links)})
    return debs, sources, units


def _split_corpora(by_split: Mapping[str, list[Piece]], full_name: str,
                   version: str) -> tuple[dict[str, dict[str, str]], dict[str, dict]]:
    """Each split as a corpus folder's files (documents, manifest, sources note) and its entry in
    the pool's manifest; an empty split is refused."""
    texts: dict[str, dict[str, str]] = {}
    split_info: dict[str, dict] = {}
    for split in SPLITS:
        if not by_split[split]:
            raise CorpusError(f"the {split} split of the pool is empty",
                              hint="the packages gave too little text; add packages")
        docs = number_documents(by_split[split])
        manifest = build_manifest(f"{full_name}-{split}", version, docs, SIZE_POLICY)
        texts[split] = {DOCUMENTS_FILE: documents_jsonl(docs), MANIFEST_FILE: manifest_json(manifest),
                        SOURCES_FILE: (f"# {full_name}-{split} {version}\n\nThe `{split}` split of the "
                                       f"pool {full_name} {version}; its sources, versions and the "
                                       "build rules are in `../manifest.json`.\n")}
        split_info[split] = {"name": manifest["name"], "version": version, "sha256": manifest["sha256"],
                             **manifest["total"], "slices": manifest["slices"]}
    return texts, split_info


def _check_rebuild(split_info: Mapping[str, dict], pins_data: Mapping[str, Any], pins: str | Path) -> None:
    """A rebuild of the pinned pool must give every split the sha256 the pins recorded."""
    want = {s: (pins_data.get("splits") or {}).get(s, {}).get("sha256") for s in SPLITS}
    got = {s: split_info[s]["sha256"] for s in SPLITS}
    if want != got:
        bad = [s for s in SPLITS if want[s] != got[s]]
        raise CorpusError(f"the rebuilt pool differs from {pins} in split(s) {', '.join(bad)} "
                          f"({bad[0]}: {str(got[bad[0]])[:16]}… vs pinned {str(want[bad[0]])[:16]}…)",
                          hint="the build code or the excluded corpora changed since the pins were written")


def _write(out: Path, texts: Mapping[str, Mapping[str, str]], manifest_text: str) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent))
    try:
        for split, files in texts.items():
            (tmp / split).mkdir()
            for fname, text in files.items():
                _write_file(tmp / split / fname, text)
        _write_file(tmp / MANIFEST_FILE, manifest_text)
        for folder in (tmp, *(tmp / s for s in texts)):
            os.chmod(folder, 0o755)
        if out.is_dir():
            out.rmdir()
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _write_file(path: Path, text: str) -> None:
    with path.open("w", encoding="utf-8", newline="\n") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
