"""The lab analysis on synthetic lab records drawn from a known generative model, where the
right answer is known by construction: every family shares one latent training progress u;
L* is the same function of u in every family, raw CE is L* plus the family's unigram entropy,
bits/byte scales CE by the family's tokens per byte; the task's accuracy is a logistic rise
in one chosen quantity. LOFO must pick the axis that drives the task, its difference
intervals must exclude zero where the other axes are badly offset, and be exactly zero where
an axis is L* plus a constant. Also: the lab.json reader refuses bad input with one clear
line naming the file and key."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from lanes import fast_first

from monitor.errors import LabError
from monitor.lab.analysis import AXES, AnalysisConfig, analyse, difference_intervals
from monitor.lab.records import LabRecord, load_lab

# family -> (unigram CE in nats/token, tokens per byte, learning speed)
FAMILIES = {"gpt2": (7.2, 0.30, 1.0), "llama-3": (8.1, 0.26, 1.3), "bert-base-uncased": (6.3, 0.36, 0.8),
            "unigram-toy": (4.0, 0.95, 0.6)}
FAST = AnalysisConfig(lofo_resamples=50, curve_resamples=100, diff_resamples=1000)


def synthetic_lab(*, driver: str = "lstar", families: dict[str, tuple[float, float, float]] = FAMILIES,
                  seeds: int = 2, steps: int = 10, n_items: int = 300, seed: int = 0) -> dict[str, Any]:
    """A lab.json whose task accuracy is a logistic rise in `driver` ("lstar" or
    "bpb_minus_unigram") of a latent progress shared by every family."""
    rng = np.random.default_rng(seed)
    checkpoints = []
    for name, (ce_uni, tpb, speed) in families.items():
        for s in range(seeds):
            for k in range(steps):
                step = 100 * (k + 1)
                bytes_seen = 40_000 * step
                u = 1.0 - math.exp(-speed * bytes_seen / 1.2e7) + rng.normal(0, 0.01)
                lstar = 0.3 - 2.0 * u
                ce = lstar + ce_uni
                bpb, ubpb = ce * tpb / math.log(2), ce_uni * tpb / math.log(2)
                drive = lstar if driver == "lstar" else (bpb - ubpb)
                mid = -0.8 if driver == "lstar" else -0.8 * 0.3 / math.log(2)
                scale = 0.12 if driver == "lstar" else 0.12 * 0.3 / math.log(2)
                p = 0.25 + 0.6 / (1.0 + math.exp((drive - mid) / scale))
                acc = rng.binomial(n_items, p) / n_items
                prob = float(np.clip(p + rng.normal(0, 0.01), 0, 1))
                checkpoints.append({
                    "family": name, "seed": s, "step": step, "bytes_seen": bytes_seen,
                    "tokens_seen": int(bytes_seen * tpb), "path": f"{name}-s{s}/step{step}",
                    "metrics": {"ce": ce, "ce_uni": ce_uni, "lstar": lstar, "lstar_se": 0.01,
                                "l_rel": ce / ce_uni, "l_gain": (ce_uni - ce) / ce_uni, "bits_per_byte": bpb,
                                "unigram_bits_per_byte": ubpb, "bpb_minus_unigram": bpb - ubpb},
                    "tasks": {"add-words": {"acc": acc, "prob_correct": prob, "brier": (1 - prob) ** 2,
                                            "n": n_items, "baseline": 0.25}}})
    return {"schema": "lstar-lab/1", "config": {"seeds": seeds, "driver": driver},
            "families": [{"family": f, "tokenizer": f, "tokenizer_fingerprint": f"fp-{f}", "vocab_used": 1000}
                         for f in families],
            "checkpoints": checkpoints}


def _rows(analysis: dict[str, Any], metric: str = "acc") -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    [a] = [x for x in analysis["analyses"] if x["metric"] == metric]
    return a, {r["predictor"]: r for r in a["lofo"]["rows"]}


@pytest.fixture(scope="module")
def lstar_driven() -> dict[str, Any]:
    return analyse(LabRecord.model_validate(synthetic_lab()), FAST)


def test_every_axis_is_raced_and_lstar_wins_when_it_drives_the_task(lstar_driven: dict[str, Any]) -> None:
    a, rows = _rows(lstar_driven)
    assert set(rows) == set(AXES)
    assert all(rows[x]["n_heldout"] == 80 and rows[x]["n_folds"] == 4 for x in rows)
    assert a["lofo"]["best"]["rmse"] == "lstar"
    # raw CE is offset by each family's unigram entropy (4.0 … 8.1 nats): held-out predictions
    # land far from the truth, and the interval on the difference says so.
    ce = a["differences"]["ce"]["rmse"]
    assert ce["difference"] > 0.1 and ce["lower"] > 0 and ce["verdict"] == "reference_better"
    assert ce["resamples"] == 1000 and ce["lower"] <= ce["difference"] <= ce["upper"]
    assert a["differences"]["bits_per_byte"]["rmse"]["verdict"] == "reference_better"
    # every full-data curve exists, with a threshold on its own axis
    assert all(a["curves"][x]["fitted"] for x in AXES)
    assert a["curves"]["lstar"]["threshold"]["status"] == "crosses"


def test_the_bits_per_byte_gain_wins_when_it_drives_the_task() -> None:
    analysis = analyse(LabRecord.model_validate(synthetic_lab(driver="bpb_minus_unigram")), FAST)
    a, rows = _rows(analysis)
    assert a["lofo"]["best"]["rmse"] == "bpb_minus_unigram"
    d = a["differences"]["bpb_minus_unigram"]["rmse"]
    assert d["difference"] < 0 and d["upper"] < 0 and d["verdict"] == "axis_better"


def test_an_axis_that_is_lstar_plus_a_constant_differs_by_exactly_zero() -> None:
    # One unigram entropy for every family: CE = L* + 7, the same isotonic fit shifted.
    same = {f: (7.0, tpb, speed) for f, (_, tpb, speed) in FAMILIES.items()}
    analysis = analyse(LabRecord.model_validate(synthetic_lab(families=same)), FAST)
    a, rows = _rows(analysis)
    assert rows["ce"]["rmse"] == pytest.approx(rows["lstar"]["rmse"], abs=1e-12)
    for error in ("rmse", "crossing_error"):
        d = a["differences"]["ce"][error]
        assert d["difference"] == pytest.approx(0, abs=1e-12)
        assert d["lower"] == pytest.approx(0, abs=1e-12) and d["upper"] == pytest.approx(0, abs=1e-12)
        assert d["verdict"] == "no_clear_difference"


def test_difference_intervals_by_hand() -> None:
    # Two families of two held-out points each; the axis errs by 0.1 more on every point.
    ref = {"index": np.arange(4), "p_hat": np.zeros(4), "prob": np.zeros(4), "sq_error": np.full(4, 0.01),
           "wrong": np.array([0.0, 1.0, 0.0, 0.0]), "brier": np.full(4, 0.04)}
    ax = {**ref, "sq_error": np.full(4, 0.04), "wrong": np.array([1.0, 1.0, 0.0, 0.0])}
    out = difference_intervals({"lstar": ref, "ce": ax}, ["a", "a", "b", "b"], resamples=1000, seed=3)
    rmse = out["ce"]["rmse"]
    assert rmse["difference"] == pytest.approx(0.1) and rmse["lower"] == pytest.approx(0.1)
    assert rmse["upper"] == pytest.approx(0.1) and rmse["verdict"] == "reference_better"
    crossing = out["ce"]["crossing_error"]
    # point 0 is wrong only on the axis: the difference is its share of a resample, 0 … 1/2
    assert crossing["difference"] == pytest.approx(0.25)
    assert 0.0 <= crossing["lower"] < crossing["upper"] <= 0.5
    assert out["ce"]["brier"]["difference"] == pytest.approx(0.0)


def test_analysis_is_deterministic_and_strict_json(lstar_driven: dict[str, Any]) -> None:
    again = analyse(LabRecord.model_validate(synthetic_lab()), FAST)
    assert json.dumps(again, sort_keys=True, allow_nan=False) == json.dumps(lstar_driven, sort_keys=True,
                                                                             allow_nan=False)


# -- the reader ---------------------------------------------------------------------------------
def _write(tmp: Path, data: Any) -> Path:
    path = tmp / "lab.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


@pytest.mark.parametrize("mutate, expected", [
    (lambda d: d["checkpoints"][3].update(extra=1), "unknown key 'checkpoints.3.extra'"),
    (lambda d: d["checkpoints"][0]["metrics"].update(lstar=float("nan")), "checkpoints.0.metrics.lstar"),
    (lambda d: d["checkpoints"][0].update(family="qwen2"), "checkpoints[0] has family 'qwen2'"),
    (lambda d: d["checkpoints"][1].update(step=100), "seed 0 step 100 is listed more than once"),
    (lambda d: d["checkpoints"][0]["tasks"]["add-words"].update(acc=1.5), "checkpoints.0.tasks.add-words.acc"),
    (lambda d: d.update(schema="lstar-lab/9"), "schema 'lstar-lab/9', expected 'lstar-lab/2' (or 'lstar-lab/1')"),
])
def test_bad_lab_json_is_one_clear_line(tmp_path: Path, mutate: Any, expected: str) -> None:
    data = synthetic_lab(seeds=1, steps=3)
    mutate(data)
    path = _write(tmp_path, json.dumps(data))
    with pytest.raises(LabError) as info:
        load_lab(path)
    line = info.value.one_line()
    assert str(path) in line and expected in line and "\n" not in line


def test_lab_json_that_is_not_a_file_or_not_json(tmp_path: Path) -> None:
    with pytest.raises(LabError, match="no lab record at"):
        load_lab(tmp_path / "missing.json")
    with pytest.raises(LabError, match="not valid JSON"):
        load_lab(_write(tmp_path, "{" * 10))
    (tmp_path / "folder" / "lab.json").mkdir(parents=True)
    with pytest.raises(LabError, match="is a directory, not a lab.json"):
        load_lab(tmp_path / "folder")


# -- the report ---------------------------------------------------------------------------------
def test_write_lab_report_writes_every_number_text_and_figures(tmp_path: Path) -> None:
    from monitor.lab.report import write_lab_report

    lab = _write(tmp_path, json.dumps(synthetic_lab()))
    out = tmp_path / "report"
    data = write_lab_report(lab, out, config=FAST)
    saved = json.loads((out / "lab-report.json").read_text())
    assert saved == json.loads(json.dumps(data))
    assert {f["family"] for f in saved["families"]} == set(FAMILIES)
    [acc] = [a for a in saved["analyses"] if a["metric"] == "acc"]
    assert {r["predictor"] for r in acc["lofo"]["rows"]} == set(AXES)
    assert set(acc["differences"]) == set(AXES) - {"lstar"}
    # the text states the best axis and what the intervals support, nothing more
    md = (out / "lab-report.md").read_text()
    assert "Smallest held-out error: RMSE — L*" in md
    assert "L* erred less than raw CE, bits/byte" in md and "(interval excludes zero)" in md
    assert "do not cover how a new family might differ" in md
    ce = acc["differences"]["ce"]["rmse"]
    assert f"{ce['difference']:+.4f} [{ce['lower']:+.4f}, {ce['upper']:+.4f}]" in md
    # figures: one per task metric plus progress, each a real PNG, embedded in the HTML
    html = (out / "lab-report.html").read_text()
    assert [p["file"] for p in saved["plots"]] == ["progress.png", "task_add-words_acc.png",
                                                   "task_add-words_prob_correct.png"]
    for p in saved["plots"]:
        assert (out / p["file"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert html.count("data:image/png;base64,") == 3
    # one colour per family, the same everywhere
    assert len(set(saved["family_colours"].values())) == len(FAMILIES)
    for family, colour in saved["family_colours"].items():
        assert f"background: {colour}" in html


def test_a_bad_lab_json_leaves_an_existing_report_intact(tmp_path: Path) -> None:
    from monitor.lab.report import write_lab_report

    out = tmp_path / "report"
    write_lab_report(_write(tmp_path, json.dumps(synthetic_lab(seeds=1, steps=4))), out, config=FAST)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    bad = synthetic_lab(seeds=1, steps=4)
    bad["checkpoints"][0]["metrics"]["lstar"] = "fast"
    with pytest.raises(LabError, match="checkpoints.0.metrics.lstar"):
        write_lab_report(_write(tmp_path, json.dumps(bad)), out, config=FAST)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


# -- hostile numbers ----------------------------------------------------------------------------
def _every_metric(value: float) -> Any:
    def mutate(d: dict[str, Any]) -> None:
        for c in d["checkpoints"]:
            c["metrics"] = {k: abs(value) if k == "lstar_se" else value for k in c["metrics"]}
    return mutate


@pytest.mark.parametrize("mutate, expected", [
    (lambda d: d["checkpoints"][0].update(bytes_seen=10**400), "checkpoints.0.bytes_seen"),
    (lambda d: d["checkpoints"][2].update(tokens_seen=10**18), "checkpoints.2.tokens_seen"),
    (lambda d: d["checkpoints"][1].update(step=-1), "checkpoints.1.step"),
    (lambda d: d["checkpoints"][1].update(seed=-3), "checkpoints.1.seed"),
    (lambda d: d["checkpoints"][0]["tasks"]["add-words"].update(n=10**400), "checkpoints.0.tasks.add-words.n"),
    (lambda d: d["families"][0].update(vocab_used=-1), "families.0.vocab_used"),
    (_every_metric(1e308), "checkpoints.0.metrics.ce"),
    (_every_metric(-2e6), "checkpoints.0.metrics.ce"),
    (lambda d: d["checkpoints"][0]["metrics"].update(lstar_se=1e7), "checkpoints.0.metrics.lstar_se"),
    (lambda d: d["checkpoints"][0]["tasks"]["add-words"].update(brier=float("inf")),
     "checkpoints.0.tasks.add-words.brier"),
])
def test_lab_report_refuses_numbers_out_of_bounds_in_one_line(tmp_path: Path, capsys: Any, mutate: Any,
                                                               expected: str) -> None:
    """`lstar lab report` on hostile numbers: one line naming the file and the field, exit code
    non-zero, nothing written."""
    from monitor.cli import main

    data = synthetic_lab(seeds=1, steps=3)
    mutate(data)
    path = _write(tmp_path, json.dumps(data))        # 10**400 and inf are written as JSON reads them
    out = tmp_path / "report"
    code = main(["lab", "report", "--lab", str(path), "--out", str(out)])
    err = capsys.readouterr().err
    assert code != 0
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert str(path) in err and expected in err and "Traceback" not in err
    assert not out.exists()


@pytest.mark.parametrize("mutate", fast_first([
    _every_metric(1e6),                                                            # the bound, everywhere
    lambda d: [c["metrics"].update(lstar=i * 1e-300, ce=i * 1e-300, bits_per_byte=i * 5e-324)
               for i, c in enumerate(d["checkpoints"])],                            # spans of 1e-300 and less
    _every_metric(-1e6),
    lambda d: [c.update(bytes_seen=10**18 - 1, tokens_seen=10**18 - 1) for c in d["checkpoints"]],
    lambda d: [c["metrics"].update(lstar=(-1e6 if i % 2 else 1e6)) for i, c in enumerate(d["checkpoints"])],
], keep=2))
def test_lab_report_on_extreme_numbers_within_bounds(tmp_path: Path, mutate: Any) -> None:
    """Any record the schema accepts gives a report, figures included, without an exception."""
    from monitor.lab.report import write_lab_report

    data = synthetic_lab(seeds=1, steps=5)
    mutate(data)
    out = tmp_path / "report"
    saved = write_lab_report(_write(tmp_path, json.dumps(data)), out, config=FAST)
    for p in saved["plots"]:
        assert (out / p["file"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    json.loads((out / "lab-report.json").read_text())


def test_task_metrics_that_slug_alike_get_one_figure_each(tmp_path: Path) -> None:
    from monitor.lab.report import write_lab_report

    data = synthetic_lab(seeds=1, steps=5)
    for c in data["checkpoints"]:
        c["tasks"]["add words"] = dict(c["tasks"]["add-words"])
        c["tasks"]["add/words"] = dict(c["tasks"]["add-words"], acc=c["tasks"]["add-words"]["acc"] * 0.9)
    out = tmp_path / "report"
    saved = write_lab_report(_write(tmp_path, json.dumps(data)), out, config=FAST)
    files = [p["file"] for p in saved["plots"]]
    assert len(files) == len(set(files)) == 1 + 3 * 2          # progress + 3 tasks × (acc, prob_correct)
    assert {p.name for p in out.glob("*.png")} == set(files)
    titles = [p["title"] for p in saved["plots"]]
    assert any(t.startswith("add words · acc") for t in titles) and any(t.startswith("add/words · acc") for t in titles)
    html = (out / "lab-report.html").read_text()
    assert html.count("data:image/png;base64,") == len(files)
    # task "a_b" metric "c" and task "a" metric "b_c" join to one name too
    from monitor.lab.report import figure_name

    first = figure_name("a_b", "c")
    assert first == "task_a_b_c.png" and figure_name("a", "b_c", {first}) not in {first}
