"""The lab's text pool (monitor/scoring/debs.py, pool_text.py, pool_build.py, monitor/lab/pool.py,
`lstar corpus build-pool`), built from real .debs made here with `dpkg-deb --build`."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import random
import re
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from monitor.cli import main
from monitor.errors import CorpusError
from monitor.scoring.pool_load import SAMPLE_POOL, read_pool_manifest
from monitor.scoring.pool_load import load_pool_corpora as load_pool
from monitor.scoring.corpus import load_corpus
from monitor.scoring.debs import check_pin, inspect_deb
from monitor.scoring.pool_build import build_pool
from monitor.scoring.pool_text import rest_sections

REPO = Path(__file__).resolve().parents[1]
B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
WORDS = ("river stone light garden quiet morning letter window summer market bridge island "
         "teacher winter forest animal kitchen journey harbour silver meadow lantern orchard "
         "village candle thunder valley shadow feather mirror").split()
SECRET = "zzsecretmarker outside the package root must never be read"

needs_dpkg = pytest.mark.skipif(shutil.which("dpkg-deb") is None or shutil.which("ar") is None,
                                reason="needs Debian's dpkg-deb and binutils' ar")
pytestmark = needs_dpkg


def b64(n: int) -> str:
    """dictd's base64 numbers, written out here independently of the reader."""
    out = ""
    while True:
        out = B64[n % 64] + out
        n //= 64
        if n == 0:
            return out


def words12(text: str) -> set[str]:
    words = re.findall(r"\w+", text.lower())
    return {" ".join(words[i:i + 12]) for i in range(len(words) - 11)}


def entry(rng: random.Random, head: str) -> str:
    lines = [f"{head.capitalize()} \\{head.capitalize()}\\, n.",
             "   " + " ".join(rng.choice(WORDS) for _ in range(12)) + "."]
    for sense in range(1, 30):
        lines.append(f"   {sense}. " + " ".join(rng.choice(WORDS) for _ in range(11)) + ".")
        lines.append("      [1913 Webster]")
    return "\n".join(lines) + "\n\n"


def make_dictd(entries: list[tuple[str, str]]) -> tuple[bytes, bytes]:
    body, index = b"", []
    for head, text in entries:
        data = text.encode("utf-8")
        index.append(f"{head}\t{b64(len(body))}\t{b64(len(data))}")
        body += data
    return gzip.compress(body, mtime=0), ("\n".join(sorted(index)) + "\n").encode()


RST = """:mod:`tiny` --- A tiny module
=============================

.. module:: tiny
   :synopsis: Nothing at all.

The :mod:`tiny` module offers :func:`~tiny.grow` and the ``SIZE`` constant; see
:ref:`the tutorial <tut-tiny>` and `the home page <https://example.org/>`_ for **more**.

.. function:: grow(x)

   Return *x* made larger.  For example::

      grow(1)
      grow(2)

   .. versionadded:: 3.4

>>> grow(1)
2

.. code-block:: python

   print("never")

.. _a-target:

Details
-------

+-----+-----+
| a   | b   |
+-----+-----+

Plain words end here.
"""


def test_rest_markup_is_stripped_to_its_text() -> None:
    # worked by hand: roles and links keep their text, directives, code, doctest, tables go
    assert rest_sections(RST) == [
        (1, ""),
        (1, "tiny --- A tiny module\n\nThe tiny module offers tiny.grow and the SIZE constant; see\n"
            "the tutorial and the home page for more.\n\nReturn x made larger.  For example:"),
        (28, "Details\n\nPlain words end here."),
    ]


# One line of a hostile .deb, a megabyte long, for each pattern that once rescanned it from every
# character (O(n^2): a 64k-space line cost 50 s): spaces before a pronunciation, spaces inside
# a link or a role before `<`, a run of colons before a role's backtick.
MEGABYTE_LINES = {
    "spaces": " " * (1 << 20) + "x",
    "pronunciation": "\\" + " " * (1 << 20),
    "link": "`" + " " * (1 << 20) + "<",
    "role title": ":ref:`" + " " * (1 << 20) + "x`",
    "colons": ":" * (1 << 20) + "`",
    "colon words": ":a" * (1 << 19) + "`",
}


@pytest.mark.parametrize("name", list(MEGABYTE_LINES))
def test_a_megabyte_line_is_read_in_linear_time(name: str) -> None:
    import time

    from monitor.scoring.pool_text import dictd_units

    line = MEGABYTE_LINES[name]
    body, index = make_dictd([("evil", line + "\n")])
    start = time.perf_counter()
    list(dictd_units("evil.dict.dz", body, index, "dict"))
    rest_sections("Title\n=====\n\n" + line + "\n")
    assert time.perf_counter() - start < 2.0   # about 0.3 s; quadratic: an hour and more


def test_spaces_around_removed_markup_are_collapsed_as_before() -> None:
    from monitor.scoring.pool_text import dictd_units, rest_inline

    # worked by hand: the text before `<target>` loses its trailing spaces, the pronunciation
    # its leading ones
    assert rest_inline("see `the  home page   <https://x/>`_ and :ref:`a title \t <t>`.") == \
        "see the  home page and a title."
    assert rest_inline(":py:meth:`~a.b` :external+python:py:func:`len`") == "a.b len"
    text = "Benefit \\Ben`e*fit\\   (n.)  A gain.\n [1913 Webster]\n"
    body, index = make_dictd([("Benefit", text)])
    assert [u.text for u in dictd_units("d.dict.dz", body, index, "dict")] == ["Benefit (n.) A gain."]


def dpkg_build(root: Path, package: str, version: str, out: Path) -> Path:
    (root / "DEBIAN").mkdir(parents=True, exist_ok=True)
    (root / "DEBIAN" / "control").write_text(
        f"Package: {package}\nVersion: {version}\nArchitecture: all\n"
        "Maintainer: Test <test@example.org>\nDescription: test package\n")
    subprocess.run(["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(root), str(out)],
                   check=True, capture_output=True)
    return out


@pytest.fixture(scope="module")
def calib_texts(shared_dir: Path) -> list[str]:
    return [d.text for name in ("calib-v0", "calib-v0-alt")
            for d in load_corpus(shared_dir / "corpus" / name).documents]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, shared_dir: Path, calib_texts: list[str]) -> dict:
    """Two real .debs (a dictionary and a reST documentation package) in a cache folder."""
    base = tmp_path_factory.mktemp("pool")
    rng = random.Random(7)
    heads = [f"{rng.choice(WORDS)}{i:03d}" for i in range(130)]
    entries = [("00-database-short", "00-database-short\n   A tiny test dictionary\n\n")]
    entries += [(h, entry(rng, h)) for h in heads]
    prose = next(t for t in calib_texts if len(t.split()) > 80 and not re.search(r"[{}\\\[\]]", t)
                 and "  " not in t and "\n\n" not in t)
    quote = " ".join(prose.split()[:30])
    near = " ".join(prose.split()[:11])
    entries.append(("quoteword", f"Quoteword \\Quote\\, n.\n   As in: {quote}\n\n"))
    entries.append(("exactword", prose + "\n\n"))
    entries.append(("nearword", f"Nearword \\Near\\, n.\n   As in: {near} zebra giraffe.\n\n"))
    entries.append(("dupword", entries[5][1]))  # the same entry text twice
    dict_dz, index = make_dictd(entries)

    root = base / "dict-tiny"
    (root / "usr/share/dictd").mkdir(parents=True)
    (root / "usr/share/dictd/tiny.dict.dz").write_bytes(dict_dz)
    (root / "usr/share/dictd/tiny.index").write_bytes(index)
    doc = base / "tinydoc-doc"
    src = doc / "usr/share/doc/tinydoc/html/_sources"
    src.mkdir(parents=True)
    (src / "tiny.rst.txt").write_text(RST)
    (base / "secret.rst.txt").write_text(SECRET + "\n")
    (src / "link.rst.txt").symlink_to(base / "secret.rst.txt")
    (src / "rel.rst.txt").symlink_to("../../../../../../../secret.rst.txt")

    cache = base / "cache"
    cache.mkdir()
    dpkg_build(root, "dict-tiny", "1.0-1", cache / "dict-tiny_1.0-1_all.deb")
    dpkg_build(doc, "tinydoc-doc", "2:3.1-2", cache / "tinydoc-doc_3.1-2_all.deb")
    excl = [shared_dir / "corpus" / "calib-v0", shared_dir / "corpus" / "calib-v0-alt"]
    built = build_pool(base / "pool", ["dict-tiny", "tinydoc-doc"], cache=cache, exclude=excl)
    return {"base": base, "cache": cache, "exclude": excl, "pool": base / "pool", "built": built,
            "files": {"usr/share/dictd/tiny.dict.dz": dict_dz, "usr/share/dictd/tiny.index": index,
                      "usr/share/doc/tinydoc/html/_sources/tiny.rst.txt": RST.encode()},
            "quote": quote, "near": near, "prose": prose, "n_entries": 130}


def tree(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def all_docs(pool: Path) -> list[dict]:
    return [json.loads(line) | {"split": s} for s in ("train", "heldout", "tasks")
            for line in (pool / s / "documents.jsonl").open(encoding="utf-8")]


def test_same_debs_give_byte_identical_pools(world: dict) -> None:
    again = world["base"] / "again"
    cache2 = world["base"] / "cache-copy"
    shutil.copytree(world["cache"], cache2)
    # other cache path, other package order: the same bytes
    build_pool(again, ["tinydoc-doc", "dict-tiny"], cache=cache2, exclude=list(reversed(world["exclude"])))
    first, second = tree(world["pool"]), tree(again)
    assert sorted(first) == ["heldout/SOURCES.md", "heldout/documents.jsonl", "heldout/manifest.json",
                             "manifest.json", "tasks/SOURCES.md", "tasks/documents.jsonl",
                             "tasks/manifest.json", "train/SOURCES.md", "train/documents.jsonl",
                             "train/manifest.json"]
    assert first == second


def test_manifest_records_each_deb_and_source_file(world: dict) -> None:
    manifest = json.loads((world["pool"] / "manifest.json").read_text())
    assert manifest["schema"] == "lstar-pool/1"
    debs = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in world["cache"].glob("*.deb")}
    assert [(p["package"], p["version"], p["deb_sha256"]) for p in manifest["packages"]] == [
        ("dict-tiny", "1.0-1", debs["dict-tiny_1.0-1_all.deb"]),
        ("tinydoc-doc", "2:3.1-2", debs["tinydoc-doc_3.1-2_all.deb"])]
    got = {s["path"]: (s["package"], s["sha256"], s["bytes"]) for s in manifest["sources"]}
    assert got == {path: ("tinydoc-doc" if "tinydoc" in path else "dict-tiny",
                          hashlib.sha256(data).hexdigest(), len(data))
                   for path, data in world["files"].items()}
    # each split is a pinned corpus whose pin the pool manifest records
    for split in ("train", "heldout", "tasks"):
        corpus = load_corpus(world["pool"] / split)
        assert manifest["splits"][split]["sha256"] == corpus.sha256
        assert manifest["splits"][split]["bytes"] == corpus.n_bytes


def test_calibration_text_is_removed_and_counted(world: dict, calib_texts: list[str]) -> None:
    docs = all_docs(world["pool"])
    text = "\n".join(d["text"] for d in docs)
    assert world["quote"] not in text and world["prose"] not in text
    assert world["near"] + " zebra giraffe." in text        # 11 words shared: kept
    calib_grams = set().union(*(words12(t) for t in calib_texts))
    assert not any(words12(d["text"]) & calib_grams for d in docs)   # naive re-check
    excluded = json.loads((world["pool"] / "manifest.json").read_text())["excluded"]
    assert excluded["units_calib_exact"] == 1
    assert excluded["units_calib_shingle"] == 1
    assert excluded["units_duplicate"] == 1
    # 130 entries + quote + exact + near + duplicate + the reST sections (2 with text)
    assert excluded["units_read"] == world["n_entries"] + 4 + 2
    assert "00-database" not in text and "A tiny test dictionary" not in text
    assert "[1913 Webster]" not in text and "\\" not in text


def test_split_is_a_hash_of_each_document(world: dict) -> None:
    docs = all_docs(world["pool"])
    counts = {"train": 0, "heldout": 0, "tasks": 0}
    for d in docs:
        h = int(hashlib.sha256(("lstar-pool/1 split\n" + d["text"]).encode()).hexdigest()[:16], 16) % 1000
        assert d["split"] == ("train" if h < 900 else "heldout" if h < 950 else "tasks")
        counts[d["split"]] += 1
    assert all(counts.values()) and counts["train"] > 100
    texts = [d["text"] for d in docs]
    assert len(set(texts)) == len(texts)
    assert all(len(t.encode()) <= 4000 for t in texts)


def test_symlink_members_are_skipped_not_followed(world: dict) -> None:
    text = "\n".join(d["text"] for d in all_docs(world["pool"]))
    assert "zzsecretmarker" not in text
    manifest = json.loads((world["pool"] / "manifest.json").read_text())
    doc_pkg = next(p for p in manifest["packages"] if p["package"] == "tinydoc-doc")
    assert doc_pkg["links_skipped"] == 2
    assert not any("link.rst" in s["path"] or "rel.rst" in s["path"] for s in manifest["sources"])


def evil_deb_cache(tmp_path: Path, member: str) -> Path:
    """A cache folder holding `evil-doc_1.0_all.deb`: a real .deb's control part with a data
    archive of one member named `member`, assembled with ar as dpkg-deb would refuse to."""
    ok = dpkg_build(tmp_path / "root", "evil-doc", "1.0", tmp_path / "ok.deb")
    subprocess.run(["ar", "x", str(ok), "debian-binary", "control.tar.gz"], cwd=tmp_path, check=True)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        data = (("Evil words " * 20) + "\n").encode()
        info = tarfile.TarInfo(member)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    (tmp_path / "data.tar").write_bytes(buf.getvalue())
    cache = tmp_path / "cache"
    cache.mkdir()
    subprocess.run(["ar", "rc", str(cache / "evil-doc_1.0_all.deb"), "debian-binary",
                    "control.tar.gz", "data.tar"], cwd=tmp_path, check=True)
    return cache


@pytest.mark.parametrize("member", ["./../../usr/share/doc/x/html/_sources/evil.rst.txt",
                                    "/usr/share/doc/x/html/_sources/evil.rst.txt"])
def test_member_outside_the_package_root_refuses_the_deb(world: dict, tmp_path: Path, member: str) -> None:
    cache = evil_deb_cache(tmp_path, member)
    with pytest.raises(CorpusError, match=r"evil-doc.*outside the package root"):
        build_pool(tmp_path / "out", ["evil-doc"], cache=cache, exclude=world["exclude"])
    assert not (tmp_path / "out").exists()


@needs_dpkg
def test_a_huge_long_name_header_is_refused_before_it_is_read(world: dict, tmp_path: Path) -> None:
    """tarfile reads a GNU long-name header whole before its member can be judged: a member
    named in 64 KiB (a 3 MB .deb can name one in 768 MiB) refuses the package at the header."""
    cache = evil_deb_cache(tmp_path, "./usr/share/doc/x/html/_sources/" + "a" * (64 << 10) + ".rst.txt")
    with pytest.raises(CorpusError, match=r"evil-doc.*long member name of 65,"):
        build_pool(tmp_path / "out", ["evil-doc"], cache=cache, exclude=world["exclude"])
    assert not (tmp_path / "out").exists()


def pins_with(world: dict, tmp_path: Path, package: str, **change: str) -> Path:
    manifest = json.loads((world["pool"] / "manifest.json").read_text())
    for entry in manifest["packages"]:
        if entry["package"] == package:
            entry.update(change)
    path = tmp_path / "pins.json"
    path.write_text(json.dumps(manifest))
    return path


def test_pins_reproduce_the_pool(world: dict, tmp_path: Path) -> None:
    assert main(["corpus", "build-pool", str(tmp_path / "out"), "--cache", str(world["cache"]),
                 "--pins", str(world["pool"] / "manifest.json"),
                 *sum((["--exclude", str(p)] for p in world["exclude"]), [])]) == 0
    assert tree(tmp_path / "out") == tree(world["pool"])


@pytest.mark.parametrize("field,value,needle", [
    ("deb_sha256", "0" * 64, r"package tinydoc-doc 2:3\.1-2: tinydoc-doc_3\.1-2_all\.deb has sha256 [0-9a-f]{16}…, .* pins 0{16}…"),
    ("version", "2:3.1-3", r"package tinydoc-doc: tinydoc-doc_3\.1-2_all\.deb is version 2:3\.1-2, .* pins 2:3\.1-3"),
])
def test_a_deb_differing_from_its_pin_is_refused(world: dict, tmp_path: Path, capsys: pytest.CaptureFixture,
                                                 field: str, value: str, needle: str) -> None:
    pins = pins_with(world, tmp_path, "tinydoc-doc", **{field: value})
    if field == "version":  # a build would look for 2:3.1-3 with apt: check the cached .deb
        deb = inspect_deb(world["cache"] / "tinydoc-doc_3.1-2_all.deb")
        with pytest.raises(CorpusError, match=needle):
            check_pin(deb, {"tinydoc-doc": ("2:3.1-3", deb.sha256)}, pins)
        return
    code = main(["corpus", "build-pool", str(tmp_path / "out"), "--cache", str(world["cache"]),
                 "--pins", str(pins), *sum((["--exclude", str(p)] for p in world["exclude"]), [])])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert re.search(needle, err), err
    assert not (tmp_path / "out").exists()


def test_a_changed_build_is_refused_against_its_pins(world: dict, tmp_path: Path) -> None:
    manifest = json.loads((world["pool"] / "manifest.json").read_text())
    manifest["splits"]["heldout"]["sha256"] = "f" * 64
    pins = tmp_path / "pins.json"
    pins.write_text(json.dumps(manifest))
    with pytest.raises(CorpusError, match=r"differs from .*pins\.json in split\(s\) heldout"):
        build_pool(tmp_path / "out", None, cache=world["cache"], exclude=world["exclude"], pins=pins)
    assert not (tmp_path / "out").exists()


def test_a_rebuild_takes_its_label_from_the_pins_so_the_check_runs(world: dict, tmp_path: Path) -> None:
    """Pins of a pool labelled v2: a rebuild given no --version is labelled v2 (the same manifest
    as the pins), and a changed split is refused. Labelled v1 by default, the rebuild's label
    differed from the pins' and the split check was skipped."""
    manifest = json.loads((world["pool"] / "manifest.json").read_text())
    manifest["version"] = "v2"
    for info in manifest["splits"].values():
        info["version"] = "v2"
    pins = tmp_path / "pins.json"
    pins.write_text(json.dumps(manifest))
    built = build_pool(tmp_path / "out", None, cache=world["cache"], exclude=world["exclude"], pins=pins)
    assert built.manifest == manifest
    assert json.loads((tmp_path / "out" / "manifest.json").read_text()) == manifest
    manifest["splits"]["tasks"]["sha256"] = "f" * 64
    pins.write_text(json.dumps(manifest))
    with pytest.raises(CorpusError, match=r"differs from .*pins\.json in split\(s\) tasks"):
        build_pool(tmp_path / "again", None, cache=world["cache"], exclude=world["exclude"], pins=pins)
    assert not (tmp_path / "again").exists()


def test_load_pool_verifies_against_its_manifest(world: dict, tmp_path: Path) -> None:
    train, heldout, tasks = load_pool(world["pool"], pins=world["pool"] / "manifest.json")
    assert (train.name, heldout.name, tasks.name) == ("lab-pool-train", "lab-pool-heldout", "lab-pool-tasks")
    copy = tmp_path / "copy"
    shutil.copytree(world["pool"], copy)
    # a split from another build: valid on its own, not the one the pool manifest pins
    (copy / "tasks").rename(copy / "tasks-old")
    shutil.copytree(copy / "heldout", copy / "tasks")
    with pytest.raises(CorpusError, match=r"tasks has sha256 .* the pool manifest says"):
        load_pool(copy)


def test_the_committed_sample_loads_and_is_disjoint_from_calibration(calib_texts: list[str]) -> None:
    assert SAMPLE_POOL == REPO / "data" / "lab-pool-sample"
    train, heldout, tasks = load_pool(SAMPLE_POOL, pins=REPO / "data" / "lab-pool-v1.manifest.json")
    sizes = [c.n_bytes for c in (train, heldout, tasks)]
    assert 200_000 <= sizes[0] <= 300_000 and all(30_000 <= s <= 50_000 for s in sizes[1:])
    docs = [d for c in (train, heldout, tasks) for d in c.documents]
    calib_grams = set().union(*(words12(t) for t in calib_texts))
    calib_exact = {" ".join(t.split()) for t in calib_texts}
    assert not any(words12(d.text) & calib_grams for d in docs)
    assert not any(" ".join(d.text.split()) in calib_exact for d in docs)
    assert len({d.sha256 for d in docs}) == len(docs)          # the splits share no document
    assert {d.slice for d in docs} == {"dictionary", "documentation"}


def test_the_committed_pool_manifest_describes_a_large_enough_pool() -> None:
    manifest = read_pool_manifest(REPO / "data" / "lab-pool-v1.manifest.json")
    assert manifest["splits"]["train"]["bytes"] >= 25_000_000
    assert [(p["package"], p["version"]) for p in manifest["packages"]] == [
        ("dict-gcide", "0.48.5+nmu2"), ("python3.11-doc", "3.11.2-6+deb12u8")]
    assert {s["package"] for s in manifest["sources"]} == {"dict-gcide", "python3.11-doc"}


def test_load_pool_refuses_a_pool_from_other_packages(world: dict, tmp_path: Path) -> None:
    pins = pins_with(world, tmp_path, "dict-tiny", version="1.0-2")
    with pytest.raises(CorpusError, match=r"manifest's packages differ from .*pins\.json"):
        load_pool(world["pool"], pins=pins)


def test_oversized_member_is_refused(world: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import monitor.scoring.debs as debs
    monkeypatch.setattr(debs, "MAX_MEMBER_BYTES", 1000)  # the gzip'd dictionary is larger
    with pytest.raises(CorpusError, match=r"dict-tiny_1\.0-1_all\.deb: usr/share/dictd/tiny\.dict\.dz .* exceeds"):
        build_pool(tmp_path / "out", ["dict-tiny"], cache=world["cache"], exclude=world["exclude"])
    assert not (tmp_path / "out").exists()


def test_two_versions_in_the_cache_need_a_pin(world: dict, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    shutil.copytree(world["cache"], cache)
    root = tmp_path / "v2"
    (root / "usr/share/doc/tinydoc/html/_sources").mkdir(parents=True)
    (root / "usr/share/doc/tinydoc/html/_sources/a.rst.txt").write_text(RST)
    dpkg_build(root, "tinydoc-doc", "2:3.2-1", cache / "tinydoc-doc_3.2-1_all.deb")
    with pytest.raises(CorpusError, match=r"holds 2 \.debs of tinydoc-doc \(2:3\.1-2, 2:3\.2-1\)"):
        build_pool(tmp_path / "out", ["tinydoc-doc"], cache=cache, exclude=world["exclude"])
    # the pins pick the one the pool was built from
    build_pool(tmp_path / "out", None, cache=cache, exclude=world["exclude"], pins=world["pool"] / "manifest.json")
    assert tree(tmp_path / "out") == tree(world["pool"])
