"""The task-format stress test: the instability score on a hand-worked example, the surface
forms, and the whole test on two tiny models against the evaluator called directly."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from monitor.curves.evaluator import McItem, evaluate_multiple_choice, load_mc_task
from monitor.errors import LabelError
from monitor.stress.subject import StressCheckpoint, StressOptions, StressSubject
from monitor.stress.task_format import (FORMATS, PADDING, format_instability, format_stress, item_flip_rate,
                                        reformat_task)


def test_instability_hand_worked_three_checkpoints_two_formats():
    # Format A orders c1 < c2 < c3; format B swaps c1 and c2 (0.55 > 0.52) and keeps c3 on top.
    # Pairs: (c1,c2) disagree -> minority share 1/2; (c1,c3) and (c2,c3) agree -> 0.
    # instability = (1/2 + 0 + 0) / 3 = 1/6; a scalar metric's pairwise accuracy <= 5/6.
    instability, bound = format_instability({"A": [0.50, 0.60, 0.70], "B": [0.55, 0.52, 0.80]})
    assert instability == pytest.approx(1 / 6)
    assert bound == pytest.approx(5 / 6)


def test_instability_extremes_and_ties():
    assert format_instability({"A": [0.1, 0.2, 0.3], "B": [0.2, 0.3, 0.9]}) == (0.0, 1.0)
    # two formats reverse a two-checkpoint order: the pair is split evenly
    assert format_instability({"A": [0.1, 0.2], "B": [0.2, 0.1]}) == (0.5, 0.5)
    # three formats, one dissenting: minority 1/3; a tie counts half to each side: (0.5+1)/3
    assert format_instability({"A": [0, 1], "B": [0, 1], "C": [1, 0]})[0] == pytest.approx(1 / 3)
    assert format_instability({"A": [0, 1], "B": [1, 1], "C": [0, 1]})[0] == pytest.approx(0.5 / 3)
    assert format_instability({"A": [0.3]}) == (None, None)


def test_item_flip_rate_counts_items_whose_correctness_changes():
    assert item_flip_rate({"A": np.array([1, 1, 0, 0]), "B": np.array([1, 0, 0, 1])}) == 0.5


def test_surface_forms_keep_the_question_and_change_its_length():
    item = McItem("x", "The cat sat\n   on the", (" mat", " moon"), 0)
    by_name = {f.name: f.encode(item) for f in FORMATS}
    assert by_name["original"] == item
    assert by_name["padded"].context == PADDING + item.context
    assert by_name["collapsed_whitespace"].context == "The cat sat on the"
    letters = by_name["letter_labels"]
    assert letters.context.endswith("A. mat\nB. moon\nAnswer:") and letters.choices == (" A", " B")
    numbers = by_name["number_labels"]
    assert numbers.context.endswith("(1) mat\n(2) moon\nAnswer: (") and numbers.choices == ("1)", "2)")
    assert all(v.answer == 0 and v.id == "x" for v in by_name.values())


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory, shared_dir):
    from monitor.lab.tiny_models import build_tiny_model

    root = tmp_path_factory.mktemp("fmt")
    tok = shared_dir / "tokenizers" / "gpt2"
    return [build_tiny_model(root / f"m{seed}", tok, seed=seed, hidden=16, layers=1, heads=2, max_positions=256)
            for seed in (1, 2)]


def _loader(checkpoint, options):
    from monitor.scoring import load_checkpoint, load_tokenizer

    loaded = load_checkpoint(checkpoint.ref, dtype="float32", device="cpu")
    handle = load_tokenizer(loaded.model_dir)
    return loaded.model, handle.tokenizer, handle.prefix_token_id, loaded.max_positions


def test_format_stress_on_two_tiny_models_matches_the_evaluator(tiny_pair, tmp_path, shared_dir):
    task_file = tmp_path / "mini.jsonl"
    items = [{"id": f"q{i}", "context": f"Item {i}: the  answer\nis", "choices": [" yes", " no", " maybe"],
              "answer": i % 3} for i in range(6)]
    task_file.write_text("".join(json.dumps(x) + "\n" for x in items))
    subject = StressSubject(kind="model", name="tiny", corpus=tmp_path,
                            checkpoints=tuple(StressCheckpoint(str(p), f"c{i}") for i, p in enumerate(tiny_pair)))
    options = StressOptions(task_file=task_file, extra={"task_format_loader": _loader})
    section = format_stress(subject, options)
    task = section["tasks"][0]
    assert task["n_items"] == 6 and [f["name"] for f in task["formats"]] == [f.name for f in FORMATS]
    # each number is the evaluator's on the hand-padded task, scored directly
    model, tokenizer, prefix, max_len = _loader(subject.checkpoints[1], options)
    base = load_mc_task(task_file)
    padded = base.__class__(base.name, base.path, base.sha256,
                            tuple(McItem(it.id, PADDING + it.context, it.choices, it.answer) for it in base.items))
    direct = evaluate_multiple_choice(model, tokenizer, padded, prefix_token_id=prefix, max_length=max_len)
    got = next(f for f in task["formats"] if f["name"] == "padded")["checkpoints"][1]
    assert got["value"] == pytest.approx(direct.metrics["prob_correct"][0], abs=1e-12)
    # the padding lengthens every context by the padding's own tokens
    lengths = {f["name"]: f["checkpoints"][1]["mean_context_tokens"] for f in task["formats"]}
    assert lengths["padded"] - lengths["original"] == pytest.approx(
        len(tokenizer.encode(PADDING, add_special_tokens=False).ids), abs=1.0)
    # the reported instability is the definition applied to the reported values
    values = {f["name"]: [c["value"] for c in f["checkpoints"]] for f in task["formats"]}
    pair = [v[0] - v[1] for v in values.values()]
    wins = sum(d > 0 for d in pair) + 0.5 * sum(d == 0 for d in pair)
    assert task["instability"] == pytest.approx(min(wins, 5 - wins) / 5)
    assert task["accuracy_upper_bound"] == pytest.approx(1 - task["instability"])


def test_format_stress_needs_a_task_file(tmp_path):
    subject = StressSubject(kind="model", name="x", corpus=tmp_path, checkpoints=(StressCheckpoint("m", "m"),))
    with pytest.raises(LabelError, match="task file"):
        format_stress(subject, StressOptions())


def test_reformat_task_names_the_format(tmp_path):
    f = tmp_path / "t.jsonl"
    f.write_text(json.dumps({"id": 1, "context": "a b", "choices": [" c", " d"], "answer": 1}) + "\n")
    task = reformat_task(load_mc_task(f), FORMATS[3])
    assert task.name == "t[letter_labels]" and task.items[0].choices == (" A", " B")
