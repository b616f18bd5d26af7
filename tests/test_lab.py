"""The emergence lab's shared machinery (version 1's training loop, which lab v2 and
`lstar demo` use): resuming a lineage killed mid-training, a checkpoint's files, the addition
table, the seeded stream, and refusals of bad lab input. Lab v2 end to end is
tests/test_lab_race.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from monitor.errors import LabError
from monitor.lab.record_file import load_lab
from monitor.lab.records import LAB_SCHEMA, parse_lab

REPO_ROOT = Path(__file__).resolve().parent.parent
FAMILIES = ("gpt2", "spm-unigram-toy")


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "LSTAR_LAB_KILL_AT_STEP"}
    env["DISABLE_SAFETENSORS_CONVERSION"] = "1"
    return env


TINY_TRAIN = textwrap.dedent("""
    import sys
    from pathlib import Path
    from monitor.lab.config import reduced_config
    from monitor.lab.model import ArchConfig
    from monitor.lab.pipeline import train_lab
    if __name__ == "__main__":
        shared = Path(sys.argv[2])
        config = reduced_config(families=("spm-unigram-toy",), byte_budget=30_000,
                                arch=ArchConfig(hidden=32, layers=1, heads=2, intermediate=64, context=32),
                                fractions=(0.25, 0.5, 1.0), warmup_steps=3,
                                lr=float(sys.argv[3]) if len(sys.argv) > 3 else 3e-3,
                                tokenizers_dir=shared / "tokenizers",
                                text_corpus=shared / "corpus" / "calib-v0-alt",
                                calib_corpus=shared / "corpus" / "calib-v0",
                                cloze_task=shared / "tasks" / "cloze-v0.jsonl")
        print(train_lab(config, Path(sys.argv[1]), workers=1, progress=False))
""")


def _train_tiny(out: Path, shared: Path, script: Path, kill_at: int | None = None,
                extra: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    env = _env()
    if kill_at is not None:
        env["LSTAR_LAB_KILL_AT_STEP"] = str(kill_at)
    return subprocess.run([sys.executable, str(script), str(out), str(shared), *extra], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_a_lineage_killed_mid_training_resumes_to_the_same_weights(tmp_path: Path, shared_dir: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from safetensors.torch import load_file
    from support.script_run import run_script

    script = tmp_path / "tiny_train.py"
    script.write_text(TINY_TRAIN)
    whole = _train_tiny(tmp_path / "whole", shared_dir, script)
    assert whole.returncode == 0, whole.stderr[-2000:]
    lineage = tmp_path / "whole" / "spm-unigram-toy-s0"
    steps = sorted(int(p.name[4:]) for p in lineage.glob("step*"))
    assert len(steps) == 3
    # SIGKILL between the second and the last checkpoint
    kill_at = steps[1] + (steps[2] - steps[1]) // 2
    killed = _train_tiny(tmp_path / "resumed", shared_dir, script, kill_at=kill_at)
    assert killed.returncode == -9, killed.stderr[-2000:]
    resumed_lineage = tmp_path / "resumed" / "spm-unigram-toy-s0"
    assert sorted(int(p.name[4:]) for p in resumed_lineage.glob("step*")) == steps[:2]
    kept = {s: (resumed_lineage / f"step{s}" / "model.safetensors").stat().st_mtime_ns for s in steps[:2]}
    again = _train_tiny(tmp_path / "resumed", shared_dir, script)
    assert again.returncode == 0, again.stderr[-2000:]
    # it resumed from the last saved state instead of training again from step 0
    assert {s: (resumed_lineage / f"step{s}" / "model.safetensors").stat().st_mtime_ns for s in steps[:2]} == kept
    for step in steps:
        a = load_file(lineage / f"step{step}" / "model.safetensors")
        b = load_file(resumed_lineage / f"step{step}" / "model.safetensors")
        assert a.keys() == b.keys()
        for key in a:
            assert bool((a[key] == b[key]).all()), (step, key)

    # the same folder with another learning rate: the saved state is refused, not resumed. The
    # script runs in this process (support/script_run.py): what is checked is the refusal, not
    # a process's start (as a fourth child it used 9.7 CPU-seconds, here 4.9 where torch alone
    # was imported before and 0.6 where transformers was too)
    weights = (lineage / f"step{steps[-1]}" / "model.safetensors").read_bytes()
    with pytest.raises(LabError) as info:
        run_script(script, [tmp_path / "whole", shared_dir, "0.001"], monkeypatch,
                   env={"LSTAR_LAB_KILL_AT_STEP": None, "DISABLE_SAFETENSORS_CONVERSION": "1"})
    assert "was saved by a lab with other settings" in str(info.value) and "spm-unigram-toy-s0" in str(info.value)
    assert (lineage / f"step{steps[-1]}" / "model.safetensors").read_bytes() == weights


def test_the_addition_table_and_its_items() -> None:
    from monitor.lab.tasks import problem_items
    from monitor.lab.text import all_problems

    words = "zero one two three four five six seven eight nine".split()
    problems = all_problems()
    assert len(problems) == 55 == len({p.prompt for p in problems})
    for problem, item in zip(problems, problem_items(problems)):
        first, _, second, _ = item["context"].split()
        # the answer is the sum, read back from the words
        assert item["choices"][item["answer"]] == " " + words[words.index(first) + words.index(second)]
        assert problem.text == item["context"] + item["choices"][item["answer"]]


def test_the_stream_is_seeded_and_reads_every_text_chunk_once_per_pass(shared_dir: Path) -> None:
    from monitor.lab.text import _chunk_pool, build_stream, load_text_source

    source = load_text_source(shared_dir / "corpus" / "calib-v0-alt")
    pool = _chunk_pool(source.texts, 600)
    one_pass = sum(len(c.encode("utf-8")) for c in pool)
    stream = build_stream(source, total_bytes=int(2.5 * one_pass), seed=3, problems_per_doc=2)
    assert stream == build_stream(source, total_bytes=int(2.5 * one_pass), seed=3, problems_per_doc=2)
    assert stream != build_stream(source, total_bytes=int(2.5 * one_pass), seed=4, problems_per_doc=2)
    chunks = [doc.split("\n", 1)[1].rsplit("\n", 1)[0] for doc in stream]
    first, second = chunks[:len(pool)], chunks[len(pool):2 * len(pool)]
    # each pass is a permutation of all chunks, and the two passes are in different orders
    assert sorted(first) == sorted(pool) == sorted(second) and first != second
    # not in corpus order: slices are mixed from the start
    assert first != pool


def _valid_record() -> dict:
    return {"schema": LAB_SCHEMA, "config": {},
            "families": [{"family": "gpt2", "tokenizer": "gpt2", "tokenizer_fingerprint": "f", "vocab_used": 10}],
            "checkpoints": [{"family": "gpt2", "seed": 0, "step": 1, "bytes_seen": 5, "tokens_seen": 2,
                             "path": "gpt2-s0/step1",
                             "metrics": {k: 0.5 for k in ("ce", "ce_uni", "lstar", "lstar_se", "l_rel", "l_gain",
                                                          "bits_per_byte", "unigram_bits_per_byte",
                                                          "bpb_minus_unigram")},
                             "tasks": {"kv": {"acc": 0.5, "prob_correct": 0.4, "brier": 0.6, "n": 10,
                                              "baseline": 0.25}}}]}


@pytest.mark.parametrize("change, needle", [
    (lambda r: r.update(schema="lstar-lab/0"), "schema"),
    (lambda r: r["checkpoints"][0].update(path="../../etc/passwd"), "checkpoints.0.path"),
    (lambda r: r["checkpoints"][0].update(family="llama-3"), "llama-3"),
    (lambda r: r["checkpoints"][0]["metrics"].update(lstar=float("nan")), "checkpoints.0.metrics.lstar"),
    (lambda r: r["checkpoints"][0]["tasks"]["kv"].update(acc=1.5), "checkpoints.0.tasks.kv.acc"),
    (lambda r: r.update(extra=1), "extra"),
])
def test_a_bad_lab_record_is_one_line_naming_the_file_and_key(tmp_path: Path, change, needle: str) -> None:
    record = _valid_record()
    parse_lab(record)
    change(record)
    path = tmp_path / "lab.json"
    path.write_text(json.dumps(record))
    with pytest.raises(LabError) as info:
        load_lab(tmp_path)
    line = info.value.one_line()
    assert "\n" not in line and str(path) in line and needle in line


@pytest.mark.slow
def test_bad_lab_flags_are_refused_before_anything_is_written(tmp_path: Path, shared_dir: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    # In this process (the console script's `main`): what is checked is the refusal, its exit code
    # and its one line, not the interpreter start (a subprocess per flag imported torch six times).
    from monitor.cli import main

    out = tmp_path / "lab"
    pool = tmp_path / "pool"
    for name in ("train", "heldout", "tasks"):
        (pool / name).mkdir(parents=True)
        (pool / name / "manifest.json").write_text("{}")
    for args, needle in ((["--families", "gpt2,../x"], "family '../x'"),
                         (["--seeds", "0,0"], "seeds"),
                         (["--seeds", "a"], "--seeds"),
                         (["--stress-families", "gpt2"], "repeated"),
                         (["--pool", str(tmp_path / "nowhere")], "--pool DIR"),
                         ([], "--pool is required")):
        pool_args = [] if any(a == "--pool" for a in args) or not args else ["--pool", str(pool)]
        capsys.readouterr()
        code = main(["lab", "run", "--size", "reduced", "--out", str(out), "--shared", str(shared_dir),
                     *pool_args, *args])
        stderr = capsys.readouterr().err
        assert code == 2 and needle in stderr, (args, stderr)
        assert len(stderr.strip().splitlines()) == 1, stderr
        assert not out.exists()


def _tiny_lab(shared: Path):
    from monitor.lab.config import reduced_config
    from monitor.lab.model import ArchConfig

    return reduced_config(families=("spm-unigram-toy",), byte_budget=30_000,
                          arch=ArchConfig(hidden=32, layers=1, heads=2, intermediate=64, context=32),
                          fractions=(0.25, 0.5, 1.0), warmup_steps=3, tokenizers_dir=shared / "tokenizers",
                          text_corpus=shared / "corpus" / "calib-v0-alt", calib_corpus=shared / "corpus" / "calib-v0",
                          cloze_task=shared / "tasks" / "cloze-v0.jsonl")


def test_a_saved_checkpoint_is_the_full_model_built_with_its_random_init_then_overwritten(
        tmp_path: Path, shared_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`save_full_model` builds the full-vocabulary model without drawing its random initial
    weights, since every saved tensor is overwritten: the files are byte for byte those of the
    model built with its initialisation and tied by `from_config`, then overwritten the same way (`fill_full_model`);
    torch's random state is left as it was; and training draws nothing from that state after
    its seeded initialisation, so the draws the initialisation made at each checkpoint changed
    no weight (a lineage trained with the random state disturbed at every checkpoint saves
    the same files)."""
    import torch
    from transformers import AutoModelForCausalLM

    from monitor.lab import train as train_mod
    from monitor.lab.model import (
        VocabMap,
        build_compact_model,
        fill_full_model,
        phi_config,
        save_full_model,
    )
    from monitor.lab.pipeline import prepare_inputs
    from monitor.lab.train import encode_family, train_lineage

    config = _tiny_lab(shared_dir)
    arch = config.arch
    vocab = VocabMap(np.array([0, 3, 4, 9, 50, 51, 99], dtype=np.int64), 120)
    compact = build_compact_model(arch, vocab.n_used, seed=5)
    state = torch.get_rng_state()
    save_full_model(compact, vocab, arch, tmp_path / "saved", prefix_token_id=3)
    assert torch.equal(torch.get_rng_state(), state)

    # the reference: what the function did before, a randomly initialised full model
    full = AutoModelForCausalLM.from_config(phi_config(arch, vocab.full_size, prefix_token_id=3))
    assert full.lm_head.weight is full.model.embed_tokens.weight     # tied by from_config
    fill_full_model(full, compact, vocab)
    full.save_pretrained(tmp_path / "reference", safe_serialization=True)
    for name in ("model.safetensors", "config.json", "generation_config.json"):
        assert (tmp_path / "saved" / name).read_bytes() == (tmp_path / "reference" / name).read_bytes(), name

    inputs = prepare_inputs(config, tmp_path / "lab")
    data = encode_family(config, "spm-unigram-toy", inputs.stream, inputs.eval_texts)
    quiet = train_lineage(config, "spm-unigram-toy", 0, data, tmp_path / "quiet")
    write = train_mod._write_checkpoint

    def disturbing(*args, **kwargs):
        torch.rand(1000)       # what the full model's random initialisation did to the state
        return write(*args, **kwargs)

    monkeypatch.setattr(train_mod, "_write_checkpoint", disturbing)
    disturbed = train_lineage(config, "spm-unigram-toy", 0, data, tmp_path / "disturbed")
    assert [m["step"] for m in disturbed] == [m["step"] for m in quiet] and len(quiet) == 3
    for meta in quiet:
        folder = f"spm-unigram-toy-s0/step{meta['step']}/model.safetensors"
        assert (tmp_path / "quiet" / folder).read_bytes() == (tmp_path / "disturbed" / folder).read_bytes()
