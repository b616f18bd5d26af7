"""Values reach the terminal as they are: a curve warning such as `[none, -1.63]` (which rich
would read as a markup tag and drop) is printed whole by `lstar alerts show` and the terminal
report, exactly as the webhook and `--json` carry it."""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from monitor.alerts import evaluate_pending
from monitor.cli import main
from monitor.curves.artifact import Threshold, load_curve, save_curve, unresolved_warnings
from monitor.policy.load import load_policy
from monitor.store import Store
from support.scores import record_fake_score

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "policies" / "curves" / "arith.json"
T0 = datetime(2025, 6, 1, 12, 0, tzinfo=timezone.utc)


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path, list[str]]:
    """A policy on a curve whose threshold interval is open below (`[none, …]`), an at-risk
    alert on it in a real DuckDB file, and the curve's warning messages."""
    monkeypatch.setenv("COLUMNS", "1000")  # the messages on one line each, to compare them whole
    clean = load_curve(FIXTURE)
    changed = clean.model_copy(update={"threshold": Threshold.model_validate(
        {**clean.threshold.model_dump(), "lower": None})})
    curve = changed.model_copy(update={"curve_id": changed.content_id()})
    save_curve(curve, tmp_path / "curves" / "arith.json")
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text("name: watched\ntasks:\n  - name: arith\n    curve: curves/arith.json\n"
                           "route: {receiver: log, group_wait: 0s}\nreceivers:\n  - name: log\n"
                           "    file: {path: alerts.jsonl}\n")
    db = tmp_path / "state.duckdb"
    with Store.open(db) as store:
        record_fake_score(store, repo="org/[draft]-model", sha="c" * 40, lstar=-2.0, se=0.02, finished_at=T0)
        evaluate_pending(store, [load_policy(policy_file)], now=T0)
    messages = [w.message for w in unresolved_warnings(curve)]
    assert any("[none, " in m for m in messages)
    return db, policy_file, messages


def test_alerts_show_prints_bracketed_values_whole(state, capsys) -> None:
    db, _, messages = state
    assert main(["alerts", "list", "--db", str(db), "--json"]) == 0
    [alert] = json.loads(capsys.readouterr().out)["items"]
    assert main(["alerts", "show", str(alert["id"]), "--db", str(db), "--json"]) == 0
    description = json.loads(capsys.readouterr().out)["annotations"]["description"]
    assert all(m in description for m in messages)
    assert main(["alerts", "show", str(alert["id"]), "--db", str(db)]) == 0
    out = capsys.readouterr().out
    assert description in out
    assert "org/[draft]-model" in out and all(m in out for m in messages)


def test_the_terminal_report_prints_bracketed_values_whole(state, capsys) -> None:
    db, policy_file, messages = state
    assert main(["report", "--db", str(db), "--policy", str(policy_file), "--json"]) == 0
    [problem] = json.loads(capsys.readouterr().out)["problems"]
    assert main(["report", "--db", str(db), "--policy", str(policy_file)]) == 0
    out = capsys.readouterr().out
    assert f"problem: {problem}\n" in out
    assert "org/[draft]-model" in out and all(m in out for m in messages)


# -- the Markdown report's plots ------------------------------------------------------------------
IMAGE = re.compile(r"!\[([^\]]+)\]\(([^)]+)\)")


def test_the_markdown_report_links_its_plots_to_files_that_exist(state, tmp_path: Path, capsys) -> None:
    db, policy_file, _ = state
    folder = tmp_path / "out" / "weekly"
    assert main(["report", "--db", str(db), "--policy", str(policy_file), "--out", str(folder)]) == 0
    assert capsys.readouterr().out == f"wrote {folder / 'report.md'}\n"
    markdown = (folder / "report.md").read_text(encoding="utf-8")
    plots = markdown.split("## Plots", 1)[1]
    images = IMAGE.findall(plots)
    # the titles as they render (Markdown-escaped in the source: `L\* over time`)
    assert {"L* over time per lineage", "Raw CE against L* per family", "Task curve: arith"} <= \
        {re.sub(r"\\(.)", r"\1", title) for title, _ in images}
    for _, link in images:
        assert (folder / link).is_file() and (folder / link).read_bytes().startswith(b"\x89PNG")
    # printed with --out, the links point at the written files from here
    other = tmp_path / "again"
    assert main(["report", "--db", str(db), "--policy", str(policy_file), "--out", str(other), "--markdown"]) == 0
    printed = capsys.readouterr().out
    links = [link for _, link in IMAGE.findall(printed.split("## Plots", 1)[1])]
    assert links and all(Path(link).is_file() for link in links)


def test_printed_markdown_says_where_the_plots_are(state, capsys) -> None:
    db, policy_file, _ = state
    assert main(["report", "--db", str(db), "--policy", str(policy_file), "--markdown"]) == 0
    plots = capsys.readouterr().out.split("## Plots", 1)[1]
    assert "lstar report --out DIR" in plots


def test_out_refuses_a_folder_that_holds_anything(state, tmp_path: Path, capsys) -> None:
    db, policy_file, _ = state
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.txt").write_text("keep me")
    assert main(["report", "--db", str(db), "--policy", str(policy_file), "--out", str(folder)]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert f"--out {folder}: exists and is not an empty folder" in line
    assert [p.name for p in folder.iterdir()] == ["notes.txt"] and (folder / "notes.txt").read_text() == "keep me"


# -- --quiet silences the Hub client's progress bars too -----------------------------------------
@pytest.fixture
def bars_on(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    from huggingface_hub.utils import enable_progress_bars

    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)  # restored after the test
    enable_progress_bars()
    yield
    enable_progress_bars()


@pytest.mark.parametrize("flags, quiet", [(["--quiet"], True), (["--json"], True), ([], False)])
def test_score_quiet_turns_off_the_hub_progress_bars_before_any_download(bars_on, monkeypatch, capsys,
                                                                       flags: list[str], quiet: bool) -> None:
    from huggingface_hub.utils import are_progress_bars_disabled

    import monitor.commands.score as score_command
    from monitor.errors import ModelLoadError

    seen = []

    def score_checkpoint(request, db_path=None):  # the seam where the download would start
        seen.append(are_progress_bars_disabled())
        raise ModelLoadError("stopped here")

    monkeypatch.setattr(score_command, "score_checkpoint", score_checkpoint)
    assert main(["score", "org/model", *flags, "--no-db"]) == 2
    assert seen == [quiet]


def test_calibrate_quiet_turns_off_the_hub_progress_bars(bars_on, tmp_path: Path, capsys) -> None:
    from huggingface_hub.utils import are_progress_bars_disabled

    assert main(["calibrate", str(tmp_path / "missing.yaml"), "--quiet"]) == 2  # stops at the file
    assert are_progress_bars_disabled()
