"""Tokenization stress test: BPE-dropout replay, re-estimated unigram, merge pruning, the α/β fit
and `lstar stress` end to end, each against an independent computation."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from monitor.cli import main
from monitor.errors import SpecError
from monitor.lab.tiny_models import build_tiny_model
from monitor.scoring.corpus import Document, load_corpus, text_sha256
from monitor.scoring.corpus_build import build_manifest, documents_jsonl, manifest_json
from monitor.scoring.loader import load_checkpoint
from monitor.scoring.tokenizer import load_tokenizer
from monitor.stress.runner import parse_tests, run_stress
from monitor.stress.segmentation import (BpeReplay, collapse_whitespace, dropout_segmentations, encode_with,
                                         pruned_tokenizer)
from monitor.stress.subject import StressCheckpoint, StressOptions, StressSubject
from monitor.stress.tokenization import fit_alpha_beta, tokenization_stress, variant_numbers

TEXTS = [
    "The quick brown fox jumps over the lazy dog.  Twice,\tthen  rests.",
    "def tokenize(text):\n    return [word   for word in text.split()]\n",
    "Unigram baselines are re-estimated on the induced distribution of tokens: 12345 tokens.",
]


@pytest.fixture(scope="module")
def gpt2_dir(shared_dir) -> Path:
    return shared_dir / "tokenizers" / "gpt2"


@pytest.fixture(scope="module")
def tiny_corpus(tmp_path_factory) -> Path:
    """A three-document corpus folder, pinned as `lstar corpus build` pins one."""
    folder = tmp_path_factory.mktemp("corpus")
    docs = [(Document(id=f"prose-hand-{i:04d}", slice="prose", source="hand", text=t, sha256=text_sha256(t)),
             "test") for i, t in enumerate(TEXTS)]
    (folder / "documents.jsonl").write_text(documents_jsonl(docs), encoding="utf-8")
    (folder / "manifest.json").write_text(manifest_json(build_manifest("hand", "v1", docs, "one per text")),
                                          encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory, gpt2_dir) -> list[Path]:
    root = tmp_path_factory.mktemp("models")
    return [build_tiny_model(root / f"m{seed}", gpt2_dir, arch="llama", seed=seed, hidden=16, layers=1,
                             heads=2, max_positions=256) for seed in range(3)]


def _naive_ce(model_dir: Path, token_seqs: list[list[int]], prefix_id: int) -> float:
    """Σ NLL / N by one full forward pass per document and a float64 log-softmax, token by token."""
    model = load_checkpoint(str(model_dir), dtype="float32", device="cpu").model
    total, n = 0.0, 0
    with torch.no_grad():
        for seq in token_seqs:
            ids = torch.tensor([[prefix_id, *seq]])
            logp = torch.log_softmax(model(input_ids=ids).logits[0].double(), dim=-1)
            for q in range(1, ids.shape[1]):
                total -= float(logp[q - 1, ids[0, q]])
                n += 1
    return total / n


def _hand_unigram_ce(token_seqs: list[list[int]]) -> float:
    counts = Counter(i for seq in token_seqs for i in seq)
    n = sum(counts.values())
    return -sum(c / n * math.log(c / n) for c in counts.values())


def test_dropout_segmentations_are_seeded_and_keep_the_bytes(gpt2_dir) -> None:
    handle = load_tokenizer(gpt2_dir)
    a, info = dropout_segmentations(handle, TEXTS, 0.3, seed=7)
    b, _ = dropout_segmentations(handle, TEXTS, 0.3, seed=7)
    c, _ = dropout_segmentations(handle, TEXTS, 0.3, seed=8)
    canonical = handle.encode_documents(TEXTS)
    assert a == b and a != c and a != canonical
    assert info["reproduces_library"] is True
    assert [handle.tokenizer.decode(s) for s in a] == TEXTS
    assert sum(map(len, a)) > sum(map(len, canonical))      # dropout only ever splits
    # one replay lent to several rates (as the section does) segments as a replay of its own
    replay = BpeReplay.of(handle)
    assert dropout_segmentations(handle, TEXTS, 0.3, seed=7, replay=replay) == (a, info)
    assert dropout_segmentations(handle, TEXTS, 0.3, seed=8, replay=replay)[0] == c
    assert (dropout_segmentations(handle, TEXTS, 0.1, seed=7, replay=replay)
            == dropout_segmentations(handle, TEXTS, 0.1, seed=7))       # a second rate on the same replay


def test_replay_at_rate_zero_is_the_library_segmentation(shared_dir) -> None:
    texts = [d.text for d in load_corpus(shared_dir / "corpus" / "calib-v0").documents[:6]]
    for name in ("gpt2", "smollm2"):
        handle = load_tokenizer(shared_dir / "tokenizers" / name)
        seqs, info = dropout_segmentations(handle, texts, 0.0, seed=0)
        assert seqs == handle.encode_documents(texts), name
        assert info["reproduces_library"] is True


def test_unigram_baseline_is_the_hand_count() -> None:
    # prefix policy "bos": every token is scored; "none": each document's first is not.
    seqs = [[1, 2, 2], [2, 3]]
    bos = variant_numbers([1.0, 1.0], seqs, "bos")
    assert bos["n_tokens"] == 5
    assert bos["ce_uni"] == pytest.approx(-(2 * 0.2 * math.log(0.2) + 0.6 * math.log(0.6)), abs=1e-12)
    assert bos["ce"] == pytest.approx(2.0 / 5)
    none = variant_numbers([1.0, 1.0], seqs, "none")
    assert none["n_tokens"] == 3
    assert none["ce_uni"] == pytest.approx(-(2 / 3 * math.log(2 / 3) + 1 / 3 * math.log(1 / 3)), abs=1e-12)


def test_alpha_beta_fit_is_polyfit() -> None:
    x = [1.2, 0.9, 0.55, 0.31, 0.12]
    y = [1.5, 1.05, 0.71, 0.33, 0.2]
    fit = fit_alpha_beta(x, y)
    alpha, beta = np.polyfit(x, y, 1)
    residuals = np.asarray(y) - np.polyval([alpha, beta], x)
    assert fit["alpha"] == pytest.approx(alpha, abs=1e-12)
    assert fit["beta"] == pytest.approx(beta, abs=1e-12)
    assert fit["residual_variance"] == pytest.approx(float(residuals @ residuals) / 3, abs=1e-12)
    assert fit["n"] == 5
    assert fit_alpha_beta([0.0, 1.0], [1.0, 3.0])["residual_variance"] is None
    with pytest.raises(SpecError):
        fit_alpha_beta([1.0], [1.0])


def test_pruned_vocabulary_round_trips_the_bytes_with_original_ids(gpt2_dir, shared_dir) -> None:
    handle = load_tokenizer(gpt2_dir)
    texts = TEXTS + [d.text for d in load_corpus(shared_dir / "corpus" / "calib-v0").documents[:4]]
    pruned, info = pruned_tokenizer(handle, 0.2)
    seqs = encode_with(pruned, texts)
    assert [handle.tokenizer.decode(s) for s in seqs] == texts
    assert info["merges_dropped"] == 10000 and info["tokens_dropped"] > 0
    used = {i for s in seqs for i in s}
    assert not used & set(info["dropped_ids"])
    # an id means the same token string in the pruned and the original vocabulary
    assert all(pruned.id_to_token(i) == handle.tokenizer.id_to_token(i) for i in used)
    assert sum(map(len, seqs)) > sum(map(len, handle.encode_documents(texts)))


def test_collapse_whitespace_keeps_line_breaks() -> None:
    assert collapse_whitespace("a  b\t\tc\n  d\te") == "a b c\n d e"


def test_tokenization_section_against_a_naive_loop(tiny_models, tiny_corpus, gpt2_dir) -> None:
    subject = StressSubject(kind="model", name="tiny", corpus=tiny_corpus,
                            checkpoints=tuple(StressCheckpoint(ref=str(m), label=m.name) for m in tiny_models))
    options = StressOptions(seed=3, dropout_rates=(0.1,), extra={"device": "cpu", "prune_fraction": 0.2})
    section = tokenization_stress(subject, options)
    handle = load_tokenizer(gpt2_dir)
    dropped, _ = dropout_segmentations(handle, TEXTS, 0.1, seed=3)
    names = [v["name"] for v in section["checkpoints"][0]["variants"]]
    assert names == ["base", "whitespace-collapsed", "bpe-dropout-0.1", "pruned-merges-20%"]
    first = {v["name"]: v for v in section["checkpoints"][0]["variants"]}
    # CE under dropout: the same sampled segmentations, scored naively
    naive = _naive_ce(tiny_models[0], dropped, handle.prefix_token_id)
    assert first["bpe-dropout-0.1"]["ce"] == pytest.approx(naive, abs=1e-5)
    # CE_uni re-estimated on the dropout tokens, by hand
    assert first["bpe-dropout-0.1"]["ce_uni"] == pytest.approx(_hand_unigram_ce(dropped), abs=1e-12)
    assert first["bpe-dropout-0.1"]["n_tokens"] == sum(map(len, dropped))
    assert first["base"]["ce_uni"] == pytest.approx(_hand_unigram_ce(handle.encode_documents(TEXTS)), abs=1e-12)
    collapsed = [collapse_whitespace(t) for t in TEXTS]
    assert first["whitespace-collapsed"]["n_bytes"] == sum(len(t.encode()) for t in collapsed)
    assert first["whitespace-collapsed"]["ce"] == pytest.approx(
        _naive_ce(tiny_models[0], handle.encode_documents(collapsed), handle.prefix_token_id), abs=1e-5)
    for v in first.values():
        assert v["lstar"] == pytest.approx(v["ce"] - v["ce_uni"], abs=1e-12)
    # the fit is numpy's on the reported numbers
    fit = {f["variant"]: f for f in section["fits"]}["bpe-dropout-0.1"]
    rows = [{v["name"]: v["lstar"] for v in c["variants"]} for c in section["checkpoints"]]
    alpha, beta = np.polyfit([r["base"] for r in rows], [r["bpe-dropout-0.1"] for r in rows], 1)
    assert (fit["alpha"], fit["beta"], fit["n"]) == (pytest.approx(alpha), pytest.approx(beta), 3)


def test_lstar_stress_json_end_to_end(tiny_models, tiny_corpus, capsys) -> None:
    code = main(["stress", "--model", str(tiny_models[0]), "--corpus", str(tiny_corpus), "--tests",
                 "tokenization", "--max-documents", "2", "--device", "cpu", "--json"])
    assert code == 0
    document = json.loads(capsys.readouterr().out)
    assert document["schema"] == "lstar-stress/1"
    section = document["sections"]["tokenization"]
    assert section["corpus"]["n_documents"] == 2
    assert section["fits"] == [] and any("no α/β fit" in n for n in section["notes"])
    variant = section["checkpoints"][0]["variants"][0]
    assert set(variant) >= {"name", "ce", "ce_uni", "lstar", "n_tokens"}


def test_lstar_stress_save_stores_the_document_in_the_states_database(tiny_models, tiny_corpus, tmp_path,
                                                                      capsys) -> None:
    from monitor.store import Store

    state = tmp_path / "state"
    args = ["stress", "--model", str(tiny_models[0]), "--corpus", str(tiny_corpus), "--tests", "tokenization",
            "--max-documents", "1", "--device", "cpu", "--json", "--state", str(state)]
    assert main(args) == 0  # without --save nothing is written
    assert "stored_id" not in json.loads(capsys.readouterr().out) and not (state / "lstar.duckdb").exists()
    assert main([*args, "--save"]) == 0
    stored_id = json.loads(capsys.readouterr().out)["stored_id"]
    with Store.open(state / "lstar.duckdb") as store:
        rows = store.query("SELECT report_id FROM stress_reports", None)
    assert [r["report_id"] for r in rows] == [stored_id]


def test_unknown_test_and_missing_checkpoints_are_clear_errors(tiny_corpus) -> None:
    with pytest.raises(SpecError, match="unknown stress test"):
        parse_tests("tokenization,spelling")
    with pytest.raises(SpecError, match="at least one checkpoint"):
        run_stress(StressSubject(kind="model", name="x", checkpoints=(), corpus=tiny_corpus), StressOptions(),
                   ["tokenization"])
    assert main(["stress", "--corpus", str(tiny_corpus)]) != 0


def test_lab_lineage_steps_in_step_order_and_a_missing_step_named(tmp_path) -> None:
    from monitor.commands.stress import lineage_checkpoints

    for name in ("step30", "step2", "step100", "notes"):
        (tmp_path / name).mkdir()
    assert [c.label for c in lineage_checkpoints(tmp_path, None)] == ["step2", "step30", "step100"]
    assert [c.label for c in lineage_checkpoints(tmp_path, None, "100,step2")] == ["step2", "step100"]
    with pytest.raises(SpecError, match="no step\\(s\\) 7"):
        lineage_checkpoints(tmp_path, None, "2,7")


def test_lstar_stress_runs_the_three_tests_from_the_command_line(tiny_models, tiny_corpus, tmp_path,
                                                                  capsys) -> None:
    # the command had no way to pass register corpora or a task file, and its default (every
    # registered test) failed in the registers test after the tokenization test had scored
    register = tmp_path / "register-code"
    register.mkdir()
    for f in tiny_corpus.iterdir():
        (register / f.name).write_bytes(f.read_bytes())
    (register / "register.json").write_text('{"register": "code"}', encoding="utf-8")
    task = tmp_path / "task.jsonl"
    task.write_text("".join(json.dumps({"id": f"q{i}", "context": f"The {w} sat on the", "choices": [" mat", " moon"],
                                        "answer": 0}) + "\n" for i, w in enumerate(("cat", "dog"))), encoding="utf-8")
    args = ["stress", *(a for m in tiny_models for a in ("--model", str(m))), "--corpus", str(tiny_corpus),
            "--max-documents", "2", "--device", "cpu", "--json"]
    assert main([*args, "--register", str(register), "--task-file", str(task)]) == 0
    document = json.loads(capsys.readouterr().out)
    assert set(document["sections"]) == {"tokenization", "registers", "task_format"}
    assert [t["a"] for t in document["sections"]["registers"]["kendall_tau"]] == ["hand-v1"]
    assert document["sections"]["task_format"]["tasks"][0]["n_items"] == 2
    # without their inputs the default is the tests that can run; naming one that cannot is an
    # error before anything is scored. One checkpoint: which tests run does not depend on how
    # many checkpoints there are, and each one more is scored three more times.
    one = ["stress", "--model", str(tiny_models[0]), *args[1 + 2 * len(tiny_models):]]
    assert main(one) == 0
    assert set(json.loads(capsys.readouterr().out)["sections"]) == {"tokenization"}
    assert main([*args, "--tests", "registers"]) != 0
    assert "--register" in capsys.readouterr().err
