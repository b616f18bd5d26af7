"""Corpus loading, verification, selection and building (monitor/scoring/corpus.py and
corpus_build.py, `lstar corpus`)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from monitor.cli import main
from monitor.errors import CorpusError
from monitor.scoring.corpus import Corpus, canonicalize, load_corpus
from monitor.scoring.corpus_build import build_corpus, glob_to_regex, load_slice_rules

CALIB_SHA = "9f269a7db0b131d819be2e51974914a3cf715cc388cceb82885f7a5a21e644d8"
# calib-v0's slices as published in shared/README.md: documents, bytes.
CALIB_SLICES = {"code": (42, 119_315), "encyclopedic": (41, 121_893), "math": (53, 119_843),
                "prose": (37, 125_218), "technical": (43, 120_242)}


def pin(pairs) -> str:
    """The manifest formula, written out independently of the code under test."""
    text = "".join(f"{i}\t{s}\n" for i, s in pairs)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def doc_pin(docs) -> str:
    return pin((d["id"], hashlib.sha256(d["text"].encode("utf-8")).hexdigest()) for d in docs)


@pytest.fixture(scope="module")
def calib(calib_v0: Path) -> Corpus:
    return load_corpus(calib_v0)


@pytest.fixture(scope="module")
def raw_docs(calib_v0: Path) -> list[dict]:
    return [json.loads(line) for line in (calib_v0 / "documents.jsonl").open(encoding="utf-8")]


@pytest.fixture()
def calib_copy(calib_v0: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "calib-copy"
    shutil.copytree(calib_v0, dst)
    return dst


# -- loading -------------------------------------------------------------------------------
def test_calib_v0_loads_with_its_published_pin(calib: Corpus, raw_docs: list[dict]) -> None:
    assert (calib.name, calib.version, calib.selection) == ("lstar-calib", "v0", "all")
    assert len(calib.documents) == 216
    assert calib.n_bytes == 606_511
    assert calib.sha256 == calib.manifest_sha256 == CALIB_SHA == doc_pin(raw_docs)
    assert calib.slices == list(CALIB_SLICES)
    for name, (n_docs, n_bytes) in CALIB_SLICES.items():
        docs = [d for d in calib.documents if d.slice == name]
        assert (len(docs), sum(d.n_bytes for d in docs)) == (n_docs, n_bytes)
    first = calib.documents[0]
    assert (first.id, first.slice, first.source) == ("code-cpython_stdlib-0004", "code", "cpython_stdlib")
    assert first.sha256 == "73113d48239e4f31e35a701b059db237cb163486488e3747697538a0d4a6cd1b"
    assert first.n_bytes == 5998


def test_an_edited_byte_names_the_document_and_file(calib_copy: Path, raw_docs: list[dict]) -> None:
    path = calib_copy / "documents.jsonl"
    lines = path.read_text(encoding="utf-8").split("\n")
    victim = raw_docs[100]
    record = json.loads(lines[100])
    record["text"] = record["text"].replace("e", "E", 1)          # one byte
    lines[100] = json.dumps(record, ensure_ascii=False)
    path.write_text("\n".join(lines), encoding="utf-8")
    with pytest.raises(CorpusError) as err:
        load_corpus(calib_copy)
    message = str(err.value)
    assert victim["id"] in message and "documents.jsonl:101" in message
    # Without verification it loads, but its pin is no longer calib-v0's.
    unverified = load_corpus(calib_copy, verify=False)
    assert unverified.sha256 != CALIB_SHA
    assert unverified.documents[100].text != victim["text"]


def test_an_edited_manifest_is_refused(calib_copy: Path) -> None:
    path = calib_copy / "manifest.json"
    original = path.read_text(encoding="utf-8")
    manifest = json.loads(original)

    manifest["sha256"] = "0" * 64
    path.write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    with pytest.raises(CorpusError, match=r"manifest.json: its sha256 0000000000000000"):
        load_corpus(calib_copy)

    manifest = json.loads(original)
    doc_id = manifest["documents"][7]["id"]
    manifest["documents"][7]["sha256"] = "f" * 64
    path.write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    with pytest.raises(CorpusError, match=rf"document '{doc_id}' \(.*documents.jsonl:8\)"):
        load_corpus(calib_copy)

    manifest = json.loads(original)
    manifest["slices"]["math"]["bytes"] += 1
    path.write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    with pytest.raises(CorpusError, match=r"'slices' counts"):
        load_corpus(calib_copy)

    path.write_text(original[:-30], encoding="utf-8")
    with pytest.raises(CorpusError, match=r"manifest.json:\d+: invalid JSON"):
        load_corpus(calib_copy)


def test_order_count_and_syntax_errors_name_file_and_line(calib_copy: Path, raw_docs) -> None:
    path = calib_copy / "documents.jsonl"
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)

    swapped = lines.copy()
    swapped[3], swapped[4] = swapped[4], swapped[3]
    path.write_text("".join(swapped), encoding="utf-8")
    with pytest.raises(CorpusError, match=rf"documents.jsonl:4: document '{raw_docs[4]['id']}' "
                                          rf"is at position 3, where manifest.json lists "
                                          rf"'{raw_docs[3]['id']}'"):
        load_corpus(calib_copy)

    path.write_text("".join(lines[:-1]), encoding="utf-8")
    with pytest.raises(CorpusError, match=rf"has 215 documents, manifest.json lists 216 \(first "
                                          rf"missing from documents.jsonl: '{raw_docs[-1]['id']}'\)"):
        load_corpus(calib_copy)

    broken = lines.copy()
    broken[9] = broken[9][:40] + "\n"
    path.write_text("".join(broken), encoding="utf-8")
    with pytest.raises(CorpusError, match=r"documents.jsonl:10: invalid JSON"):
        load_corpus(calib_copy)


def test_missing_folder_and_files_name_the_path(tmp_path: Path, calib_copy: Path) -> None:
    with pytest.raises(CorpusError, match=r"corpus folder .*nowhere does not exist"):
        load_corpus(tmp_path / "nowhere")
    (calib_copy / "manifest.json").unlink()
    with pytest.raises(CorpusError, match=r"calib-copy/manifest.json is missing"):
        load_corpus(calib_copy)


# -- selections ------------------------------------------------------------------------------
def test_first_k_selection_is_pinned_by_the_same_formula(calib: Corpus, raw_docs) -> None:
    part = calib.select(first=12)
    assert part.selection == "first:12"
    assert [d.id for d in part.documents] == [d["id"] for d in raw_docs[:12]]
    assert part.sha256 == doc_pin(raw_docs[:12])
    assert part.manifest_sha256 == CALIB_SHA
    assert part.as_row() == {"sha256": part.sha256, "name": "lstar-calib", "version": "v0",
                             "parent_sha256": CALIB_SHA, "selection": "first:12",
                             "n_documents": 12,
                             "n_bytes": sum(len(d["text"].encode()) for d in raw_docs[:12])}
    assert calib.select() is calib
    assert calib.select(first=216).sha256 == CALIB_SHA


def test_slice_selection_keeps_corpus_order(calib: Corpus, raw_docs) -> None:
    part = calib.select(slices=["math", "code"])
    expected = [d for d in raw_docs if d["slice"] in ("code", "math")]
    assert part.selection == "slices:code,math"
    assert [d.id for d in part.documents] == [d["id"] for d in expected]
    assert part.sha256 == doc_pin(expected)
    assert part.n_bytes == 119_315 + 119_843
    both = calib.select(slices=["prose"], first=5)
    assert both.selection == "slices:prose;first:5"
    assert both.sha256 == doc_pin([d for d in raw_docs if d["slice"] == "prose"][:5])
    assert both.select(first=2).selection == "slices:prose;first:5;first:2"


def test_every_kth_selection_samples_all_slices(calib: Corpus, raw_docs) -> None:
    part = calib.select(every=24)
    assert part.selection == "every:24"
    assert [d.id for d in part.documents] == [raw_docs[i]["id"] for i in range(0, 216, 24)]
    assert len(part.documents) == 9 and {d.slice for d in part.documents} == set(calib.slices)
    assert part.sha256 == doc_pin(raw_docs[::24])
    prose = [d for d in raw_docs if d["slice"] == "prose"]
    both = calib.select(slices=["prose"], every=3, first=4)
    assert both.selection == "slices:prose;every:3;first:4"
    assert [d.id for d in both.documents] == [d["id"] for d in prose[::3][:4]]


@pytest.mark.parametrize("kwargs, pattern", [
    ({"every": 0}, r"every 0-th document: the selection has 216"),
    ({"every": True}, r"every True-th document"),
    ({"slices": ["poetry"]}, r"unknown slice\(s\) poetry .*available slices: code, encyclopedic, "
                             r"math, prose, technical"),
    ({"slices": []}, r"no slice named"),
    ({"first": 0}, r"first 0 documents: the selection has 216"),
    ({"first": 217}, r"first 217 documents"),
    ({"slices": ["code"], "first": 43}, r"first 43 documents: the selection has 42"),
])
def test_bad_selections_are_refused(calib: Corpus, kwargs, pattern) -> None:
    with pytest.raises(CorpusError, match=pattern):
        calib.select(**kwargs)


# -- canonicalization and globs --------------------------------------------------------------
def test_canonicalize_follows_the_manifest_statement(calib: Corpus) -> None:
    assert canonicalize("\ufeffa\r\nb\rc") == "a\nb\nc"
    assert canonicalize("cafe\u0301") == "caf\u00e9"                      # NFC
    assert canonicalize("\n  \n\t\n    indented\nline  \n\n \t") == "    indented\nline"
    assert canonicalize(" \n\n") == ""
    # calib-v0 is canonical already (canonicalize is idempotent on it).
    assert all(canonicalize(d.text) == d.text for d in calib.documents)


def test_glob_semantics() -> None:
    rx = glob_to_regex("code/**/*.py")
    assert rx.fullmatches("code/a.py") and rx.fullmatches("code/x/y/a.py")
    assert not rx.fullmatches("code.py") and not rx.fullmatches("other/code/a.py")
    assert not rx.fullmatches("code/a.pyc")
    star = glob_to_regex("*.md")
    assert star.fullmatches("README.md") and not star.fullmatches("docs/README.md")
    assert glob_to_regex("[!_]*.txt").fullmatches("a.txt")
    assert not glob_to_regex("[!_]*.txt").fullmatches("_a.txt")


# -- building -------------------------------------------------------------------------------
RULES = """\
name: toy-corpus
version: v1
rules:
  - {glob: "code/**/*.py", slice: code, source: scripts}
  - {glob: "docs/*.md", slice: technical, source: docs, max_bytes: 60}
  - {glob: "notes/*.txt", slice: prose}
  - {glob: "data/*.jsonl", slice: prose, source: web}
"""


def make_source_tree(root: Path) -> Path:
    (root / "code" / "pkg").mkdir(parents=True)
    (root / "docs").mkdir()
    (root / "notes").mkdir()
    (root / "data").mkdir()
    (root / ".git").mkdir()
    (root / "code" / "pkg" / "b.py").write_bytes(b"\xef\xbb\xbfdef b():\r\n    return 2\r\n\r\n")
    (root / "code" / "a.py").write_text("\n\ndef a():\n    return 1   \n", encoding="utf-8")
    # Four paragraphs: with max_bytes 60 the first three pack, the fourth is alone.
    (root / "docs" / "guide.md").write_text(
        "# Guide\n\nFirst paragraph, one line.\n\nSecond paragraph here.\n\n\n"
        "Third paragraph is alone now.\n",
        encoding="utf-8")
    (root / "notes" / "cafe.txt").write_bytes("cafe\u0301 au lait\rnext line".encode("utf-8"))
    (root / "notes" / "empty.txt").write_text(" \n\n\t\n", encoding="utf-8")
    (root / "notes" / "image.png").write_bytes(b"\x89PNG\r\n")        # not a text type: ignored
    (root / ".git" / "config").write_text("[core]\n", encoding="utf-8")   # hidden: ignored
    records = [{"text": "A web page.\n"}, {"text": "   "}, {"text": "Another page", "id": "prose-web-custom"},
               {"text": "From elsewhere", "source": "forum"}]
    (root / "data" / "pages.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return root


@pytest.fixture()
def source_tree(tmp_path: Path) -> tuple[Path, Path]:
    src = make_source_tree(tmp_path / "src")
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES, encoding="utf-8")
    return src, rules


def test_build_is_deterministic_canonical_and_loadable(source_tree, tmp_path: Path) -> None:
    src, rules = source_tree
    first = build_corpus(src, tmp_path / "out1", rules)
    second = build_corpus(src, tmp_path / "out2", rules)
    for name in ("documents.jsonl", "manifest.json", "SOURCES.md"):
        assert (tmp_path / "out1" / name).read_bytes() == (tmp_path / "out2" / name).read_bytes()
    assert first.sha256 == second.sha256 == load_corpus(tmp_path / "out1").sha256

    docs = {d.id: d for d in first.documents}
    # slices alphabetically, then sources alphabetically, then source order
    assert list(docs) == ["code-scripts-0000", "code-scripts-0001", "prose-forum-0000",
                          "prose-prose-0000", "prose-web-0000", "prose-web-custom",
                          "technical-docs-0000", "technical-docs-0001"]
    assert docs["code-scripts-0000"].text == "def a():\n    return 1"
    assert docs["code-scripts-0001"].text == "def b():\n    return 2"          # BOM, CRLF gone
    assert docs["prose-prose-0000"].text == "caf\u00e9 au lait\nnext line"       # NFC, CR -> LF
    # 7 + 2 + 26 + 2 + 22 = 59 bytes fit in 60; adding the third paragraph would give 91.
    assert docs["technical-docs-0000"].text == ("# Guide\n\nFirst paragraph, one line.\n\n"
                                                "Second paragraph here.")
    assert docs["technical-docs-0001"].text == "Third paragraph is alone now."
    assert docs["prose-web-0000"].text == "A web page."                  # the blank record dropped
    assert docs["prose-forum-0000"].text == "From elsewhere"
    manifest = json.loads((tmp_path / "out1" / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["sha256"] == pin((d.id, hashlib.sha256(d.text.encode()).hexdigest())
                                     for d in first.documents)
    origins = {e["id"]: e["origin"] for e in manifest["documents"]}
    assert origins["code-scripts-0001"] == "code/pkg/b.py:L1-L2"
    assert origins["prose-web-custom"] == "data/pages.jsonl:3"
    assert manifest["total"] == {"documents": len(first.documents), "bytes": first.n_bytes}
    assert set(manifest) >= {"name", "version", "canonicalization", "documents", "slices", "total",
                             "sha256"}


def test_build_splits_at_blank_lines_within_max_bytes(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    paragraphs = [f"Paragraph {i} " + "x" * (10 + 7 * i) for i in range(6)] + ["y" * 100]
    (src / "long.txt").write_text("\n\n".join(paragraphs) + "\n", encoding="utf-8")
    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps({"name": "split", "version": "v1", "max_bytes": 80,
                                 "rules": [{"glob": "*.txt", "slice": "prose"}]}), encoding="utf-8")
    corpus = build_corpus(src, tmp_path / "out", rules)
    # Greedy packing by hand, paragraphs joined by "\n\n" (2 bytes):
    # 22 + 2 + 29 = 53 fits; + 2 + 36 = 91 does not. 36 + 2 + 43 = 81 does not fit, nor
    # 43 + 2 + 50 or 50 + 2 + 57. The 100-byte paragraph cannot be split: it stands alone.
    assert [len(p) for p in paragraphs] == [22, 29, 36, 43, 50, 57, 100]
    texts = [d.text for d in corpus.documents]
    assert texts == [paragraphs[0] + "\n\n" + paragraphs[1], *paragraphs[2:]]
    assert [d.id for d in corpus.documents] == [f"prose-prose-{i:04d}" for i in range(6)]
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["documents"][1]["origin"] \
        == "long.txt:L5-L5"


def test_rebuilding_calib_v0_from_its_documents_reproduces_its_pin(tmp_path: Path, raw_docs) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for name in CALIB_SLICES:
        with (src / f"{name}.jsonl").open("w", encoding="utf-8") as f:
            for d in raw_docs:
                if d["slice"] == name:
                    f.write(json.dumps({"id": d["id"], "source": d["source"], "text": d["text"]}) + "\n")
    rules = tmp_path / "rules.yaml"
    rules.write_text("name: lstar-calib\nversion: v0\nrules:\n" + "".join(
        f"  - {{glob: {name}.jsonl, slice: {name}}}\n" for name in CALIB_SLICES), encoding="utf-8")
    rebuilt = build_corpus(src, tmp_path / "out", rules)
    assert rebuilt.sha256 == CALIB_SHA
    assert len(rebuilt.documents) == 216 and rebuilt.n_bytes == 606_511


def test_build_refuses_a_non_empty_output_and_leaves_nothing_on_failure(source_tree, tmp_path) -> None:
    src, rules = source_tree
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("x", encoding="utf-8")
    with pytest.raises(CorpusError, match=r"already exists and is not an empty folder"):
        build_corpus(src, out, rules)
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"]

    empty = tmp_path / "empty-out"
    empty.mkdir()
    (src / "notes" / "bad.txt").write_bytes(b"ok \xff not utf-8")
    with pytest.raises(CorpusError, match=r"notes/bad.txt is not valid UTF-8 \(byte offset 3\)"):
        build_corpus(src, empty, rules)
    assert list(empty.iterdir()) == []
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".partial")]

    (src / "notes" / "bad.txt").unlink()
    assert build_corpus(src, empty, rules).name == "toy-corpus"       # an empty folder is fine
    with pytest.raises(CorpusError, match=r"inside the source folder"):
        build_corpus(src, src / "corpus", rules)


def test_build_checks_rules_and_unmatched_files(source_tree, tmp_path) -> None:
    src, rules = source_tree
    (src / "stray.md").write_text("nobody claims me", encoding="utf-8")
    with pytest.raises(CorpusError, match=r"no rule in .*rules.yaml matches stray.md"):
        build_corpus(src, tmp_path / "o1", rules)
    rules.write_text(RULES + "unmatched: skip\n", encoding="utf-8")
    assert "stray" not in json.dumps([d.text for d in build_corpus(src, tmp_path / "o2", rules).documents])

    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nversion: v1\nrules:\n  - {glob: '*.txt', slice: prose, colour: red}\n",
                   encoding="utf-8")
    with pytest.raises(CorpusError, match=r"bad.yaml: rules\[0\]: unknown key\(s\) colour"):
        load_slice_rules(bad)
    bad.write_text("name: x\nversion: v1\nrules:\n  - {glob: '*.txt', slice: my-prose}\n", encoding="utf-8")
    with pytest.raises(CorpusError, match=r"rules\[0\].slice must be letters"):
        load_slice_rules(bad)
    bad.write_text("version: v1\nrules: []\n", encoding="utf-8")
    with pytest.raises(CorpusError, match=r"'name' must be a non-empty string"):
        load_slice_rules(bad)
    # the policy files' defences: no deep nesting, no tags, no alias bombs
    bad.write_text("[" * 100_000, encoding="utf-8")
    with pytest.raises(CorpusError, match=r"bad.yaml:1: .*nested more than"):
        load_slice_rules(bad)
    bad.write_text("name: !!python/object/apply:os.system ['true']\nversion: v1\nrules: []\n",
                   encoding="utf-8")
    with pytest.raises(CorpusError, match=r"bad.yaml:1: .*tag"):
        load_slice_rules(bad)


# -- CLI ------------------------------------------------------------------------------------
def test_cli_info_and_verify(calib_v0: Path, calib_copy: Path, capsys) -> None:
    assert main(["corpus", "info", str(calib_v0), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["name"], data["version"], data["sha256"]) == ("lstar-calib", "v0", CALIB_SHA)
    assert (data["documents"], data["bytes"]) == (216, 606_511)
    assert {k: (v["documents"], v["bytes"]) for k, v in data["slices"].items()} == CALIB_SLICES

    assert main(["corpus", "info", str(calib_v0)]) == 0
    out = capsys.readouterr().out
    assert "encyclopedic" in out and "606,511" in out and CALIB_SHA in out

    assert main(["corpus", "verify", str(calib_v0)]) == 0
    assert capsys.readouterr().out.strip() == (f"OK lstar-calib v0: 216 documents, 606,511 bytes, "
                                               f"sha256 {CALIB_SHA}")

    path = calib_copy / "documents.jsonl"
    path.write_bytes(path.read_bytes().replace(b"heapq", b"heapQ", 1))
    assert main(["corpus", "verify", str(calib_copy)]) == 2
    captured = capsys.readouterr()
    err_lines = captured.err.strip().splitlines()
    assert len(err_lines) == 1 and err_lines[0].startswith("error: document 'code-cpython_stdlib-")
    assert captured.out == ""


def test_cli_build(source_tree, tmp_path: Path, capsys) -> None:
    src, rules = source_tree
    out = tmp_path / "built"
    assert main(["corpus", "build", str(src), str(out), "--slice-rules", str(rules)]) == 0
    line = capsys.readouterr().out.strip()
    corpus = load_corpus(out)
    assert line == (f"built {out}: toy-corpus v1: {len(corpus.documents)} documents, "
                    f"{corpus.n_bytes} bytes, sha256 {corpus.sha256}")
    assert main(["corpus", "build", str(src), str(out), "--slice-rules", str(rules)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "already exists" in err[0]
