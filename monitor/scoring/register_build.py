"""Calibration-corpus registers: small pinned corpora of one register each (code, technical
prose, dictionary prose) built from Debian packages by the pool's readers, for the registers
stress test (`monitor.stress.registers`).

A register corpus is an ordinary corpus folder (documents.jsonl, manifest.json, SOURCES.md)
plus `register.json` (schema `lstar-register/1`): the packages with their versions and deb
sha256s, the source files read, what the calibration-overlap filter dropped, the sampling rule
and the resulting corpus sha256. That file is the pin: `build_register(..., pins=register.json)`
refuses any other package version in one line and fails unless the rebuild gives the same
corpus. Preprocessing is the pool's (`monitor.scoring.pool_build`): the same readers, the same
text normalisation, the same document packing, the same shingle exclusion of calib-v0.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from monitor.errors import CorpusError, PolicyError
from monitor.files import FileKind, NotJsonError, read_bounded_json
from monitor.scoring.corpus import DOCUMENTS_FILE, MANIFEST_FILE, SOURCES_FILE
from monitor.scoring.corpus_build import Piece, build_manifest, documents_jsonl, manifest_json, number_documents
from monitor.scoring.debs import Deb, _cached, check_package_name, check_pin, fetch_deb, read_deb
from monitor.scoring.pool_build import (SIZE_POLICY, Counts, _filter_documents, _filter_units, _source_entry,
                                        _write_file, check_empty_output, checked_package_names,
                                        exclusion_manifest, load_exclusions,
                                        pack_units, source_name)
from monitor.scoring.pool_text import Unit, clean_text, decode_text, dictd_units, rest_units

SCHEMA = "lstar-register/1"
REGISTER_FILE = "register.json"
REGISTER_PINS_DIR = Path(__file__).resolve().parents[2] / "data" / "registers"
REGISTERS = ("code", "technical", "dictionary")
DEFAULT_DOCUMENTS = 300
SAMPLE_RULE = ("documents in order of sha256('lstar-register/1 sample\\n' + text), the first N kept, "
               "then put back in corpus order")
_DICTD = re.compile(r"^usr/share/dictd/([^/]+)\.dict(\.dz)?$")
_REST = re.compile(r"^usr/share/doc/[^/]+/html/_sources/.+\.rst\.txt$")
# The standard library's own modules; its test suites are mostly data and fixtures, not code
# as written for use, and idlelib/lib2to3 carry grammar and icon files under .py names.
_CODE = re.compile(r"^usr/lib/python3\.[0-9]+/[A-Za-z0-9_/]+\.py$")
_CODE_SKIP = ("/test/", "/tests/", "/idle_test/", "/lib2to3/", "/site-packages/", "/dist-packages/")
_TOP_LEVEL_START = ("def ", "class ", "async def ", "@")


def reader_of(path: str, register: str) -> str | None:
    """Which reader a register takes a package file with ("code", "rest", "dictd"), or None."""
    if register == "code":
        return "code" if _CODE.match(path) and not any(s in f"/{path}" for s in _CODE_SKIP) else None
    if register == "technical":
        return "rest" if _REST.match(path) else None
    if register == "dictionary":
        if _DICTD.match(path) or (path.startswith("usr/share/dictd/") and path.endswith(".index")):
            return "dictd"
        return None
    raise CorpusError(f"unknown register {register!r}", hint=f"registers: {', '.join(REGISTERS)}")


def code_units(path: str, data: bytes, slice_: str) -> list[Unit]:
    """A Python source file cut at its top-level statements: the module head (docstring,
    imports, constants) and each top-level def/class with the decorators and comments just
    above it. One pass over the lines, no regular expression: linear in the file."""
    lines = clean_text(decode_text(data, path)).split("\n")
    starts = [0]
    for i, line in enumerate(lines):
        # a definition starts at its first decorator; the comment lines just above go with it
        if i and line.startswith(_TOP_LEVEL_START) and not lines[i - 1].startswith("@"):
            j = i
            while j > 0 and lines[j - 1].startswith("#"):
                j -= 1
            if j > starts[-1]:
                starts.append(j)
    starts.append(len(lines))
    units = []
    for a, b in zip(starts, starts[1:]):
        text = clean_text("\n".join(lines[a:b]))
        if text:
            units.append(Unit(slice=slice_, group=path, origin=f"{path}:L{a + 1}", text=text))
    return units


def _units_of_package(deb: Deb, files: Mapping[str, bytes], register: str) -> tuple[list[Unit], list[dict]]:
    units: list[Unit] = []
    used: list[dict] = []
    for path in sorted(files):
        reader = reader_of(path, register)
        match = _DICTD.match(path)
        if reader == "dictd" and match:
            index_path = f"usr/share/dictd/{match.group(1)}.index"
            if index_path not in files:
                raise CorpusError(f"{deb.path.name}: {path} has no {index_path}")
            units.extend(dictd_units(path, files[path], files[index_path], "dictionary"))
            used += [_source_entry(deb, p, files[p], "dictd") for p in (path, index_path)]
        elif reader == "rest":
            units.extend(rest_units(path, files[path], "documentation"))
            used.append(_source_entry(deb, path, files[path], "rest"))
        elif reader == "code":
            units.extend(code_units(path, files[path], "code"))
            used.append(_source_entry(deb, path, files[path], "code"))
    if not used:
        raise CorpusError(f"package {deb.package} has no file the {register} register can read",
                          hint="code: usr/lib/python3.X/**/*.py; technical: Sphinx reST sources "
                               "(usr/share/doc/*/html/_sources/**/*.rst.txt); dictionary: dictd files")
    return units, used


# A register's name is the folder `build_registers` writes it to under OUT: one plain folder
# name, never a path (`../x`, `/tmp/x`, `a/b`) that would put the corpus outside OUT.
_REGISTER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
# The committed pins are under 200 kB (the technical register lists every reST source it read).
REGISTER_PINS_MAX_BYTES = 8 << 20
_PINS_FILE = FileKind("register pin file", "register pin files", "JSON")


def load_register_pins(path: Path) -> dict[str, Any]:
    """A register manifest (`register.json` or a committed copy), read bounded and checked for
    the shape every later step relies on (a name that is one folder name, string versions, a
    positive document count, a sha256)."""
    try:
        data, _ = read_bounded_json(Path(path), str(path), what=_PINS_FILE, limit=REGISTER_PINS_MAX_BYTES)
    except PolicyError as exc:
        raise CorpusError(f"register pins {exc.message}", hint=exc.hint) from None
    except NotJsonError as exc:
        raise CorpusError(f"register pins {path} is not a readable JSON file ({exc})") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or not isinstance(data.get("packages"), list) \
            or data.get("register") not in REGISTERS:
        raise CorpusError(f"register pins {path} is not a {SCHEMA} manifest",
                          hint="pass a file from data/registers/ or the register.json of a built register")
    name = data.get("name")
    if not isinstance(name, str) or not _REGISTER_NAME.fullmatch(name):
        raise CorpusError(f"register pins {path}: name {str(name)[:80]!r} is not a plain folder name",
                          hint="letters, digits, '.', '_' and '-', at most 100, e.g. register-code")
    if "version" in data and not (isinstance(data["version"], str) and _REGISTER_NAME.fullmatch(data["version"])):
        raise CorpusError(f"register pins {path}: version {str(data['version'])[:80]!r} is not a plain version name",
                          hint="e.g. v1")
    sample = data.get("sample", {})
    documents = sample.get("documents") if isinstance(sample, dict) else None
    if not isinstance(sample, dict) or (documents is not None and (
            not isinstance(documents, int) or isinstance(documents, bool) or documents < 1)):
        raise CorpusError(f"register pins {path}: sample.documents must be a positive whole number",
                          hint="e.g. \"sample\": {\"documents\": 300}")
    corpus = data.get("corpus", {})
    if not isinstance(corpus, dict) or ("sha256" in corpus and not (
            isinstance(corpus["sha256"], str) and _SHA256.fullmatch(corpus["sha256"]))):
        raise CorpusError(f"register pins {path}: corpus.sha256 must be 64 lowercase hex digits",
                          hint="restore the pin file from data/registers/")
    for i, entry in enumerate(data["packages"]):
        if not isinstance(entry, dict) or not all(isinstance(entry.get(k), str)
                                                  for k in ("package", "version", "deb_sha256")):
            raise CorpusError(f"register pins {path}: packages[{i}] needs string package, version, deb_sha256")
        check_package_name(entry["package"])
    return data


def _pinned_deb(package: str, cache: Path, version: str, pins_path: Path) -> Deb:
    """The .deb of `package` at its pinned version; another version already in the cache is
    refused in one line rather than silently downloaded around."""
    cache.mkdir(parents=True, exist_ok=True)
    found = _cached(cache, package, None)
    if found and not any(d.version == version for d in found):
        raise CorpusError(f"package {package}: pinned version {version}, found "
                          f"{', '.join(d.version for d in found)} in {cache} ({pins_path})",
                          hint="put the pinned .deb in the cache (e.g. from snapshot.debian.org), "
                               "or build new pins without --pins")
    return fetch_deb(package, cache, version)


def _sample(pieces: list[Piece], n: int) -> list[Piece]:
    order = sorted(range(len(pieces)), key=lambda i: hashlib.sha256(
        ("lstar-register/1 sample\n" + pieces[i].text).encode("utf-8")).hexdigest())
    keep = set(order[:n])
    return [p for i, p in enumerate(pieces) if i in keep]


@dataclass(frozen=True)
class RegisterBuild:
    path: Path
    manifest: dict[str, Any]


def _read_packages(names: list[str], register: str, *, cache: Path, pins: str | Path | None,
                   versions: dict[str, tuple[str, str]]) -> tuple[list[dict[str, Any]], list[Any], list[Any]]:
    """Each package's .deb (the pinned version checked, else the newest) read into the
    register's units: the packages' manifest rows, the source files used, and the units with
    the source they came from."""
    debs, sources, units = [], [], []
    for package in names:
        if pins is not None:
            deb = _pinned_deb(package, cache, versions[package][0], Path(pins))
            check_pin(deb, versions, Path(pins))
        else:
            deb = fetch_deb(package, cache)
        files = read_deb(deb, lambda p: reader_of(p, register) is not None)
        package_units, used = _units_of_package(deb, files.files, register)
        units += [(u, source_name(package)) for u in package_units]
        sources += used
        debs.append({"package": deb.package, "version": deb.version, "deb_sha256": deb.sha256,
                     "deb_bytes": deb.path.stat().st_size, "links_skipped": len(files.skipped_links)})
    return debs, sources, units


def _register_manifest(register: str, name: str, version: str, debs: list[dict[str, Any]], sources: list[Any],
                       excluded: Any, counts: Counts, n_docs: int,
                       corpus_manifest: dict[str, Any]) -> dict[str, Any]:
    """The register's manifest: its packages and sources, how they were read, normalised,
    excluded and sampled, and the corpus they made."""
    return {
        "schema": SCHEMA, "register": register, "name": name, "version": version,
        "built_by": "lstar corpus build-registers",
        "rebuild": "lstar corpus build-registers OUT (pins: data/registers/*.json; see docs/stress.md)",
        "packages": debs, "sources": sources,
        "normalization": "as lstar-pool/1: UTF-8 (Latin-1 fallback per file), NFC, LF, control and "
                         "invisible format characters removed, tabs as spaces, trailing spaces "
                         "stripped, at most one blank line in a row",
        "readers": {"code": "Python source: one unit per top-level statement group (module head; "
                            "each def/class with its decorators and the comments above it)",
                    "rest": "as lstar-pool/1 (Sphinx reST sections, markup stripped, prose only)",
                    "dictd": "as lstar-pool/1 (one unit per dictionary entry)"},
        "document_size_policy": SIZE_POLICY,
        "excluded": {**exclusion_manifest(excluded, counts),
                     "documents_duplicate": counts.documents_duplicate,
                     "documents_calib_shingle": counts.documents_calib_shingle,
                     "documents_before_sample": counts.documents},
        "sample": {"rule": SAMPLE_RULE, "documents": n_docs},
        "corpus": {"name": name, "version": version, "sha256": corpus_manifest["sha256"],
                   **corpus_manifest["total"]},
    }


def _write_register(out: Path, docs: Any, corpus_manifest: dict[str, Any], manifest: dict[str, Any]) -> None:
    """The corpus folder: documents, corpus manifest, a SOURCES note and the register manifest."""
    name, version, register = manifest["name"], manifest["version"], manifest["register"]
    out.mkdir(parents=True, exist_ok=True)
    _write_file(out / DOCUMENTS_FILE, documents_jsonl(docs))
    _write_file(out / MANIFEST_FILE, manifest_json(corpus_manifest))
    _write_file(out / SOURCES_FILE, f"# {name} {version}\n\nThe {register} register corpus; its packages, "
                                    f"versions and build rules are in `{REGISTER_FILE}`.\n")
    _write_file(out / REGISTER_FILE, manifest_json(manifest))


def build_register(out_dir: str | Path, packages: Sequence[str] | None, *, register: str | None = None,
                   cache: str | Path, exclude: Sequence[str | Path], pins: str | Path | None = None,
                   documents: int | None = None, name: str | None = None,
                   version: str | None = None) -> RegisterBuild:
    """Build one register corpus at `out_dir` (new or empty). With `pins` (a register
    manifest) every other argument defaults to the pinned one and the rebuild must give the
    pinned corpus sha256."""
    out, cache = Path(out_dir), Path(cache)
    check_empty_output(out, "a register corpus")
    pinned = load_register_pins(Path(pins)) if pins is not None else {}
    register = register or pinned.get("register")
    if register not in REGISTERS:
        raise CorpusError(f"unknown register {register!r}", hint=f"registers: {', '.join(REGISTERS)}")
    versions = {e["package"]: (e["version"], e["deb_sha256"]) for e in pinned.get("packages", [])}
    names = checked_package_names(packages, versions, pins, building="register")
    n_docs = documents or (pinned.get("sample") or {}).get("documents") or DEFAULT_DOCUMENTS
    name = name or pinned.get("name") or f"register-{register}"
    version = version or pinned.get("version") or "v1"
    excluded, calib = load_exclusions(exclude)

    debs, sources, units = _read_packages(names, register, cache=cache, pins=pins, versions=versions)
    counts = Counts()
    pieces = _filter_documents(pack_units(_filter_units(units, calib, counts)), calib, counts)
    pieces = _sample(pieces, n_docs)
    if not pieces:
        raise CorpusError(f"the {register} register is empty", hint="the packages gave too little text")
    docs = number_documents(pieces)
    corpus_manifest = build_manifest(name, version, docs, SIZE_POLICY)
    manifest = _register_manifest(register, name, version, debs, sources, excluded, counts, n_docs, corpus_manifest)
    want = (pinned.get("corpus") or {}).get("sha256") if pins is not None else None
    if want is not None and pinned.get("name") == name and pinned.get("version") == version \
            and want != manifest["corpus"]["sha256"]:
        raise CorpusError(f"the rebuilt {register} register differs from {pins}: corpus sha256 "
                          f"{manifest['corpus']['sha256'][:16]}… vs pinned {want[:16]}…",
                          hint="the build code or the excluded corpora changed since the pins were written")
    _write_register(out, docs, corpus_manifest, manifest)
    return RegisterBuild(path=out, manifest=manifest)


def build_registers(out_dir: str | Path, pins_files: Sequence[str | Path], *, cache: str | Path,
                    exclude: Sequence[str | Path]) -> list[RegisterBuild]:
    """Every register of `pins_files` rebuilt under `out_dir/<name>/`."""
    out = Path(out_dir)
    built = []
    for pins in sorted(Path(p) for p in pins_files):
        name = load_register_pins(pins)["name"]
        built.append(build_register(out / name, None, cache=cache, exclude=exclude, pins=pins))
    return built
