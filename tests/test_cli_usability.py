"""The command line as a new user meets it after `lstar demo`: the demo's next commands run on
its state, one `--state DIR` everywhere, `lstar report` without `--policy`, `lstar runs`,
`lstar --version`, flags shown as flags, identifiers kept whole at 80 columns."""

from __future__ import annotations

import json
import os
import shlex
from datetime import datetime, timedelta, timezone
from importlib.metadata import version
from pathlib import Path

import click
import pytest
import typer
from rich.cells import cell_len

from monitor.cli import app, main
from monitor.commands.demo import next_commands, print_summary
from monitor.demo.run import POLICY
from monitor.environment import quiet_hub_progress
from monitor.hub.poll import Candidate
from monitor.store import Store
from support.scores import CALIB_V0_SHA256, fake_sha, record_fake_score

CURVES = Path(__file__).parent / "fixtures" / "policies" / "curves"
T0 = datetime(2024, 3, 1, tzinfo=timezone.utc)
# Identifiers longer than an 80-column table leaves any cell: cut, they would read "long-org…".
# Under demo-org, so that the demo's policy watches them and its report lists them.
LONG_REPOS = ("demo-org/a-checkpoint-family-whose-name-is-long-enough-to-be-cut-at-80-columns-v2",
              "demo-org/second-family-of-checkpoints-with-an-identifier-longer-than-any-table-cell")
LONG_REF = "step123456-of-a-branch-with-a-name-longer-than-any-column-of-an-80-column-table"


def populate_state(workdir: Path, repos: tuple[str, ...] = LONG_REPOS) -> tuple[Path, Path, list[str]]:
    """A demo-shaped folder: WORKDIR/state/lstar.duckdb with score runs (one per repo, an hour
    apart) and WORKDIR/policies/demo.yaml, the demo's policy on a fitted cloze curve."""
    state, policies = workdir / "state", workdir / "policies"
    policies.mkdir(parents=True)
    run_ids = []
    with Store.open(state / "lstar.duckdb") as store:
        for i, repo in enumerate(repos):
            run_ids.append(record_fake_score(store, repo=repo, sha=fake_sha(repo), lstar=-1.0 - i / 10,
                                             se=0.01 + i / 100, finished_at=T0 + timedelta(hours=i)))
    policy = policies / "demo.yaml"
    (policies / "tasks").mkdir()
    (policies / "tasks" / "add.jsonl").write_text(
        '{"id": "a", "context": "two plus two is", "choices": [" four", " five"], "answer": 0}\n')
    policy.write_text(POLICY.format(org="demo-org", corpus=CALIB_V0_SHA256, curve=str(CURVES / "cloze.json"),
                                    task_file="tasks/add.jsonl", per_day=20,
                                    webhook="http://127.0.0.1:9/hook", smtp_port=2525,
                                    audit=str(workdir / "received" / "audit.jsonl")))
    return state, policy, run_ids


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def column_text(output: str, header: str) -> str:
    """Every line's piece of the table column `header`, stripped and joined: a value folded over
    several lines reads whole again (rich draws cells between │ and the header between ┃)."""
    lines = output.splitlines()
    head = next(i for i, line in enumerate(lines) if header in [c.strip() for c in line.split("┃")])
    index = [c.strip() for c in lines[head].split("┃")].index(header)
    pieces = []
    for line in lines[head + 1:]:
        cells = line.split("│")
        if len(cells) > index:
            pieces.append(cells[index].strip())
    return "".join(pieces)


# -- the demo's next commands --------------------------------------------------------------------

def fake_summary(workdir: Path, state: Path, policy: Path) -> dict:
    """What `run_demo` returns, for a demo that ran in `workdir` (the demo itself takes minutes)."""
    return {"ok": True, "wall_s": 150.0, "workdir": str(workdir), "state": str(state),
            "db": str(state / "lstar.duckdb"), "policy": str(policy),
            "curve": str(workdir / "policies" / "curves" / "cloze.json"), "fit": {"level": 0.2955},
            "predictions": {"at_risk": 2, "clear": 4},
            "webhook": {"alert_messages": 2, "file": str(workdir / "received" / "webhook.json")},
            "email": {"alert_messages": 2, "report_messages": 1, "files": [str(workdir / "received" / "mail-0.eml")]},
            "reports": [{"folder": str(state / "reports" / "demo" / "demo-report")}],
            "audit_log": str(workdir / "received" / "audit.jsonl")}


def test_the_demo_ends_with_commands_that_work_on_its_state(tmp_path: Path, capsys, monkeypatch) -> None:
    # A deep folder with a space: printed whole and quoted, the commands still run.
    workdir = tmp_path / "a folder with a space" / ("deep-" * 12).rstrip("-") / "demo"
    state, policy, _ = populate_state(workdir)
    monkeypatch.setenv("COLUMNS", "80")
    print_summary(fake_summary(workdir, state, policy))
    out = capsys.readouterr().out
    assert "{" not in out  # no Python dict repr
    assert "predictions:   2 at_risk, 4 clear" in out
    assert f"policy:        {policy}\n" in out and f"database:      {state / 'lstar.duckdb'}\n" in out
    printed = [line.strip() for line in out.splitlines() if line.strip().startswith("lstar ")]
    assert printed == next_commands(fake_summary(workdir, state, policy))
    assert {shlex.split(line)[1] for line in printed} >= {"status", "runs", "checkpoints", "alerts", "report"}
    monkeypatch.chdir(tmp_path)  # nowhere near ./state: the commands must name the demo's state
    for line in printed:
        argv = shlex.split(line)
        assert argv[0] == "lstar" and shlex.quote(str(state)) in line
        code, cmd_out, err = run(argv[1:], capsys)
        assert code == 0, (line, err)
        if argv[1] == "runs":
            assert all(repo in column_text(cmd_out, "model") for repo in LONG_REPOS), cmd_out
        if argv[1] == "report":
            assert "Governance report: demo" in cmd_out


# -- one --state everywhere ----------------------------------------------------------------------

def _commands(group: click.Command, prefix: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], click.Command]]:
    out = [(prefix, group)]
    for name, sub in getattr(group, "commands", {}).items():
        out += _commands(sub, (*prefix, name))
    return out


COMMANDS = [(path, cmd) for path, cmd in _commands(typer.main.get_command(app)) if path]
READ_COMMANDS = {("status",), ("runs",), ("checkpoints",), ("report",), ("alerts", "list"), ("alerts", "show"),
                 ("db", "info"), ("silence", "list")}


def _option(cmd: click.Command, flag: str) -> click.Parameter | None:
    return next((p for p in cmd.params if flag in getattr(p, "opts", ())), None)


def test_every_command_on_the_database_takes_state_and_db_as_override() -> None:
    names = {path for path, _ in COMMANDS}
    assert READ_COMMANDS <= names
    for path, cmd in COMMANDS:
        state, db = _option(cmd, "--state"), _option(cmd, "--db")
        if path in READ_COMMANDS:
            assert state is not None and db is not None, path
        if db is not None:  # --db never without --state, and --state means the same everywhere
            assert state is not None, path
        if state is not None:
            assert str(state.default) == "state", path


def test_status_and_runs_read_the_state_given(tmp_path: Path, capsys) -> None:
    state, _, run_ids = populate_state(tmp_path / "w")
    code, out, err = run(["status", "--state", str(state), "--json"], capsys)
    assert code == 0, err
    assert json.loads(out)["db"] == str(state / "lstar.duckdb")
    moved = tmp_path / "elsewhere.duckdb"
    (state / "lstar.duckdb").rename(moved)
    code, out, err = run(["status", "--state", str(state), "--db", str(moved), "--json"], capsys)
    assert code == 0, err
    assert json.loads(out)["db"] == str(moved)
    code, out, err = run(["runs", "--db", str(moved), "--json"], capsys)
    assert code == 0, err
    assert [r["run_id"] for r in json.loads(out)["items"]] == run_ids[::-1]


# -- lstar report without --policy ---------------------------------------------------------------

def test_report_picks_the_only_policy_and_says_so(tmp_path: Path, capsys) -> None:
    state, policy, _ = populate_state(tmp_path / "w")
    code, out, err = run(["report", "--state", str(state), "--json"], capsys)
    assert code == 0, err
    assert json.loads(out)["policy"] == "demo"
    assert err.strip() == f"report: policy {policy} (the only policy in {policy.parent})"


def test_report_picks_the_first_policy_in_name_order(tmp_path: Path, capsys) -> None:
    state, policy, _ = populate_state(tmp_path / "w")
    text = policy.read_text()
    (policy.parent / "zz-later.yaml").write_text(text.replace("name: demo\n", "name: later\n"))
    (policy.parent / "aa-first.yaml").write_text(text.replace("name: demo\n", "name: first\n"))
    code, out, err = run(["report", "--state", str(state), "--json"], capsys)
    assert code == 0, err
    assert json.loads(out)["policy"] == "first"
    assert f"report: policy {policy.parent / 'aa-first.yaml'} (the first of 3 policies" in err


def test_report_with_no_policy_anywhere_says_what_to_give(tmp_path: Path, capsys, monkeypatch) -> None:
    state, policy, _ = populate_state(tmp_path / "w")
    policy.unlink()
    monkeypatch.chdir(tmp_path)
    code, out, err = run(["report", "--state", str(state)], capsys)
    assert code != 0 and out == ""
    assert err.count("\n") == 1 and "no --policy given and no policy file" in err and "--policy FILE" in err
    assert str(policy.parent) in err


# -- lstar runs ----------------------------------------------------------------------------------

def test_runs_lists_score_runs_newest_first_with_their_numbers(tmp_path: Path, capsys) -> None:
    repos = tuple(f"org/model-{i}" for i in range(5))
    state, _, run_ids = populate_state(tmp_path / "w", repos)
    code, out, err = run(["runs", "--state", str(state), "--limit", "3", "--json"], capsys)
    assert code == 0, err
    rows = json.loads(out)["items"]
    assert [r["run_id"] for r in rows] == run_ids[::-1][:3]
    # Against the table itself, read independently of the listing's query.
    with Store.open(state / "lstar.duckdb", read_only=True) as store:
        truth = {r["run_id"]: r for r in store.query("SELECT run_id, model_repo, model_sha, lstar, se_ce, "
                                                      "tokens_per_s FROM score_runs")}
    for row in rows:
        t = truth[row["run_id"]]
        assert (row["model_repo"], row["model_sha"]) == (t["model_repo"], t["model_sha"])
        assert row["lstar"] == pytest.approx(t["lstar"]) and row["se_ce"] == pytest.approx(t["se_ce"])
        assert row["tokens_per_s"] == pytest.approx(t["tokens_per_s"])
        assert (row["corpus_name"], row["corpus_selection"]) == ("test", "all")
    assert rows[0]["lstar"] == pytest.approx(-1.4) and rows[0]["se_ce"] == pytest.approx(0.05)
    code, out, err = run(["runs", "--state", str(state)], capsys)
    assert code == 0, err
    assert "5 score run(s), newest first" in out
    models = column_text(out, "model")
    assert models.index("org/model-4") < models.index("org/model-3") < models.index("org/model-0")
    assert "-1.4000" in out and "0.0500" in out and "".join(column_text(out, "corpus").split()).startswith("test0(all)")


def test_runs_on_a_state_without_a_database_is_one_line(tmp_path: Path, capsys) -> None:
    code, out, err = run(["runs", "--state", str(tmp_path / "nothing")], capsys)
    assert code != 0 and err.count("\n") == 1 and str(tmp_path / "nothing") in err


# -- --version and flags -------------------------------------------------------------------------

def test_version(capsys) -> None:
    code, out, _ = run(["--version"], capsys)
    assert code == 0 and out == f"lstar-monitor {version('lstar-monitor')}\n"


def test_lstar_alone_prints_the_help_and_no_error_line() -> None:
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "monitor.cli"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "120"})
    assert proc.returncode in (0, 2), proc.stderr
    assert "Usage:" in proc.stdout + proc.stderr and "demo" in proc.stdout + proc.stderr
    assert not any(line.strip().startswith("error:") for line in (proc.stdout + proc.stderr).splitlines()), \
        proc.stderr


@pytest.mark.parametrize("path", [path for path, _ in COMMANDS] + [()], ids=lambda p: " ".join(p) or "lstar")
def test_help_shows_flags_as_flags(path: tuple[str, ...], capsys, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    code, out, _ = run([*path, "--help"], capsys)
    assert code == 0 and "--help" in out
    assert "<bool>" not in out, out
    cmd = dict(COMMANDS).get(path)
    for param in getattr(cmd, "params", []):  # each flag is listed, bare
        if getattr(param, "is_flag", False):
            flag = next(o for o in param.opts if o.startswith("--"))
            line = next(line for line in out.splitlines() if flag in line.split())
            after = line.split(flag, 1)[1].lstrip(" │")
            assert not after.startswith("<"), line


# -- tables at 80 columns ------------------------------------------------------------------------

def test_tables_keep_long_identifiers_whole_at_80_columns(tmp_path: Path, capsys, monkeypatch) -> None:
    state, policy, _ = populate_state(tmp_path / "w")
    # Inside the report's window (the week to the clock's now): a report reads its window only.
    recent = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(days=3)
    with Store.open(state / "lstar.duckdb") as store:
        store.record_discoveries("k", "rule", "http://hub", [Candidate(repo, fake_sha(repo), (LONG_REF,))
                                                            for repo in LONG_REPOS],
                                 watermark=None, boundary=[], now=recent, requests=1, listed=2)
        for repo in LONG_REPOS:  # past the cloze curve's threshold: an emerged alert each
            record_fake_score(store, repo=repo, sha=fake_sha(repo + "-later"), lstar=-3.5, se=0.01,
                              finished_at=recent + timedelta(days=1))
    code, _, err = run(["alerts", "evaluate", "--policy", str(policy), "--state", str(state),
                        "--now", (recent + timedelta(days=2)).isoformat()], capsys)
    assert code == 0, err
    monkeypatch.setenv("COLUMNS", "80")
    # Model names (repo ids, repo@commit) stay whole on one line, even when that makes the
    # table wider than the terminal; other identifiers (refs, deliveries) wrap whole.
    cases = ((["runs"], "model", LONG_REPOS + tuple(fake_sha(r)[:12] for r in LONG_REPOS), True),
             (["alerts", "list"], "repo@commit", [f"{r}@{fake_sha(r + '-later')[:12]}" for r in LONG_REPOS], True),
             (["alerts", "list"], "deliveries", ["demo-webhook:pending", "demo-email:pending"], False),
             (["checkpoints"], "repo", LONG_REPOS, True), (["checkpoints"], "refs", [LONG_REF], False),
             (["report", "--policy", str(policy)], "lineage / checkpoint", LONG_REPOS + (LONG_REF,), True),
             (["report", "--policy", str(policy)], "lineage", LONG_REPOS, True))  # the task table
    for argv, header, ids, whole in cases:
        code, out, err = run([*argv, "--state", str(state)], capsys)
        assert code == 0, err
        assert "…" not in out, out
        text = column_text(out, header)
        for wanted in ids:
            assert wanted in text, (argv, header, text)
            if whole:
                assert any(wanted in line for line in out.splitlines()), (argv, wanted, out)


SHORT_REPOS = ("demo-org/pythia-160m-deduped", "demo-org/SmolLM2-135M-ckpts")


def test_model_names_are_never_broken_and_tables_fit_80_columns_when_they_can(tmp_path: Path, capsys,
                                                                              monkeypatch) -> None:
    state, policy, _ = populate_state(tmp_path / "w", SHORT_REPOS)
    with Store.open(state / "lstar.duckdb") as store:
        store.record_discoveries("k", "rule", "http://hub", [Candidate(repo, fake_sha(repo), ("main",))
                                                            for repo in SHORT_REPOS],
                                 watermark=None, boundary=[], now=T0, requests=1, listed=2)
    monkeypatch.setenv("COLUMNS", "80")
    for argv, fits in ((["runs"], True), (["checkpoints"], False), (["report", "--policy", str(policy)], False)):
        code, out, err = run([*argv, "--state", str(state)], capsys)
        assert code == 0, err
        if fits:  # P̂: two code points, one cell
            assert max(cell_len(line) for line in out.splitlines()) <= 80, (argv, out)
        for repo in SHORT_REPOS:
            assert any(repo in line for line in out.splitlines()), (argv, repo, out)


def test_the_daemon_draws_no_hub_progress_bars(monkeypatch) -> None:
    from huggingface_hub.utils import are_progress_bars_disabled, enable_progress_bars

    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)
    enable_progress_bars()
    try:
        assert not are_progress_bars_disabled()
        quiet_hub_progress()
        assert os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"
        assert are_progress_bars_disabled()
    finally:
        enable_progress_bars()


def test_paths_are_printed_whole_at_80_columns(tmp_path: Path, capsys, monkeypatch) -> None:
    state, policy, _ = populate_state(tmp_path / "w")
    target = tmp_path / ("a-folder-with-a-long-name-" * 4) / "[draft] report.html"
    monkeypatch.setenv("COLUMNS", "80")
    code, out, err = run(["report", "--state", str(state), "--policy", str(policy), "--html", str(target)], capsys)
    assert code == 0, err
    assert f"wrote {target}\n" in out and target.is_file()


def test_the_demo_summary_prints_the_lineage_and_the_evaluations(tmp_path: Path, capsys) -> None:
    """The lineage's states line by line, then each evaluation: done with its numbers and
    verdict, or skipped with the reason."""
    workdir = tmp_path / "demo"
    summary = fake_summary(workdir, workdir / "state", workdir / "policies" / "demo.yaml")
    summary["threshold"] = {"estimate": 0.8212, "lower": 0.8029, "upper": 0.9864, "confidence": 0.9,
                            "resolved": True}
    step = {"lstar_se": 0.1, "p_hat": 0.2, "lo": 0.1, "hi": 0.45}
    summary["lineage"] = {"repo": "demo-org/gpt2-lab", "seed": 1, "in_order": True, "states": [
        {"step": 95, "state": "clear", "lstar": 1.717, **step},
        {"step": 190, "state": "at_risk", "lstar": 1.2, **step, "emerged_margin": -0.05, "emerged_margin_se": -0.5},
        {"step": 285, "state": "emerged", "lstar": 0.5, **step, "emerged_margin": 0.1234, "emerged_margin_se": 1.234}]}
    summary["evaluation"] = [
        {"step": 190, "status": "done", "reason": None, "predicted_state": "at_risk", "predicted_lo": 0.1043,
         "predicted_hi": 0.4477, "observed": 8 / 55, "k": 8, "n": 55, "observed_lo": 0.0745, "observed_hi": 0.2472,
         "observed_state": "observed_clear", "verdict": "confirmed"},
        {"step": 285, "status": "skipped", "reason": "budget"}]
    print_summary(summary)
    out = capsys.readouterr().out
    assert "threshold:     L* = 0.821 [0.803, 0.986] (90%), resolved" in out
    assert "one checkpoint per poll: clear -> at_risk -> emerged" in out
    # how far each checkpoint is from the edge of emerged, in its own standard errors
    assert "step285    L* 0.500 ± 0.100  predicted 0.20 [0.10, 0.45]  emerged  (emerged by 1.23 SE)\n" in out
    assert "step190    L* 1.200 ± 0.100  predicted 0.20 [0.10, 0.45]  at_risk  (0.50 SE short of emerged)\n" in out
    assert ("step190    predicted at_risk [0.10, 0.45]; observed acc 0.15 (8/55) [0.07, 0.25] -> "
            "observed_clear: confirmed") in out
    assert "step285    skipped (budget)" in out
    summary["lineage"]["in_order"] = False
    summary["evaluation"] = []
    print_summary(summary)
    out = capsys.readouterr().out
    assert "states NOT in order" in out and "evaluations:   none" in out
