"""`lstar curves fit|show|validate|predict` in-process, with CSV labels."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from scipy.special import expit

from monitor.cli import main
from monitor.curves.artifact import load_curve, predict

CORPUS = "9f269a7db0b131d819be2e51974914a3cf715cc388cceb82885f7a5a21e644d8"
OTHER = "42eba56a92409f2fbaaf1689f6772b3bda630d41ef2ead6f8d195a104253dd3a"
SPEC = "lstar-score/1:window=2048,stride=1024,prefix=bos"
H1 = {"gpt2": 6.3867, "llama-3": 7.2180, "bert-base-uncased": 6.2588, "spm-unigram-toy": 5.0535}


def write_population(path: Path, *, per_family: int = 8, n: int = 300, seed: int = 5) -> Path:
    rng = np.random.default_rng(seed)
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["checkpoint", "family", "lstar", "lstar_se", "raw_ce", "value", "n", "params",
                         "task", "metric"])
        for name, h1 in H1.items():
            z = np.sort(rng.uniform(-4.2, -1.2, per_family))
            values = rng.binomial(n, 0.25 + 0.6 * expit(-(z + 3.0) / 0.3)) / n
            for i in range(per_family):
                ce = z[i] + h1 + 0.03
                writer.writerow([f"{name}-{i}", name, f"{ce - h1:.6f}", "0.01", f"{ce:.6f}", f"{values[i]:.6f}",
                                 n, f"{10 ** (8 + 0.8 * (-z[i] - 1.2)):.6g}", "cloze-v0", "acc"])
    return path


@pytest.fixture(scope="module")
def labels_csv(tmp_path_factory):
    return write_population(tmp_path_factory.mktemp("labels") / "labels.csv")


@pytest.fixture(scope="module")
def fitted(labels_csv, tmp_path_factory):
    out = tmp_path_factory.mktemp("curve") / "cloze.json"
    code = main(["curves", "fit", "--labels", str(labels_csv), "--task", "cloze-v0", "--baseline", "0.25",
                 "--margin", "0.05", "--out", str(out), "--bootstrap", "200", "--corpus-sha", CORPUS,
                 "--spec", SPEC])
    assert code == 0
    return out


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_fit_writes_a_valid_artifact(fitted):
    curve = load_curve(fitted)
    assert curve.task == "cloze-v0" and curve.metric == "acc" and curve.n_checkpoints == 32
    assert curve.corpus_sha256 == CORPUS and curve.scoring_spec.describe() == SPEC
    thr = curve.threshold
    assert thr.lower <= thr.estimate <= thr.upper and 0.0 <= thr.never_share <= 1.0
    assert {r.predictor for r in curve.lofo.rows} == {"lstar", "raw_ce", "log_params"}


def test_show_prints_a_summary_and_renders_a_png(fitted, tmp_path, capsys):
    png = tmp_path / "curve.png"
    code, out, err = run(capsys, "curves", "show", str(fitted), "--png", str(png))
    assert code == 0, err
    assert "η̂" in out and "leave-one-family-out" in out and "cloze-v0" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    code, out, err = run(capsys, "curves", "show", str(fitted), "--json")
    summary = json.loads(out)
    assert summary["threshold"]["estimate"] == load_curve(fitted).threshold.estimate


BBH_CURVE = Path(__file__).resolve().parents[1] / "examples" / "post-training" / "results" / "bbh-curve.json"


def _row(out: str, key: str) -> str:
    """The value of one row of `curves show`'s table (printed one line a row)."""
    cells = [[c.strip() for c in line.split("│")] for line in out.splitlines() if "│" in line]
    return next(c[2] for c in cells if len(c) > 2 and c[1] == key)


def test_show_names_the_reported_and_the_diagnostic_threshold_interval(fitted, capsys, monkeypatch):
    """The artifact holds two intervals of η̂; `curves show` says which is reported (the band
    inverted) and which is a diagnostic (the bootstrap percentile), in text and in JSON, and
    keeps the old `threshold` object unchanged."""
    curve = load_curve(fitted)
    thr, boot = curve.threshold, curve.threshold.bootstrap
    monkeypatch.setenv("COLUMNS", "300")
    code, out, err = run(capsys, "curves", "show", str(fitted))
    assert code == 0, err
    assert _row(out, "η̂ interval") == f"[{thr.lower:.4g}, {thr.upper:.4g}] at 90% (band inversion, reported)"
    assert _row(out, "η̂ bootstrap percentile") == (f"[{boot.late:.4g}, {boot.early:.4g}] at 90%, median "
                                                    f"{boot.median:.4g} (diagnostic; no state rests on it)")
    code, out, err = run(capsys, "curves", "show", str(fitted), "--json")
    summary = json.loads(out)
    assert summary["threshold"] == thr.model_dump()
    reported, diagnostic = summary["threshold_intervals"]["reported"], summary["threshold_intervals"]["diagnostic"]
    assert reported["label"] == "threshold interval (band inversion, reported)"
    assert diagnostic["label"] == "bootstrap percentile of the threshold (diagnostic)"
    assert (reported["lower"], reported["upper"]) == (thr.lower, thr.upper)
    # L*: lower is progress, so the latest crossing in progress is the smaller L*.
    assert (diagnostic["lower"], diagnostic["upper"], diagnostic["median"]) == (boot.late, boot.early, boot.median)

    code, out, err = run(capsys, "curves", "show", str(BBH_CURVE), "--json")
    level = json.loads(out)["budget"]["per_level"][1]
    boot = level["threshold"]["bootstrap"]
    got = level["threshold_intervals"]["diagnostic"]
    assert (got["lower"], got["upper"]) == (boot["early"], boot["late"])   # FLOPs: higher is progress
    code, out, err = run(capsys, "curves", "show", str(BBH_CURVE))
    assert _row(out, "η̂ at budget 1") == "22.35 [20.84, 22.9] at 90% (band inversion, reported) · crosses"
    assert _row(out, "η̂ at budget 1, bootstrap").startswith("percentile [22.29, 22.86] at 90%, median 22.36 "
                                                             "(diagnostic")


def _states_follow_the_interval(curve, se: float) -> int:
    """Predict on a dense grid inside the band and check each state against the threshold
    interval (docs/measurement.md §2): clear when [x ± z·se] lies wholly before the interval in
    progress, emerged when wholly beyond it, at_risk when they overlap. Returns points checked."""
    from scipy.stats import norm

    sign = -1.0 if curve.axis == "lstar" else 1.0
    thr = curve.threshold
    ends = sorted(sign * v for v in (thr.lower, thr.upper))   # [early, late] in progress
    z = float(norm.ppf(0.5 + curve.confidence / 2.0))
    lo, hi = min(curve.band.x) + z * se, max(curve.band.x) - z * se
    checked = 0
    for x in np.linspace(lo, hi, 997):
        near, far = sign * x - z * se, sign * x + z * se   # least and most advanced ends
        if min(abs(e - v) for e in ends for v in (near, far)) < 1e-9:
            continue
        expected = "emerged" if near >= ends[1] else "at_risk" if far >= ends[0] else "clear"
        assert predict(curve, float(x), se).state == expected, (x, se)
        checked += 1
    return checked


def test_the_reported_threshold_interval_is_where_the_states_turn(fitted):
    """The band inverted is the interval the alert states agree with; the bootstrap
    percentile is not (the BBH chain-of-thought level's numbers of docs/measurement.md §2)."""
    from monitor.curves import at_budget

    curve = load_curve(fitted)
    cot = at_budget(load_curve(BBH_CURVE), 1)
    for c in (curve, cot):
        for se in (0.0, 0.02, 0.1):
            assert _states_follow_the_interval(c, se) > 900
    thr = cot.threshold
    assert (round(thr.lower, 2), round(thr.upper, 2)) == (20.84, 22.90)
    assert (round(thr.bootstrap.early, 2), round(thr.bootstrap.late, 2)) == (22.29, 22.86)
    # 10^22 FLOPs: before the whole percentile interval, yet at risk by the band.
    assert predict(cot, 22.0).state == "at_risk" and 22.0 < thr.bootstrap.early


def test_validate_prints_and_writes_the_lofo_table(labels_csv, tmp_path, capsys):
    table = tmp_path / "lofo.md"
    code, out, err = run(capsys, "curves", "validate", "--labels", str(labels_csv), "--task", "cloze-v0",
                         "--baseline", "0.25", "--margin", "0.05", "--bootstrap", "100", "--out", str(table))
    assert code == 0, err
    with capsys.disabled():
        print("\n" + out)
    assert "L*" in out and "raw CE" in out and "crossing error" in out
    text = table.read_text()
    assert text.startswith("| predictor | RMSE | crossing error | Brier |") and "| L* |" in text
    code, out, err = run(capsys, "curves", "validate", "--labels", str(labels_csv), "--task", "cloze-v0",
                         "--baseline", "0.25", "--margin", "0.05", "--bootstrap", "100", "--json")
    rows = {r["predictor"]: r for r in json.loads(out)["rows"]}
    assert rows["lstar"]["crossing_error"] <= rows["raw_ce"]["crossing_error"]


def test_predict_prints_p_hat_interval_and_state(fitted, capsys):
    code, out, err = run(capsys, "curves", "predict", str(fitted), "--lstar", "-2.4", "--se", "0.05", "--json")
    assert code == 0, err
    got = json.loads(out)
    expected = predict(load_curve(fitted), -2.4, 0.05)
    for key in ("p_hat", "lower", "upper", "state"):
        assert got[key] == getattr(expected, key)
    assert got["state"] in ("clear", "at_risk", "emerged")
    code, out, err = run(capsys, "curves", "predict", str(fitted), "--lstar", "-4.1", "--corpus-sha", CORPUS,
                         "--spec", SPEC, "--json")
    assert code == 0 and json.loads(out)["state"] == "emerged"
    code, out, err = run(capsys, "curves", "predict", str(fitted), "--lstar", "-2.4")
    assert code == 0 and "cloze-v0 (acc) at L* -2.4000 ± 0.0000: P̂ =" in out


def one_line_error(code: int, err: str, *fragments: str) -> None:
    assert code != 0
    assert err.startswith("error: ") and err.count("\n") == 1, err
    for fragment in fragments:
        assert fragment in err, err


def test_bad_input_exits_non_zero_with_one_line(fitted, labels_csv, tmp_path, capsys):
    code, _, err = run(capsys, "curves", "predict", str(fitted), "--lstar", "-2.4", "--corpus-sha", OTHER)
    one_line_error(code, err, CORPUS, OTHER)
    code, _, err = run(capsys, "curves", "predict", str(fitted), "--lstar", "-2.4",
                       "--spec", "lstar-score/1:window=1024,stride=512,prefix=bos")
    one_line_error(code, err, "window=2048,stride=1024", "window=1024,stride=512")
    code, _, err = run(capsys, "curves", "predict", str(fitted))
    one_line_error(code, err, "--value")

    rows = labels_csv.read_text().splitlines()
    few = tmp_path / "few.csv"
    few.write_text("\n".join(rows[:3]) + "\n")
    code, _, err = run(capsys, "curves", "fit", "--labels", str(few), "--task", "cloze-v0", "--baseline", "0.25",
                       "--margin", "0.05", "--out", str(tmp_path / "x.json"))
    one_line_error(code, err, "at least 3")
    flat = tmp_path / "flat.csv"
    header, *body = rows
    flat.write_text("\n".join([header] + [",".join(r.split(",")[:5] + ["0.25"] + r.split(",")[6:]) for r in body]))
    code, _, err = run(capsys, "curves", "fit", "--labels", str(flat), "--task", "cloze-v0", "--baseline", "0.25",
                       "--margin", "0.05", "--out", str(tmp_path / "x.json"))
    one_line_error(code, err, "performance is constant")
    nan = tmp_path / "nan.csv"
    nan.write_text("\n".join([header, body[0].replace(body[0].split(",")[5], "nan", 1)] + body[1:]))
    code, _, err = run(capsys, "curves", "fit", "--labels", str(nan), "--task", "cloze-v0", "--baseline", "0.25",
                       "--margin", "0.05", "--out", str(tmp_path / "x.json"))
    one_line_error(code, err, "nan.csv:2", "'value'")
    code, _, err = run(capsys, "curves", "fit", "--labels", str(labels_csv), "--task", "cloze-v0",
                       "--metric", "acc_norm", "--baseline", "0.25", "--margin", "0.05",
                       "--out", str(tmp_path / "x.json"))
    one_line_error(code, err, "unknown metric 'acc_norm'", "available: acc")
    code, _, err = run(capsys, "curves", "validate", "--labels", str(labels_csv), "--task", "arc",
                       "--baseline", "0.25", "--margin", "0.05")
    one_line_error(code, err, "unknown task 'arc'")
    assert not (tmp_path / "x.json").exists()

    edited = tmp_path / "edited.json"
    data = json.loads(fitted.read_text())
    data["surprise"] = True
    edited.write_text(json.dumps(data))
    code, _, err = run(capsys, "curves", "show", str(edited))
    one_line_error(code, err, "unknown key 'surprise'")


def test_small_test_sets_warn_about_resolution(labels_csv, tmp_path, capsys):
    code, _, err = run(capsys, "curves", "fit", "--labels", str(labels_csv), "--task", "cloze-v0",
                       "--baseline", "0.25", "--margin", "0.001", "--out", str(tmp_path / "fine.json"),
                       "--bootstrap", "100", "--no-lofo")
    assert code == 0
    assert "warning: acc: resolution 1/n = 0.003333 (n = 300) is coarser than the margin" in err
    assert "not pinned" in err


@pytest.mark.parametrize("field, value", [("band.fit", "NaN"), ("band.upper", "Infinity"), ("baseline", "NaN"),
                                          ("baseline", "-Infinity"), ("band.fit", "Infinity"),
                                          ("band.upper", "NaN"), ("threshold.bootstrap.median", "NaN"),
                                          ("emergence_by_family.gpt2", "Infinity")])
def test_a_curve_with_nan_or_infinity_is_refused_naming_the_field(fitted, tmp_path, capsys, field, value):
    """Python's JSON reader accepts NaN and Infinity literals; every float field of the artifact,
    nested ones included, refuses them with one line naming the field."""
    data = json.loads(fitted.read_text())
    *parents, key = field.split(".")
    target = data
    for part in parents:
        target = target[part]
    marker = "__HOSTILE__"
    if isinstance(target[key], list):
        target[key][1] = marker
        where = f"{field}.1"
    else:
        target[key] = marker
        where = field
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data).replace(f'"{marker}"', value))   # a bare literal, as json.dumps writes
    assert json.loads(bad.read_text()) is not None                     # the file is JSON Python reads
    code, out, err = run(capsys, "curves", "show", str(bad))
    one_line_error(code, err, str(bad), where, "finite")
    assert "Traceback" not in out + err
