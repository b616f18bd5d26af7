"""Importers of published training histories (`monitor.curves.importers`, `lstar labels import`),
checked against cells read straight from the source tables with the csv module."""

from __future__ import annotations

import csv
import dataclasses
import math
from pathlib import Path

import pytest

from monitor.cli import main
from monitor.curves.importers import (OLMO_PAPER_TASKS, SPLIT_ITEMS, import_obsscaling, import_olmo_ladder,
                                      import_pythia, items_from_stderr, read_table, write_labels_csv)
from monitor.curves.labels import Label, read_labels_csv
from monitor.errors import LabelError


@pytest.fixture(scope="module")
def public(shared_dir: Path) -> Path:
    return shared_dir / "data" / "public-evals"


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(encoding="utf-8", newline="") as handle:
        return list(csv.DictReader(handle))


@pytest.fixture(scope="module")
def olmo(public: Path) -> list[Label]:
    return import_olmo_ladder(public / "olmo-ladder" / "ladder-runs")


@pytest.fixture(scope="module")
def pythia(public: Path) -> list[Label]:
    return import_pythia(public / "pythia" / "pythia-v1-evals.csv")


def _pick(labels: list[Label], **where: object) -> Label:
    found = [x for x in labels if all(getattr(x, k) == v for k, v in where.items())]
    assert len(found) == 1, where
    return found[0]


# -- olmo-ladder ------------------------------------------------------------------------------------
def test_olmo_7b_last_row_read_straight_from_the_file(public: Path, olmo: list[Label]) -> None:
    rows = _rows(public / "olmo-ladder" / "ladder-runs" / "peteish7_eval_full.csv")
    last = rows[-1]
    assert last["_step"] == "925000"   # the last row; step 920000 is the one before
    assert rows[-2]["_step"] == "920000" and float(rows[-2]["eval/c4_en-validation/CrossEntropyLoss"]) == 2.5164339542388916
    hella = _pick(olmo, lineage="peteish7_eval_full", step=925000.0, task="hellaswag")
    assert hella.value == float(last["eval/downstream/hellaswag_val_rc_5shot_len_norm"])
    assert hella.task_loss == float(last["eval/downstream_bpb/hellaswag_val_rc_5shot_bpb"])
    assert hella.raw_ce == float(last["eval/c4_en-validation/CrossEntropyLoss"])
    assert (hella.metric, hella.n, hella.family, hella.checkpoint) == ("acc_norm", 10042, "7B", "peteish7_eval_full@step925000")
    assert hella.tokens == 925000 * 4194304 and hella.flops == hella.tokens * 49412071424
    boolq = _pick(olmo, lineage="peteish7_eval_full", step=925000.0, task="boolq")
    assert (boolq.metric, boolq.value) == ("acc", float(last["eval/downstream/boolq_val_rc_5shot_acc"]))
    # MMLU: the plain mean of the four category columns, by hand
    cats = ("stem", "humanities", "social_sciences", "other")
    mmlu = _pick(olmo, lineage="peteish7_eval_full", step=925000.0, task="mmlu")
    acc = [float(last[f"eval/downstream/mmlu_{c}_test_rc_5shot_len_norm"]) for c in cats]
    bpb = [float(last[f"eval/downstream_bpb/mmlu_{c}_test_rc_5shot_bpb"]) for c in cats]
    assert mmlu.value == pytest.approx((acc[0] + acc[1] + acc[2] + acc[3]) / 4, abs=1e-15)
    assert mmlu.task_loss == pytest.approx((bpb[0] + bpb[1] + bpb[2] + bpb[3]) / 4, abs=1e-15)
    assert mmlu.n == 3018 + 4705 + 3077 + 3242


def test_olmo_ladder_tokens_and_flops_are_the_files_own(public: Path, olmo: list[Label]) -> None:
    rows = _rows(public / "olmo-ladder" / "ladder-runs" / "1B-5xC.csv")
    row = rows[10]
    label = _pick(olmo, lineage="1B-5xC", step=float(row["_step"]), task="piqa")
    assert label.tokens == float(row["throughput/total_tokens"]) == float(row["_step"]) * 1572864
    assert label.flops == float(row["throughput/total_training_Gflops"]) * 1e9
    # the repository's FLOPs per token for 1B (used for the 7B) agrees with the file's own ratio
    assert label.flops / label.tokens == pytest.approx(10109071360, rel=1e-12)
    assert label.family == "1B" and label.params == 1279395840


def test_olmo_default_lineages_and_the_paper_tasks(olmo: list[Label]) -> None:
    lineages = {x.lineage for x in olmo}
    assert "peteish7_eval_full" in lineages and len(lineages) == 31
    assert not {x for x in lineages if "medlr" in x or "170k" in x or "anneal" in x}
    assert set(OLMO_PAPER_TASKS) == {"mmlu", "hellaswag", "arc_challenge", "arc_easy", "piqa", "csqa",
                                     "socialiqa", "openbookqa"}


def test_olmo_paper_actual_is_not_a_7b_row(public: Path, olmo: list[Label]) -> None:
    """The paper's step2 'Actual' values are not in these 7B files (see the module doc): a
    regression guard for that finding, so that nobody compares the 7B with them unknowingly."""
    actual = {r["Task"]: float(r["Actual"]) for r in _rows(public / "olmo-ladder" / "paper-figures" / "step2_c4_main.csv")}
    hella_7b = [x.value for x in olmo if x.lineage == "peteish7_eval_full" and x.task == "hellaswag"]
    assert max(hella_7b) < actual["hellaswag_val_5shot"]


def test_olmo_other_corpus_and_refusals(public: Path, tmp_path: Path) -> None:
    folder = public / "olmo-ladder" / "ladder-runs"
    pile = import_olmo_ladder(folder, corpus="pile", lineages=["190M-1xC"], tasks=["arc_easy"])
    first = _rows(folder / "190M-1xC.csv")[0]
    assert pile[0].raw_ce == float(first["eval/pile-validation/CrossEntropyLoss"]) and len(pile) == 37
    with pytest.raises(LabelError, match="lacks column.*_step"):
        import_olmo_ladder(folder, lineages=["peteish7_eval_anneal"])
    with pytest.raises(LabelError, match="unknown OLMo validation corpus"):
        import_olmo_ladder(folder, corpus="c5")
    # a step twice, a NaN, a word, a short row: each named by file and line
    header, *body = (folder / "190M-1xC.csv").read_text(encoding="utf-8").splitlines()[:4]
    bad = tmp_path / "190M-1xC.csv"
    bad.write_text("\n".join([header, body[0], body[0]]) + "\n", encoding="utf-8")
    with pytest.raises(LabelError, match=r"190M-1xC.csv:3: step 200 again \(first on line 2\)"):
        import_olmo_ladder(bad)
    cells = body[1].split(",")
    for cell, message in (("nan", "not a finite number"), ("abc", "is not a number"), ("", "is empty")):
        broken = ",".join(cells[:1] + [cell] + cells[2:])
        bad.write_text(f"{header}\n{body[0]}\n{broken}\n", encoding="utf-8")
        with pytest.raises(LabelError, match=rf"190M-1xC.csv:3: column 'eval/c4_en-validation/CrossEntropyLoss'.*{message}"):
            import_olmo_ladder(bad)
    bad.write_text(f"{header}\n{body[0]}\n200,1.0\n", encoding="utf-8")
    with pytest.raises(LabelError, match=r"190M-1xC.csv:3: the row has fewer cells"):
        import_olmo_ladder(bad)


# -- pythia -----------------------------------------------------------------------------------------
def test_pythia_cells_and_the_lambada_axis(public: Path, pythia: list[Label]) -> None:
    rows = [r for r in _rows(public / "pythia" / "pythia-v1-evals.csv")
            if r["model"] == "pythia-410m" and r["step"] == "13000" and r["shots"] == "zero-shot"]
    cell = {(r["task"], r["metric"]): r for r in rows}
    sciq = _pick(pythia, lineage="pythia-410m", step=13000.0, task="sciq", metric="acc")
    assert sciq.value == float(cell[("sciq", "acc")]["value"]) and sciq.stderr == float(cell[("sciq", "acc")]["stderr"])
    assert sciq.raw_ce == math.log(float(cell[("lambada_openai", "ppl")]["value"]))
    assert sciq.tokens == 13000 * 1024 * 2048 and sciq.flops == 6 * 405334016 * 13000 * 1024 * 2048
    assert (sciq.family, sciq.n, sciq.checkpoint) == ("410m", 1000, "pythia-410m@step13000")
    # MMLU: the mean of the 57 subjects by a naive loop, n = their items together
    subjects = [r for (t, m), r in cell.items() if t.startswith("hendrycksTest-") and m == "acc"]
    assert len(subjects) == 57
    total = 0.0
    for r in subjects:
        total += float(r["value"])
    mmlu = _pick(pythia, lineage="pythia-410m", step=13000.0, task="mmlu", metric="acc")
    assert mmlu.value == pytest.approx(total / 57, abs=1e-12) and mmlu.n == 14042


def test_pythia_item_counts_are_given_back_by_the_files_stderr(public: Path) -> None:
    rows = _rows(public / "pythia" / "pythia-v1-evals.csv")
    wanted = {"arc_easy": "arc_easy_test", "arc_challenge": "arc_challenge_test", "piqa": "piqa_val",
              "sciq": "sciq_test", "winogrande": "winogrande_val", "lambada_openai": "lambada_openai_test"}
    for task, split in wanted.items():
        r = next(r for r in rows if r["task"] == task and r["metric"] == "acc" and float(r["stderr"]) > 0)
        assert round(items_from_stderr(float(r["value"]), float(r["stderr"]))) == SPLIT_ITEMS[split], task


def test_pythia_five_shot_and_filters(public: Path) -> None:
    labels = import_pythia(public / "pythia" / "pythia-v1-evals.csv", shots=5, lineages=["pythia-70m"],
                           tasks=["arc_easy"])
    assert {x.lineage for x in labels} == {"pythia-70m"} and {x.task for x in labels} == {"arc_easy"}
    with pytest.raises(LabelError, match="0 or 5 shots"):
        import_pythia(public / "pythia" / "pythia-v1-evals.csv", shots=3)


# -- obsscaling -------------------------------------------------------------------------------------
def test_obsscaling_row_read_straight(public: Path) -> None:
    path = public / "obsscaling" / "base_llm_benchmark_eval.csv"
    row = next(r for r in _rows(path) if r["Model"] == "meta-llama/Llama-2-13b-hf")
    labels = import_obsscaling(path, lineages=["meta-llama/Llama-2-13b-hf"])
    arc = _pick(labels, task="arc_challenge")
    assert arc.value == float(row["ARC-C"]) and arc.family == row["Model Family"] and arc.n == 1172
    assert arc.params == float(row["Model Size (B)"]) * 1e9 and arc.flops == float(row["FLOPs (1E21)"]) * 1e21
    assert arc.tokens == float(row["Pretraining Data Size (T)"]) * 1e12 and arc.lineage == arc.checkpoint


# -- writing, bounds, the command -------------------------------------------------------------------
def test_write_then_read_keeps_every_field(olmo: list[Label], pythia: list[Label], tmp_path: Path) -> None:
    sample = olmo[:40] + pythia[:40] + [Label(checkpoint="x,y", value=0.1, family="f", n=3, lstar=1.5, lstar_se=0.1,
                                              bits_per_byte=0.9, axis_se={"bits_per_byte": 0.01}, sha="abc",
                                              imported=("lstar", "bits_per_byte"))]
    back = read_labels_csv(write_labels_csv(sample, tmp_path / "h.csv"))

    def comparable(x: Label) -> Label:
        return dataclasses.replace(x, source="csv", source_ref=None)
    assert [comparable(x) for x in back] == [comparable(x) for x in sample]
    with pytest.raises(LabelError, match="neither n nor stderr"):
        write_labels_csv([Label(checkpoint="a", value=0.5, raw_ce=1.0)], tmp_path / "bad.csv")


def test_oversize_table_is_refused_unread(public: Path) -> None:
    with pytest.raises(LabelError, match="bytes; public evaluation tables are limited to 1,000 bytes"):
        read_table(public / "obsscaling" / "base_llm_benchmark_eval.csv", max_bytes=1000)
    with pytest.raises(LabelError, match="lacks column.*Model Family"):
        import_obsscaling(public / "pythia" / "pythia-v1-evals.csv")


def test_cli_writes_a_file_read_labels_csv_reads(public: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "olmo.csv"
    assert main(["labels", "import", "--format", "olmo-ladder", str(public / "olmo-ladder" / "ladder-runs"),
                 "-o", str(out), "--lineages", "190M-1xC,peteish7_eval_full", "--tasks", "mmlu,piqa"]) == 0
    assert "2 lineages, 223 checkpoints, 2 tasks, 446 rows" in capsys.readouterr().out
    labels = read_labels_csv(out)
    assert {x.lineage for x in labels} == {"190M-1xC", "peteish7_eval_full"} and len(labels) == 446
    assert main(["labels", "import", "--format", "nope", str(out), "-o", str(out)]) == 2
