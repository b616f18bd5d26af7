"""Governance reports against a real DuckDB file: numbers match score_runs, states and crossings
match the predictions the outbox wrote, schedules, delivery to a file receiver, the three
formats, and the HTML page rendered by headless Chromium with non-blank plots."""

from __future__ import annotations

import contextlib
import errno
import json
import resource
import shutil
import signal
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pytest

from monitor.alerts.evaluation_tick import evaluate_pending
from monitor.curves.artifact import ScoringRef, save_curve
from monitor.curves.fit import fit_curve
from monitor.curves.labels import Label
from monitor.policy.load import load_policy
from monitor.reports.report import build_report, to_markdown, write_report
from monitor.reports.schedule import write_due_reports
from monitor.store import Store
from support.report_state import write_report_policy
from support.screenshot import chromium_screenshot, drawn_plots, plot_frames

CORPUS = "c" * 64
SPEC = ScoringRef(spec_version="lstar-score/1", window=64, stride=32, prefix_policy="bos")
T0 = datetime(2025, 3, 1, 12, tzinfo=timezone.utc)
ROOT = Path(__file__).resolve().parents[1]


def _run(run_id: str, repo: str, sha: str, lstar: float, se: float, ce_uni: float, fp: str, when: datetime,
         tcb: dict | None) -> dict:
    return {"run_id": run_id, "checkpoint_id": None, "model_repo": repo, "model_sha": sha, "model_source": "hub",
            "tokenizer_fingerprint": fp, "corpus_sha256": CORPUS, "spec_version": SPEC.spec_version,
            "window_len": SPEC.window, "stride": SPEC.stride, "prefix_policy": SPEC.prefix_policy, "dtype": "float32",
            "device": "cpu", "n_tokens": 1000, "n_bytes": 4000, "nll_sum": (lstar + ce_uni) * 1000,
            "ce": lstar + ce_uni, "ce_unigram": ce_uni, "lstar": lstar, "l_rel": 1.0, "l_gain": 0.0,
            "bits_per_byte": 1.0, "tokens_per_byte": 0.25, "se_ce": se, "weighted_ppl": None,
            "reference_fingerprint": None, "slices": {}, "tcb": tcb, "spec": {}, "model": {},
            "library_versions": {}, "wall_s": 1.0, "tokens_per_s": 1000.0, "finished_at": when}


# (run, repo, L*, SE, tokenizer, CE_uni, hours after T0): lineage a improves step by step
RUNS = [("r1", "org/a", 3.0, 0.02, "fp-neox", 7.0, 1), ("r2", "org/a", 1.5, 0.02, "fp-neox", 7.0, 2),
        ("r3", "org/a", 0.2, 0.02, "fp-neox", 7.0, 3), ("r4", "org/b", 2.9, 0.05, "fp-llama", 6.0, 2)]


@pytest.fixture(scope="module")
def built_world(tmp_path_factory: pytest.TempPathFactory):
    """A store with 4 score runs, a fitted curve, a policy, and the outbox's predictions."""
    folder = tmp_path_factory.mktemp("world")
    rng = np.random.default_rng(0)
    xs = np.linspace(0.0, 3.2, 16)
    labels = [Label(checkpoint=f"h{i}", value=float(np.clip(0.25 + 0.6 / (1 + np.exp(4 * (x - 1.2)))
                                                              + rng.normal(0, 0.02), 0, 1)),
                    family="f1" if i % 2 else "f2", task="cloze", metric="acc", n=200, lstar=float(x))
              for i, x in enumerate(xs)]
    curve = fit_curve(labels, task="cloze", metric="acc", baseline=0.25, margin=0.2, resamples=100, lofo=False,
                      corpus_sha256=CORPUS, scoring_spec=SPEC)
    save_curve(curve, folder / "curves" / "cloze.json")
    write_report_policy(folder, folder / "audit.jsonl")
    policy = load_policy(folder / "policy.yaml")
    tcb = {"mean": 0.5, "median": 0.4, "p10": 0.1, "v_eff_mean": 12.0, "margin_mean": 1.5, "n_positions": 64}
    with Store.open(folder / "lstar.duckdb") as store:
        for run_id, repo, lstar, se, fp, ce_uni, hours in RUNS:
            when = T0 + timedelta(hours=hours)
            store.record_score_run(_run(run_id, repo, f"{run_id}sha".ljust(40, "0"), lstar, se, ce_uni, fp, when,
                                        {**tcb, "mean": lstar / 10}),
                                   [("d1", "web", 1000, 1.0, 4000)],
                                   {"sha256": CORPUS, "name": "calib", "version": "0", "parent_sha256": CORPUS,
                                    "selection": "all", "n_documents": 1, "n_bytes": 4000},
                                   {"fingerprint": fp, "source": fp, "vocab_size": 10, "prefix_policy": "bos",
                                    "prefix_token_id": 0})
            evaluate_pending(store, [policy], now=when + timedelta(minutes=1))
    assert not (folder / "audit.jsonl").exists()   # nothing sent: a test's copy starts with no audit file
    return folder, curve


@pytest.fixture()
def world(built_world, tmp_path: Path):
    """The module's world, copied into the test's own folder (tests write reports, deliveries
    and a closed store into it): building it per test cost about 0.6 CPU-seconds each."""
    folder, curve = built_world
    shutil.copytree(folder / "curves", tmp_path / "curves")
    shutil.copyfile(folder / "lstar.duckdb", tmp_path / "lstar.duckdb")
    write_report_policy(tmp_path, tmp_path / "audit.jsonl")
    policy = load_policy(tmp_path / "policy.yaml")
    store = Store.open(tmp_path / "lstar.duckdb")
    yield store, policy, curve, tmp_path
    store.close()


def test_report_numbers_match_the_store(world) -> None:
    store, policy, curve, _ = world
    now = T0 + timedelta(hours=4)
    data = build_report(store, policy, now=now, period_start=T0 + timedelta(hours=1, minutes=30))
    raw = {r["run_id"]: r for r in store.query("SELECT run_id, lstar, se_ce, ce, ce_unigram, tcb FROM score_runs")}
    assert len(data["lstar_table"]) == len(RUNS)
    for row in data["lstar_table"]:
        ref = raw[row["run_id"]]
        assert (row["lstar"], row["se"], row["ce"], row["ce_unigram"]) == \
            (ref["lstar"], ref["se_ce"], ref["ce"], ref["ce_unigram"])
        assert row["stability"]["mean"] == json.loads(ref["tcb"])["mean"]
    # new in the period (after T0 + 1.5 h): r2, r3, r4
    assert sorted(r["run_id"] for r in data["lstar_table"] if r["new"]) == ["r2", "r3", "r4"]
    assert {f["lineage"]: f["latest_lstar"] for f in data["families"]} == {"org/a": 0.2, "org/b": 2.9}

    # Task states are the newest prediction per lineage; crossings every state change in the period.
    preds = store.query("SELECT lineage, state, lo, hi, threshold, evaluated_at FROM predictions "
                        "WHERE policy = 'governance' ORDER BY evaluated_at, id")
    newest = {p["lineage"]: p for p in preds}
    (task,) = data["tasks"]
    assert {x["lineage"]: x["state"] for x in task["lineages"]} == {k: v["state"] for k, v in newest.items()}
    assert {x["lineage"]: (x["lo"], x["hi"], x["threshold"]) for x in task["lineages"]} == \
        {k: (v["lo"], v["hi"], v["threshold"]) for k, v in newest.items()}
    assert task["level"] == pytest.approx(0.45)
    expected, last = [], {}
    for p in preds:
        if p["state"] != last.get(p["lineage"]) and p["evaluated_at"] > T0 + timedelta(hours=1, minutes=30):
            expected.append((p["lineage"], last.get(p["lineage"]), p["state"]))
        last[p["lineage"]] = p["state"]
    assert [(c["lineage"], c["from"], c["to"]) for c in data["crossings"]] == expected
    # the curve makes lineage a emerge at L* = 0.2 and leaves it clear at 3.0
    assert newest["org/a"]["state"] == "emerged" and preds[0]["state"] == "clear"
    assert data["summary"]["emerged"] == 1

    md = to_markdown(data)
    for row in data["lstar_table"]:
        assert f"{row['lstar']:.4f} | {row['se']:.4f}" in md
    assert "**emerged**" in md


def test_a_report_names_the_policy_version_it_was_computed_under(world) -> None:
    """The policy text as it was parsed (not as the file reads now) and each task's curve id,
    in the data, the JSON, the Markdown and the HTML."""
    import hashlib

    from types import SimpleNamespace

    from monitor.reports.report import to_html, to_json
    from monitor.reports.version import policy_version

    store, policy, curve, tmp = world
    text = (tmp / "policy.yaml").read_bytes()
    (tmp / "policy.yaml").write_bytes(text + b"# edited after the policy was loaded\n")
    data = build_report(store, policy, now=T0 + timedelta(hours=4), period_start=T0)
    version = data["policy_version"]
    sha = hashlib.sha256(text).hexdigest()
    assert (version["name"], version["file"], version["sha256"]) == ("governance", str(tmp / "policy.yaml"), sha)
    assert version["curves"] == {"cloze": curve.curve_id}
    expected = hashlib.sha256(('{"curves": {"cloze": "%s"}, "policy_sha256": "%s"}' % (curve.curve_id, sha)).encode())
    assert version["fingerprint"] == expected.hexdigest()
    assert isinstance(version["loaded_at"], datetime) and version["loaded_at"].tzinfo is not None
    assert json.loads(to_json(data))["policy_version"]["fingerprint"] == version["fingerprint"]
    line = f"governance version {version['fingerprint'][:12]} ({tmp / 'policy.yaml'} sha256 {sha[:12]}; " \
           f"curves cloze {curve.curve_id[:12]})"
    assert f"Policy {line}." in to_markdown(data)
    assert f"<p>Policy {line}.</p>" in to_html(data, {})

    # The text read again (edited) is another version; so is the same text over another curve,
    # or over a curve file that does not load.
    reread = build_report(store, load_policy(tmp / "policy.yaml"), now=T0 + timedelta(hours=4), period_start=T0)
    assert reread["policy_version"]["sha256"] == hashlib.sha256((tmp / "policy.yaml").read_bytes()).hexdigest()
    assert reread["policy_version"]["fingerprint"] != version["fingerprint"]
    other = policy_version(policy, {"cloze": SimpleNamespace(curve_id="f" * 64)})
    missing = policy_version(policy, {})
    assert (other["sha256"], missing["curves"]) == (sha, {"cloze": None})
    assert len({other["fingerprint"], missing["fingerprint"], version["fingerprint"]}) == 3


def test_due_reports_are_written_recorded_and_delivered(world) -> None:
    store, policy, _, tmp = world
    now = T0 + timedelta(hours=5)
    first = write_due_reports(store, [policy], now=now, out_dir=tmp / "reports")
    assert [r["report"] for r in first] == ["weekly"]
    folder = Path(first[0]["folder"])
    assert folder.parent == tmp / "reports" / "governance"
    for name in ("report.md", "report.html", "report.json", "lstar_over_time.png", "ce_vs_lstar.png",
                 "curve_cloze.png"):
        assert (folder / name).stat().st_size > 0
    assert json.loads((folder / "report.json").read_text())["schema"] == "lstar-report/2"
    line = json.loads((tmp / "audit.jsonl").read_text().splitlines()[-1])
    assert line["message"]["report"] == "weekly" and line["message"]["summary"]["lineages"] == 2
    assert first[0]["deliveries"] == [{"receiver": "audit", "kind": "file", "outcome": "delivered", "error": None}]

    assert write_due_reports(store, [policy], now=now + timedelta(hours=23), out_dir=tmp / "reports") == []
    second = write_due_reports(store, [policy], now=now + timedelta(days=1), out_dir=tmp / "reports")
    assert len(second) == 1
    rows = store.reports(policy="governance")
    assert [r.period_start for r in rows] == [now, now - timedelta(days=7)]
    assert rows[0].summary["new_scores"] == 0   # nothing was scored in the second period


@contextlib.contextmanager
def file_size_limit(limit: int):
    """Writes past `limit` bytes of any file fail (EFBIG) in this process, as a full disk fails them."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # else the kernel's SIGXFSZ ends the process
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)


@pytest.mark.slow
def test_a_report_write_failing_half_way_leaves_no_folder_and_sends_nothing(world) -> None:
    store, policy, _, tmp = world
    now = T0 + timedelta(hours=5)
    # Sizes of the report's files, to fail the write of the largest (the HTML, which embeds the
    # plots) after the others have been written.
    probe = tmp / "probe"
    write_report(build_report(store, policy, now=now, period_start=now - timedelta(days=7)), probe)
    sizes = {p.name: p.stat().st_size for p in probe.iterdir()}
    limit = max(size for name, size in sizes.items() if name != "report.html") + 1
    assert sizes["report.html"] > limit

    reports = tmp / "reports"
    with file_size_limit(limit), pytest.raises(OSError) as failed:
        write_due_reports(store, [policy], now=now, out_dir=reports)
    assert failed.value.errno == errno.EFBIG
    assert not reports.exists()                     # no empty or half-written folder is left
    assert store.reports() == []                    # nothing recorded: the next tick writes it again
    assert not (tmp / "audit.jsonl").exists()       # and nothing was sent

    (done,) = write_due_reports(store, [policy], now=now, out_dir=reports)
    assert sorted(p.name for p in Path(done["folder"]).iterdir()) == sorted(sizes)
    assert [p.name for p in (reports / "governance").iterdir()] == [Path(done["folder"]).name]
    assert len((tmp / "audit.jsonl").read_text().splitlines()) == 1
    assert store.reports()[0].deliveries == done["deliveries"] == [
        {"receiver": "audit", "kind": "file", "outcome": "delivered", "error": None}]


def test_report_cli_json_and_markdown(world, capsys) -> None:
    from monitor.cli import main

    store, policy, _, tmp = world
    store.close()
    code = main(["report", "--policy", str(tmp / "policy.yaml"), "--db", str(tmp / "lstar.duckdb"), "--json"])
    data = json.loads(capsys.readouterr().out)
    # The runs are years before the default week's window: each lineage is carried in at its
    # state then (its newest run), nothing is new.
    assert code == 0 and data["policy"] == "governance"
    assert [(r["run_id"], r["new"]) for r in data["lstar_table"]] == [("r3", False), ("r4", False)]
    assert [(f["lineage"], f["checkpoints_before"]) for f in data["families"]] == [("org/a", 3), ("org/b", 1)]
    code = main(["report", "--policy", str(tmp / "policy.yaml"), "--db", str(tmp / "lstar.duckdb"), "--markdown"])
    assert code == 0 and "## L* by family" in capsys.readouterr().out
    code = main(["report", "--policy", str(tmp / "policy.yaml"), "--db", str(tmp / "lstar.duckdb")])
    out = capsys.readouterr().out
    assert code == 0 and "L* by family" in out and "emerged" in out


@pytest.mark.skipif(shutil.which("chromium") is None,
                    reason="headless Chromium missing: apt-get install -y chromium")
def test_html_report_renders_with_non_blank_plots(world, tmp_path_factory) -> None:
    store, policy, _, tmp = world
    data = build_report(store, policy, now=T0 + timedelta(hours=4), period_start=T0)
    paths = write_report(data, tmp / "out")
    html = paths["html"].read_text()
    assert html.count("data:image/png;base64,") == len(data["plots"]) == 3
    assert "<img src=\"file:" not in html and "http" not in html.split("<body>")[1]  # self-contained
    shot = chromium_screenshot(paths["html"], tmp_path_factory.mktemp("chromium") / "report.png",
                               tmp_path_factory.mktemp("chromium-profile"))
    keep = ROOT / "state" / "test-artifacts"
    keep.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(shot, keep / "report-screenshot.png")
    plots = drawn_plots(shot)
    assert len(plots) == 3, plot_frames(shot)
    for non_white, colours in plots:
        assert non_white > 0.02 and colours > 50, (non_white, colours)   # a drawn plot, not a broken image
