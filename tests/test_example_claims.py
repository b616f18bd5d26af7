"""The numbers the example READMEs (and the project's task-curves page, docs/curves.md) state about the shipped examples,
recomputed from the committed labels: the post-training budget claims
(`examples/post-training/budget_checks.py`) and the public-evals grouping and gaps.

The recomputations here are independent of the monitor's fitting code: the CSV is read with
`csv`, ties pooled by hand, the fits are scikit-learn's isotonic regression and the crossing a
linear interpolation written out; only the resampling scheme (seed 0, multinomial counts over
the distinct FLOPs values) is shared, so that the intervals are those of the same resamples.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import math
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy.stats import binomtest
from sklearn.isotonic import isotonic_regression

REPO = Path(__file__).resolve().parents[1]
POST = REPO / "examples" / "post-training"
PUBLIC = REPO / "examples" / "public-evals"
# The project's own account of these examples (moved there from the README).
CURVES_PAGE = REPO / "docs" / "curves.md"


def _flat(path: Path) -> str:
    """A Markdown file with its line breaks folded, so a sentence reads as one string."""
    return " ".join(path.read_text(encoding="utf-8").split())


def _checks() -> dict[str, Any]:
    return json.loads((POST / "results" / "budget-checks.json").read_text(encoding="utf-8"))


# -- post-training: an independent recomputation ---------------------------------------------------
def _grid(name: str, column: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(distinct log10 FLOPs ascending, pooled values [m, 2], pooled weights [m, 2], raw
    per-model values [models, 2]) with binomial weights n / (p(1-p)), p = (k+1)/(n+2)."""
    rows: dict[str, dict[float, tuple[float, float, float]]] = defaultdict(dict)
    with open(POST / "labels" / name, encoding="utf-8") as fh:
        for row in csv.DictReader(fh):
            value, n = float(row["value"]), float(row["n"])
            p = (value * n + 1.0) / (n + 2.0)
            rows[row["checkpoint"]][float(row[column])] = (math.log10(float(row["flops"])), value, n / (p * (1 - p)))
    levels = sorted({b for cells in rows.values() for b in cells})
    assert len(levels) == 2
    per_x: dict[float, list[tuple[list[float], list[float]]]] = defaultdict(list)
    raw = []
    for cells in rows.values():
        x = cells[levels[0]][0]
        per_x[x].append(([cells[b][1] for b in levels], [cells[b][2] for b in levels]))
        raw.append([cells[b][1] for b in levels])
    xs = sorted(per_x)
    w = np.array([[sum(ws[j] for _, ws in per_x[x]) for j in (0, 1)] for x in xs])
    y = np.array([[sum(v[j] * ws[j] for v, ws in per_x[x]) for j in (0, 1)] for x in xs]) / w
    return np.array(xs), y, w, np.array(raw)


def _isotonic(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The weighted increasing fit at `x` (distinct, ascending): what
    `IsotonicRegression(increasing=True).fit(x, y, sample_weight=w).predict(x)` gives, from the
    function it fits with. The estimator's checks, sorting and interpolator cost 1.3 ms a fit
    against 0.35, and the bootstraps below make 2,000 fits a test."""
    assert np.all(np.diff(x) > 0)
    return isotonic_regression(y, sample_weight=w, increasing=True)


def _first_at(x: np.ndarray, f: np.ndarray, level: float, start: float) -> float:
    if f[0] >= level:
        return start
    i = int(np.argmax(f >= level))
    assert f[i] >= level
    return float(x[i - 1] + (level - f[i - 1]) * (x[i] - x[i - 1]) / (f[i] - f[i - 1]))


@pytest.mark.parametrize(("task", "name", "column", "level"),
                         [("gsm8k_cot", "gsm8k-samples.csv", "samples", 0.1), ("bbh", "bbh-cot.csv", "cot", 0.35)])
def test_the_budget_checks_hold_on_an_independent_recomputation(task: str, name: str, column: str,
                                                                level: float) -> None:
    got = _checks()[task]
    x, y, w, raw = _grid(name, column)
    fits = np.stack([_isotonic(x, y[:, j], w[:, j]) for j in (0, 1)], axis=1)
    gap = fits[:, 0] - fits[:, 1]
    order = got["per_level_order"]
    assert (order["values"], order["violated"]) == (len(x), int(np.sum(gap > 1e-12)))
    assert order["largest"] == pytest.approx(gap.max(), abs=1e-9)

    diff = raw[:, 1] - raw[:, 0]
    higher, lower = int(np.sum(diff > 0)), int(np.sum(diff < 0))
    assert (got["raw_scores"]["higher"], got["raw_scores"]["lower"]) == (higher, lower)
    assert got["raw_scores"]["sign_test_p"] == pytest.approx(binomtest(higher, higher + lower).pvalue)

    # The unconstrained paired bootstrap: each level refitted alone on the fit's resamples.
    m = len(x)
    draws = np.random.default_rng(0).multinomial(m, np.full(m, 1.0 / m), size=got["shift"]["resamples"])
    shifts = []
    for counts in draws:
        keep = np.flatnonzero(counts)
        c = [_first_at(x[keep], _isotonic(x[keep], y[keep, j], w[keep, j] * counts[keep]), level, x[0])
             for j in (0, 1)]
        shifts.append(c[0] - c[1])
    low, high = np.quantile(shifts, [0.05, 0.95], method="inverted_cdf")
    free = got["shift"]["unconstrained"]
    assert (free["lower"], free["upper"]) == pytest.approx((low, high), abs=1e-9)
    assert free["share_at_or_below_zero"] == pytest.approx(np.mean(np.array(shifts) <= 0))
    assert free["estimate"] == pytest.approx(_first_at(x, fits[:, 0], level, x[0])
                                             - _first_at(x, fits[:, 1], level, x[0]), abs=1e-9)


def test_the_readmes_state_the_budget_checks_numbers() -> None:
    """Every number the READMEs say about the budget is the checks' number, rounded as written."""
    checks = _checks()
    bbh, gsm = checks["bbh"], checks["gsm8k_cot"]
    curve = json.loads((POST / "results" / "bbh-curve.json").read_text(encoding="utf-8"))
    off, on = (c["threshold"] for c in curve["budget"]["curves"])
    for text in (_flat(CURVES_PAGE), _flat(POST / "README.md")):
        b, f = bbh["shift"]["bivariate"], bbh["shift"]["unconstrained"]
        assert (f"by {b['estimate']:.2f} log10 FLOPs as fitted, but the data place the shift only between "
                f"{b['lower']:.2f} and {b['upper']:.2f}") in text
        assert f"overlap on {off['lower']:.2f}–{on['upper']:.2f}" in text
        assert f"below a quarter of a decade in {round(100 * f['share_below_quarter_decade'])} %" in text
        assert f["share_at_or_below_zero"] == 0.0 and "positive in every resample" in text
        raw = bbh["raw_scores"]
        assert (f"scores higher for {raw['higher']} of the {raw['models']} models and lower for {raw['lower']} "
                f"(sign test p = {raw['sign_test_p']:.2f})") in text
        g = gsm["shift"]["bivariate"]
        assert f"moves GSM8K's threshold by {g['estimate']:.3f} [{g['lower']:.4f}, {g['upper']:.2f}]" in text
        go, bo = gsm["per_level_order"], bbh["per_level_order"]
        assert (f"break the budget order at {go['violated']} of {go['values']} (GSM8K) and {bo['violated']} of "
                f"{bo['values']} (BBH) FLOPs values, by at most {go['largest']:.4f} and {bo['largest']:.3f}") in text
    raw = gsm["raw_scores"]
    assert (f"higher for {raw['higher']} of {raw['models']} models and lower for {raw['lower']} ({raw['ties']} tied; "
            f"sign test p = {raw['sign_test_p']:.2g})") in _flat(POST / "README.md")
    assert "already ordered" not in _flat(CURVES_PAGE)


@pytest.mark.slow
def test_the_bivariate_shift_bootstrap_uses_the_artifacts_resamples() -> None:
    """The script's bivariate paired bootstrap (1000 refits, a few CPU-seconds) gives back the committed
    numbers, and each level's crossing percentiles are the artifact's stored ones: the same
    resamples as the table's intervals."""
    spec = importlib.util.spec_from_file_location("budget_checks", POST / "budget_checks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    got = module.check(POST / "labels" / "bbh-cot.csv", "cot", 0.35, resamples=1000, seed=0)
    mine, committed = got["shift"]["bivariate"], _checks()["bbh"]["shift"]["bivariate"]
    for key in ("estimate", "lower", "median", "upper", "share_at_or_below_zero", "share_below_quarter_decade"):
        assert mine[key] == pytest.approx(committed[key], abs=1e-12), key
    curve = json.loads((POST / "results" / "bbh-curve.json").read_text(encoding="utf-8"))
    for j, level in enumerate(curve["budget"]["curves"]):
        stored = level["threshold"]["bootstrap"]
        mine = got["shift"]["bivariate"]["crossing_percentiles"][j]
        assert (mine["lower"], mine["median"], mine["upper"]) == (stored["early"], stored["median"], stored["late"])


# -- public-evals: what each task lacks, and how families are grouped -----------------------------
def _public_rows(name: str) -> list[dict[str, str]]:
    with open(PUBLIC / "labels" / name, encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def test_the_public_evals_gaps_and_families_are_those_the_readme_names() -> None:
    rows = _public_rows("obsscaling-hkust.csv")
    models = {r["checkpoint"] for r in rows}
    assert len(models) == 28
    lacks = {task: sorted(models - {r["checkpoint"] for r in rows if r["task"] == task})
             for task in ("mmlu", "arc_challenge", "gsm8k", "humaneval")}
    assert lacks == {"mmlu": [], "gsm8k": [], "arc_challenge": ["Llama-3-70b", "Llama-3-8b"],
                     "humaneval": ["Deepseek-llm-67b", "Falcon-40b", "Falcon-7b"]}
    tokenizer = {r["checkpoint"]: r["family"] for r in rows}
    release = {r["checkpoint"]: r["family"] for r in _public_rows("obsscaling-hkust-by-release.csv")}
    assert set(release) == models
    groups: dict[str, set[str]] = defaultdict(set)
    for model in models:
        groups[tokenizer[model]].add(release[model])
    assert groups == {"llama": {"Llama-1", "Llama-2"}, "llama-3": {"Llama-3"}, "qwen": {"Qwen", "Qwen1.5", "Qwen2"},
                      "mistral": {"Mistral", "Mixtral"}, "deepseek": {"DeepSeek-LLM", "DeepSeek-V2"},
                      "yi": {"Yi"}, "falcon": {"Falcon"}}
    # The by-release file is the same rows with only the family changed.
    strip = [{k: v for k, v in r.items() if k != "family"} for r in rows]
    assert strip == [{k: v for k, v in r.items() if k != "family"}
                     for r in _public_rows("obsscaling-hkust-by-release.csv")]
    text = _flat(PUBLIC / "README.md")
    assert ("no ARC-C for Llama-3-8b and Llama-3-70b, and no HumanEval for Falcon-7b, Falcon-40b and "
            "Deepseek-llm-67b") in text
    for task, (n_tok, n_rel) in {"mmlu": (7, 12), "arc_challenge": (6, 11), "gsm8k": (7, 12),
                                 "humaneval": (6, 11)}.items():
        present = {r["checkpoint"] for r in rows if r["task"] == task}
        assert (len({tokenizer[m] for m in present}), len({release[m] for m in present})) == (n_tok, n_rel)


def test_make_labels_writes_the_committed_by_release_file(shared_dir: Path, tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("make_labels", PUBLIC / "make_labels.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--data", str(shared_dir / "data" / "public-evals"), "--out", str(tmp_path)]) == 0
    for name in ("obsscaling-hkust.csv", "obsscaling-hkust-by-release.csv"):
        assert (tmp_path / name).read_bytes() == (PUBLIC / "labels" / name).read_bytes(), name


def _choice(folder: Path, task: str) -> dict[str, Any]:
    return json.loads((folder / f"{task}.json").read_text(encoding="utf-8"))["tasks"][0]


def _vs(choice: dict[str, Any], axis: str) -> dict[str, Any]:
    return next(r for r in choice["axes"] if r["axis"] == axis)["vs_reference"]["rmse"]


def test_the_readmes_state_what_grouping_by_release_changes() -> None:
    by_release = PUBLIC / "results" / "by-release"
    mmlu = _choice(by_release, "mmlu")
    assert mmlu["recommended"] == "log_flops" and _choice(PUBLIC / "results", "mmlu")["recommended"] == "bits_per_byte"
    assert [_choice(by_release, t)["recommended"] for t in ("arc_challenge", "gsm8k", "humaneval")] == \
        ["bits_per_byte"] * 3
    flops = _vs(mmlu, "log_flops")
    sentence = (f"log FLOPs beats bits per character on MMLU by the rule (Δ RMSE {flops['difference']:.3f} "
                f"[{flops['lower']:.3f}, {flops['upper']:.4f}], p = {flops['p_value']:.3f})")
    for text in (_flat(PUBLIC / "README.md"), _flat(CURVES_PAGE)):
        assert sentence in text, sentence
    text = _flat(PUBLIC / "README.md")
    by_tokenizer = _vs(_choice(PUBLIC / "results", "mmlu"), "log_flops")
    assert f"where by tokenizer it does not (p = {by_tokenizer['p_value']:.2g})" in text
    for task, axis in (("gsm8k", "log_params"), ("humaneval", "log_params"), ("humaneval", "log_flops")):
        got = _vs(_choice(by_release, task), axis)
        assert f"p = {got['p_value']:.2g}" in text and got["lower"] > 0
    assert re.search(r"ARC-C's recommendation (stays|is unchanged)", text)
