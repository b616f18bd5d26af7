"""docs/stress.md's Results tables, checked against the committed lstar-stress/1 documents
(benchmarks/results/stress/): every number the tables quote is read from a document, and the
derived ones (α/β, changes in L*, Kendall τ, format instability) are recomputed here with
numpy/scipy or a plain loop rather than read back from the section that stored them."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import kendalltau

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "stress"
DOC = ROOT / "docs" / "stress.md"
RESULT = RESULTS / "lab-v3-pilot-gpt2-s0-tokenization.json"
NAMES = {"whitespace collapsed": "whitespace-collapsed", "BPE-dropout 0.05": "bpe-dropout-0.05",
         "BPE-dropout 0.1": "bpe-dropout-0.1", "pruned merges 10 %": "pruned-merges-10%", "base": "base"}
NUMBER = r"([−+-]?[0-9.]+)"


def _number(text: str) -> float:
    return float(text.replace("−", "-"))


def _section(heading: str) -> str:
    """The docs text from `heading` (a whole line) to the next heading of the same or higher level."""
    text = DOC.read_text()
    level = heading.split(" ")[0]
    start = text.index("\n" + heading + "\n")
    stop = re.search(rf"\n#{{1,{len(level)}}} ", text[start + 1:])
    return text[start:start + 1 + stop.start()] if stop else text[start:]


def _rows(text: str, first: str) -> list[list[str]]:
    """Cells of the table rows whose first cell is `first` (a regex)."""
    return [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in text.splitlines() if re.match(rf"^\| ?{first} ?\|", line)]


def test_the_docs_table_is_the_committed_result():
    section = json.loads(RESULT.read_text())["sections"]["tokenization"]
    lstar = {v["name"]: [next(x["lstar"] for x in c["variants"] if x["name"] == v["name"])
                         for c in section["checkpoints"]] for v in section["checkpoints"][0]["variants"]}
    text = DOC.read_text()
    for label, name in NAMES.items():
        if name == "base":
            continue
        row = re.search(rf"^\| {re.escape(label)} \| ([0-9.]+) → ([0-9.]+) \| ([0-9.]+) \| ([0-9.]+) \| ([0-9.]+) \|",
                        text, re.M)
        assert row, label
        assert (float(row[1]), float(row[2])) == (round(lstar[name][0], 3), round(lstar[name][-1], 3))
        alpha, beta = np.polyfit(lstar["base"], lstar[name], 1)
        assert float(row[4]) == round(alpha, 3), label
        fit = next(f for f in section["fits"] if f["variant"] == name)
        assert abs(fit["alpha"] - alpha) < 1e-9 and abs(fit["beta"] - beta) < 1e-9


# --- the tokenization test on real models: one checkpoint each, so offsets only -------------

REAL_TOKENIZATION = {"SmolLM2-135M": RESULTS / "smollm2-135m-tokenization.json",
                     "Gemma 3 270M (Q4_K_M, dequantised)": RESULTS / "gemma3-270m-tokenization.json"}


@pytest.mark.parametrize("model", sorted(REAL_TOKENIZATION))
def test_real_model_tokenization_rows_are_the_committed_results(model):
    path = REAL_TOKENIZATION[model]
    if not path.exists():
        pytest.fail(f"{path.name} is quoted in docs/stress.md but not committed")
    variants = {v["name"]: v for v in json.loads(path.read_text())["sections"]["tokenization"]["checkpoints"][0]["variants"]}
    rows = _rows(_section("### Tokenization on real models"), re.escape(model))
    assert rows, model
    assert {NAMES[r[1]] for r in rows} == set(variants)   # every measured variant is quoted, none invented
    base = variants["base"]["lstar"]
    for cells in rows:
        v = variants[NAMES[cells[1]]]
        assert _number(cells[2]) == round(v["ce"], 3)
        assert _number(cells[3]) == round(v["ce_uni"], 3)
        assert _number(cells[4]) == round(v["lstar"], 3)
        assert abs(_number(cells[4]) - (v["ce"] - v["ce_uni"])) < 1e-3   # L* = CE − CE_uni
        assert int(cells[5].replace(",", "")) == v["n_tokens"]
        if cells[1] != "base":
            assert _number(cells[6]) == round(v["lstar"] - base, 3)


# --- the registers test -------------------------------------------------------------------

REGISTER_COLUMNS = {"calib-v0": "lstar-calib-v0", "code": "code", "dictionary": "dictionary", "technical": "technical"}


def _register_table(section: dict) -> dict[str, list[str]]:
    """{checkpoint label: its row's cells} of the docs table quoting this registers section."""
    text = DOC.read_text()
    header = "| checkpoint | " + " | ".join(REGISTER_COLUMNS) + " |"
    assert header in text
    return {cells[0]: cells for label in section["lstar"] for cells in _rows(text, re.escape(label))}


@pytest.mark.parametrize("name", ["registers-smollm2-135m.json", "registers-gemma3-270m.json",
                                  "registers-lab-gpt2-large-s0.json"])
def test_register_tables_are_the_committed_lstar(name):
    path = RESULTS / name
    if not path.exists():
        pytest.fail(f"{name} is quoted in docs/stress.md but not committed")
    section = json.loads(path.read_text())["sections"]["registers"]
    table = _register_table(section)
    assert set(table) == set(section["lstar"])   # every checkpoint quoted
    for label, cells in table.items():
        for column, register in zip(REGISTER_COLUMNS.values(), cells[1:]):
            score = section["scores"][label][column]
            assert _number(register) == round(section["lstar"][label][column], 3)
            assert abs(score["ce"] - score["ce_unigram"] - section["lstar"][label][column]) < 1e-9


def test_smollm2_register_claims():
    section = json.loads((RESULTS / "registers-smollm2-135m.json").read_text())["sections"]["registers"]
    (row,) = section["lstar"].values()
    assert all(t["tau"] is None for t in section["kendall_tau"])   # one checkpoint: no τ, as the docs say
    text = " ".join(_section("## Registers").split())
    assert f"up to {max(row.values()) - min(row.values()):.3f} nats per token" in text
    (scores,) = section["scores"].values()   # the one model of the run
    tokens = sorted(int(s["n_tokens"]) for s in scores.values())
    assert f"{tokens[0]:,}–{tokens[-1]:,} tokens per register" in text


def test_lab_register_tau_table_is_recomputed_with_scipy():
    section = json.loads((RESULTS / "registers-lab-gpt2-large-s0.json").read_text())["sections"]["registers"]
    labels = list(section["lstar"])
    assert len(labels) >= 3   # τ across checkpoints needs a lineage
    text = _section("## Registers")
    shown = {"lstar-calib-v0": "calib-v0"}
    for a, b in itertools.combinations(["lstar-calib-v0", "code", "dictionary", "technical"], 2):
        (cells,) = _rows(text, re.escape(f"{shown.get(a, a)} – {shown.get(b, b)}"))
        tau = kendalltau([section["lstar"][k][a] for k in labels], [section["lstar"][k][b] for k in labels]).statistic
        assert _number(cells[1]) == round(tau, 3)
        stored = next(t for t in section["kendall_tau"] if {t["a"], t["b"]} == {a, b})
        low, high = (_number(x) for x in cells[2].strip("[]").split(", "))
        assert (low, high) == (round(stored["low"], 3), round(stored["high"], 3))
        assert low <= tau <= high


def test_lab_register_claims():
    section = json.loads((RESULTS / "registers-lab-gpt2-large-s0.json").read_text())["sections"]["registers"]
    text = " ".join(_section("## Registers").split())
    spread = {r: np.ptp([row[r] for row in section["lstar"].values()]) for r in ("code", "dictionary", "technical")}
    assert f"moves {spread['dictionary']:.3f} (dictionary) to {spread['code']:.3f} (code)" in text
    assert min(spread, key=spread.get) == "dictionary" and max(spread, key=spread.get) == "code"
    ce = [s["ce"] for row in section["scores"].values() for r, s in row.items() if r != "lstar-calib-v0"]
    uni = [s["ce_unigram"] for row in section["scores"].values() for r, s in row.items() if r != "lstar-calib-v0"]
    assert f"CE is {min(ce):.0f}–{max(ce):.0f} nats per token against a unigram CE of {min(uni):.1f}–{max(uni):.1f}" in text
    calib = ", ".join(f"{row['lstar-calib-v0']:.3f}" for row in section["lstar"].values())
    assert f"({calib})" in text
    below = sum(t["low"] < 0 for t in section["kendall_tau"])
    words = {5: "five", 6: "six", 4: "four", 3: "three"}
    where = " ".join(_section("## Where L\\* should not be expected to work").split())
    assert f"{words[below]} of {words[len(section['kendall_tau'])]} register pairs have a τ interval reaching below 0" in where


# --- the task-format test -----------------------------------------------------------------

TASK_FORMAT_RESULTS = ["task-format-lab-gpt2-large-s0.json", "task-format-smollm2-gemma3.json"]


def _naive_instability(table: dict[str, list[float]]) -> float:
    """Mean over checkpoint pairs of the minority share of formats ordering the pair (ties ½)."""
    formats = list(table)
    n = len(table[formats[0]])
    shares = []
    for i in range(n):
        for j in range(i + 1, n):
            wins = 0.0
            for f in formats:
                wins += 1.0 if table[f][i] > table[f][j] else 0.5 if table[f][i] == table[f][j] else 0.0
            shares.append(min(wins, len(formats) - wins) / len(formats))
    return sum(shares) / len(shares)


@pytest.mark.parametrize("name", TASK_FORMAT_RESULTS)
def test_task_format_tables_are_the_committed_results(name):
    task = json.loads((RESULTS / name).read_text())["sections"]["task_format"]["tasks"][0]
    text = _section("## Task format")
    block = text[text.index(f"`{name}`"):]
    values = {}
    for fmt in task["formats"]:
        cells = _rows(block, re.escape(fmt["name"]))[0]
        for cell, row in zip(cells[1:], fmt["checkpoints"], strict=True):
            value, stderr = (_number(x) for x in cell.split(" ± "))
            assert (value, stderr) == (round(row["value"], 3), round(row["stderr"], 3))
        values[fmt["name"]] = [row["value"] for row in fmt["checkpoints"]]
    instability = _naive_instability(values)
    assert abs(instability - task["instability"]) < 1e-12
    flat = " ".join(block.split())
    assert f"instability {instability:.3f} (accuracy bound {1 - instability:.3f})" in flat
    flips = ", ".join(f"{f['item_flip_rate']:.2f}" for f in task["item_flips"])
    assert f"item flip rates {flips}" in flat.lower()
    original = next(f["checkpoints"] for f in task["formats"] if f["name"] == "original")
    spread = max(r["value"] for r in original) - min(r["value"] for r in original)
    errors = sorted(r["stderr"] for r in original)
    assert f"differ by at most {spread:.3f}" in flat
    assert f"standard error of {errors[0]:.3f}–{errors[-1]:.3f}" in flat
    assert spread < errors[0]   # the docs' reading: the original format's order is within noise


def test_where_lstar_fails_quotes_the_lab_instability():
    task = json.loads((RESULTS / "task-format-lab-gpt2-large-s0.json").read_text())["sections"]["task_format"]["tasks"][0]
    where = " ".join(_section("## Where L\\* should not be expected to work").split())
    assert f"is {task['instability']:.3f} (bound {task['accuracy_upper_bound']:.3f})" in where
    assert task["instability"] > 0.10   # the docs say the limit flags it


def test_gemma_register_claims_and_the_two_models_side_by_side():
    gemma = json.loads((RESULTS / "registers-gemma3-270m.json").read_text())["sections"]["registers"]
    smol = json.loads((RESULTS / "registers-smollm2-135m.json").read_text())["sections"]["registers"]
    (g,) = gemma["lstar"].values()
    (m,) = smol["lstar"].values()
    assert all(t["tau"] is None for t in gemma["kendall_tau"])   # one checkpoint: no τ
    text = " ".join(_section("## Registers").split())
    assert f"moves Gemma's L\\* by up to {max(g.values()) - min(g.values()):.3f} nats per token" in text
    assert max(g, key=g.get) == max(m, key=m.get) == "technical" and min(g, key=g.get) == min(m, key=m.get) == "lstar-calib-v0"
    tokens = sorted(int(s["n_tokens"]) for s in gemma["scores"]["builtin:gemma3-270m"].values())
    assert f"({tokens[0]:,}–{tokens[-1]:,} tokens per register)" in text
    gaps = ", ".join(f"{abs(g[k] - m[k]):.3f} ({name})" for k, name in
                     (("lstar-calib-v0", "calib-v0"), ("code", "code"), ("dictionary", "dictionary")))
    assert gaps.replace(", 0.047 (dictionary)", " and 0.047 (dictionary)") in text or gaps in text
    lower_gemma = [k for k in g if g[k] < m[k]]
    assert lower_gemma == ["dictionary"]   # the docs: only on dictionary prose is Gemma's L* the lower
    assert f"Gemma {g['dictionary']:.3f} against SmolLM2 {m['dictionary']:.3f}".replace("-", "−") in text


def test_the_two_real_models_format_instability_is_one_pair_three_to_two():
    task = json.loads((RESULTS / "task-format-smollm2-gemma3.json").read_text())["sections"]["task_format"]["tasks"][0]
    order = [f["checkpoints"][0]["value"] > f["checkpoints"][1]["value"] for f in task["formats"]]
    assert sorted(order) == [False, False, False, True, True]   # ordered 3 to 2, as the docs say
    assert task["instability"] == pytest.approx(2 / 5)
    where = " ".join(_section("## Where L\\* should not be expected to work").split())
    assert f"(instability {task['instability']:.3f}, the most one pair allows)" in where


# --- the registers test with a curve: the lab lineage's add-words curve refitted per register ----

CURVE_RUN = RESULTS / "registers-curve-lab-gpt2-large-s0.json"
CURVE_FILE = RESULTS / "curve-lab-gpt2-large-s0-add-words.json"
LAB_RECORD = ROOT / "benchmarks" / "results" / "lab-v3" / "pilot" / "lab.json"
CURVE_COLUMNS = {"calib-v0": "lstar-calib-v0", "code": "code", "dictionary": "dictionary", "technical": "technical"}


def _lineage_add_words() -> tuple[dict[str, float], dict[str, float], float]:
    """gpt2-large-s0's add-words logp_correct and calib-v0 L* by `step<N>`, and the metric's
    baseline, read straight from the lab record's JSON (not through the lab's parser)."""
    record = json.loads(LAB_RECORD.read_text())
    rows = [c for c in record["checkpoints"] if (c["family"], c["size"], c["seed"]) == ("gpt2", "large", 0)]
    values = {f"step{c['step']}": c["tasks"]["add-words"]["logp_correct"] for c in rows}
    lstar = {f"step{c['step']}": c["texts"]["calib"]["lstar"] for c in rows}
    (baseline,) = {c["tasks"]["add-words"]["baselines"]["logp_correct"] for c in rows}
    return values, lstar, baseline


def test_the_curve_file_is_the_lineage_add_words_curve():
    curve = json.loads(CURVE_FILE.read_text())
    values, lstar, baseline = _lineage_add_words()
    assert [p["checkpoint"] for p in curve["points"]] == list(values) == [f"step{s}" for s in (144, 287, 431, 575, 718, 861)]
    for p in curve["points"]:
        assert p["value"] == values[p["checkpoint"]] and p["x"] == lstar[p["checkpoint"]]
    assert curve["baseline"] == baseline == pytest.approx(np.log(1 / 21), abs=1e-12)
    assert curve["margin"] == pytest.approx(np.log(1.5), abs=1e-12)
    assert (curve["axis"], curve["metric"], curve["task"], curve["confidence"]) == ("lstar", "logp_correct", "add-words", 0.9)
    text = " ".join(_section("## Registers").split())
    t = curve["threshold"]
    assert f"threshold is L\\* {t['estimate']:.3f} (interval [{t['lower']:.3f}, {t['upper']:.3f}])" in text
    assert f"level {baseline + np.log(1.5):.3f}".replace("-", "−") in text
    below = [k for k, v in values.items() if v < baseline + np.log(1.5)]
    assert below == ["step144", "step287"]   # the docs: these two below the level, four above


def test_the_curve_run_scored_the_committed_runs_lstar():
    new = json.loads(CURVE_RUN.read_text())
    old = json.loads((RESULTS / "registers-lab-gpt2-large-s0.json").read_text())
    assert new["sections"]["registers"]["lstar"] == old["sections"]["registers"]["lstar"]   # to the last digit
    assert new["subject"] == old["subject"]
    text = " ".join(_section("## Registers").split())
    assert f"{new['run']['wall_s']:,.0f} s wall, {new['run']['cpu_s']:,.0f} CPU-seconds" in text


def test_register_curve_table_is_recomputed():
    from monitor.curves.fit import fit_curve
    from monitor.curves.labels import Label
    from monitor.stress.limits import register_flags

    section = json.loads(CURVE_RUN.read_text())["sections"]["registers"]
    curve = json.loads(CURVE_FILE.read_text())
    values, _, baseline = _lineage_add_words()
    labels = list(values)
    table = " ".join(_section("## Registers").split("**A curve refitted")[1:])
    rows = {r["register"]: r for r in section["curves"]}
    assert set(rows) == set(CURVE_COLUMNS.values()) and {r["curve_id"] for r in rows.values()} == {curve["curve_id"]}
    x = {r: np.array([section["lstar"][k][r] for k in labels]) for r in CURVE_COLUMNS.values()}
    crossed = [values[k] >= baseline + np.log(1.5) for k in labels]

    def naive_error(xs, threshold):   # L* falls with progress: predicted crossed at or below the threshold
        return sum((xv <= threshold) != c for xv, c in zip(xs, crossed)) / len(xs)

    # the primary refit, reproduced: same points, calib-v0 L* of this run, the test's settings
    fit = fit_curve([Label(checkpoint=k, value=values[k], family="gpt2", task="add-words", metric="logp_correct",
                           lstar=float(x["lstar-calib-v0"][i])) for i, k in enumerate(labels)],
                    task="add-words", metric="logp_correct", baseline=baseline, margin=curve["margin"],
                    confidence=0.9, resamples=200, seed=0, lofo=False).threshold
    primary = rows["lstar-calib-v0"]["threshold_lstar"]
    assert primary == pytest.approx(fit.estimate, abs=1e-12)
    width = fit.upper - fit.lower
    shifts = {}
    for shown, register in CURVE_COLUMNS.items():
        row = rows[register]
        (cells,) = _rows(table, re.escape(shown))
        order = np.argsort(x[register])
        mapped = float(np.interp(row["threshold_lstar"], x[register][order], x["lstar-calib-v0"][order]))
        shifts[shown] = mapped - primary
        error = naive_error(x[register], row["threshold_lstar"])
        expected = [row["threshold_lstar"], mapped, mapped - primary, width, error,
                    error - naive_error(x["lstar-calib-v0"], primary)]
        assert [_number(c) for c in cells[1:]] == [round(v, 3) + 0.0 for v in expected]
        assert row["threshold_interval_width"] == pytest.approx(width, abs=1e-12)
    text = " ".join(_section("## Registers").split())
    who = max(shifts, key=lambda k: abs(shifts[k]))
    assert f"moves at most {abs(shifts[who]):.3f} calib-v0 L\\* units ({who})" in text
    assert f"({width:.3f} wide)" in text
    assert max(abs(s) for s in shifts.values()) < width and register_flags(section, curve["curve_id"]) == []
    assert "`register_threshold_shift` does not flag the curve" in text
    assert f"(L\\* {section['lstar']['step287']['lstar-calib-v0']:.3f}) on the crossed side" in text
    spread = float(np.ptp(x["lstar-calib-v0"]))
    assert f"spread of calib-v0 L\\* over the lineage ({spread:.3f} here)" in text
    assert all(abs(s) <= spread for s in shifts.values())
    assert naive_error(x["dictionary"], rows["dictionary"]["threshold_lstar"]) == 0.0
    assert naive_error(x["technical"], rows["technical"]["threshold_lstar"]) == 0.0


@pytest.mark.parametrize("path", sorted(RESULTS.glob("cli-*.json")), ids=lambda p: p.name)
def test_one_stress_command_gave_all_three_tests(path):
    document = json.loads(path.read_text())
    assert document["schema"] == "lstar-stress/1"
    sections = document["sections"]
    assert set(sections) == {"tokenization", "registers", "task_format"}
    for row in sections["tokenization"]["checkpoints"]:
        for variant in row["variants"]:   # L* is CE minus the re-estimated unigram CE, per variant
            assert abs(variant["ce"] - variant["ce_uni"] - variant["lstar"]) < 1e-9
    for label, scores in sections["registers"]["scores"].items():
        for name, score in scores.items():
            assert abs(score["ce"] - score["ce_unigram"] - sections["registers"]["lstar"][label][name]) < 1e-9
    labels = list(sections["registers"]["lstar"])
    if len(labels) >= 2:
        for t in sections["registers"]["kendall_tau"]:
            tau = kendalltau([sections["registers"]["lstar"][k][t["a"]] for k in labels],
                             [sections["registers"]["lstar"][k][t["b"]] for k in labels]).statistic
            assert t["tau"] == pytest.approx(tau, abs=1e-12)
    for task in sections["task_format"]["tasks"]:
        table = {f["name"]: [c["value"] for c in f["checkpoints"]] for f in task["formats"]}
        if len(labels) < 2:   # one checkpoint orders nothing: no instability, said so
            assert task["instability"] is None and all(t["tau"] is None for t in sections["registers"]["kendall_tau"])
            continue
        assert task["instability"] == pytest.approx(_naive_instability(table), abs=1e-12)
