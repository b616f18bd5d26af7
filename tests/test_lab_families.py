"""Lab v3's tokenizer families: building them (reproducibly), the mistral conversions against
mistral-common's own tokenizers, pruned merges, the round trip and the boundary Jaccard."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from monitor.errors import LabError
from monitor.lab.distinctness import boundary_jaccard, distinct_families, token_ends
from monitor.lab.families import (SPEC_BY_NAME, V3_FAMILY_NAMES, build_lab_families, refuse_lossy,
                                  round_trip_exclusions)
from monitor.scoring import load_corpus, load_tokenizer

REPO = Path(__file__).resolve().parents[1]
SAMPLE_POOL = REPO / "data" / "lab-pool-sample"


def _tiny_bpe(vocab: list[str], merges: list[list[str]]) -> Tokenizer:
    """A BPE over characters with no normalizer or pre-tokenizer."""
    return Tokenizer.from_str(json.dumps({
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
        "pre_tokenizer": None, "post_processor": None, "decoder": None,
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": {t: i for i, t in enumerate(vocab)}, "merges": merges}}))


# ------------------------------------------------------------------ boundary Jaccard
def test_boundary_jaccard_of_a_hand_worked_pair() -> None:
    """"abéab" (é is two bytes): A = ab|é|ab ends at bytes {2, 4, 6}; B = a|b|é|a|b at
    {1, 2, 4, 5, 6}. "ba": both b|a, ends {1, 2}. Over both texts the intersection has
    3 + 2 = 5 ends and the union 5 + 2 = 7: 5/7."""
    tok_a = _tiny_bpe(["a", "b", "é", "ab"], [["a", "b"]])
    tok_b = _tiny_bpe(["a", "b", "é"], [])
    assert [e.tokens for e in tok_a.encode_batch(["abéab", "ba"])] == [["ab", "é", "ab"], ["b", "a"]]
    assert token_ends(tok_a, ["abéab"]).tolist() == [2, 4, 6]
    assert token_ends(tok_b, ["abéab"]).tolist() == [1, 2, 4, 5, 6]
    assert boundary_jaccard(tok_a, tok_b, ["abéab"]) == pytest.approx(3 / 5)
    assert boundary_jaccard(tok_a, tok_b, ["abéab", "ba"]) == pytest.approx(5 / 7)
    assert boundary_jaccard(tok_a, tok_a, ["abéab", "ba"]) == 1.0


def test_a_byte_token_inside_a_character_ends_where_the_character_ends(shared_dir: Path) -> None:
    """gpt2 splits the rare "𝔘" (4 bytes) into byte tokens: they all end at byte 4 of it, so
    "x𝔘" has the ends {1, 5}."""
    gpt2 = load_tokenizer(shared_dir / "tokenizers" / "gpt2")
    assert len(gpt2.encode_documents(["x𝔘"])[0]) > 2
    assert token_ends(gpt2, ["x𝔘"]).tolist() == [1, 5]


def test_distinct_families_keeps_in_order_and_names_the_reason() -> None:
    names = ["a", "b", "c", "d"]
    m = np.array([[1.0, 0.97, 0.90, 0.80],
                  [0.97, 1.0, 0.99, 0.80],
                  [0.90, 0.99, 1.0, 0.95],
                  [0.80, 0.80, 0.95, 1.0]])
    result = distinct_families(names, cutoff=0.95, matrix=m)
    # b is dropped for a; c is close only to b, which was dropped; d reaches the cut-off with c
    assert result["kept"] == ["a", "c"]
    assert set(result["dropped"]) == {"b", "d"}
    assert "0.970 with a" in result["dropped"]["b"] and "0.950 with c" in result["dropped"]["d"]
    assert distinct_families(names, cutoff=0.999, matrix=m)["kept"] == names


def test_phi3_and_llama2_are_one_family_on_calib(shared_dir: Path, calib_v0: Path) -> None:
    docs = [d.text for d in load_corpus(calib_v0).documents][:40]
    tok = {n: load_tokenizer(shared_dir / "tokenizers" / n) for n in ("llama-2", "phi-3", "gpt2")}
    assert boundary_jaccard(tok["llama-2"], tok["phi-3"], docs) == 1.0
    result = distinct_families(["llama-2", "phi-3", "gpt2"], docs, 0.95, tokenizers=tok)
    assert result["kept"] == ["llama-2", "gpt2"] and "phi-3" in result["dropped"]


# ------------------------------------------------------------------ the round trip
def _with_swallowing_literal(shared_dir: Path, tmp_path: Path) -> Path:
    """gpt2 plus a special token `<|im_start|>` that swallows the spaces after it (rstrip): it
    fails the round trip exactly where that literal is followed by a space."""
    data = json.loads((shared_dir / "tokenizers" / "gpt2" / "tokenizer.json").read_text())
    data["added_tokens"].append({"id": 50257, "content": "<|im_start|>", "single_word": False, "lstrip": False,
                                 "rstrip": True, "normalized": False, "special": True})
    folder = tmp_path / "gpt2-swallow"
    folder.mkdir()
    (folder / "tokenizer.json").write_text(json.dumps(data))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>"}))
    return folder


def test_a_document_with_a_special_literal_that_fails_is_excluded_for_all(shared_dir: Path, tmp_path: Path) -> None:
    families = {"gpt2": load_tokenizer(shared_dir / "tokenizers" / "gpt2"),
                "swallow": load_tokenizer(_with_swallowing_literal(shared_dir, tmp_path))}
    docs = [("plain", "hello world"), ("literal", "say <|im_start|> user"), ("kept", "<|im_start|>user")]
    assert round_trip_exclusions(families, docs) == ["literal"]
    result = refuse_lossy(families, {"calib": docs})
    assert result["excluded"] == ["literal"]
    assert result["checks"]["swallow"]["texts"]["calib"] == {"documents": 2, "failing": 0}


def test_a_tokenizer_that_fails_the_round_trip_is_refused_in_one_line(shared_dir: Path, calib_v0: Path) -> None:
    docs = load_corpus(calib_v0).documents[:20]
    families = {n: load_tokenizer(shared_dir / "tokenizers" / n) for n in ("gpt2", "bert-base-uncased")}
    with pytest.raises(LabError) as info:
        refuse_lossy(families, {"calib": docs})
    line = info.value.one_line()
    assert "'bert-base-uncased' is lossy" in line and "100.0% fail: calib 20/20" in line and "\n" not in line


def test_the_calib_document_with_a_literal_im_start_round_trips(shared_dir: Path, calib_v0: Path) -> None:
    """technical-llamacpp_docs-0201 holds `<|im_start|>`, a special token of qwen2 and smollm2:
    matched as one token, it decodes back, so nothing is excluded."""
    doc = next(d for d in load_corpus(calib_v0).documents if d.id == "technical-llamacpp_docs-0201")
    assert "<|im_start|>" in doc.text
    families = {n: load_tokenizer(shared_dir / "tokenizers" / n) for n in ("qwen2", "smollm2", "gpt2")}
    assert round_trip_exclusions(families, [doc]) == []
    assert refuse_lossy(families, {"calib": [doc]})["excluded"] == []


# ------------------------------------------------------------------ building
QUICK = ["pool-bpe-1k", "pool-bpe-lines-2k", "gpt2-merges-8k"]


def test_the_candidate_list_is_long_enough_and_well_formed() -> None:
    assert len(V3_FAMILY_NAMES) == len(set(V3_FAMILY_NAMES)) >= 22
    assert V3_FAMILY_NAMES[:6] == ("gpt2", "llama-2", "llama-3", "smollm2", "qwen2", "gpt-neox")
    for spec in SPEC_BY_NAME.values():      # a pruned family comes after its base
        if spec.kind == "pruned":
            assert V3_FAMILY_NAMES.index(spec.params["base"]) < V3_FAMILY_NAMES.index(spec.name)


def _same_files(a: Path, b: Path) -> None:
    files = sorted(p.name for p in a.iterdir())
    assert {"tokenizer.json", "tokenizer_config.json", "provenance.json"} <= set(files)
    assert files == sorted(p.name for p in b.iterdir())
    for f in files:
        assert (a / f).read_bytes() == (b / f).read_bytes(), (a.name, f)


def test_a_rebuild_is_byte_identical(shared_dir: Path, tmp_path: Path) -> None:
    """Two builds (the base gpt2 of the pruned family is built too, unlisted)."""
    first = build_lab_families(tmp_path / "a", pool=SAMPLE_POOL, shared=shared_dir, names=QUICK)
    build_lab_families(tmp_path / "b", pool=SAMPLE_POOL, shared=shared_dir, names=QUICK)
    assert [s.name for s in first] == QUICK and (tmp_path / "a" / "gpt2").is_dir()
    for name in [*QUICK, "gpt2"]:
        _same_files(tmp_path / "a" / name, tmp_path / "b" / name)
    assert (tmp_path / "a" / "gpt2" / "tokenizer.json").read_bytes() == \
        (shared_dir / "tokenizers" / "gpt2" / "tokenizer.json").read_bytes()
    prov = json.loads((tmp_path / "a" / "pool-bpe-1k" / "provenance.json").read_text())
    assert prov["kind"] == "trained" and prov["vocab_size"] == 1024 and prov["training_text"]["bytes"] > 100_000
    assert prov["tokenizer_json_sha256"] == hashlib.sha256((tmp_path / "a" / "pool-bpe-1k" / "tokenizer.json")
                                                           .read_bytes()).hexdigest()


@pytest.mark.slow
def test_the_trained_and_pruned_families_round_trip(shared_dir: Path, tmp_path: Path) -> None:
    names = [n for n, s in SPEC_BY_NAME.items() if s.kind in ("trained", "pruned") and "tekken" not in n]
    built = build_lab_families(tmp_path, pool=SAMPLE_POOL, shared=shared_dir, names=names)
    handles = {s.name: load_tokenizer(s.folder) for s in built}
    heldout = [json.loads(line)["text"] for line in (SAMPLE_POOL / "heldout" / "documents.jsonl").open()]
    calib = load_corpus(shared_dir / "corpus" / "calib-v0").documents
    checks = refuse_lossy(handles, {"heldout": [(str(i), t) for i, t in enumerate(heldout)], "calib": calib})
    assert checks["excluded"] == [] and all(c["lossless"] for c in checks["checks"].values())
    # digits alone: no token of the digit-split family holds a digit next to anything else
    digits = handles["pool-bpe-digits-8k"].tokenizer.encode("in 2024 and 17", add_special_tokens=False).tokens
    assert [t for t in digits if any(c.isdigit() for c in t)] == ["2", "0", "2", "4", "1", "7"]
    # lines: a token may hold a space inside it; words: no token starts with a space and a letter
    lines = handles["pool-bpe-lines-8k"].tokenizer.get_vocab()
    words = handles["pool-bpe-words-8k"].tokenizer.get_vocab()
    assert any("Ġ" in t.strip("Ġ") for t in lines)
    assert not any(t.startswith("Ġ") and t[1:2].isascii() and t[1:2].isalpha() for t in words)


def test_pruned_merges_keep_a_subset_and_only_coarsen(shared_dir: Path, tmp_path: Path, calib_v0: Path) -> None:
    build_lab_families(tmp_path, pool=SAMPLE_POOL, shared=shared_dir, names=["gpt2-merges-8k"])
    full = json.loads((shared_dir / "tokenizers" / "gpt2" / "tokenizer.json").read_text())["model"]
    pruned = json.loads((tmp_path / "gpt2-merges-8k" / "tokenizer.json").read_text())["model"]
    assert pruned["merges"] == full["merges"][:8000]       # gpt2's merges all reach new tokens
    assert len(pruned["vocab"]) == 256 + 8000 + 1              # and <|endoftext|>, the added token
    assert all(full["vocab"][t] == i for t, i in pruned["vocab"].items())
    assert load_tokenizer(tmp_path / "gpt2-merges-8k").tokenizer.token_to_id("<|endoftext|>") == 50256
    docs = [d.text for d in load_corpus(calib_v0).documents][:30]
    a = token_ends(load_tokenizer(shared_dir / "tokenizers" / "gpt2"), docs)
    b = token_ends(load_tokenizer(tmp_path / "gpt2-merges-8k"), docs)
    assert np.isin(a, b).all() and len(b) > len(a)          # every gpt2 boundary stays a boundary
    assert boundary_jaccard(load_tokenizer(shared_dir / "tokenizers" / "gpt2"),
                            load_tokenizer(tmp_path / "gpt2-merges-8k"), docs) == pytest.approx(len(a) / len(b))


@pytest.mark.slow
def test_the_mistral_conversions_give_mistral_commons_ids(shared_dir: Path, tmp_path: Path, calib_v0: Path) -> None:
    pytest.importorskip("sentencepiece")
    pytest.importorskip("mistral_common")
    from mistral_common.tokens.tokenizers.sentencepiece import SentencePieceTokenizer
    from mistral_common.tokens.tokenizers.tekken import Tekkenizer

    from monitor.lab.families import mistral_data_dir

    built = build_lab_families(tmp_path, pool=SAMPLE_POOL, shared=shared_dir, names=["mistral-spm", "mistral-tekken"])
    data = mistral_data_dir()
    refs = {"mistral-spm": SentencePieceTokenizer(str(data / "tokenizer.model.v1")),
            "mistral-tekken": Tekkenizer.from_file(str(data / "tekken_240718.json"))}
    docs = [d.text for d in load_corpus(calib_v0).documents]
    for source in built:
        handle = load_tokenizer(source.folder)
        ours = handle.encode_documents(docs)
        theirs = [refs[source.name].encode(t, bos=False, eos=False) for t in docs]
        assert sum(a == b for a, b in zip(ours, theirs)) == len(docs) == 216, source.name
        assert handle.prefix_policy == "bos" and handle.prefix_token_id == 1
    assert refuse_lossy({s.name: load_tokenizer(s.folder) for s in built}, {"calib": load_corpus(calib_v0).documents})


def test_the_build_command(shared_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from monitor.cli import main

    assert main(["lab", "tokenizers", "build", str(tmp_path / "fam"), "--pool", str(SAMPLE_POOL),
                 "--shared", str(shared_dir), "--families", "gpt2,pool-bpe-1k", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert [p["family"] for p in printed] == ["gpt2", "pool-bpe-1k"]
    assert (tmp_path / "fam" / "pool-bpe-1k" / "tokenizer.json").is_file()
    assert main(["lab", "tokenizers", "build", str(tmp_path / "x"), "--pool", str(SAMPLE_POOL),
                 "--families", "gpt-5"]) != 0
    assert "unknown families gpt-5" in capsys.readouterr().err


@pytest.mark.slow
def test_the_check_command(shared_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Round trip and matrix over the families a folder holds; a matrix entry equals the
    Jaccard computed directly, and a cut-off below gpt2/gpt2-merges-8k drops the pruned one."""
    from support.lab_calib import shared_with_small_calib

    from monitor.cli import main

    # Every 8th calib-v0 document (27 of 216, from every slice): the command, its matrix and the
    # Jaccard computed directly are over the same texts whatever their number (gpt2 against
    # gpt2-merges-8k: 0.876 on these, 0.860 on all of calib-v0). The round trip of these two
    # families over the whole of calib-v0 is the trained and pruned families' test above.
    shared_dir = shared_with_small_calib(shared_dir, tmp_path / "shared", every=8)
    build_lab_families(tmp_path / "fam", pool=SAMPLE_POOL, shared=shared_dir, names=["gpt2-merges-8k", "pool-bpe-1k"])
    out = tmp_path / "check.json"
    assert main(["lab", "tokenizers", "check", str(tmp_path / "fam"), "--pool", str(SAMPLE_POOL),
                 "--shared", str(shared_dir), "--cutoff", "0.8", "--out", str(out), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result == json.loads(out.read_text())
    assert result["names"] == ["gpt2", "pool-bpe-1k", "gpt2-merges-8k", "phi-3"]
    assert result["round_trip"]["excluded"] == [] and set(result["round_trip"]["failing"].values()) == {0}
    m = np.array(result["matrix"])
    assert np.allclose(m, m.T) and np.allclose(np.diag(m), 1.0)
    docs = [d.text for d in load_corpus(shared_dir / "corpus" / "calib-v0").documents]
    direct = boundary_jaccard(load_tokenizer(tmp_path / "fam" / "gpt2"), load_tokenizer(tmp_path / "fam" / "gpt2-merges-8k"), docs)
    assert m[0, 2] == pytest.approx(direct, abs=1e-4) and 0.8 <= direct < 0.95
    assert result["kept"] == ["gpt2", "pool-bpe-1k"] and "0.8" in result["dropped"]["gpt2-merges-8k"]


# ------------------------------------------------------------------ the pinned mistral-common wheel
# the real wheel, where one has been downloaded (pip download --no-deps mistral-common==1.13.1)
REAL_WHEEL = Path(os.environ.get("LSTAR_MISTRAL_WHEEL", "mistral_common-1.13.1-py3-none-any.whl"))


def _wheel(path: Path, files: dict[str, bytes]) -> tuple[Path, str]:
    import zipfile

    with zipfile.ZipFile(path, "w") as z:
        for name, data in files.items():
            z.writestr(f"mistral_common/data/{name}", data)
        z.writestr("mistral_common/__init__.py", b"")
    return path, hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_mistral_files_are_read_from_a_wheel_with_the_pinned_sha256(tmp_path: Path) -> None:
    from monitor.lab.families import MISTRAL_WHEEL_SHA256, mistral_data_from_wheel

    files = {"tokenizer.model.v1": b"\x0a\x03spm" * 10, "tekken_240718.json": b'{"vocab": []}'}
    wheel, sha = _wheel(tmp_path / "m.whl", files)
    out = mistral_data_from_wheel(wheel, tmp_path / "data", sha256=sha)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == files
    # the pinned sha256 refuses any other file, in one line naming both hashes
    with pytest.raises(LabError) as info:
        mistral_data_from_wheel(wheel, tmp_path / "refused")
    line = info.value.one_line()
    assert "\n" not in line and f"sha256 {sha[:16]}" in line and MISTRAL_WHEEL_SHA256[:16] in line
    assert not (tmp_path / "refused").exists()
    # a wheel without a vocabulary file, and a file that is not a zip
    short, short_sha = _wheel(tmp_path / "short.whl", {"tokenizer.model.v1": b"x"})
    with pytest.raises(LabError, match="has no mistral_common/data/tekken_240718.json"):
        mistral_data_from_wheel(short, tmp_path / "d2", sha256=short_sha)
    junk = tmp_path / "junk.whl"
    junk.write_bytes(b"not a zip at all")
    with pytest.raises(LabError, match="cannot be read as a wheel"):
        mistral_data_from_wheel(junk, tmp_path / "d3", sha256=hashlib.sha256(junk.read_bytes()).hexdigest())


def test_the_build_reads_a_wheel_without_mistral_common(tmp_path: Path, shared_dir: Path, monkeypatch) -> None:
    """`build_lab_families(mistral_wheel=...)` never looks for the installed package."""
    import monitor.lab.families as families

    wheel, sha = _wheel(tmp_path / "m.whl", {"tokenizer.model.v1": b"spm", "tekken_240718.json": b"{}"})
    monkeypatch.setattr(families, "MISTRAL_WHEEL_SHA256", sha)
    monkeypatch.setattr(families, "mistral_data_dir", lambda: pytest.fail("looked for mistral-common"))
    seen = {}

    def fake_build(spec, folder, data_dir):
        seen[spec.name] = (data_dir / spec.params["file"]).read_bytes()
        (folder / "tokenizer.json").write_text((shared_dir / "tokenizers" / "gpt2" / "tokenizer.json").read_text())
        return {}

    monkeypatch.setattr(families, "_build_mistral", fake_build)
    built = build_lab_families(tmp_path / "out", pool=SAMPLE_POOL, shared=shared_dir,
                               names=["mistral-spm", "mistral-tekken"], mistral_wheel=wheel)
    assert [b.name for b in built] == ["mistral-spm", "mistral-tekken"]
    assert seen == {"mistral-spm": b"spm", "mistral-tekken": b"{}"}


@pytest.mark.skipif(not REAL_WHEEL.is_file(), reason=f"no {REAL_WHEEL}")
def test_the_pinned_sha256_is_the_real_wheels_and_its_files_are_the_installed_packages(tmp_path: Path) -> None:
    from monitor.lab.families import MISTRAL_WHEEL, mistral_data_from_wheel, mistral_data_dir

    assert REAL_WHEEL.name == MISTRAL_WHEEL
    out = mistral_data_from_wheel(REAL_WHEEL, tmp_path)          # the pinned sha256 accepts it
    pytest.importorskip("mistral_common")
    for name in ("tokenizer.model.v1", "tekken_240718.json"):
        assert (out / name).read_bytes() == (mistral_data_dir() / name).read_bytes()


def _family_folder(shared_dir: Path, tmp_path: Path, name: str, source: str = "gpt2") -> Path:
    import shutil

    folder = tmp_path / "fam" / name
    folder.mkdir(parents=True)
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (shared_dir / "tokenizers" / source / f).is_file():
            shutil.copy(shared_dir / "tokenizers" / source / f, folder / f)
    return folder.parent


def test_the_check_measures_the_jaccard_without_the_excluded_documents(shared_dir: Path, tmp_path: Path,
                                                                       monkeypatch) -> None:
    """As at the start of a run (`family_set.check_run_families`), a calib-v0 document excluded
    from the round trip for every family is left out of the Jaccard matrix too."""
    from support.lab_calib import shared_with_small_calib

    import monitor.lab.distinctness as distinctness
    import monitor.lab.families as families

    # every 8th calib-v0 document: which texts reach the matrix does not depend on their number
    shared_dir = shared_with_small_calib(shared_dir, tmp_path / "shared", every=8)
    calib = load_corpus(shared_dir / "corpus" / "calib-v0").documents
    dropped = str(calib[3].id)
    real_refuse = families.refuse_lossy
    monkeypatch.setattr(families, "refuse_lossy",
                        lambda handles, texts: {**real_refuse(handles, texts), "excluded": [dropped]})
    seen: list[list[str]] = []
    real_matrix = distinctness.jaccard_matrix
    monkeypatch.setattr(distinctness, "jaccard_matrix", lambda toks, docs: seen.append(list(docs)) or real_matrix(toks, docs))
    result = families.check_family_set(_family_folder(shared_dir, tmp_path, "gpt2"), pool=SAMPLE_POOL,
                                       shared=shared_dir, names=["gpt2"])
    assert result["round_trip"]["excluded"] == [dropped]
    assert seen == [[d.text for d in calib if str(d.id) != dropped]]


def test_the_check_refuses_an_oversized_tokenizer_file_before_reading_it(shared_dir: Path, tmp_path: Path) -> None:
    folder = _family_folder(shared_dir, tmp_path, "gpt2")
    with open(folder / "gpt2" / "tokenizer.json", "r+b") as f:
        f.truncate((64 << 20) + 1)          # sparse
    with pytest.raises(LabError) as info:
        from monitor.lab.families import check_family_set

        check_family_set(folder, pool=SAMPLE_POOL, shared=shared_dir, names=["gpt2"])
    assert "gpt2/tokenizer.json" in info.value.message and "larger than" in info.value.message
