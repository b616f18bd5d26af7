"""Progress axes (monitor/curves/axes.py): every score axis's standard error from one bootstrap,
prediction on each axis, `lstar-curve/1` artifacts unchanged, a stored reason where a score lacks
the curve's axis, and an alert on a bits/byte curve that names its axis in every channel."""

from __future__ import annotations

import json
import math
import random
import statistics
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import norm

from monitor.alerts import Dispatcher, evaluate_pending
from monitor.curves import ScoringRef, load_curve, predict, predict_score_run, read_labels_csv, save_curve
from monitor.curves.artifact import Band, Knots
from monitor.curves.axes import AXES, axis_value, label_point
from monitor.curves.fit import fit_curve
from monitor.curves.labels import Label
from monitor.demo.receivers import SmtpReceiver, WebhookReceiver
from monitor.errors import CurveError
from monitor.policy.load import load_policy
from monitor.reports.report import build_report, to_markdown
from monitor.scoring.metrics import aggregate, bootstrap_se_ce
from monitor.store import Store
from support.scores import CALIB_V0_SHA256, TEST_SPEC, record_fake_score

CURVES = Path(__file__).resolve().parent / "fixtures" / "policies" / "curves"
T0 = datetime(2025, 6, 1, 12, 0, tzinfo=timezone.utc)
SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
LN2 = math.log(2.0)


# -- one bootstrap, every axis's SE ------------------------------------------------------------
NLL = [3.1, 7.4, 0.9, 5.5, 2.2, 8.0]
NTOK = [2, 5, 1, 4, 2, 6]
NBYTES = [9, 17, 3, 15, 8, 22]
CE_UNI = 1.3


def test_every_axis_se_is_the_naive_bootstrap_over_the_same_resamples() -> None:
    out = aggregate(NLL, NTOK, NBYTES, CE_UNI, n_boot=300, seed=5)
    # The resamples, drawn as the spec says, and every ratio taken in a plain loop.
    idx = np.random.default_rng(5).integers(0, len(NLL), size=(300, len(NLL)))
    ce, bpb, lpb = [], [], []
    for row in idx:
        s = sum(NLL[i] for i in row)
        n = sum(NTOK[i] for i in row)
        b = sum(NBYTES[i] for i in row)
        ce.append(s / n)
        bpb.append(s / b / LN2)
        lpb.append((s - CE_UNI * n) / b / LN2)
    assert out["se_ce"] == pytest.approx(statistics.stdev(ce), rel=1e-12)
    assert out["se_ce"] == bootstrap_se_ce(NLL, NTOK, 300, 5)          # the same resamples as before
    assert out["se_lstar"] == out["se_ce"]
    assert out["se_bits_per_byte"] == pytest.approx(statistics.stdev(bpb), rel=1e-12)
    assert out["se_lstar_per_byte"] == pytest.approx(statistics.stdev(lpb), rel=1e-12)
    assert out["se_l_rel"] == pytest.approx(statistics.stdev([c / CE_UNI for c in ce]), rel=1e-12)
    assert out["se_l_gain"] == pytest.approx(statistics.stdev([(CE_UNI - c) / CE_UNI for c in ce]), rel=1e-12)
    # L* per byte is bits/byte minus the unigram model's bits/byte.
    total_nll, total_tok, total_bytes = sum(NLL), sum(NTOK), sum(NBYTES)
    unigram_bpb = CE_UNI * total_tok / total_bytes / LN2
    assert out["lstar_per_byte"] == pytest.approx(total_nll / total_bytes / LN2 - unigram_bpb, rel=1e-12)


def test_a_stored_run_gives_each_axis_value_and_se(tmp_path: Path) -> None:
    out = aggregate(NLL, NTOK, NBYTES, CE_UNI, n_boot=300, seed=5)
    cols = {k: out[k] for k in ("ce", "ce_unigram", "lstar", "l_rel", "l_gain", "bits_per_byte",
                                "tokens_per_byte", "se_ce", "lstar_per_byte", "se_bits_per_byte",
                                "se_lstar_per_byte", "se_l_rel", "se_l_gain")}
    with Store.open(tmp_path / "s.duckdb") as store:
        run_id = record_fake_score(store, repo="o/m", sha="a" * 40, lstar=out["lstar"], se=out["se_ce"],
                                   finished_at=T0, columns={**cols, "model": {"n_params": 1.5e8}})
        run = store.score_run(run_id)
    assert run is not None
    expected = {"lstar": ("lstar", "se_ce"), "raw_ce": ("ce", "se_ce"),
                "bits_per_byte": ("bits_per_byte", "se_bits_per_byte"),
                "lstar_per_byte": ("lstar_per_byte", "se_lstar_per_byte"),
                "l_rel": ("l_rel", "se_l_rel"), "l_gain": ("l_gain", "se_l_gain")}
    for name, (col, se) in expected.items():
        assert axis_value(run, name) == pytest.approx((out[col], out[se]), rel=1e-12), name
    assert axis_value(run, "log_params") == pytest.approx((math.log10(1.5e8), 0.0))
    reason = axis_value(run, "log_flops")
    assert isinstance(reason, str) and f"score run {run_id} has no declared training FLOPs" in reason


def test_a_run_without_bootstrap_ses_of_the_byte_axes_says_so(tmp_path: Path) -> None:
    # A row written without the new columns (as a run scored before them): L* per byte and the
    # L_rel/L_gain SEs follow from stored columns; the byte-axis SEs do not.
    with Store.open(tmp_path / "s.duckdb") as store:
        run_id = record_fake_score(store, repo="o/m", sha="a" * 40, lstar=-2.0, se=0.07, finished_at=T0)
        run = store.score_run(run_id)
    assert run.lstar_per_byte == pytest.approx(-2.0 * 0.25 / LN2)
    value = axis_value(run, "l_rel")
    assert value == pytest.approx(((7.0 - 2.0) / 7.0, 0.07 / 7.0))
    reason = axis_value(run, "bits_per_byte")
    assert isinstance(reason, str) and "no standard error of bits/byte" in reason and "rescore" in reason


# -- prediction on each axis, worked by hand ----------------------------------------------------
def _base_curve(tmp_path: Path):  # type: ignore[no-untyped-def]
    labels = [Label(checkpoint=f"c{i}", value=v, family="f", lstar=x, n=400)
              for i, (x, v) in enumerate([(3.0, 0.2), (2.5, 0.3), (2.0, 0.5), (1.5, 0.65), (1.0, 0.8)])]
    spec = ScoringRef(spec_version=TEST_SPEC["spec_version"], window=TEST_SPEC["window_len"],
                      stride=TEST_SPEC["stride"], prefix_policy=TEST_SPEC["prefix_policy"])
    return fit_curve(labels, task="t", baseline=0.25, margin=0.2, resamples=50, lofo=False,
                     corpus_sha256=CALIB_V0_SHA256, scoring_spec=spec)


def test_a_task_loss_curve_is_not_applied_to_a_score_run() -> None:
    # The task loss comes with a history's rows; a score run has no such column to misread.
    got = axis_value({"run_id": "r1", "ce": 2.0, "se_ce": 0.01, "lstar": 1.0}, "task_loss")
    assert isinstance(got, str) and "score run r1 has no task loss" in got


@pytest.mark.parametrize("name", [n for n, a in AXES.items() if a.source != "task"])
def test_prediction_on_each_axis_against_a_hand_worked_example(tmp_path: Path, name: str) -> None:
    axis = AXES[name]
    base = _base_curve(tmp_path)
    # g on x in [1, 3]: 0.8 → 0.2 where lower is progress, 0.2 → 0.8 where higher is; band ±0.1.
    ys = [0.8, 0.5, 0.2] if axis.lower_is_progress else [0.2, 0.5, 0.8]
    curve = base.model_copy(update={
        "axis": name, "direction": axis.direction, "x_range": (1.0, 3.0),
        "knots": Knots(x=[1.0, 2.0, 3.0], y=ys),
        "band": Band(x=[1.0, 2.0, 3.0], fit=ys, lower=[y - 0.1 for y in ys], upper=[y + 0.1 for y in ys])})
    x, se = (1.5, 0.1) if axis.lower_is_progress else (2.5, 0.1)
    if axis.source == "external":
        se = 0.0
    z = float(norm.ppf(0.95))                         # the curve's 90 % band
    # By hand: g(x) = 0.65 either way; the interval takes the band at x ∓ z·se.
    if axis.lower_is_progress:
        lower, upper = 0.7 - 0.3 * (x + z * se - 1.0), 0.9 - 0.3 * (x - z * se - 1.0)
    else:
        lower, upper = 0.1 + 0.3 * (x - z * se - 1.0), 0.3 + 0.3 * (x + z * se - 1.0)
    # A score run whose other columns are far away: the prediction must read the axis's own.
    columns = {"ce": 50.0, "lstar": 50.0, "bits_per_byte": 50.0, "lstar_per_byte": 50.0, "l_rel": 50.0,
               "l_gain": 50.0, "se_ce": 9.0, "se_bits_per_byte": 9.0, "se_lstar_per_byte": 9.0,
               "se_l_rel": 9.0, "se_l_gain": 9.0, "model": {"n_params": 1.0, "flops": 1.0}}
    if axis.source == "score":
        columns[axis.score_column] = x
        columns[axis.se_column] = se
    else:
        columns["model"] = {"n_params": 10 ** x, "flops": 10 ** x}
    with Store.open(tmp_path / "s.duckdb") as store:
        run_id = record_fake_score(store, repo="o/m", sha="a" * 40, lstar=columns["lstar"], se=columns["se_ce"],
                                   finished_at=T0, columns=columns)
        run = store.score_run(run_id)
    for out in (predict(curve, x, se), predict_score_run(curve, run)):
        assert out.axis == name and out.value == pytest.approx(x) and out.se == pytest.approx(se)
        assert out.p_hat == pytest.approx(0.65)
        assert (out.lower, out.upper) == pytest.approx((lower, upper))
        assert out.state == ("emerged" if lower >= 0.45 else "at_risk")
        assert out.as_dict()["axis"] == name and out.as_dict()["axis_label"] == axis.label


def test_fit_on_an_axis_from_a_labels_csv_marks_imported_points(tmp_path: Path) -> None:
    path = tmp_path / "labels.csv"
    path.write_text("checkpoint,family,task,metric,value,n,bits_per_byte,bits_per_byte_se,log_params\n"
                    "a,f1,t,acc,0.25,400,1.20,0.01,8\n"
                    "b,f1,t,acc,0.30,400,1.05,0.01,8.5\n"
                    "c,f2,t,acc,0.55,400,0.95,0.01,9\n"
                    "d,f2,t,acc,0.75,400,0.80,0.01,9.5\n", encoding="utf-8")
    labels = read_labels_csv(path)
    assert labels[0].params == pytest.approx(1e8) and labels[0].axis_se == {"bits_per_byte": 0.01}
    assert label_point(labels[2], "bits_per_byte") == (0.95, 0.01)
    assert label_point(labels[3], "log_params") == pytest.approx((9.5, 0.0))
    curve = fit_curve(labels, task="t", baseline=0.25, margin=0.1, resamples=50, lofo=False, axis="bits_per_byte")
    assert curve.schema_ == "lstar-curve/2" and curve.axis == "bits_per_byte"
    assert curve.direction == "non-increasing" and curve.x_range == (0.8, 1.2)
    assert all(p.imported for p in curve.points)
    saved = save_curve(curve, tmp_path / "bpb.json")
    data = json.loads(saved.read_text())
    assert data["schema"] == "lstar-curve/2" and data["axis"] == "bits_per_byte" and "predictor" not in data
    assert load_curve(saved) == curve
    with pytest.raises(CurveError, match="unknown axis 'bpb'"):
        fit_curve(labels, task="t", baseline=0.25, margin=0.1, resamples=50, axis="bpb")


# -- lstar-curve/1 --------------------------------------------------------------------------------
def test_a_v1_artifact_loads_and_predicts_as_before(tmp_path: Path) -> None:
    path = CURVES / "arith.json"
    raw = json.loads(path.read_text())
    curve = load_curve(path)
    assert raw["schema"] == "lstar-curve/1" and curve.schema_ == "lstar-curve/1"
    assert curve.axis == "lstar" == curve.predictor and curve.content_id() == raw["curve_id"]
    assert json.loads(curve.to_json()) == raw                   # written back byte-for-byte the same JSON
    # Numbers of this artifact under the release before axes (lstar-curve/1 only).
    for x, se, p_hat, lower, upper, state in (
            (-2.5, 0.02, 0.55, 0.4958854641022699, 0.6038783352128811, "emerged"),
            (-1.7, 0.05, 0.2748888888888889, 0.23817767894364106, 0.3204578214424847, "at_risk"),
            (-3.9, 0.0, 0.8482962962962963, 0.8158761059412482, 0.8753808482491561, "emerged")):
        out = predict(curve, x, se)
        assert (out.p_hat, out.lower, out.upper) == pytest.approx((p_hat, lower, upper), rel=1e-12)
        assert out.state == state
        assert out.as_dict()["lstar"] == x
    edited = tmp_path / "v1.json"
    edited.write_text(json.dumps({**raw, "axis": "lstar"}))
    with pytest.raises(CurveError, match="unknown key 'axis'"):
        load_curve(edited)


# -- the daemon's evaluation on an axis -----------------------------------------------------------
def _bpb_curve(tmp_path: Path, *, axis: str = "bits_per_byte", imported: int = 0) -> Path:
    """A bits/byte (or other axis) curve pinned like the fixture curves: from arith.json's
    shape, moved to x in [0.8, 1.2]; its first `imported` points marked imported."""
    base = load_curve(CURVES / "arith.json")
    base = base.model_copy(update={"points": [point.model_copy(update={"imported": i < imported})
                                              for i, point in enumerate(base.points)]})
    xs = [0.8, 1.0, 1.2]
    ys = [0.8, 0.45, 0.2]
    draft = base.model_copy(update={
        "schema_": "lstar-curve/2", "axis": axis, "x_range": (0.8, 1.2), "knots": Knots(x=xs, y=ys),
        "margin": 0.25,
        "band": Band(x=xs, fit=ys, lower=[y - 0.05 for y in ys], upper=[y + 0.05 for y in ys])})
    curve = draft.model_copy(update={"curve_id": draft.content_id()})
    return save_curve(curve, tmp_path / f"{axis}.json")


def _policy(tmp_path: Path, curve: Path, receivers: str, route_to: str) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(f"""\
name: bytes
tasks:
  - name: arith
    curve: {curve}
route:
  receiver: {route_to}
  group_wait: 0s
  group_interval: 0s
  routes:
    - receiver: mail
      matchers: ['axis="bits_per_byte"']
      continue: true
    - receiver: hook
receivers:
{receivers}
  - name: ops-log
    file: {{path: ops.jsonl}}
meta_receivers: [ops-log]
""")
    return path


def test_a_bits_per_byte_curve_alerts_with_its_axis_value_and_se(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LSTAR_TEST_WEBHOOK_SECRET", SECRET)
    curve = _bpb_curve(tmp_path, imported=2)
    with WebhookReceiver() as hook, SmtpReceiver() as smtp:
        receivers = f"""\
  - name: hook
    webhook: {{url: "{hook.url}", secret_env: LSTAR_TEST_WEBHOOK_SECRET, timeout: 2s}}
  - name: mail
    email: {{to: [gov@example.org], from: lstar@example.org, host: 127.0.0.1, port: {smtp.port}, tls: none,
             timeout: 5s}}"""
        policy = load_policy(_policy(tmp_path, curve, receivers, "hook"))
        with Store.open(tmp_path / "state.duckdb") as store:
            # bits/byte 1.0 ± 0.02: g = 0.45, band [0.40, 0.50] widened over 1.0 ± z·0.02; level 0.5.
            record_fake_score(store, repo="org/model", sha="c" * 40, lstar=-2.0, se=0.03, finished_at=T0,
                              columns={"bits_per_byte": 1.0, "se_bits_per_byte": 0.02})
            report = evaluate_pending(store, [policy], now=T0)
            assert report.predictions == 1 and not report.skipped
            Dispatcher(store, [policy], rng=random.Random(0), owner="t").run_once(T0)
            [prediction] = store.report_predictions("bytes", start=T0 - timedelta(days=1), end=T0 + timedelta(hours=1))
            report = build_report(store, policy, now=T0 + timedelta(hours=1), period_start=T0 - timedelta(days=1))
        [request] = hook.requests
        [mail] = smtp.mails
    z = float(norm.ppf(0.95))
    # Hand-worked: the band falls with bits/byte, so its upper edge is read at 1.0 - z·0.02
    # (between 0.85 at 0.8 and 0.50 at 1.0) and its lower edge at 1.0 + z·0.02 (0.40 → 0.15).
    hi = 0.5 + (0.85 - 0.5) * (z * 0.02 / 0.2)
    lo = 0.4 + (0.15 - 0.4) * (z * 0.02 / 0.2)
    body = json.loads(request.body)
    [alert] = body["alerts"]
    [numbers] = body["lstar"]["alerts"]
    assert alert["labels"]["axis"] == "bits_per_byte" and alert["labels"]["state"] == "at_risk"
    assert numbers["axis"] == "bits_per_byte" and numbers["axis_label"] == "bits/byte"
    assert numbers["value"] == 1.0 and numbers["se"] == 0.02
    assert numbers["lstar"] == -2.0 and numbers["lstar_se"] == 0.03
    assert numbers["p_hat"] == pytest.approx(0.45)
    assert numbers["interval"] == pytest.approx([lo, hi])
    assert "bits/byte = 1.0000 ± 0.0200 (SE); L* = -2.0000 ± 0.0300" in alert["annotations"]["description"]
    text = mail.message.get_body(preferencelist=("plain",)).get_content()
    assert "axis       bits_per_byte" in text and "bits/byte  1.0000 (SE 0.0200)" in text
    assert "L*         -2.0000 (SE 0.0300)" in text
    assert prediction.lstar == -2.0 and prediction.detail["axis"] == "bits_per_byte"
    assert prediction.detail["value"] == 1.0 and prediction.detail["se"] == 0.02
    # The governance report names the axis and shows the value on it.
    [task] = report["tasks"]
    assert task["axis"] == "bits_per_byte" and task["axis_label"] == "bits/byte"
    [lineage] = task["lineages"]
    assert (lineage["value"], lineage["value_se"], lineage["lstar"]) == (1.0, 0.02, -2.0)
    assert "| lineage | current checkpoint | state | bits/byte | P̂ |" in to_markdown(report)
    # ... and the evidence behind the axis: the curve file the policy points at, its points,
    # and how many of them a labels file gave directly.
    n_points = len(load_curve(curve).points)
    assert (task["curve_file"], task["curve_points"], task["imported_points"]) == (str(curve), n_points, 2)
    assert (f"Progress axis: bits/byte, from the curve `{curve}` ({n_points} labelled points, 2 of them "
            "imported from a labels file (not scored here)).") in to_markdown(report)


def test_a_curve_on_an_axis_the_score_lacks_is_recorded_with_its_reason(tmp_path: Path) -> None:
    curve = _bpb_curve(tmp_path, axis="log_flops")
    receivers = "  - name: hook\n    file: {path: hook.jsonl}\n  - name: mail\n    file: {path: mail.jsonl}"
    policy = load_policy(_policy(tmp_path, curve, receivers, "hook"))
    with Store.open(tmp_path / "state.duckdb") as store:
        run_id = record_fake_score(store, repo="org/model", sha="c" * 40, lstar=-2.0, se=0.03, finished_at=T0)
        report = evaluate_pending(store, [policy], now=T0)
        [row] = store.report_predictions("bytes", start=T0 - timedelta(days=1), end=T0 + timedelta(hours=1))
        again = evaluate_pending(store, [policy], now=T0)
    assert report.predictions == 1 and list(report.skip_reasons.values()) == ["curve_refused"]
    assert row.state == "not_evaluated" and row.run_id == run_id
    reason = row.detail["reason"]
    assert "is on log10 FLOPs" in reason and f"score run {run_id} has no declared training FLOPs" in reason
    assert again.predictions == 0  # recorded once, not retried while the curve is the same


# -- the command line ----------------------------------------------------------------------------
def test_policy_test_and_curves_predict_take_a_value_on_the_curves_axis(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    from monitor.cli import main

    curve = _bpb_curve(tmp_path)
    path = tmp_path / "mixed.yaml"
    path.write_text(f"""\
name: mixed
tasks:
  - name: arith
    curve: {CURVES / "arith.json"}
  - name: bytes
    curve: {curve}
route:
  receiver: log
receivers:
  - name: log
    file: {{path: log.jsonl}}
""")
    assert main(["policy", "test", str(path), "--value", "1.0"]) != 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "2 axes (L*: arith; bits/byte: bytes)" in err and "--axis" in err
    assert main(["policy", "test", str(path), "--value", "1.0", "--se", "0.02", "--axis", "bits_per_byte",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    [task] = out["tasks"]
    assert out["axis"] == "bits_per_byte" and out["skipped"] == {"arith": "its curve is on L*, not bits/byte"}
    expected = predict(load_curve(curve), 1.0, 0.02)
    assert (task["task"], task["axis"], task["value"], task["se"]) == ("bytes", "bits_per_byte", 1.0, 0.02)
    assert task["interval"] == [expected.lower, expected.upper] and task["state"] == expected.state
    assert main(["curves", "predict", str(curve), "--value", "1.0", "--se", "0.02"]) == 0
    assert "at bits/byte 1.0000 ± 0.0200: P̂ = 0.4500" in capsys.readouterr().out


def test_every_axis_can_be_named_in_a_curve_artifact() -> None:
    # The artifact's schema lists the axes by name; an axis missing there could be fitted on but
    # its curve could not be written or loaded.
    from typing import get_args

    from monitor.curves.artifact import AxisName

    assert set(get_args(AxisName)) == set(AXES)
