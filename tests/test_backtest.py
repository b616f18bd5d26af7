"""Backtests (monitor.backtest, `lstar backtest`): every metric on hand-worked lineages, the
replay against the daemon's own pass over a store, and the outputs."""

from __future__ import annotations

import csv
import json
import math
from datetime import timezone
from pathlib import Path

import pytest
from scipy.stats import beta, norm

from monitor.alerts.channels.filesink import FileSender
from monitor.alerts.dispatcher import Dispatcher, run_pass
from monitor.backtest import compare, load_history, run_backtest, spec_from_options
from monitor.backtest.compare import Row, make_row
from monitor.backtest.fit import BACKTEST_CORPUS_SHA256, fit_reference_curves, fit_task_curve, save_curves
from monitor.backtest.replay import EPOCH, TICK, ReplayPoint, read_replay, replay_history
from monitor.backtest.scores import SPEC, checkpoint_sha
from monitor.backtest.spec import BacktestTask, replay_policy
from monitor.cli import main
from monitor.curves.artifact import predict
from monitor.curves.labels import Label
from monitor.errors import CurveError, LabelError
from monitor.store import Store
from support.scores import record_fake_score

TASK = BacktestTask("arith", "arith", "acc", baseline=0.25, margin=0.25, confidence=0.9)   # level 0.5


# -- hand-worked rows for the metrics ---------------------------------------------------------
def rows(states, values, *, n=1000, steps=(100, 200, 300, 400, 500, 600), lineage="tgt"):
    """One lineage: predicted states and observed values per step (tokens = step·10⁴)."""
    out = []
    for step, state, value in zip(steps, states, values):
        label = Label(checkpoint=f"s{step}", value=value, task="arith", metric="acc", n=n, lineage=lineage,
                      step=float(step), tokens=step * 1e4)
        point = None if state is None else ReplayPoint(task="arith", lineage=lineage, repo=lineage, commit="c",
                                                       at=EPOCH, state=state, p_hat=value, lo=value - 0.01,
                                                       hi=value + 0.01)
        out.append(make_row(label, TASK, point))
    return out


# Observed with n = 1000 at level 0.5: 0.25 … 0.45 are clear (Clopper–Pearson upper < 0.5), 0.74
# and 0.9 emerged (lower ≥ 0.5): the crossing is at step 500.
CROSSING_VALUES = (0.25, 0.27, 0.31, 0.45, 0.74, 0.90)
FLAT_VALUES = (0.25, 0.26, 0.27, 0.30, 0.30, 0.29)


def test_observed_states_by_hand():
    got = [r.observed_state for r in rows(["clear"] * 6, CROSSING_VALUES)]
    assert got == ["observed_clear"] * 4 + ["observed_emerged"] * 2
    lo, hi = compare.observed_interval(0.45, 1000, None, 0.9)
    assert hi == pytest.approx(beta.ppf(0.95, 451, 550)) and hi < 0.5
    # without n: value ± z·stderr
    lo, hi = compare.observed_interval(0.6, None, 0.05, 0.9)
    assert (lo, hi) == pytest.approx((0.6 - norm.ppf(0.95) * 0.05, 0.6 + norm.ppf(0.95) * 0.05))


def test_lead_time_from_first_warning_to_crossing():
    r = rows(["clear", "clear", "at_risk", "at_risk", "emerged", "emerged"], CROSSING_VALUES)
    assert compare.first_warning(r).step == 300 and compare.crossing(r).step == 500
    assert compare.lead(r) == {"steps": 200.0, "tokens": 2e6, "flops": None, "in_force": True,
                               "first_warning_steps": 200.0}
    assert compare.missed(r) is None and compare.late_warning(r) is None and compare.false_alarm(r) is None


def test_lead_counts_from_the_last_uninterrupted_warning_run():
    # warned at 100, back to clear at 200, warned again from 300 (400 not predicted: no break);
    # the crossing is at 500 (0.74 ≥ 0.5): the lead is 500 − 300, the first warning 500 − 100 ahead
    r = rows(["at_risk", "clear", "at_risk", None, "emerged", "emerged"], CROSSING_VALUES)
    assert compare.lead(r) == {"steps": 200.0, "tokens": 2e6, "flops": None, "in_force": True,
                               "first_warning_steps": 400.0}
    # a warning that lapsed before the crossing still counts from its start, and says it lapsed
    r = rows(["clear", "at_risk", "at_risk", "clear", "emerged", "emerged"], CROSSING_VALUES)
    assert compare.lead(r) == {"steps": 300.0, "tokens": 3e6, "flops": None, "in_force": False,
                               "first_warning_steps": 300.0}


def test_pooled_coverage_uses_each_rows_own_nominal_level():
    import dataclasses

    r = rows(["clear"] * 6, CROSSING_VALUES)
    mixed = [dataclasses.replace(x, confidence=0.9 if i < 3 else 0.5) for i, x in enumerate(r)]
    assert compare.pooled_nominal(mixed) == pytest.approx((3 * 0.9 + 3 * 0.5) / 6)
    assert compare.coverage_of(mixed).nominal == pytest.approx(0.7)
    # the order of the rows no longer decides the level
    assert compare.coverage_of(mixed[::-1]).nominal == pytest.approx(0.7)
    assert compare.coverage_of(r).nominal == pytest.approx(TASK.confidence)


def test_late_warning_is_also_a_miss():
    r = rows(["clear", "clear", "clear", "clear", "at_risk", "emerged"], CROSSING_VALUES)
    assert compare.lead(r) is None
    assert compare.late_warning(r).step == 500 and compare.missed(r).step == 500


def test_miss_without_any_warning():
    r = rows(["clear"] * 6, CROSSING_VALUES)
    assert compare.missed(r).step == 500 and compare.late_warning(r) is None and compare.first_warning(r) is None


def test_a_crossing_at_the_first_checkpoint_is_neither_a_miss_nor_a_late_warning():
    # Observed emerged from the first checkpoint on (a history that starts past the level): no
    # warning could have come earlier, so it is counted apart, not as a miss.
    values = (0.74, 0.80, 0.85, 0.88, 0.90, 0.91)
    r = rows(["at_risk"] * 6, values)
    assert compare.crossing(r).step == 100 and compare.crossed_at_start(r).step == 100
    assert compare.missed(r) is None and compare.late_warning(r) is None and compare.lead(r) is None
    silent = rows(["clear"] * 6, values)
    assert compare.missed(silent) is None and compare.crossed_at_start(silent).step == 100
    # A crossing at the second checkpoint without an earlier warning is a miss again.
    later = rows(["clear"] * 6, (0.25,) + values[1:])
    assert compare.crossed_at_start(later) is None and compare.missed(later).step == 200


def test_false_alarm_on_a_lineage_that_never_crosses():
    r = rows(["clear", "clear", "clear", "at_risk", "at_risk", "clear"], FLAT_VALUES)
    assert compare.crossing(r) is None
    assert compare.false_alarm(r).step == 400
    quiet = rows(["clear"] * 6, FLAT_VALUES)
    assert compare.false_alarm(quiet) is None


def test_false_emerged_lists_each_checkpoint():
    r = rows(["clear", "clear", "emerged", "at_risk", "emerged", "emerged"], CROSSING_VALUES)
    assert [x.step for x in compare.false_emerged(r)] == [300.0]   # 500, 600 are observed emerged


def test_coverage_by_hand():
    # p̂ 0.5, interval [0.45, 0.55], n = 100, 90 %: half-width hypot(0.05, z·0.05) = 0.09625.
    z = norm.ppf(0.95)
    half = math.hypot(0.05, z * math.sqrt(0.25 / 100))
    observed = (0.5 - half + 0.001, 0.5 + half - 0.001, 0.5 - half - 0.001, 0.5)
    r = []
    for i, value in enumerate(observed):
        label = Label(checkpoint=f"s{i}", value=value, task="arith", metric="acc", n=100, lineage="t", step=float(i))
        r.append(make_row(label, TASK, ReplayPoint("arith", "t", "t", "c", EPOCH, "at_risk", p_hat=0.5, lo=0.45,
                                                   hi=0.55)))
    assert [compare.covered(x) for x in r] == [True, True, False, True]
    cov = compare.coverage_of(r, 0.9)
    assert (cov.checked, cov.covered) == (4, 3)
    assert cov.lo == pytest.approx(beta.ppf(0.05, 3, 2)) and cov.hi == pytest.approx(beta.ppf(0.95, 4, 1))


def test_final_relative_error():
    r = rows(["clear"] * 6, CROSSING_VALUES)
    object.__setattr__(r[-1], "predicted", ReplayPoint("arith", "tgt", "tgt", "c", EPOCH, "emerged", p_hat=0.81,
                                                       lo=0.8, hi=0.82))
    assert compare.final_relative_error(r) == pytest.approx((0.81 - 0.9) / 0.9)


# -- a tiny history, end to end ---------------------------------------------------------------
def acc_of(lstar: float) -> float:
    return 0.25 if lstar > 2.6 else 0.3 if lstar > 2.2 else 0.75 if lstar > 1.8 else 0.9


TARGETS = {"tgt": ([3.0, 2.7, 2.3, 2.1, 1.9, 1.6], CROSSING_VALUES),
           "<script>": ([3.0, 2.9, 2.5, 2.4, 2.35, 2.3], FLAT_VALUES)}


def write_history(path: Path, *, duplicate: bool = False, drop_axis: bool = False) -> Path:
    out = []
    for lineage, family, xs in (("ref-a", "a", [3.0, 2.8, 2.4, 2.0, 1.7, 1.5]), ("ref-b", "b", [3.1, 2.7, 2.3, 1.9, 1.6, 1.4])):
        for i, x in enumerate(xs):
            out.append(dict(checkpoint=f"s{i}", family=family, value=acc_of(x), n=1000, task="arith", metric="acc",
                            lstar=x, lineage=lineage, step=(i + 1) * 100, tokens=(i + 1) * 1e6))
    for lineage, (xs, values) in TARGETS.items():
        for i, (x, v) in enumerate(zip(xs, values)):
            out.append(dict(checkpoint=f"s{i}", family="t", value=v, n=1000, task="arith", metric="acc",
                            lstar="" if drop_axis and i == 2 else x, lineage=lineage, step=(i + 1) * 100,
                            tokens=(i + 1) * 1e6))
    if duplicate:
        out.append(dict(out[-1]))
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(out[0]))
        writer.writeheader()
        writer.writerows(out)
    return path


@pytest.fixture(scope="module")
def history_file(tmp_path_factory):
    return write_history(tmp_path_factory.mktemp("history") / "history.csv")


def test_history_is_validated(tmp_path):
    dup = write_history(tmp_path / "dup.csv", duplicate=True)
    with pytest.raises(LabelError, match=r"lineage '<script>' step 600 task 'arith' metric 'acc'"):
        load_history(dup, reference="ref-*", target="tgt", axis="lstar")
    hole = write_history(tmp_path / "hole.csv", drop_axis=True)
    with pytest.raises(LabelError, match=r"target lineage 'tgt', step 300.*no L\* value"):
        load_history(hole, reference="ref-*", target="tgt", axis="lstar")
    with pytest.raises(LabelError, match="matches both"):
        load_history(hole, reference="*", target="tgt", axis="lstar")


def test_backtest_end_to_end(history_file, tmp_path):
    history = load_history(history_file, reference="ref-*", target="[!r]*", axis="lstar")
    spec = spec_from_options(task="arith", baseline=0.25, margin=0.25, axis="lstar")
    result = run_backtest(history, spec, alerts_out=tmp_path / "alerts.jsonl", resamples=200)
    data = result.as_dict()
    curve = fit_task_curve(history.reference_labels(), TASK, axis="lstar", resamples=200)
    assert data["curves"]["arith"]["curve_id"] == curve.curve_id
    by_lineage = {r["lineage"]: r for r in data["results"]}
    for lineage, (xs, _) in TARGETS.items():
        # every predicted state is the curve's own prediction at the checkpoint's L*
        expected = [predict(curve, x, 0.0).state for x in xs]
        assert [p["predicted_state"] for p in by_lineage[lineage]["points"]] == expected
    tgt = by_lineage["tgt"]
    assert tgt["crossing"]["step"] == 500
    warn = next(p["step"] for p in tgt["points"] if p["predicted_state"] in ("at_risk", "emerged"))
    assert tgt["first_warning"]["step"] == warn
    if warn < 500:
        assert tgt["lead"]["steps"] == 500 - warn and tgt["lead"]["tokens"] == (500 - warn) * 1e4
    flat = by_lineage["<script>"]
    assert flat["crossing"] is None
    if any(p["predicted_state"] != "clear" for p in flat["points"]):
        assert flat["false_alarm"] is not None and data["summary"]["false_alarms"] >= 1
    assert data["summary"]["false_emerged"] == 0
    # the file sink holds one line per delivered notification
    lines = (tmp_path / "alerts.jsonl").read_text().splitlines()
    assert len(lines) == data["alerts"]["notifications"] > 0
    assert json.loads(json.dumps(data)) == data   # JSON-safe


def test_replay_equals_the_daemons_pass_over_the_same_scores(history_file, tmp_path):
    """The replay's states and alert keys equal those a daemon's `run_pass` writes for the same
    score runs, recorded the way tests record real scores (`record_fake_score`)."""
    history = load_history(history_file, reference="ref-*", target="[!r]*", axis="lstar")
    spec = spec_from_options(task="arith", baseline=0.25, margin=0.25, axis="lstar")
    curves = save_curves(fit_reference_curves(history.reference_labels(), spec, resamples=200), tmp_path / "curves")
    policy_a = replay_policy(spec, curves, tmp_path / "a.jsonl", corpus_sha256=BACKTEST_CORPUS_SHA256)
    policy_b = replay_policy(spec, curves, tmp_path / "b.jsonl", corpus_sha256=BACKTEST_CORPUS_SHA256)
    with Store.open(tmp_path / "a.duckdb") as store:
        replay = replay_history(store, history, spec, policy_a)
    with Store.open(tmp_path / "b.duckdb") as store:
        dispatcher = Dispatcher(store, [policy_b], senders={"file": FileSender()})
        i = 0
        for lineage, (xs, _) in sorted(TARGETS.items()):
            for k, x in enumerate(xs):
                at = EPOCH + i * TICK
                record_fake_score(store, repo=lineage, sha=checkpoint_sha(lineage, (k + 1) * 100.0), lstar=x, se=0.0,
                                  finished_at=at, corpus_sha256=BACKTEST_CORPUS_SHA256, spec=SPEC)
                run_pass(store, [policy_b], now=at, dispatcher=dispatcher)
                i += 1
        run_pass(store, [policy_b], now=at + TICK, dispatcher=dispatcher)
        daemon = read_replay(store, policy_b)
    assert [(p.lineage, p.commit, p.state) for p in replay.points] == \
        [(p.lineage, p.commit, p.state) for p in daemon.points]
    assert [(a.alert_key, a.kind) for a in replay.alerts] == [(a.alert_key, a.kind) for a in daemon.alerts]
    assert replay.alerts and replay.notifications == daemon.notifications
    assert all(p.at.tzinfo is not None for p in replay.points) and replay.points[0].at == EPOCH.astimezone(timezone.utc)


def test_cli_outputs_agree_and_are_escaped(history_file, tmp_path, capsys):
    md, html_dir = tmp_path / "out.md", tmp_path / "html"
    code = main(["backtest", str(history_file), "--reference", "ref-*", "--target", "[!r]*", "--task", "arith",
                 "--baseline", "0.25", "--margin", "0.25", "--axis", "lstar", "--bootstrap", "200", "--json",
                 "--markdown", str(md), "--html", str(html_dir), "--alerts-out", str(tmp_path / "alerts.jsonl")])
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert data == json.loads((html_dir / "result.json").read_text())
    assert data["alerts"]["file"] == str(tmp_path / "alerts.jsonl")
    text = md.read_text()
    page = (html_dir / "index.html").read_text()
    assert "<script>" not in text and "\\<script\\>" in text
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert len(list(html_dir.glob("plot-*.png"))) == len(data["results"]) == 2
    for item in data["results"]:
        final = item["final"]
        assert f"{final['relative_error'] * 100:+.1f} %".replace("+", "\\+").replace("-", "\\-") in text
    # the curve table: the family each task's curve was fitted with, in the JSON and both pages
    assert data["curves"]["arith"]["family"] == "isotonic"
    assert "| arith | isotonic |" in text and "<td>arith</td><td>isotonic</td>" in page
    summary = data["summary"]
    assert f"false alarms {summary['false_alarms']}" in page and f"false alarms {summary['false_alarms']}" in text


def test_cli_refuses_mixed_sources(history_file, tmp_path, capsys):
    code = main(["backtest", str(history_file), "--reference", "ref-*", "--target", "tgt", "--task", "arith"])
    assert code != 0
    assert "--baseline" in capsys.readouterr().err


def test_several_globs_separated_by_commas(tmp_path):
    history = load_history(write_history(tmp_path / "h.csv"), reference="ref-a, ref-b", target="tgt,nothing-*",
                           axis="lstar")
    assert [l.name for l in history.references] == ["ref-a", "ref-b"] and [l.name for l in history.targets] == ["tgt"]
    with pytest.raises(LabelError, match="empty glob"):
        load_history(tmp_path / "h.csv", reference="ref-a,,ref-b", target="tgt", axis="lstar")


def test_several_tasks_from_the_command_line_each_with_its_baseline(history_file, tmp_path, capsys):
    spec = spec_from_options(task=["mmlu=0.25", "piqa=0.5", "arith"], baseline=0.1, margin=0.1, axis="raw_ce")
    assert [(t.name, t.baseline, t.level) for t in spec.tasks] == \
        [("mmlu", 0.25, pytest.approx(0.35)), ("piqa", 0.5, pytest.approx(0.6)), ("arith", 0.1, pytest.approx(0.2))]
    policy = replay_policy(spec, {t.name: tmp_path / f"{t.name}.json" for t in spec.tasks}, tmp_path / "a.jsonl",
                           corpus_sha256=BACKTEST_CORPUS_SHA256)
    assert [t.name for t in policy.tasks] == ["mmlu", "piqa", "arith"]
    for bad, says in ((["arith"], "has no baseline"), (["arith=x"], "is not a number"), (["=0.2"], "no task name"),
                      (["arith=1.5"], "out of range")):
        with pytest.raises(CurveError, match=says):
            spec_from_options(task=bad, baseline=None, margin=0.1)
    code = main(["backtest", str(history_file), "--reference", "ref-*", "--target", "tgt", "--task", "arith",
                 "--margin", "0.25"])
    assert code != 0 and "has no baseline" in capsys.readouterr().err
    code = main(["backtest", str(history_file), "--reference", "ref-*", "--target", "tgt", "--task", "arith=0.25",
                 "--margin", "0.25", "--axis", "lstar", "--bootstrap", "200", "--json"])
    assert code == 0 and json.loads(capsys.readouterr().out)["results"][0]["level"] == pytest.approx(0.5)


def test_policy_tasks_are_backtested_with_their_curve_and_margin(history_file, tmp_path):
    from monitor.backtest import spec_from_policy
    from monitor.curves.artifact import save_curve

    history = load_history(history_file, reference="ref-*", target="tgt", axis="lstar")
    loose = BacktestTask("arith", "arith", "acc", baseline=0.25, margin=0.1, confidence=0.9)
    save_curve(fit_task_curve(history.reference_labels(), loose, axis="lstar", resamples=200), tmp_path / "arith.json")
    (tmp_path / "policy.yaml").write_text(
        "name: team\ntasks:\n  - {name: arith-watch, curve: arith.json, margin: 0.25}\n"
        "route: {receiver: ops, group_wait: 10m}\n"
        "receivers:\n  - {name: ops, webhook: {url: 'https://example.invalid/hook'}}\n")
    spec = spec_from_policy(tmp_path / "policy.yaml")
    # the curve gives task, metric, baseline and axis; the policy task's margin is in force
    assert spec.axis == "lstar" and spec.tasks == (BacktestTask("arith-watch", "arith", "acc", 0.25, 0.25, 0.9),)
    result = run_backtest(history, spec, alerts_out=tmp_path / "alerts.jsonl", resamples=200).as_dict()
    assert result["curves"]["arith-watch"]["level"] == pytest.approx(0.5)
    assert [r["task"] for r in result["results"]] == ["arith-watch"]
    assert result["results"][0]["crossing"]["step"] == 500
    # the webhook became a file sink: what was delivered is in the file, nothing was sent
    assert len((tmp_path / "alerts.jsonl").read_text().splitlines()) == result["alerts"]["notifications"]
    assert all(a["alert_key"].startswith("team|arith-watch|tgt|") for a in result["alerts"]["list"])


def test_a_prediction_beyond_the_references_is_marked_with_its_distance(tmp_path, capsys):
    # A target that ends at L* 1.0, 0.4 beyond the most advanced reference (1.4): its last
    # prediction is extrapolated by 0.4 (SE 0), in the JSON, the Markdown and the HTML.
    path = write_history(tmp_path / "h.csv")
    rows_ = list(csv.DictReader(path.open()))
    for i, x in enumerate([2.0, 1.6, 1.2, 1.0]):
        rows_.append({**rows_[0], "checkpoint": f"s{i}", "family": "t", "value": 0.9, "lstar": x, "lineage": "far",
                      "step": (i + 1) * 100, "tokens": (i + 1) * 1e6})
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows_[0]))
        writer.writeheader()
        writer.writerows(rows_)
    md, html_dir = tmp_path / "out.md", tmp_path / "html"
    assert main(["backtest", str(path), "--reference", "ref-*", "--target", "far", "--task", "arith=0.25",
                 "--margin", "0.25", "--axis", "lstar", "--bootstrap", "200", "--json", "--markdown", str(md),
                 "--html", str(html_dir)]) == 0
    final = json.loads(capsys.readouterr().out)["results"][0]["final"]
    assert final["extrapolated"] is True and final["extrapolation"] == pytest.approx(0.4)
    words = "extrapolated by 0.4 nats/token beyond the most advanced reference"
    assert words in md.read_text() and words in (html_dir / "index.html").read_text()


def test_no_refit_replays_the_policys_own_curve(history_file, tmp_path, capsys):
    """`--policy --no-refit`: nothing fitted, no references; the policy's curve artifact is the
    one every prediction comes from (checked against `predict` on that curve)."""
    from monitor.curves.artifact import save_curve

    history = load_history(history_file, reference="ref-*", target="tgt", axis="lstar")
    # fitted on one reference only, so it differs from what a refit on both would give
    curve = fit_task_curve([r for r in history.reference_labels() if r.lineage == "ref-a"], TASK, axis="lstar",
                           resamples=200)
    save_curve(curve, tmp_path / "arith.json")
    (tmp_path / "policy.yaml").write_text("name: team\ntasks:\n  - {name: arith, curve: arith.json}\n"
                                          "route: {receiver: ops}\n"
                                          "receivers:\n  - {name: ops, file: {path: a.jsonl}}\n")
    args = ["backtest", str(history_file), "--target", "tgt", "--policy", str(tmp_path / "policy.yaml")]
    assert main([*args, "--no-refit", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["curves"]["arith"]["curve_id"] == curve.curve_id and data["references"] == []
    assert [p["predicted_state"] for p in data["results"][0]["points"]] == \
        [predict(curve, x, 0.0).state for x in TARGETS["tgt"][0]]
    assert [p["p_hat"] for p in data["results"][0]["points"]] == \
        [predict(curve, x, 0.0).p_hat for x in TARGETS["tgt"][0]]
    assert main(args) != 0 and "--reference" in capsys.readouterr().err          # a refit needs references
    assert main([*args, "--no-refit", "--reference", "ref-*"]) != 0
    assert "no --reference" in capsys.readouterr().err
