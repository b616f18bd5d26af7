"""Choosing the progress axis by leave-one-family-out evidence (`monitor.curves.axis_choice`):
the sign-flip permutation test against hand-enumerated cases, the recommendation rule on
synthetic families where the right axis is known by construction, labels CSVs that import
axis values, and the published-data example through `lstar curves validate --axes --json`."""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import io
import itertools
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from monitor.cli import main
from monitor.curves import axis_choice
from monitor.curves.axis_choice import ChoiceConfig, axis_values, choose_axis, parse_axes, sign_flip_pvalue
from monitor.curves.labels import Label, read_labels_csv
from monitor.errors import CurveError, LabelError

REPO = Path(__file__).resolve().parent.parent
FAST = ChoiceConfig(family_resamples=20, resamples=10)


# -- the permutation test ------------------------------------------------------------------------
@pytest.mark.parametrize(("diffs", "expected"), [
    # 8 sign patterns of (1, 2, -0.5): |sums| 2.5, 3.5, 1.5, 0.5, 0.5, 1.5, 3.5, 2.5 -> 4 reach 2.5.
    ((1.0, 2.0, -0.5), 4 / 8),
    # (3, 1, 1): |±3 ± 1 ± 1| is 5 only with all signs equal -> 2 of 8.
    ((3.0, 1.0, 1.0), 2 / 8),
    # Four equal differences: only all-plus and all-minus reach |4|.
    ((0.1, 0.1, 0.1, 0.1), 2 / 16),
    # All zero: every pattern ties the observed mean.
    ((0.0, 0.0, 0.0), 1.0),
])
def test_sign_flip_pvalue_matches_hand_enumeration(diffs: tuple[float, ...], expected: float) -> None:
    p, how = sign_flip_pvalue(diffs)
    assert p == pytest.approx(expected, abs=1e-12) and how.startswith("exact")


def test_sign_flip_pvalue_beyond_16_families_is_seeded_monte_carlo() -> None:
    d = np.linspace(0.5, 1.5, 17)
    p1, how = sign_flip_pvalue(d, permutations=2000, seed=3)
    assert "Monte Carlo" in how and p1 == sign_flip_pvalue(d, permutations=2000, seed=3)[0]
    # Exact value by enumeration: 2 of 2^17 patterns reach |mean| (all +, all −) plus the few
    # flipping only small differences; the Monte Carlo estimate is close to it.
    signs = np.array(list(itertools.product((1.0, -1.0), repeat=17)))
    exact = float(np.mean(np.abs(signs @ d) >= abs(d.sum()) - 1e-9))
    assert exact < 0.001 and p1 <= 0.01


# -- the rule on synthetic families ----------------------------------------------------------------
def _families(good: str, offset_axis: str, *, n_fam: int = 6, per: int = 7) -> list[Label]:
    """Families whose performance is one logistic curve of the `good` axis; on `offset_axis`
    each family is shifted by its own offset, so its threshold differs between families."""
    labels = []
    offsets = np.linspace(-0.6, 0.6, n_fam)
    for f in range(n_fam):
        for j in range(per):
            x = 3.0 - 2.0 * j / (per - 1) + 0.05 * f          # progress: lower x
            value = 1.0 / (1.0 + math.exp(6.0 * (x - 2.0)))
            axes = {good: x, offset_axis: x + offsets[f]}
            labels.append(Label(checkpoint=f"f{f}-{j}", family=f"fam{f}", value=value, n=1000,
                                **axes))
    return labels


def _row(choice: dict[str, Any], axis: str) -> dict[str, Any]:
    return next(r for r in choice["axes"] if r["axis"] == axis)


def test_an_axis_on_which_thresholds_transfer_beats_lstar_with_family_offsets() -> None:
    labels = _families(good="bits_per_byte", offset_axis="lstar")
    choice = choose_axis(labels, baseline=0.0, margin=0.5, axes=["lstar", "bits_per_byte"], config=FAST)
    assert choice["reference"] == "lstar" and choice["recommended"] == "bits_per_byte"
    bpb, lstar = _row(choice, "bits_per_byte"), _row(choice, "lstar")
    assert bpb["rmse"] < lstar["rmse"]
    cmp = bpb["vs_reference"]
    assert cmp["better_by_rule"] and cmp["n_families"] == 6
    # 6 families all better: only 2 of 2^6 sign patterns reach the observed mean.
    assert cmp["rmse"]["p_value"] == pytest.approx(2 / 64)
    assert cmp["rmse"]["upper"] < 0
    # The difference is the mean of the per-family differences, recomputed here.
    per = {r["family"]: r["rmse"] for r in bpb["per_family"]}
    ref = {r["family"]: r["rmse"] for r in lstar["per_family"]}
    assert cmp["rmse"]["difference"] == pytest.approx(np.mean([per[f] - ref[f] for f in per]), abs=1e-12)
    # The pooled RMSE is the per-family RMSEs pooled by their counts.
    pooled = math.sqrt(sum(r["n"] * r["rmse"] ** 2 for r in bpb["per_family"]) / sum(r["n"] for r in bpb["per_family"]))
    assert bpb["rmse"] == pytest.approx(pooled, rel=1e-9)
    assert "default lstar" in choice["rule"] and "p < 0.05" in choice["rule"]


def test_lstar_stays_when_it_is_the_transferring_axis_or_when_axes_tie() -> None:
    labels = _families(good="lstar", offset_axis="bits_per_byte")
    choice = choose_axis(labels, baseline=0.0, margin=0.5, axes=["lstar", "bits_per_byte"], config=FAST)
    assert choice["recommended"] == "lstar"
    assert _row(choice, "bits_per_byte")["vs_reference"]["rmse"]["difference"] > 0
    # A monotone transform of L* gives the same isotonic fits: every family ties, p = 1.
    tied = [label.with_(bits_per_byte=2.0 * label.lstar + 1.0) for label in labels]
    choice = choose_axis(tied, baseline=0.0, margin=0.5, axes=["lstar", "bits_per_byte"], config=FAST)
    cmp = _row(choice, "bits_per_byte")["vs_reference"]
    assert choice["recommended"] == "lstar" and not cmp["better_by_rule"]
    assert cmp["rmse"]["difference"] == pytest.approx(0.0, abs=1e-12) and cmp["rmse"]["p_value"] == 1.0


def test_an_axis_missing_on_some_points_is_validated_on_the_others_and_says_so() -> None:
    labels = _families(good="bits_per_byte", offset_axis="lstar")
    labels = [label.with_(bits_per_byte=None) if label.checkpoint.endswith("-0") else label for label in labels]
    choice = choose_axis(labels, baseline=0.0, margin=0.5, axes=["lstar", "bits_per_byte", "log_flops"],
                         config=FAST)
    bpb = _row(choice, "bits_per_byte")
    assert bpb["n_points"] == 36 and "validated only on the 36 of 42 points" in bpb["note"]
    assert _row(choice, "lstar")["n_points"] == 42 and _row(choice, "lstar")["note"] is None
    assert _row(choice, "log_flops") == {"axis": "log_flops", "available": False, "reason": "no point has it"}


def test_without_lstar_the_first_available_axis_is_the_reference() -> None:
    labels = [label.with_(lstar=None, params=10 ** (4 - label.bits_per_byte))
              for label in _families(good="bits_per_byte", offset_axis="lstar")]
    choice = choose_axis(labels, baseline=0.0, margin=0.5, config=FAST)
    assert choice["reference"] == "bits_per_byte" and "no point has L*" in choice["reference_note"]
    assert "here bits_per_byte" in choice["rule"]
    # log10 of params is an exact monotone transform of bits/byte here: a tie.
    assert choice["recommended"] == "bits_per_byte"


def test_bad_axis_names_and_rows_without_a_family() -> None:
    with pytest.raises(CurveError, match="unknown axis 'bpc'"):
        parse_axes("lstar,bpc")
    assert parse_axes("all")[0] == "lstar" and parse_axes("raw_ce, lstar") == ["raw_ce", "lstar"]
    with pytest.raises(LabelError, match="needs a family"):
        choose_axis([Label(checkpoint="a", value=0.5, lstar=1.0)], baseline=0.0, margin=0.1)


# -- labels CSVs with axis columns ----------------------------------------------------------------
def test_a_labels_csv_imports_axis_values_without_lstar(tmp_path: Path) -> None:
    path = tmp_path / "labels.csv"
    path.write_text("checkpoint,family,value,n,bits_per_byte,log_params,flops\n"
                    "m-7b,llama,0.4,100,0.61,9.8,8.4e22\nm-13b,llama,0.5,100,0.58,,\n", encoding="utf-8")
    labels = read_labels_csv(path)
    assert labels[0].lstar is None and labels[0].bits_per_byte == 0.61
    assert labels[0].params == pytest.approx(10 ** 9.8) and labels[0].flops == 8.4e22
    assert set(labels[0].imported) == {"bits_per_byte", "log_params", "log_flops"}
    assert labels[1].bits_per_byte == 0.58 and labels[1].params is None and labels[1].imported == ("bits_per_byte",)
    np.testing.assert_allclose(axis_values(labels, "log_params"), [9.8, np.nan])
    path.write_text("checkpoint,family,value,n\nm,llama,0.4,100\n", encoding="utf-8")
    with pytest.raises(LabelError, match="no axis column"):
        read_labels_csv(path)


# -- the published-data example --------------------------------------------------------------------
def _make_labels(shared_dir: Path, out: Path) -> None:
    spec = importlib.util.spec_from_file_location("make_labels", REPO / "examples" / "public-evals" / "make_labels.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--data", str(shared_dir / "data" / "public-evals"), "--out", str(out)]) == 0


@pytest.fixture(scope="module")
def public_labels(shared_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example's labels CSVs, written once for the module by its own script."""
    out = tmp_path_factory.mktemp("public-evals")
    with contextlib.redirect_stdout(io.StringIO()):   # the script's own "wrote ..." lines
        _make_labels(shared_dir, out)
    return out


VALIDATE = ["--baseline", "0", "--margin", "0.1", "--family-resamples", "20", "--bootstrap", "50", "--json"]


@pytest.fixture(scope="module")
def gsm8k_run(public_labels: Path) -> tuple[int, dict[str, Any], list[tuple[list[Label], dict[str, Any], dict[str, Any]]]]:
    """`lstar curves validate --task gsm8k --axes all --json` on the example's labels, run once
    for the module: its exit code, its JSON, and each `choose_axis` call it made (labels,
    keyword arguments, result), which the every-task test reuses for gsm8k."""
    calls: list[tuple[list[Label], dict[str, Any], dict[str, Any]]] = []
    real = axis_choice.choose_axis

    def recording(labels: Any, **kwargs: Any) -> dict[str, Any]:
        result = real(labels, **kwargs)
        calls.append((list(labels), kwargs, copy.deepcopy(result)))
        return result

    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(io.StringIO()) as out:
        patch.setattr(axis_choice, "choose_axis", recording)
        code = main(["curves", "validate", "--labels", str(public_labels / "obsscaling-hkust.csv"),
                     "--task", "gsm8k", "--axes", "all", *VALIDATE])
    return code, json.loads(out.getvalue()), calls


def _check_choice(choice: dict[str, Any], reference: str) -> None:
    """Structure and finiteness of one task's axis choice, and its p-value recomputed by a
    naive loop over all 2^F sign patterns of the per-family differences it reports."""
    assert choice["reference"] == reference and choice["rule"].startswith("default lstar, here " + reference)
    rows = {r["axis"]: r for r in choice["axes"] if r["available"]}
    assert choice["recommended"] in rows
    for r in rows.values():
        for key in ("rmse", "crossing_error"):
            assert math.isfinite(r[key]) and r[f"family_{key}"]["lower"] <= r[f"family_{key}"]["upper"]
    for axis, r in rows.items():
        if axis == reference:
            continue
        cmp = r["vs_reference"]
        mine = {p["family"]: p["rmse"] for p in r["per_family"]}
        ref = {p["family"]: p["rmse"] for p in rows[reference]["per_family"]}
        d = [mine[f] - ref[f] for f in sorted(mine)]
        if r["note"] is None:   # on the same points as the reference's own row
            hits = sum(abs(sum(s * x for s, x in zip(signs, d))) >= abs(sum(d)) - 1e-12
                       for signs in itertools.product((1, -1), repeat=len(d)))
            assert cmp["rmse"]["p_value"] == pytest.approx(hits / 2 ** len(d), abs=1e-12)
            assert cmp["rmse"]["difference"] == pytest.approx(sum(d) / len(d), abs=1e-12)


def test_the_public_evals_example_gives_an_axis_for_gsm8k(public_labels: Path, gsm8k_run: Any) -> None:
    csv_text = (public_labels / "obsscaling-hkust.csv").read_text()
    # Llama-2-7b's MMLU from ObsScaling, beside its Common Crawl bits per character from hkust.
    assert "Llama-2-7b,llama,mmlu,acc,0.4379609636092418,14042,0.612,7e+09,8.4e+22," in csv_text
    code, data, calls = gsm8k_run
    assert code == 0 and [c["task"] for c in data["tasks"]] == ["gsm8k"] and len(calls) == 1
    choice = data["tasks"][0]
    assert choice["families"] == ["deepseek", "falcon", "llama", "llama-3", "mistral", "qwen", "yi"]
    rows = {r["axis"]: r for r in choice["axes"] if r["available"]}
    assert set(rows) == {"bits_per_byte", "log_params", "log_flops"}
    assert rows["log_flops"]["n_points"] == 23 and "23 of 28 points" in rows["log_flops"]["note"]
    _check_choice(choice, "bits_per_byte")
    lp = rows["log_params"]
    assert lp["vs_reference"]["rmse"]["permutation"] == "exact, all 2^7 = 128 sign patterns"


@pytest.mark.slow
def test_every_public_evals_task_gets_a_recommended_axis(public_labels: Path, gsm8k_run: Any,
                                                        capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # gsm8k's choice is the one `gsm8k_run` computed: the same labels and keyword arguments (both
    # checked here), and `choose_axis` is a function of them (every draw seeded by the config), so
    # it is taken from there rather than computed twice; every other task is computed here.
    (gsm8k_labels, gsm8k_kwargs, gsm8k_choice), = gsm8k_run[2]
    real, reused = axis_choice.choose_axis, []

    def reusing(labels: Any, **kwargs: Any) -> dict[str, Any]:
        if kwargs == gsm8k_kwargs and list(labels) == gsm8k_labels:
            reused.append(kwargs["task"])
            return copy.deepcopy(gsm8k_choice)
        return real(labels, **kwargs)

    monkeypatch.setattr(axis_choice, "choose_axis", reusing)
    capsys.readouterr()
    code = main(["curves", "validate", "--labels", str(public_labels / "obsscaling-hkust.csv"), "--axes", "all",
                 *VALIDATE])
    data = json.loads(capsys.readouterr().out)
    assert code == 0 and [c["task"] for c in data["tasks"]] == ["arc_challenge", "gsm8k", "humaneval", "mmlu"]
    assert reused == ["gsm8k"]
    for choice in data["tasks"]:
        assert len(choice["families"]) in (6, 7)   # ObsScaling lacks ARC-C of Llama-3, HumanEval of Falcon
        _check_choice(choice, "bits_per_byte")
    # Pythia's LAMBADA with the isotonic family only: what is checked here (the 15 families, the
    # raw-CE reference, the exact 2^15-pattern p-values) is read from the first fit family's
    # table, which the sigmoid refits do not change; those refits (15 folds on each of 20
    # family draws, per axis) cost 50 of this test's 80 CPU-seconds, and the sigmoid family is
    # validated through the same command on the four ObsScaling tasks above.
    code = main(["curves", "validate", "--labels", str(public_labels / "pythia-lambada.csv"),
                 "--axes", "raw_ce,log_params,log_flops", "--fit-families", "isotonic", *VALIDATE])
    data = json.loads(capsys.readouterr().out)
    assert code == 0 and len(data["tasks"][0]["families"]) == 15
    assert data["tasks"][0]["fit_families"] == ["isotonic"]
    _check_choice(data["tasks"][0], "raw_ce")
