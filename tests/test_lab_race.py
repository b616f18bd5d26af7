"""The race between progress axes (`monitor.lab.analysis.race`) on race rows with a known answer
(`monitor.lab.synthetic`): a task metric that is a known logistic function of a latent progress,
L* equal to that progress plus noise that does not depend on the family, bits/byte with a
fixed offset per family (L* must win, and the verdict must say so) or without one (nothing
may be concluded). The statistics are checked against independent computations: the
permutation p-value against a brute-force enumeration, Holm and Cochran's Q / τ² against
hand-worked examples; the bootstrap against what a refit must do; the JSON is strict."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from lanes import fast_first

from monitor.curves.axis_choice import cluster_draw
from monitor.errors import LabError
from monitor.lab import analysis
from monitor.lab.analysis import RaceConfig, cochran_q, holm, race, verdict
from monitor.lab.synthetic import synthetic_race_rows

# Four axes keep each test under a few seconds; the full set is raced by the CLI test.
FAST = RaceConfig(resamples=20, threshold_resamples=20, axes=("lstar", "lstar_oos", "bits_per_byte", "bytes_seen"))


def _additions_only(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows with only the additions' metrics (halves the work of a test)."""
    for r in rows:
        r["metrics"] = {"add-words": r["metrics"]["add-words"]}
        r["baselines"] = {"add-words": r["baselines"]["add-words"]}
    return rows


def _rows(**kw: Any) -> list[dict[str, Any]]:
    return _additions_only(synthetic_race_rows(seeds=2, steps=14, **kw))


def _entry(result: dict[str, Any], task: str = "add-words", metric: str = "exact_match") -> dict[str, Any]:
    [e] = [m for m in result["metrics"] if m["task"] == task and m["metric"] == metric]
    return e


@pytest.fixture(scope="module")
def lstar_wins() -> dict[str, Any]:
    return race(_rows(winner="lstar"), FAST)


# -- known answers --------------------------------------------------------------------------------
def test_the_axis_without_family_offsets_wins_and_the_verdict_says_so(lstar_wins: dict[str, Any]) -> None:
    p = lstar_wins["primary"]
    assert p["role"] == "primary" and p["axis"] == "bits_per_byte" and p["metric"] == "exact_match"
    assert p["statement"] == "L* transfers better than bits/byte"
    assert p["decided"] and p["failed"] == [] and all(p["checks"].values())
    # six families, every one erring more on bits/byte: the most extreme of 2^6 sign patterns
    assert p["p_value"] == pytest.approx(2 / 64)
    assert p["difference"] > 0.05 and 0 < p["lower"] <= p["upper"]
    assert set(p["signs_by_size"]) == {"calib/small", "calib/large", "heldout/small", "heldout/large"}
    # each family's own LOFO error on bits/byte exceeds that on L*
    calib = _entry(lstar_wins)["texts"]["calib"]["axes"]
    per = calib["bits_per_byte"]["vs_reference"]["crossing_error"]["per_family"]
    assert len(per) == 6 and all(d > 0 for d in per.values())
    lstar_fams = {f["family"]: f for f in calib["lstar"]["per_family"]}
    for f in calib["bits_per_byte"]["per_family"]:
        assert f["crossing_error"] == pytest.approx(lstar_fams[f["family"]]["crossing_error"] + per[f["family"]])
        assert set(f["by_size"]) == {"small", "large"}


@pytest.mark.parametrize("seed", fast_first([0, 1, 2]))
def test_equivalent_axes_are_not_declared_different(seed: int) -> None:
    result = race(_rows(winner=None, seed=seed), FAST)
    p = result["primary"]
    assert p["statement"] == "not distinguishable" and not p["decided"]
    assert p["p_value"] > 0.2 and "permutation_p_below_alpha" in p["failed"]
    # "equivalent" is never a verdict
    assert all("equivalent" not in v["statement"] for m in result["metrics"] for v in m["verdicts"].values())


def test_a_winner_on_one_text_only_is_not_a_verdict() -> None:
    """On the heldout text bits/byte is an increasing function of L* (the same fit, the same
    errors): the calib advantage alone does not make a verdict."""
    rows = _rows(winner="lstar")
    for r in rows:
        if r["text"] == "heldout":
            r["axes"]["bits_per_byte"] = 2.0 + 0.6 * r["axes"]["lstar"]
    p = race(rows, FAST)["primary"]
    assert p["checks"]["permutation_p_below_alpha"] and p["checks"]["interval_excludes_zero"]
    assert p["signs_by_text"] == {"calib": 1, "heldout": 0}
    assert p["failed"] == ["same_sign_on_both_texts", "same_sign_within_each_size"]
    assert p["statement"] == "not distinguishable"


def test_a_difference_that_is_zero_up_to_rounding_has_no_sign() -> None:
    """A mean of per-family differences that are all exactly zero can come out as 1.85e-17 (it did
    in the full run); read as positive, it could satisfy "the same sign within each size"."""
    exact = {"difference": 1 / 36 - 1 / 18, "lower": -0.1, "upper": -0.01, "p_value": 0.01}
    comps = {"calib": {"crossing_error": {**exact, "by_size": {"large": -0.05, "small": 1.850371707708594e-17}}},
             "heldout": {"crossing_error": {**exact, "by_size": {"large": -0.05, "small": -0.05}}}}
    v = verdict("bits_per_byte", comps, p_used=0.01, cfg=RaceConfig())
    assert v["signs_by_size"]["calib/small"] == 0
    assert v["failed"] == ["same_sign_within_each_size"] and v["statement"] == "not distinguishable"
    comps["calib"]["crossing_error"]["by_size"]["small"] = -0.05
    assert verdict("bits_per_byte", comps, p_used=0.01, cfg=RaceConfig())["decided"]


def test_per_family_thresholds_spread_on_the_offset_axis_only(lstar_wins: dict[str, Any]) -> None:
    th = _entry(lstar_wins, metric="acc")["thresholds"]["calib"]
    assert th["bits_per_byte"]["k"] >= 4 and th["lstar"]["k"] >= 4
    assert th["bits_per_byte"]["p_value"] < 1e-6 and th["bits_per_byte"]["i2"] > 0.9
    assert th["lstar"]["p_value"] > 0.01


def test_negative_control_bytes_seen_fails_across_sizes(lstar_wins: dict[str, Any]) -> None:
    c = lstar_wins["negative_control"]
    assert c["ran"] and c["sizes"] == ["large", "small"]
    assert c["errors"]["bytes_seen"]["crossing_error"] > c["errors"]["lstar"]["crossing_error"]
    assert c["failed_to_transfer"] is True
    assert set(c["per_held_out_size"]["bytes_seen"]) == {"large", "small"}


def test_negative_control_needs_two_sizes() -> None:
    rows = _additions_only(synthetic_race_rows(families=3, sizes=("small",), seeds=1, steps=8))
    result = race(rows, FAST)
    assert result["negative_control"]["ran"] is False and "one size" not in result["negative_control"]["reason"]
    assert "1 size(s)" in result["negative_control"]["reason"]


# -- the statistics against independent computations ----------------------------------------------
def _brute_force_p(diffs: list[float]) -> float:
    observed = abs(sum(diffs) / len(diffs))
    hits = 0
    for signs in itertools.product((1, -1), repeat=len(diffs)):
        if abs(sum(s * d for s, d in zip(signs, diffs)) / len(diffs)) >= observed - 1e-12:
            hits += 1
    return hits / 2 ** len(diffs)


def test_permutation_p_is_exact_on_four_families() -> None:
    result = race(_rows(winner="lstar", families=4), FAST)
    checked = 0
    for m in result["metrics"]:
        for a, r in m["texts"]["calib"]["axes"].items():
            vs = r.get("vs_reference")
            if not vs:
                continue
            for e in ("rmse", "crossing_error"):
                diffs = list(vs[e]["per_family"].values())
                assert len(diffs) == 4 and vs[e]["permutation"].startswith("exact")
                assert vs[e]["p_value"] == pytest.approx(_brute_force_p(diffs), abs=1e-12)
                checked += 1
    assert checked == 3 * 3 * 2   # three metrics × three axes against L* × two errors
    # with four families no comparison can reach p < 0.05, so nothing is decided
    assert result["design"]["smallest_permutation_p"] == pytest.approx(0.125)
    assert not any(v["decided"] for m in result["metrics"] for v in m["verdicts"].values())


def test_holm_against_a_hand_computation() -> None:
    # sorted: d .005·4 = .02, a .01·3 = .03, c .03·2 = .06, b .04·1 = .04 → max(.06, .04)
    out = holm({"a": 0.01, "b": 0.04, "c": 0.03, "d": 0.005, "e": None})
    assert out == pytest.approx({"d": 0.02, "a": 0.03, "c": 0.06, "b": 0.06, "e": None})
    assert holm({"x": 0.6, "y": 0.7}) == {"x": 1.0, "y": 1.0}


def test_cochran_q_and_tau2_against_hand_worked_examples() -> None:
    # w = 1, 1, 1/4; pooled = 3.75/2.25 = 5/3; Q = (2/3)² + (1/3)² + (4/3)²/4 = 1; df 2;
    # p = exp(−1/2) (chi-squared with 2 df); C = 2.25 − 2.0625/2.25; τ² = max(0, (1 − 2)/C) = 0
    q = cochran_q([1.0, 2.0, 3.0], [1.0, 1.0, 2.0])
    assert q["pooled"] == pytest.approx(5 / 3) and q["q"] == pytest.approx(1.0) and q["df"] == 2
    assert q["p_value"] == pytest.approx(math.exp(-0.5)) and q["tau2"] == 0.0 and q["i2"] == 0.0
    # equal se 1: pooled 2, Q = 8, p = exp(−4), C = 3 − 3/3 = 2, τ² = (8 − 2)/2 = 3, I² = 6/8
    q = cochran_q([0.0, 2.0, 4.0], [1.0, 1.0, 1.0])
    assert (q["q"], q["tau2"], q["i2"]) == pytest.approx((8.0, 3.0, 0.75))
    assert q["p_value"] == pytest.approx(math.exp(-4.0))
    assert cochran_q([1.0], [0.5])["q"] is None


def test_two_stage_draw_resamples_families_then_seeds_within_each_size() -> None:
    rows = _rows(winner="lstar", families=3)
    d = analysis._data(analysis.check_rows(rows), "add-words", "exact_match", "calib")
    names = sorted(set(d.family.tolist()))
    rng = np.random.default_rng(5)
    varied = False
    for _ in range(30):
        mult, copies = cluster_draw(d.family, rng, sizes=d.size, seeds=d.seed)
        assert sum(copies.values()) == 3
        for fam in names:
            for size in ("small", "large"):
                cell = (d.family == fam) & (d.size == size)
                # each drawn copy draws as many seeds as the cell has, whole lineages at a time
                assert mult[cell].sum() == copies.get(fam, 0) * cell.sum()
                for s in (0, 1):
                    lineage = cell & (d.seed == s)
                    assert len(set(mult[lineage].tolist())) == 1
                if copies.get(fam, 0) == 1 and len(set(mult[cell].tolist())) > 1:
                    varied = True
    assert varied   # the second stage does resample seeds


def test_the_bootstrap_refits_the_whole_lofo(monkeypatch: pytest.MonkeyPatch) -> None:
    rows = _rows(winner="lstar", families=4)
    for r in rows:   # an axis that is L* plus a constant: every refit gives it L*'s errors
        r["axes"]["lstar_oos"] = r["axes"]["lstar"] + 7.0
    calls = []
    real = analysis.lofo_axes

    def spy(*args: Any, **kw: Any) -> Any:
        calls.append(len(args[0]))
        return real(*args, **kw)

    from monitor.curves import axis_choice

    monkeypatch.setattr(analysis, "lofo_axes", spy)
    monkeypatch.setattr(axis_choice, "lofo_axes", spy)
    cfg = RaceConfig(resamples=25, threshold_resamples=20, axes=FAST.axes)
    result = race(rows, cfg)
    metrics = len(result["metrics"])
    # per metric: one LOFO per text, one per resample on calib; plus the control's
    assert len(calls) == metrics * (2 + 25) + 1
    e = _entry(result)["texts"]["calib"]["axes"]
    shifted = e["lstar_oos"]["vs_reference"]["crossing_error"]
    assert (shifted["difference"], shifted["lower"], shifted["upper"]) == (0.0, 0.0, 0.0)
    # bits/byte's LOFO changes with the families drawn: its interval has width
    bpb = e["bits_per_byte"]["vs_reference"]["crossing_error"]
    assert bpb["upper"] - bpb["lower"] > 0.01
    assert e["bits_per_byte"]["vs_reference"]["bootstrap"]["resamples"] == 25
    # the heldout text is not resampled by default: no interval, said so by None
    held = _entry(result)["texts"]["heldout"]["axes"]["bits_per_byte"]["vs_reference"]
    assert held["crossing_error"]["lower"] is None and held["bootstrap"] is None


# -- input and output -----------------------------------------------------------------------------
def test_result_is_strict_json_and_deterministic(lstar_wins: dict[str, Any]) -> None:
    text = json.dumps(lstar_wins, sort_keys=True, allow_nan=False)
    assert json.dumps(race(_rows(winner="lstar"), FAST), sort_keys=True, allow_nan=False) == text


def test_constant_metric_and_missing_axis_stay_strict_json() -> None:
    rows = _rows(winner="lstar", families=3)
    for r in rows:
        r["metrics"]["add-words"]["p_correct"] = 0.5
        r["axes"].pop("lstar_oos")
    result = race(rows, FAST)
    json.dumps(result, allow_nan=False)
    assert "values constant" in _entry(result, metric="p_correct")["texts"]["calib"]["skipped"]
    assert _entry(result)["texts"]["calib"]["axes"]["lstar_oos"]["available"] is False


@pytest.mark.parametrize("mutate, expected", [
    (lambda r: r[3]["axes"].update(lstar=float("nan")), "race row 3: axes.lstar is nan"),
    (lambda r: r[0].update(text="train"), "race row 0: text is 'train'"),
    (lambda r: r[1].update(step=r[0]["step"], text=r[0]["text"], seed=r[0]["seed"], size=r[0]["size"]),
     "is listed more than once"),
    (lambda r: r[2].pop("family"), "race row 2 has no 'family'"),
    (lambda r: r[0]["metrics"]["add-words"].update(acc="high"), "race row 0: metrics.add-words.acc"),
    (lambda r: r[0]["baselines"]["add-words"].update(acc=0.5), "disagree on the baseline"),
])
def test_bad_rows_are_one_clear_line(mutate: Any, expected: str) -> None:
    rows = _rows(families=2)
    mutate(rows)
    with pytest.raises(LabError) as info:
        race(rows, FAST)
    line = info.value.one_line()
    assert expected in line and "\n" not in line


def test_report_from_a_rows_file_through_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from monitor.cli import main

    path = tmp_path / "rows.json"
    path.write_text(json.dumps({"rows": _rows(winner="lstar")}))
    out = tmp_path / "report"
    assert main(["lab", "report", "--rows", str(path), "--out", str(out), "--resamples", "20",
                 "--axes", "bits_per_byte", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    saved = json.loads((out / "lab-report.json").read_text())
    assert printed == saved and saved["primary"]["statement"] == "L* transfers better than bits/byte"
    calib = _entry(saved)["texts"]["calib"]["axes"]["bits_per_byte"]
    assert {"per_family", "family_mean", "vs_reference"} <= set(calib)
    assert {"difference", "p_value", "p_holm", "lower", "upper"} <= set(calib["vs_reference"]["crossing_error"])
    assert _entry(saved)["verdicts"]["bits_per_byte"]["role"] == "primary"
    md = (out / "lab-report.md").read_text()
    assert "**L* transfers better than bits/byte**" in md and "written before the full run" in md
    assert "not independent" in md and "lossless" in md and "smallest exact sign-flip p-value is 2/2^6" in md
    assert "failed to transfer across sizes" in md
    html = (out / "lab-report.html").read_text()
    assert html.count("data:image/png;base64,") == len(saved["plots"]) == 1 + 3
    for p in saved["plots"]:
        assert (out / p["file"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(set(saved["family_colours"].values())) == 6 and set(saved["size_markers"]) == {"small", "large"}


def test_report_of_a_lab_without_race_rows_is_one_clear_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A version-1 lab.json has no held-out text, sizes or lineages: the report refuses it in
    one line naming the file and writes nothing."""
    from monitor.cli import main
    from monitor.lab import records

    lab = {"schema": records.LAB_SCHEMA, "config": {}, "families": [], "checkpoints": []}
    path = tmp_path / "lab.json"
    path.write_text(json.dumps(lab))
    out = tmp_path / "report"
    code = main(["lab", "report", "--lab", str(path), "--out", str(out)])
    err = capsys.readouterr().err
    assert code != 0 and err.startswith("error: ") and "race_rows needs a lstar-lab/2" in err
    assert len(err.strip().splitlines()) == 1 and not out.exists()


def test_a_bad_rows_file_leaves_an_existing_report_intact(tmp_path: Path) -> None:
    from monitor.lab.report import write_lab_report

    path = tmp_path / "rows.json"
    path.write_text(json.dumps(_rows(families=2)))
    out = tmp_path / "report"
    write_lab_report(tmp_path, out, config=FAST, rows_file=path)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    bad = _rows(families=2)
    bad[0]["axes"]["lstar"] = "fast"
    path.write_text(json.dumps(bad))
    with pytest.raises(LabError, match="race row 0: axes.lstar"):
        write_lab_report(tmp_path, out, config=FAST, rows_file=path)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def _extreme(kind: str) -> Any:
    def mutate(rows: list[dict[str, Any]]) -> None:
        for i, r in enumerate(rows):
            if kind == "bound":
                r["axes"] = {a: 1e18 for a in r["axes"]}
            elif kind == "tiny":     # spans of 1e-300 and less: too close to fit, never NaN
                r["axes"].update(lstar=i * 1e-300, bits_per_byte=i * 5e-324)
            elif kind == "alternating":
                r["axes"]["lstar"] = -1e18 if i % 2 else 1e18
            else:
                r["bytes_seen"] = 10**18 - 1
                r["axes"]["bytes_seen"] = float(10**18 - 1)
    return mutate


@pytest.mark.parametrize("kind", fast_first(["tiny", "bound", "alternating", "counts"], keep=1))
def test_report_on_extreme_numbers_within_bounds(tmp_path: Path, kind: str) -> None:
    """Any rows the checks accept give a report, figures included, and strict JSON."""
    from monitor.lab.report import write_race_report

    rows = _additions_only(synthetic_race_rows(families=2, seeds=1, steps=6))
    _extreme(kind)(rows)
    out = tmp_path / "report"
    saved = write_race_report(rows, out, source={"path": "rows.json", "sha256": "0" * 64}, config=FAST)
    for p in saved["plots"]:
        assert (out / p["file"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    json.loads((out / "lab-report.json").read_text())
    assert saved["primary"]["statement"] == "not distinguishable"


def test_a_level_no_checkpoint_crosses_is_reported_as_uninformative(tmp_path: Path) -> None:
    """Probabilities of the answer that stay below b + ε (as the additions' did in the full run)
    make every axis's crossing error 0; the report must say the comparison carries nothing."""
    from monitor.lab.report import write_race_report

    rows = _rows(families=3)
    values = [r["metrics"]["add-words"]["p_correct"] for r in rows]
    low, high = min(values), max(values)
    for r in rows:   # the same rise, squeezed into [b, b + 0.09]: below the level b + 0.1 throughout
        m = r["metrics"]["add-words"]
        m["p_correct"] = r["baselines"]["add-words"]["p_correct"] + 0.09 * (m["p_correct"] - low) / (high - low)
    saved = write_race_report(rows, tmp_path, source={"path": "rows.json", "sha256": "0" * 64}, config=FAST)
    assert saved["level_not_crossed"] == ["add-words/p_correct/calib", "add-words/p_correct/heldout"]
    flat = _entry(saved, metric="p_correct")["texts"]["calib"]
    assert flat["above_level"] == 0 and flat["level_crossed"] is False
    assert all(a.get("crossing_error", 0) == 0 for a in flat["axes"].values())
    crossed = _entry(saved, metric="exact_match")["texts"]["calib"]
    assert 0 < crossed["above_level"] < crossed["n_rows"] and crossed["level_crossed"] is True
    md = (tmp_path / "lab-report.md").read_text()
    assert md.count("The level is never crossed on this text (0 of") == 2
    assert "Uninformative on the crossing error" in md and "add-words/p_correct/calib" in md
    assert "The level is never crossed" in (tmp_path / "lab-report.html").read_text()


def test_task_metrics_that_slug_alike_get_one_figure_each() -> None:
    from monitor.lab.report import figure_name

    first = figure_name("add words", "acc")
    second = figure_name("add/words", "acc", {first})
    assert first == "task_add_words_acc.png" and second != first and second.startswith("task_add_words_acc_")
    joined = figure_name("a_b", "c")
    assert joined == "task_a_b_c.png" and figure_name("a", "b_c", {joined}) != joined


def test_report_of_a_lab_record_races_its_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`write_lab_report` on a lab.json races what `records.race_rows` gives for it, and names
    the record and its sha256 as the source."""
    import hashlib

    from monitor.lab import records
    from monitor.lab.report import write_lab_report

    rows = _rows(families=3)
    seen = []
    monkeypatch.setattr(records, "race_rows", lambda lab: seen.append(lab) or rows, raising=False)
    path = tmp_path / "lab.json"
    path.write_text(json.dumps({"schema": records.LAB_SCHEMA, "config": {}, "families": [], "checkpoints": []}))
    data = write_lab_report(path, tmp_path / "report", config=FAST)
    assert len(seen) == 1 and data["source"] == {"path": str(path),
                                                  "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
    assert data["design"]["n_families"] == 3 and data["design"]["n_lineages"] == 3 * 2 * 2
