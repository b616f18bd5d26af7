"""Lab v3's runner (issue 37): the per-family data assignment (pinned, reproducible, each chunk
once, the unigram slice excluded, a budget the pool cannot give refused), `logp_correct`
against a naive loop over items, the `lstar-lab/3` record and its race rows (the contract's
keys), the one-size config, the pre-registration's sha256, and the reduced lab end to end
through the CLI (slow), resumed, then raced from a folder of candidate families."""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from monitor.errors import LabError

REPO_ROOT = Path(__file__).resolve().parent.parent
SAMPLE_POOL = REPO_ROOT / "data" / "lab-pool-sample"


def _pool() -> Path:
    path = Path(os.environ.get("LSTAR_LAB_POOL", SAMPLE_POOL))
    assert (path / "train" / "manifest.json").is_file(), f"no lab pool at {path} (data/lab-pool-sample is committed; LSTAR_LAB_POOL names another)"
    return path


@pytest.fixture(scope="module")
def sample_chunks():
    from monitor.lab.assignment import sourced_chunks
    from monitor.lab.pool import load_pool

    pool = load_pool(_pool())
    return pool, sourced_chunks(pool.train.documents, chunk_chars=600, oos_unigram_bytes=100_000)


def _stream(text, family: str, seed: int, total: int = 40_000, spread: float = 2.0):
    from monitor.lab.assignment import assigned_stream
    from monitor.lab.text import problems_to_twenty

    return assigned_stream(text, family, seed, total_bytes=total, spread=spread, problems=problems_to_twenty(),
                           problems_per_doc=8)


# -- the data assignment ----------------------------------------------------------------------------
def test_sourced_chunks_are_v2s_readable_chunks_with_their_sources(sample_chunks) -> None:
    from monitor.lab.pool import split_train

    pool, text = sample_chunks
    v2 = split_train(pool, chunk_chars=600, oos_unigram_bytes=100_000)
    assert text.chunks == v2.readable and text.unigram_slice == v2.unigram_slice
    assert set(text.sources) == {"dictionary", "documentation"}
    # the sources read straight from the documents: every chunk lies in a document of its slice
    by_slice = {s: "\n".join(d.text for d in pool.train.documents if d.slice == s) for s in set(text.sources)}
    assert all(chunk in by_slice[source] for chunk, source in zip(text.chunks[::25], text.sources[::25]))


def test_the_assignment_is_pinned_and_reproducible(sample_chunks) -> None:
    _, text = sample_chunks
    docs, a = _stream(text, "gpt2", 0)
    docs_again, again = _stream(text, "gpt2", 0)
    assert docs == docs_again and a == again
    # the pin: the sha256 over each chunk's sha256, in reading order, recomputed here
    digest = hashlib.sha256()
    for i in a.order:
        digest.update(hashlib.sha256(text.chunks[i].encode("utf-8")).digest())
    assert a.order_sha256 == digest.hexdigest() and a.sample == f"gpt2-s0-{a.order_sha256[:12]}"
    # each chunk at most once, none of the unigram slice, the documents are the chunks in order
    assert len(set(a.order)) == len(a.order)
    reserved = set(text.unigram_slice)
    assert not any(text.chunks[i] in reserved for i in a.order)
    assert [doc.split("\n")[4] == text.chunks[i].split("\n")[0] for doc, i in zip(docs, a.order)].count(False) == 0
    assert a.stream_bytes == sum(len(d.encode("utf-8")) for d in docs) >= 40_000
    record = a.as_record()
    assert record["chunks"] == len(docs) and abs(sum(record["weights"].values()) - 1.0) < 1e-12


def test_another_family_reads_other_data_and_another_seed_another_order(sample_chunks) -> None:
    from monitor.lab.assignment import mixture_weights

    _, text = sample_chunks
    _, a = _stream(text, "gpt2", 0)
    _, b = _stream(text, "smollm2", 0)
    _, c = _stream(text, "gpt2", 1)
    assert a.order_sha256 != b.order_sha256 and a.weights != b.weights
    assert c.weights == a.weights and c.order_sha256 != a.order_sha256     # seeds: same mixture, other order
    # the weights by hand: natural share x spread**(2u - 1), normalised
    natural = text.bytes_by_source()
    total = sum(natural.values())
    raw = {}
    for s, n in natural.items():
        u = int(hashlib.sha256(f"lab-v3-mixture:gpt2:{s}".encode()).hexdigest(), 16) / 2 ** 256
        raw[s] = n / total * 2.0 ** (2 * u - 1)
    assert a.weights == pytest.approx({s: w / sum(raw.values()) for s, w in raw.items()}, rel=1e-12)
    # spread 1: the natural mixture for every family
    assert mixture_weights("anything", natural, 1.0) == pytest.approx({s: n / total for s, n in natural.items()})
    # the realised mixture follows the weights to within a chunk or two
    shares = {s: n / sum(a.bytes_by_source.values()) for s, n in a.bytes_by_source.items()}
    assert shares == pytest.approx(a.weights, abs=0.03)


def test_a_budget_the_pool_cannot_give_is_refused(sample_chunks) -> None:
    _, text = sample_chunks
    available = sum(text.bytes_by_source().values())
    with pytest.raises(LabError) as info:
        _stream(text, "gpt2", 0, total=2 * available)
    line = info.value.one_line()
    assert "reads no chunk twice" in line and "'gpt2' seed 0" in line and "source" in line


# -- logp_correct -------------------------------------------------------------------------------------
def test_mean_logp_correct_against_a_hand_computation() -> None:
    from monitor.lab.tasks import mean_logp_correct

    # item 1: options with probabilities e^-1, e^-2, e^-2 (unnormalised); correct is the first:
    # log(e^-1 / (e^-1 + 2 e^-2)) = -log(1 + 2/e); item 2: two equal options, the answer has log 1/2
    value = mean_logp_correct([[-1.0, -2.0, -2.0], [-5.0, -5.0]], [0, 1])
    assert value == pytest.approx((-math.log(1 + 2 / math.e) + math.log(0.5)) / 2, rel=1e-12)
    with pytest.raises(LabError):
        mean_logp_correct([[-1.0]], [0, 0])


def test_score_tasks_logp_correct_equals_a_naive_loop_over_items(shared_dir: Path, tmp_path: Path) -> None:
    import torch

    from monitor.lab.model import VocabMap, build_compact_model
    from monitor.lab.model import ArchConfig
    from monitor.lab.race import RaceInputs, score_tasks
    from monitor.lab.tasks import ADD_TASK, POOL_CLOZE_TASK, addition_items, write_task
    from monitor.lab.text import problems_to_twenty
    from monitor.scoring import load_tokenizer

    handle = load_tokenizer(shared_dir / "tokenizers" / "gpt2")
    add = addition_items(problems_to_twenty())[::60]
    cloze = [{"id": "c0", "slice": "cloze", "context": "The cat sat quietly on the",
              "choices": [" mat", " moon", " tablecloth", " carpet"], "answer": 3},
             {"id": "c1", "slice": "cloze", "context": "A dictionary lists the meaning of each",
              "choices": [" word", " river", " planet", " engine"], "answer": 0}]
    texts = [it["context"] + c for it in add + cloze for c in it["choices"]]
    vocab = VocabMap.from_ids([*handle.encode_documents(texts), [handle.prefix_token_id]], handle.vocab_size)
    arch = ArchConfig(hidden=16, layers=1, heads=2, intermediate=32, context=64)
    model = build_compact_model(arch, vocab.n_used, 3).eval()
    files = {ADD_TASK: write_task(tmp_path / "add.jsonl", add), POOL_CLOZE_TASK: write_task(tmp_path / "c.jsonl", cloze)}
    inputs = RaceInputs(train=None, calib=[], heldout=[], add_items=add, cloze_items=cloze, unigram_slice=[],
                        provenance={}, task_files=files)
    out = score_tasks(model, handle, vocab, inputs, context=64, with_logp=True)

    prefix = int(vocab.to_compact([handle.prefix_token_id])[0])
    for name, items in ((ADD_TASK, add), (POOL_CLOZE_TASK, cloze)):
        per_item = []
        for it in items:
            option_lp = []
            for choice in it["choices"]:
                ctx = handle.tokenizer.encode(it["context"], add_special_tokens=False).ids
                whole = handle.tokenizer.encode(it["context"] + choice, add_special_tokens=False).ids
                seq = [prefix, *vocab.to_compact(whole).tolist()]
                with torch.no_grad():
                    logits = model(input_ids=torch.tensor([seq])).logits[0].double()
                logp = torch.log_softmax(logits, dim=-1)
                option_lp.append(sum(float(logp[pos - 1, seq[pos]]) for pos in range(1 + len(ctx), len(seq))))
            norm = math.log(sum(math.exp(v) for v in option_lp))
            per_item.append(option_lp[it["answer"]] - norm)
        assert out[name]["logp_correct"] == pytest.approx(sum(per_item) / len(per_item), abs=1e-5)
        k = len(items[0]["choices"])
        assert out[name]["baselines"]["logp_correct"] == pytest.approx(math.log(1 / k))
        assert out[name]["logp_correct"] <= 0.0
    # v2's call is unchanged: no logp_correct unless asked
    assert "logp_correct" not in score_tasks(model, handle, vocab, inputs, context=64)[ADD_TASK]


# -- the record and its rows ------------------------------------------------------------------------
def _text_scores(ce: float) -> dict[str, Any]:
    return {"ce": ce, "ce_uni": 6.0, "ce_uni_oos": 6.2, "lstar": ce - 6.0, "lstar_oos": ce - 6.2, "lstar_se": 0.05,
            "l_rel": ce / 6.0, "l_gain": 6.0 - ce, "bits_per_byte": ce * 0.3 / math.log(2),
            "unigram_bits_per_byte": 2.6, "bpb_minus_unigram": ce * 0.3 / math.log(2) - 2.6,
            "n_tokens": 1000, "n_bytes": 3300}


def _task(logp: float, k: int) -> dict[str, Any]:
    return {"acc": 0.3, "exact_match": 0.2, "p_correct": 0.25, "logp_correct": logp, "brier": 0.8, "n": 50,
            "baselines": {"acc": 1 / k, "exact_match": 0.0, "p_correct": 1 / k, "logp_correct": math.log(1 / k)}}


def _record() -> dict[str, Any]:
    from monitor.lab.records_v3 import LAB_SCHEMA_V3

    families, data, checkpoints = [], [], []
    for f_i, family in enumerate(("gpt2", "smollm2")):
        families.append({"family": family, "role": "primary", "tokenizer_fingerprint": f"fp-{family}",
                         "lossless": True, "round_trip": {"calib": {"documents": 216, "failing": 0}}, "reason": None,
                         "tokenizer_sha256": hashlib.sha256(family.encode()).hexdigest(),
                         "provenance": {"family": family}})
        for seed in (0, 1):
            pin = hashlib.sha256(f"{family}{seed}".encode()).hexdigest()
            sample = f"{family}-s{seed}-{pin[:12]}"
            data.append({"family": family, "seed": seed, "sample": sample, "spread": 2.0,
                         "weights": {"dictionary": 0.7, "documentation": 0.3},
                         "bytes_by_source": {"dictionary": 700, "documentation": 300},
                         "share_by_source": {"dictionary": 0.7, "documentation": 0.3}, "chunks": 3,
                         "stream_bytes": 1300, "order_sha256": pin, "rule": "test"})
            for step in (10, 20):
                checkpoints.append({"family": family, "size": "large", "seed": seed, "step": step,
                                    "bytes_seen": 100 * step, "tokens_seen": 30 * step, "vocab_used": 500,
                                    "path": f"{family}-large-s{seed}/step{step}",
                                    "texts": {"heldout": _text_scores(5.0 - step / 100 - f_i),
                                              "calib": _text_scores(7.0 - step / 100)},
                                    "tasks": {"add-words": _task(-3.0 + step / 100, 21), "cloze": _task(-1.2, 4)},
                                    "sample": sample})
    return {"schema": LAB_SCHEMA_V3, "config": {"version": 3}, "preregistration_sha256": None,
            "families": families, "data": data, "checkpoints": checkpoints}


def test_race_rows_v3_have_the_contracts_keys_and_values_from_the_record(tmp_path: Path) -> None:
    from monitor.lab.record_file import load_lab
    from monitor.lab.records import race_rows, write_lab
    from monitor.lab.records_v3 import LabRecordV3, race_rows_v3

    raw = _record()
    path = write_lab(LabRecordV3.model_validate(raw), tmp_path / "lab.json")
    record = load_lab(path)                      # the one loader reads every version
    assert isinstance(record, LabRecordV3)
    rows = race_rows_v3(record)
    assert len(rows) == 2 * len(raw["checkpoints"])
    assert {r["text"] for r in rows} == {"heldout", "calib"} and rows[0]["text"] == "heldout"
    for r in rows:
        assert set(r) == {"family", "seed", "step", "size", "bytes_seen", "tokens_seen", "text", "axes", "metrics",
                          "baselines", "data"}
        assert set(r["axes"]) == {"lstar", "lstar_oos", "bits_per_byte", "raw_ce", "bytes_seen", "tokens_seen"}
        for task in ("add-words", "cloze"):
            assert set(r["metrics"][task]) == set(r["baselines"][task]) == {"logp_correct", "p_correct", "acc",
                                                                              "exact_match"}
    # values read straight from the file
    ck = raw["checkpoints"][5]
    [row] = [r for r in rows if (r["family"], r["seed"], r["step"], r["text"]) ==
             (ck["family"], ck["seed"], ck["step"], "heldout")]
    assert row["axes"]["lstar"] == ck["texts"]["heldout"]["lstar"] and row["axes"]["raw_ce"] == ck["texts"]["heldout"]["ce"]
    assert row["axes"]["tokens_seen"] == ck["tokens_seen"] and row["data"] == {"sample": ck["sample"]}
    assert row["metrics"]["add-words"]["logp_correct"] == ck["tasks"]["add-words"]["logp_correct"]
    assert row["baselines"]["add-words"]["logp_correct"] == pytest.approx(-math.log(21))
    # the v2 reader does not mistake a v3 record for its own
    with pytest.raises(LabError, match="lstar-lab/2"):
        race_rows(record)


@pytest.mark.parametrize("edit, message", [
    (lambda r: r["checkpoints"][0].update(sample="gpt2-s0-000000000000"), "is not the data assignment"),
    (lambda r: r["checkpoints"][0].update(size="small"), "one model size"),
    (lambda r: r["data"].pop(0), "is not the data assignment"),
    (lambda r: r["data"][0]["weights"].update(dictionary=0.9), "sum to 1"),
    (lambda r: r["checkpoints"][0]["tasks"]["cloze"].update(logp_correct=0.1), "logp_correct"),
    (lambda r: r["checkpoints"][0]["tasks"]["cloze"]["baselines"].pop("logp_correct"), "baselines"),
    (lambda r: r.update(preregistration_sha256="not-a-sha"), "preregistration_sha256"),
    (lambda r: r["checkpoints"][0]["texts"]["heldout"].update(ce=float("nan")), "ce"),
])
def test_a_broken_v3_record_is_refused_in_one_line(edit, message: str, tmp_path: Path) -> None:
    from monitor.lab.record_file import load_lab

    raw = copy.deepcopy(_record())
    edit(raw)
    path = tmp_path / "lab.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(LabError) as info:
        load_lab(path)
    line = info.value.one_line()
    assert "\n" not in line and "lstar-lab/3" in line and message in line


def test_the_preregistration_sha256_is_none_until_the_file_exists(tmp_path: Path) -> None:
    from monitor.lab.race_v3 import preregistration_sha256

    path = tmp_path / "lab-v3-preregistration.json"
    assert preregistration_sha256(path) is None
    path.write_text('{"primary": "logp_correct"}\n')
    assert preregistration_sha256(path) == hashlib.sha256(path.read_bytes()).hexdigest()


# -- the config -------------------------------------------------------------------------------------
def test_the_v3_config_has_one_size_and_keeps_v2s_validators(shared_dir: Path, tmp_path: Path) -> None:
    from monitor.lab.config import V3_SIZE, SizeSpec, family_folders, race_v3_config

    config = race_v3_config(_pool(), shared_dir).validate()
    assert config.sizes == (V3_SIZE,) and config.seeds == (0, 1, 2) and config.eval_stride == 128
    assert config.lineage_settings("large").fractions == tuple(round(k / 6, 6) for k in range(1, 7))
    with pytest.raises(LabError, match="one model size"):
        config.with_(sizes=(V3_SIZE, SizeSpec("small", V3_SIZE.arch, 1_200_000))).validate()
    with pytest.raises(LabError, match="mixture_spread"):
        config.with_(mixture_spread=0.5).validate()
    with pytest.raises(LabError, match="seeds must be distinct"):       # v2's validator
        config.with_(seeds=(0, 0)).validate()
    # --families-dir: the tokenizer folders of a folder (others ignored)
    for name in ("b-bpe", "a-bpe"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "tokenizer.json").write_text((shared_dir / "tokenizers" / "gpt2" / "tokenizer.json").read_text())
    (tmp_path / "notes").mkdir()
    assert family_folders(tmp_path) in (("a-bpe", "b-bpe"), ("b-bpe", "a-bpe"))
    from_dir = race_v3_config(_pool(), shared_dir, families_dir=tmp_path).validate()
    assert set(from_dir.families) == {"a-bpe", "b-bpe"} and from_dir.tokenizer_dir("a-bpe") == tmp_path / "a-bpe"
    with pytest.raises(LabError, match="not a folder"):
        family_folders(tmp_path / "missing")


# -- end to end -------------------------------------------------------------------------------------
@pytest.mark.slow
def test_the_reduced_v3_lab_end_to_end(tmp_path: Path, shared_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`lstar lab run3 --size reduced`: two families, one tiny size, one seed; then a second
    sitting reuses every lineage and writes the same lab.json byte for byte; then a third, from a
    folder of candidate families (`--families-dir`), drops the lossy one and the near-duplicate,
    races the kept gpt2 and smollm2 and records the set. The secondary text is every 20th
    calib-v0 document (`--shared` a folder with the real tokenizers): scoring the whole of it was
    half of each lineage's CPU, and nothing here depends on its size. Every sitting scores the
    tests' cut of the task items (`support/lab_cut.py`: 24 of the 231 additions, 30 cloze
    items; the tasks were 19 of a lineage's 24-28 CPU-seconds): the checks below read the
    tasks' chance levels, that both texts' rows share them and that a resumed record is the
    same, none of which depends on how many items there are.

    The first sitting is a process of its own running the CLI's `main` (`python
    tests/support/lab_cut.py`, which makes the cut first) with two spawned workers, as a lab is
    run. The second and third run the same command line in this process with one worker (the
    lineages run in the command's own process: every one is reused, and each spawned worker only
    imported torch to find its scores.json); the byte-for-byte lab.json shows the worker count
    changes nothing. The third sitting's candidate gpt2 and smollm2 are copies of every file of
    shared/tokenizers' folders, so their lineages have the first sitting's keys (the tokenizer's
    files by content, the settings without where the inputs are) and are reused, not trained
    again: that reuse by content is part of what it checks."""
    from support.cli_run import lstar_in_process
    from support.lab_calib import shared_with_small_calib
    from support.lab_cut import ADD_EVERY, N_CLOZE, cut_lab
    from test_lab_v3_family_set import candidate_families

    from monitor.lab.record_file import load_lab
    from monitor.lab.records_v3 import LabRecordV3, race_rows_v3

    shared_dir = shared_with_small_calib(shared_dir, tmp_path / "shared", every=20)
    cut_lab(monkeypatch.setattr)          # for the sittings in this process
    out = tmp_path / "lab"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LSTAR_LAB_KILL")}
    env["DISABLE_SAFETENSORS_CONVERSION"] = "1"
    args = ["lab", "run3", "--size", "reduced", "--out", str(out), "--pool", str(_pool()), "--shared", str(shared_dir),
            "--json"]
    cmd = [sys.executable, str(REPO_ROOT / "tests" / "support" / "lab_cut.py"), *args, "--workers", "2"]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    first = (out / "lab.json").read_bytes()
    record = load_lab(out)
    assert isinstance(record, LabRecordV3)
    assert record.family_names() == ["gpt2", "smollm2"]
    assert all(f.lossless and f.role == "primary" and f.provenance and f.provenance["family"] == f.family
               for f in record.families)
    assert [(d.family, d.seed) for d in record.data] == [("gpt2", 0), ("smollm2", 0)]
    assert len({d.order_sha256 for d in record.data}) == 2 and len({tuple(d.weights.values()) for d in record.data}) == 2
    assert record.preregistration_sha256 is None or len(record.preregistration_sha256) == 64
    assert record.config["version"] == 3 and record.config["texts"]["heldout"].startswith("primary")
    assert record.config["heldout_text"]["selection"].startswith("stratified by source")
    # the cut took effect in the first sitting's process
    assert record.config["tasks"]["add-words"]["items"] == len(range(0, 231, ADD_EVERY)) == 24
    assert record.config["tasks"]["cloze"]["items"] == N_CLOZE
    rows = race_rows_v3(record)
    assert json.loads(proc.stdout) == rows
    assert len(rows) == 2 * len(record.checkpoints) == 2 * 2 * 2
    for r in rows:
        for task, k in (("add-words", 21), ("cloze", 4)):
            assert r["baselines"][task]["logp_correct"] == pytest.approx(-math.log(k))
            assert r["metrics"][task]["logp_correct"] <= 0.0
    # a family's heldout and calib rows share the task scores and differ in the axes
    by_key: dict[tuple, dict[str, dict]] = {}
    for r in rows:
        by_key.setdefault((r["family"], r["step"]), {})[r["text"]] = r
    for pair in by_key.values():
        assert pair["heldout"]["metrics"] == pair["calib"]["metrics"]
        assert pair["heldout"]["axes"]["lstar"] != pair["calib"]["axes"]["lstar"]
    # bytes seen differ between families at the same step (their own data)
    last = {r["family"]: r["bytes_seen"] for r in rows if r["step"] == max(x["step"] for x in rows if x["family"] == r["family"])}
    assert len(set(last.values())) == 2
    # the second sitting reuses every lineage: none is trained or scored again
    lineages = ("gpt2-large-s0", "smollm2-large-s0")
    for lineage in lineages:
        assert (out / lineage / "timing.json").is_file()
    written = {p: (p.stat().st_mtime_ns, p.read_bytes()) for name in lineages
               for p in (out / name / "scores.json", out / name / "timing.json")}
    unset = {k: None for k in os.environ if k.startswith("LSTAR_LAB_KILL")}
    proc = lstar_in_process(*args, "--workers", "1", env={**unset, "DISABLE_SAFETENSORS_CONVERSION": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (out / "lab.json").read_bytes() == first
    assert {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in written} == written
    _check_a_sitting_elsewhere_reuses_the_record(args, out, first, lineages, shared_dir, tmp_path)

    # a third sitting from a folder of candidates: the family set is checked first, the kept
    # families are raced (their lineages reused by content) and the record keeps the set
    families_dir = candidate_families(shared_dir, tmp_path / "families")
    proc = lstar_in_process(*args, "--families-dir", str(families_dir), "--workers", "1",
                            env={**unset, "DISABLE_SAFETENSORS_CONVERSION": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in written} == written
    record = load_lab(out)
    assert record.family_names() == ["gpt2", "smollm2"]
    assert record.family_set is not None and record.family_set.kept == ["gpt2", "smollm2"]
    assert set(record.family_set.dropped) == {"pool-bpe-1k", "gpt2-merges-8k"} and record.family_set.cutoff == 0.96
    assert json.loads(proc.stdout) == race_rows_v3(record)


def _check_a_sitting_elsewhere_reuses_the_record(args: list[str], out: Path, first: bytes, lineages: tuple[str, ...],
                                                 shared_dir: Path, tmp_path: Path) -> None:
    """A sitting on another machine: an empty folder given the first sitting's lab.json
    (`--reuse`) takes every lineage from it, writing the first sitting's scores.json byte for
    byte (its key recomputed from this run's inputs) and the same lab.json, and trains and
    scores nothing (no timing.json). A record whose lineage differs from this run in a setting,
    the tokenizer's files or the data assignment gives that lineage nothing."""
    from support.cli_run import lstar_in_process

    from monitor.lab.config import race_v3_reduced_config
    from monitor.lab.race_v3 import lineage_key_v3, prepare_race_v3
    from monitor.lab.reuse_v3 import read_reusable_record, reuse_lineages

    elsewhere = tmp_path / "elsewhere"
    moved = [str(elsewhere) if a == str(out) else a for a in args]
    proc = lstar_in_process(*moved, "--reuse", str(out / "lab.json"), "--workers", "1",
                            env={"DISABLE_SAFETENSORS_CONVERSION": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (elsewhere / "lab.json").read_bytes() == first
    for lineage in lineages:
        assert (elsewhere / lineage / "scores.json").read_bytes() == (out / lineage / "scores.json").read_bytes()
        assert not (elsewhere / lineage / "timing.json").exists()

    config = race_v3_reduced_config(_pool(), shared_dir).validate()
    inputs = prepare_race_v3(config, tmp_path / "inputs")
    record = read_reusable_record(out / "lab.json")
    record["config"]["lr"] = record["config"]["lr"] * 2
    target = tmp_path / "tampered"
    outcome = reuse_lineages(config, inputs, record, target, lambda f, s: lineage_key_v3(config, f, s, inputs))
    assert outcome == {name: "not reused: setting lr differs" for name in lineages}
    record = read_reusable_record(out / "lab.json")
    record["families"][0]["tokenizer_sha256"] = "0" * 64
    record["data"][1]["order_sha256"] = "0" * 64
    outcome = reuse_lineages(config, inputs, record, target, lambda f, s: lineage_key_v3(config, f, s, inputs))
    assert outcome == {lineages[0]: "not reused: tokenizer files differ",
                       lineages[1]: "not reused: data assignment differs"}
    assert not target.exists() or not any(target.glob("*/scores.json"))
