"""Lab v2: the reduced race trained for real (through the CLI), one checkpoint of every family
against an independent float64 computation over its saved safetensors checkpoint, the
losslessness refusal, resuming a lab split over two sittings to the same lab.json, the
pool's reading order, and the record's rows."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from monitor.errors import LabError

REPO_ROOT = Path(__file__).resolve().parent.parent
SAMPLE_POOL = REPO_ROOT / "data" / "lab-pool-sample"
FAMILIES = ("gpt2", "smollm2")


def _pool() -> Path:
    """The committed pool sample (or LSTAR_LAB_POOL, a folder of the same layout)."""
    path = Path(os.environ.get("LSTAR_LAB_POOL", SAMPLE_POOL))
    if not (path / "train" / "manifest.json").is_file():
        pytest.skip(f"no lab pool at {path} (data/lab-pool-sample, or set LSTAR_LAB_POOL)")
    return path


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LSTAR_LAB_KILL")}
    env["DISABLE_SAFETENSORS_CONVERSION"] = "1"
    return env


# The module's race scores every 40th document of calib-v0 (6 documents, 22,591 bytes) instead
# of all 216: scoring the whole corpus at each of the 8 checkpoints was half of the race's CPU,
# and every check below (the whole of the calib corpus given is scored, its unigram baseline,
# the rows) holds for any calib corpus; the numbers are compared against that corpus's own
# files. Every 20th (11 documents, 36,588 bytes) cost 6.6 CPU-seconds of scoring over the 8
# checkpoints, every 40th 3.8 (measured in one warm process, under load).
CALIB_EVERY = 40
# The module's race scores every 30th addition (8 of 231) and 10 cloze items, fewer than the
# other lab tests' cut (support/lab_cut.py: 24 and 30): what is checked (every item given is
# scored, the options' chance level, the item counts in lab.json) holds for any number of them.
# The tasks at the 8 checkpoints cost 8.8 CPU-seconds with 24 and 30 items, 2.7 with 8 and 10.
ADD_EVERY = 30
N_CLOZE = 10
# And its lineages train on half the reduced race's byte budgets (30,000 and 40,000 bytes, still
# two checkpoints each and the small budget below the large): no check reads how well a model
# learnt, only that its checkpoints are ordinary models scored as the spec says. Training the
# four lineages on the whole budgets cost 8-12 CPU-seconds.
BUDGET_DIVISOR = 2
# The race's held-out text is its first 2 documents (7,733 bytes, 2,321 gpt2 tokens, many windows
# each) instead of 6 (22,545 bytes, 7,348 tokens) for the reduced race's 20,000 bytes: the float64
# reference loop over the held-out text costs in proportion (23 against 7.5 CPU-seconds a family,
# measured under load with a model of the small size's shape), and its comparison with the
# race's scores is the same for any documents that cross windows.
HELDOUT_BYTES = 5_000


@pytest.fixture(scope="module")
def race_shared(tmp_path_factory: pytest.TempPathFactory, shared_dir: Path) -> Path:
    """A `--shared` folder: the real tokenizers, and every CALIB_EVERY-th calib-v0 document."""
    from support.lab_calib import shared_with_small_calib

    return shared_with_small_calib(shared_dir, tmp_path_factory.mktemp("race-shared") / "shared", every=CALIB_EVERY)


@pytest.fixture(scope="module")
def race_dir(tmp_path_factory: pytest.TempPathFactory, race_shared: Path) -> Path:
    """`lstar lab run --size reduced`: gpt2 and smollm2, two sizes, one seed. With
    LSTAR_LAB_RACE_OUT the lab goes there (and a finished one there is resumed, not retrained).

    One worker: the lineages train in this one process. With two, each lineage is a spawned
    process that imports torch again (about 5 CPU-seconds each); that path is taken by the
    uninterrupted race of the split-sittings test below, whose lab.json must equal the one a
    single process resumes.

    The command runs in this process (`lstar_in_process`, then torch's settings put back):
    nothing here reads how a process starts, and a child imported torch, its compiler stack and
    transformers again, which the tests below import here anyway. It runs with the tests' cut
    (`support/lab_cut.py`), here of ADD_EVERY and N_CLOZE (the reduced race's own item counts
    are checked on its inputs in the record test), HELDOUT_BYTES of held-out text and the
    budgets divided by BUDGET_DIVISOR."""
    import dataclasses

    from support.cli_run import lstar_in_process
    from support.lab_cut import cut_lab
    from support.script_run import torch_settings_kept

    from monitor.lab.config import race_reduced_config

    sizes = tuple(dataclasses.replace(s, byte_budget=s.byte_budget // BUDGET_DIVISOR)
                  for s in race_reduced_config(_pool(), race_shared).sizes)
    out = Path(os.environ["LSTAR_LAB_RACE_OUT"]) if os.environ.get("LSTAR_LAB_RACE_OUT") \
        else tmp_path_factory.mktemp("race") / "lab"
    with pytest.MonkeyPatch.context() as patch, torch_settings_kept():
        cut_lab(patch.setattr, add_every=ADD_EVERY, n_cloze=N_CLOZE, heldout_bytes=HELDOUT_BYTES, sizes=sizes)
        proc = lstar_in_process("lab", "run", "--size", "reduced", "--out", out, "--pool", _pool(),
                                "--shared", race_shared, "--workers", "1", "--json",
                                env={**{k: None for k in os.environ if k.startswith("LSTAR_LAB_KILL")},
                                     "DISABLE_SAFETENSORS_CONVERSION": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


@pytest.mark.slow
def test_reduced_race_record_and_rows(race_dir: Path, race_shared: Path, tmp_path: Path) -> None:
    from monitor.lab.config import race_reduced_config
    from monitor.lab.race import prepare_race
    from monitor.lab.record_file import load_lab
    from monitor.lab.records import LabRecordV2, race_rows

    # the reduced race's own inputs: every addition and 300 cloze items
    inputs = prepare_race(race_reduced_config(_pool(), race_shared), tmp_path)
    assert len(inputs.add_items) == 231 and len(inputs.cloze_items) >= 300
    n_add = len(inputs.add_items[::ADD_EVERY])
    record = load_lab(race_dir)
    assert isinstance(record, LabRecordV2)
    assert record.family_names() == list(FAMILIES)
    assert all(f.role == "primary" and f.lossless for f in record.families)
    config = record.config
    # the fixture's race scored its cut of them (ADD_EVERY, N_CLOZE), all of it
    assert config["tasks"]["add-words"]["items"] == n_add == 8 and config["tasks"]["cloze"]["items"] == N_CLOZE
    assert config["calib_corpus"]["selection"] == "all"
    rows = race_rows(record)
    assert len(rows) == 2 * len(record.checkpoints)
    # the bytes of the calib corpus's documents, read straight from its file
    with open(race_shared / "corpus" / "calib-v0" / "documents.jsonl", encoding="utf-8") as fh:
        calib_bytes = sum(len(json.loads(line)["text"].encode("utf-8")) for line in fh)
    assert calib_bytes > 20_000
    for family in FAMILIES:
        for size in ("small", "large"):
            cks = sorted((c for c in record.checkpoints if c.family == family and c.size == size),
                         key=lambda c: c.step)
            assert len(cks) == 2 and all(a.bytes_seen < b.bytes_seen for a, b in zip(cks, cks[1:]))
            for ck in cks:
                add, cloze = ck.tasks["add-words"], ck.tasks["cloze"]
                assert add.n == n_add and cloze.n == N_CLOZE
                assert add.baselines["acc"] == pytest.approx(1 / 21) and cloze.baselines["acc"] == 0.25
                calib = ck.texts["calib"]
                # the whole of the calib corpus is scored (no every:k selection)
                assert calib.n_bytes == calib_bytes
                for scores in ck.texts.values():
                    assert scores.lstar == pytest.approx(scores.ce - scores.ce_uni)
                    assert scores.lstar_oos == pytest.approx(scores.ce - scores.ce_uni_oos)
                    # a smoothed unigram fitted elsewhere never beats the in-sample ML unigram
                    assert scores.ce_uni_oos > scores.ce_uni
    # the small and the large model of a family differ in budget: bytes seen is not a shared clock
    small = max(c.bytes_seen for c in record.checkpoints if c.size == "small")
    large = max(c.bytes_seen for c in record.checkpoints if c.size == "large")
    assert small < large
    row = rows[0]
    assert set(row) == {"family", "size", "seed", "step", "bytes_seen", "tokens_seen", "text", "axes",
                        "metrics", "baselines"}
    assert set(row["axes"]) == {"lstar", "lstar_oos", "bits_per_byte", "raw_ce", "l_rel", "l_gain",
                                "bpb_minus_unigram", "bytes_seen"}
    assert set(row["metrics"]) == {"add-words", "cloze"} == set(row["baselines"])
    assert {r["text"] for r in rows} == {"heldout", "calib"}
    json.dumps(rows, allow_nan=False)


def _naive_float64(checkpoint: Path, tokenizer_dir: Path, texts: list[str], window: int) -> dict[str, float]:
    """CE (float64, full vocabulary, the saved checkpoint as an ordinary model), the in-sample
    unigram CE, L* and bits/byte of `texts`, each document after the prefix token; position q is
    predicted from the spec's window: the first window reads tokens 0..L-1, each later one the
    L tokens ending at its last scored position, advancing by L/2."""
    import torch
    from transformers import AutoModelForCausalLM

    from monitor.scoring import load_tokenizer

    handle = load_tokenizer(tokenizer_dir)
    model = AutoModelForCausalLM.from_pretrained(checkpoint, torch_dtype=torch.float64).eval()
    stride = window // 2
    nll, n_tok, counts = 0.0, 0, {}
    with torch.no_grad():
        for text in texts:
            seq = [handle.prefix_token_id] + handle.tokenizer.encode(text, add_special_tokens=False).ids
            for t in seq[1:]:
                counts[t] = counts.get(t, 0) + 1
            last = len(seq) - 1
            q = 1
            end = min(window, last)
            start = 0
            while q <= last:
                if q > end:                       # the next window: L tokens ending stride later
                    end = min(end + stride, last)
                    start = end - window
                # positions q..end are predicted from the window's last end - q + 1 rows (tokens
                # q-1..end-1): only those rows go through the output layer, and each row's
                # log-softmax normaliser is taken in one call over them (a call per position over
                # the full vocabulary in float64 was most of this test's CPU)
                logits = model(input_ids=torch.tensor([seq[start:end]]), logits_to_keep=end - q + 1).logits[0]
                targets = torch.tensor(seq[q:end + 1])
                nll -= float((logits.gather(1, targets[:, None])[:, 0] - torch.logsumexp(logits, dim=-1)).sum())
                n_tok += end - q + 1
                q = end + 1
    c = np.array(list(counts.values()), dtype=np.float64)
    ce_uni = float(-(c / c.sum() * np.log(c / c.sum())).sum())
    n_bytes = sum(len(t.encode("utf-8")) for t in texts)
    return {"ce": nll / n_tok, "ce_uni": ce_uni, "lstar": nll / n_tok - ce_uni,
            "bits_per_byte": nll / n_bytes / math.log(2), "n_tokens": n_tok}


@pytest.mark.slow
def test_one_checkpoint_per_family_matches_an_independent_float64_loop(race_dir: Path, race_shared: Path) -> None:
    from monitor.lab.pool import heldout_texts, load_pool
    from monitor.lab.record_file import load_lab
    from monitor.scoring import load_corpus, load_tokenizer
    from monitor.scoring.metrics import scored_token_counts, unigram_ce

    record = load_lab(race_dir)
    config = record.config
    assert config["heldout_bytes"] == HELDOUT_BYTES
    texts = heldout_texts(load_pool(config["pool"]["path"]), config["heldout_bytes"])
    shared_dir = race_shared            # the race's calib corpus; its tokenizers are shared/'s
    calib = [d.text for d in load_corpus(shared_dir / "corpus" / "calib-v0").documents]
    for family in FAMILIES:
        ck = max((c for c in record.checkpoints if c.family == family and c.size == "small"), key=lambda c: c.step)
        window = next(s for s in config["sizes"] if s["name"] == "small")["arch"]["context"]
        ref = _naive_float64(race_dir / ck.path, shared_dir / "tokenizers" / family, texts, window)
        # the cut keeps what the comparison needs: several documents, more than two windows each on average
        assert len(texts) >= 2 and ref["n_tokens"] > 2 * len(texts) * window
        got = ck.texts["heldout"]
        assert got.n_tokens == ref["n_tokens"]
        for key in ("ce", "ce_uni", "lstar", "bits_per_byte"):
            assert getattr(got, key) == pytest.approx(ref[key], abs=2e-5), (family, key)
        # the baseline of the calib text is the in-sample unigram of the whole corpus
        handle = load_tokenizer(shared_dir / "tokenizers" / family)
        c = np.bincount(np.concatenate([handle.tokenizer.encode(t, add_special_tokens=False).ids for t in calib]))
        assert ck.texts["calib"].ce_uni == pytest.approx(float(-(c[c > 0] / c.sum() * np.log(c[c > 0] / c.sum())).sum()),
                                                         abs=1e-9)
        assert ck.texts["calib"].ce_uni == pytest.approx(unigram_ce(scored_token_counts(
            handle.encode_documents(calib), handle.prefix_policy)), abs=1e-12)


def _inputs(shared_dir: Path, texts: list[str]):
    from monitor.lab.pool import TrainText
    from monitor.lab.race import RaceInputs

    return RaceInputs(train=TrainText(tuple(texts), ()), calib=texts, heldout=texts, add_items=[], cloze_items=[],
                      unigram_slice=[], provenance={}, task_files={})


def test_a_lossy_tokenizer_is_refused_from_the_race_with_its_reason(shared_dir: Path, tmp_path: Path) -> None:
    from monitor.lab.config import RaceConfig
    from monitor.lab.race import family_checks
    from monitor.scoring import load_corpus

    texts = [d.text for d in load_corpus(shared_dir / "corpus" / "calib-v0").documents[::20]]
    base = RaceConfig(pool=tmp_path, tokenizers_dir=shared_dir / "tokenizers",
                      calib_corpus=shared_dir / "corpus" / "calib-v0")
    with pytest.raises(LabError) as info:
        family_checks(base.with_(families=("gpt2", "bert-base-uncased")), _inputs(shared_dir, texts))
    line = info.value.one_line()
    assert "\n" not in line and "'bert-base-uncased' is lossy" in line and "100.0% fail" in line
    assert "calib 11/11" in line and "--stress-families" in line
    # the same tokenizer runs as a labelled stress test, with its reason; gpt2 is lossless
    rows = family_checks(base.with_(families=("gpt2",), stress_families=("bert-base-uncased", "spm-unigram-toy")),
                         _inputs(shared_dir, texts))
    assert [(r["family"], r["role"], r["lossless"]) for r in rows] == [
        ("gpt2", "primary", True), ("bert-base-uncased", "stress", False), ("spm-unigram-toy", "stress", False)]
    assert rows[0]["reason"] is None and "lossy" in rows[2]["reason"]
    assert rows[0]["round_trip"]["calib"] == {"documents": 11, "failing": 0}


def test_each_lineage_reads_the_train_text_once_in_its_seeds_order(tmp_path: Path) -> None:
    from monitor.lab.pool import TrainText, build_lineage_stream
    from monitor.lab.text import problems_to_twenty

    chunks = tuple(f"chunk {i} " + "x" * (50 + i) for i in range(200))
    text = TrainText(chunks, ())
    problems = problems_to_twenty()
    total = sum(len(c) for c in chunks)
    a = build_lineage_stream(text, total_bytes=total // 2, seed=0, problems=problems, problems_per_doc=4)
    again = build_lineage_stream(text, total_bytes=total // 2, seed=0, problems=problems, problems_per_doc=4)
    b = build_lineage_stream(text, total_bytes=total // 2, seed=1, problems=problems, problems_per_doc=4)
    read = [doc.split("\n")[2] for doc in a]
    assert a == again and a != b
    assert len(read) == len(set(read))                       # no chunk twice
    assert read != sorted(read, key=lambda c: int(c.split()[1]))   # not in corpus order
    # a budget larger than the text is refused: the lab reads no byte twice
    with pytest.raises(LabError, match="reads no byte twice"):
        build_lineage_stream(text, total_bytes=2 * total, seed=0, problems=problems, problems_per_doc=4)


def test_race_rows_refuse_a_version_1_record() -> None:
    from monitor.lab.records import LAB_SCHEMA, LabRecord, race_rows

    v1 = LabRecord.model_validate({"schema": LAB_SCHEMA, "config": {}, "families": [], "checkpoints": []})
    with pytest.raises(LabError) as info:
        race_rows(v1)
    assert "lstar-lab/2" in info.value.one_line()


# Resuming is checked on less work: one family and size, every 40th calib-v0 document (6), 10
# cloze items, every 30th of the 231 addition items (8), 5,000 held-out bytes, a 20,000-byte
# unigram slice and a 20,000-byte training budget (two checkpoints); the lab's own sizes are the
# module fixture's. Whether a finished lineage is reused and the lab.json comes out byte for byte
# the same does not depend on how much text each lineage trains on or each checkpoint scores.
# The additions are cut where the race builds them (`prepare_race`, in the process that runs
# `run_race`; spawned workers get the items with the race's inputs): the race has no setting for
# their number, and scoring all 231 x 21 options and 231 greedy decodes at each of the 8
# checkpoints this test scores was most of its CPU. A lineage trained and scored with 24
# additions and every 20th calib document in 3.6 CPU-seconds, with 8 and every 40th in 2.9
# (measured in a warm process, under load); the test runs four (two in spawned workers, one
# killed, one resumed), and the spawned and killed processes' imports are most of the rest.
RESUME = textwrap.dedent("""
    import dataclasses
    import sys
    from pathlib import Path
    import monitor.lab.race
    from monitor.lab.config import race_reduced_config
    from monitor.lab.race import run_race
    from monitor.lab.tasks import addition_items
    if __name__ == "__main__":
        monitor.lab.race.addition_items = lambda problems: addition_items(problems)[::30]
        config = race_reduced_config(Path(sys.argv[2]), Path(sys.argv[3]), families=("gpt2",), seeds=(0, 1),
                                     calib_corpus=Path(sys.argv[4]), n_cloze=10, heldout_bytes=5_000,
                                     oos_unigram_bytes=20_000)
        config = config.with_(sizes=(dataclasses.replace(config.sizes[0], byte_budget=20_000),))
        run_race(config, Path(sys.argv[1]), workers=int(sys.argv[5]), progress=False)
""")


@pytest.mark.slow
def test_a_race_split_over_two_sittings_writes_the_same_lab_json(tmp_path: Path, shared_dir: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from support.lab_calib import calib_subset
    from support.script_run import run_script

    import monitor.lab.race

    script = tmp_path / "race.py"
    script.write_text(RESUME)
    pool = _pool()
    calib = calib_subset(shared_dir / "corpus" / "calib-v0", tmp_path / "calib", every=40)

    def run(out: Path, kill_after: int | None = None, workers: int = 1) -> subprocess.CompletedProcess:
        env = _env()
        if kill_after:
            env["LSTAR_LAB_KILL_AFTER_LINEAGES"] = str(kill_after)
        return subprocess.run([sys.executable, str(script), str(out), str(pool), str(shared_dir), str(calib),
                               str(workers)], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=1800)

    # The uninterrupted race on two workers (a spawned process per lineage), the split one in one
    # process (the kill between lineages needs that): the lab.json must not depend on either.
    whole = run(tmp_path / "whole", workers=2)
    assert whole.returncode == 0, whole.stderr[-2000:]
    first = run(tmp_path / "split", kill_after=1)
    assert first.returncode == -9, first.stderr[-2000:]
    assert not (tmp_path / "split" / "lab.json").exists()
    done = sorted(p.parent.name for p in (tmp_path / "split").glob("*/scores.json"))
    assert len(done) == 1
    kept = (tmp_path / "split" / done[0] / "scores.json").stat().st_mtime_ns
    # the second sitting in this process (support/script_run.py): it resumes, nothing kills it,
    # and as a child it used 12.7 CPU-seconds against 5.5 in a process that had imported torch
    # and transformers, as the float64 test above does (the same lab.json either way)
    run_script(script, [tmp_path / "split", pool, shared_dir, calib, 1], monkeypatch,
               env={**{k: None for k in os.environ if k.startswith("LSTAR_LAB_KILL")},
                    "DISABLE_SAFETENSORS_CONVERSION": "1"},
               replaced=[(monitor.lab.race, "addition_items")])
    # the finished lineage was reused, not retrained or rescored
    assert (tmp_path / "split" / done[0] / "scores.json").stat().st_mtime_ns == kept
    assert (tmp_path / "split" / "lab.json").read_bytes() == (tmp_path / "whole" / "lab.json").read_bytes()
    # the race scored the cut addition task (the script's cut took effect in the race's inputs)
    assert json.loads((tmp_path / "whole" / "lab.json").read_text())["config"]["tasks"]["add-words"]["items"] == 8


@pytest.mark.slow
def test_race_checkpoints_are_ordinary_full_vocabulary_models(race_dir: Path) -> None:
    import torch

    from monitor.lab.model import UNUSED_BIAS
    from monitor.lab.record_file import load_lab
    from monitor.scoring.loader import load_checkpoint
    from monitor.scoring.tokenizer import load_tokenizer

    record = load_lab(race_dir)
    for family in record.families:
        ck = max((c for c in record.checkpoints if c.family == family.family), key=lambda c: c.step)
        loaded = load_checkpoint(str(race_dir / ck.path), dtype="float32", device="cpu")
        handle = load_tokenizer(race_dir / ck.path)
        assert loaded.vocab_size == handle.vocab_size
        assert handle.fingerprint == family.tokenizer_fingerprint
        bias = loaded.model.lm_head.bias
        assert int((bias == UNUSED_BIAS).sum()) == handle.vocab_size - ck.vocab_used
        ids = torch.tensor([handle.tokenizer.encode("def f(x): return x", add_special_tokens=False).ids])
        probs = torch.softmax(loaded.model(input_ids=ids).logits[0], dim=-1)
        assert float(probs[:, bias == UNUSED_BIAS].sum()) == 0.0


def test_a_lineage_key_follows_contents_not_locations(tmp_path: Path, shared_dir: Path) -> None:
    """A lab resumed with its pool copied to another folder and `--shared` spelt another way
    reuses its scored lineages (same key); another tokenizer file or another setting does not."""
    import shutil

    from monitor.lab.config import race_reduced_config
    from monitor.lab.race import lineage_key, prepare_race

    pool = _pool()
    moved = tmp_path / "elsewhere" / "pool"
    shutil.copytree(pool, moved)
    (tmp_path / "link").symlink_to(shared_dir.resolve())
    config = race_reduced_config(pool, shared_dir)
    other = race_reduced_config(moved, tmp_path / "link" / "tokenizers" / "..")
    assert config.as_dict() != other.as_dict()                 # the paths differ ...
    key = lineage_key(config, "gpt2", "small", 0, prepare_race(config, tmp_path / "a"))
    inputs = prepare_race(other, tmp_path / "b")
    assert lineage_key(other, "gpt2", "small", 0, inputs) == key   # ... the key does not
    assert lineage_key(other, "gpt2", "small", 1, inputs) != key
    assert lineage_key(other.with_(lr=other.lr * 2), "gpt2", "small", 0, inputs) != key
    # a tokenizer whose files changed is another input
    tokenizers = tmp_path / "tokenizers"
    shutil.copytree(shared_dir / "tokenizers" / "gpt2", tokenizers / "gpt2")
    with open(tokenizers / "gpt2" / "tokenizer_config.json", "a") as handle:
        handle.write("\n")
    assert lineage_key(other.with_(tokenizers_dir=tokenizers), "gpt2", "small", 0, inputs) != key
