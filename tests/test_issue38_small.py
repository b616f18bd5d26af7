"""Issue 38's smaller analyst problems, one test (or more) per item:

- item 5: `lstar score ORG/REPO@REV` with HF_HUB_OFFLINE=1 reaches a Hub on 127.0.0.1 and
  refuses any other Hub in one line before loading anything;
- item 9: shell completion (`--show-completion`, and the completion itself);
- item 10: `score --quiet` draws no table; `score` on a state file held by another process
  refuses before reading its inputs.

The offline checks run the real CLI in a subprocess: huggingface_hub reads HF_HUB_OFFLINE and
HF_ENDPOINT once, at its import.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from monitor.cli import main
from monitor.demo.fakehub import FakeHub
from monitor.demo.hub_repos import tiny_model_files

ROOT = Path(__file__).resolve().parents[1]
TINY_SCORE = ["--docs", "2", "--max-context", "32", "--no-tcb", "--device", "cpu", "--dtype", "float32"]


def _env(**overrides: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_ENDPOINT", "LSTAR_FAILPOINT")}
    env.update(PYTHONPATH=str(ROOT), COLUMNS="200", HF_HUB_DISABLE_PROGRESS_BARS="1", **overrides)
    return env


def _lstar(args: list[str], cwd: Path, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "monitor.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


# -- item 5 ---------------------------------------------------------------------------------
def test_score_reaches_a_loopback_hub_with_hf_hub_offline_set(tmp_path: Path, calib_v0: Path) -> None:
    with FakeHub() as hub:
        # What is checked is the way to the Hub, not the vocabulary: the 1,000-id toy tokenizer
        # spares the score most of gpt-neox's 50,277-id output layer (the test went from 17.8 to
        # 14.4 CPU-seconds, this file alone before and after, 2026-11-30).
        sha = hub.add_repo("demo-org/toy-ref", tiny_model_files("spm-unigram-toy", seed=1), branch="step1000")
        env = _env(HF_HUB_OFFLINE="1", HF_ENDPOINT=hub.url, HF_HUB_CACHE=str(tmp_path / "cache"))
        done = _lstar(["score", "demo-org/toy-ref@step1000", "--corpus", str(calib_v0), *TINY_SCORE,
                       "--quiet", "--json", "--no-db"], tmp_path, env)
        assert done.returncode == 0, done.stderr[-3000:]
        result = json.loads(done.stdout)
        assert (result["model"]["repo"], result["model"]["sha"]) == ("demo-org/toy-ref", sha)
        assert hub.count_requests("/api/models/demo-org/toy-ref") >= 1


@pytest.mark.parametrize("variable", ["HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"])
@pytest.mark.parametrize("command", ["score", "eval"])
def test_score_refuses_a_remote_hub_in_one_line_when_offline(tmp_path: Path, variable: str, command: str) -> None:
    env = _env(HF_ENDPOINT="https://hub.example.org", **{variable: "1"})
    inputs = (["--corpus", "no-such-corpus", "--no-db"] if command == "score"
              else ["--task", "no-such-task.jsonl", "--no-store"])
    done = _lstar([command, "demo-org/neox-ref@step1000", *inputs], tmp_path, env)
    assert done.returncode != 0 and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    # refused before the inputs are read (the missing corpus or task would be the error otherwise)
    assert f"lstar {command} cannot fetch from the Hub while {variable}=1 is set" in lines[0]
    assert f"unset {variable}" in lines[0] and "127.0.0.1" in lines[0]


def test_poll_reaches_a_loopback_hub_with_hf_hub_offline_set(tmp_path: Path) -> None:
    folder = tmp_path / "policies"
    folder.mkdir()
    (folder / "a.yaml").write_text(_policy("alpha", "org-a"))
    with FakeHub() as hub:
        sha = hub.add_repo("org-a/one", {"config.json": b"{}", "README.md": b"card"}, branch="step1000")
        done = _lstar(["poll", "--once", "--policies", str(folder), "--no-gate", "--json",
                       "--state", str(tmp_path / "state")], tmp_path,
                      _env(HF_HUB_OFFLINE="1", HF_ENDPOINT=hub.url))
    assert done.returncode == 0, done.stderr
    assert [(r["rule"], r["new"], r["error"]) for r in json.loads(done.stdout)["rules"]] == [("alpha-steps", 1, None)]
    assert main(["checkpoints", "--json", "--state", str(tmp_path / "state")]) == 0


# -- item 9 ---------------------------------------------------------------------------------
def test_show_completion_prints_a_script_for_lstar(capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # The shell is named, not detected: with detection on, typer reads the shell from the
    # process's ancestors (shellingham) and ignores the name, so the test would depend on what
    # started pytest (a pytest-xdist worker under `timeout` found none).
    monkeypatch.setenv("_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION", "1")
    import shellingham

    def no_shell() -> None:
        raise shellingham.ShellDetectionFailure()

    monkeypatch.setattr(shellingham, "detect_shell", no_shell)
    assert main(["--show-completion", "bash"]) == 0
    script = capsys.readouterr().out
    assert "complete -o default -F _lstar_completion lstar" in script
    assert "_LSTAR_COMPLETE=complete_bash" in script


def test_completion_completes_commands_and_subcommands(tmp_path: Path) -> None:
    def complete(words: str) -> list[str]:
        env = _env(_LSTAR_COMPLETE="complete_bash", COMP_WORDS=words, COMP_CWORD=str(len(words.split(" ")) - 1))
        done = subprocess.run([sys.executable, "-c", "import sys; from monitor.cli import main; sys.exit(main())"],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout.split()

    assert complete("lstar sil") == ["silence"]
    assert set(complete("lstar silence ")) >= {"add", "list", "expire"}


# -- item 10: score --quiet, score on a held state file --------------------------------------
def test_score_quiet_prints_no_table(tmp_path: Path, calib_v0: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "tiny"
    model.mkdir()
    # The table, not the model, is checked: the 1,000-id toy tokenizer spares the three scores
    # most of gpt-neox's 50,277-id output layer (5.4 -> 1.3 CPU-seconds, measured alone, 2026-11-30).
    for name, data in tiny_model_files("spm-unigram-toy", seed=2).items():
        (model / name).write_bytes(data)
    assert main(["score", str(model), "--corpus", str(calib_v0), *TINY_SCORE, "--quiet",
                 "--state", str(tmp_path / "state")]) == 0
    out, err = capsys.readouterr()
    assert out == ""
    assert "recorded run " in err and "CE (nats/token)" not in err
    # again on the state file that exists now: the lock probe (a read-only open, closed) leaves
    # this process free to open it for writing
    assert main(["score", str(model), "--corpus", str(calib_v0), *TINY_SCORE, "--quiet", "--no-resume",
                 "--state", str(tmp_path / "state")]) == 0
    assert capsys.readouterr().out == ""
    # the same command without --quiet draws the table: the check above can fail
    assert main(["score", str(model), "--corpus", str(calib_v0), *TINY_SCORE, "--no-db"]) == 0
    assert "CE (nats/token)" in capsys.readouterr().out


def test_score_on_a_held_state_file_refuses_before_reading_its_inputs(tmp_path: Path) -> None:
    state = tmp_path / "state"
    assert main(["db", "migrate", "--state", str(state)]) == 0
    holder = subprocess.Popen([sys.executable, "-c", "import duckdb, sys, time; c = duckdb.connect(sys.argv[1]); "
                               "print('held', flush=True); time.sleep(60)", str(state / "lstar.duckdb")],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        started = time.monotonic()
        done = _lstar(["score", "./no-such-model", "--corpus", "no-such-corpus", "--state", str(state)],
                      tmp_path, _env())
        elapsed = time.monotonic() - started
    finally:
        holder.kill()
        holder.wait()
    assert done.returncode != 0
    # the lock is named, not the missing corpus or model that the slow path would meet first
    assert "is held by another process" in done.stderr and "corpus" not in done.stderr, done.stderr
    assert elapsed < 30


# -- item 10: silence ids by unique prefix; silence list keeps ids and times whole -------------
def _add_silence(state: Path, capsys: pytest.CaptureFixture[str], comment: str = "maintenance",
                 matches: tuple[str, ...] = ()) -> str:
    extra = [arg for match in matches for arg in ("--match", match)]
    assert main(["silence", "add", "--match", "policy=watch", *extra, "--until", "2h", "--comment", comment,
                 "--state", str(state)]) == 0
    return capsys.readouterr().out.strip()


def test_a_silence_is_expired_by_a_unique_prefix_and_an_ambiguous_one_lists_the_candidates(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    state = tmp_path / "state"
    ids: list[str] = []
    while not any(a[0] == b[0] for i, a in enumerate(ids) for b in ids[:i]):   # two ids with one first character
        ids.append(_add_silence(state, capsys))
        assert len(ids) <= 17   # 16 hex digits: the 17th shares one
    first = ids[-1][0]
    twins = sorted(i for i in ids if i[0] == first)
    assert main(["silence", "expire", first, "--state", str(state)]) != 0
    err = capsys.readouterr().err
    assert "ambiguous" in err and all(t in err for t in twins), err

    # a unique prefix, of at least the 4 characters a prefix needs (as git asks)
    unique = max(4, next(n for n in range(1, 37) if sum(i.startswith(twins[0][:n]) for i in ids) == 1))
    assert main(["silence", "expire", twins[0][:unique], "--state", str(state)]) == 0
    assert capsys.readouterr().out.strip() == f"expired {twins[0]}"
    assert main(["silence", "list", "--json", "--state", str(state)]) == 0
    left = {s["id"] for s in json.loads(capsys.readouterr().out)["items"]}
    assert left == set(ids) - {twins[0]}
    # a prefix of no silence, and of one expired already, is still refused
    assert main(["silence", "expire", twins[0][:unique], "--state", str(state)]) != 0
    assert f"no active or pending silence with id {twins[0][:unique]}" in capsys.readouterr().err


@pytest.mark.parametrize("columns", [150, 80])
def test_silence_list_keeps_the_id_and_the_end_whole(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                     monkeypatch: pytest.MonkeyPatch, columns: int) -> None:
    state = tmp_path / "state"
    silence_id = _add_silence(state, capsys, comment="maintenance window for the pythia lineage retraining, ask "
                                                     "the on-call before extending it",
                              matches=('lineage=~"demo-org/pythia.*"', "task=cloze"))
    assert main(["silence", "list", "--json", "--state", str(state)]) == 0
    until = json.loads(capsys.readouterr().out)["items"][0]["ends_at"][:19].replace(" ", "T")   # to the second
    monkeypatch.setenv("COLUMNS", str(columns))
    assert main(["silence", "list", "--state", str(state)]) == 0
    out = capsys.readouterr().out
    assert "…" not in out
    assert any(silence_id in line for line in out.splitlines()), out   # the id on one line
    assert any(until in line for line in out.splitlines()), out        # the end too


# -- item 10: lstar poll --policies ----------------------------------------------------------
def _policy(name: str, author: str) -> str:
    return (f"name: {name}\nwatch:\n  - name: {name}-steps\n    author: {author}\n"
            "    revisions: {branches: \"step\\\\d+\"}\n"
            "route: {receiver: log}\nreceivers:\n  - name: log\n    file: {path: alerts.jsonl}\n")


def test_poll_takes_a_policy_folder_as_run_does(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(variable, raising=False)
    folder = tmp_path / "policies"
    folder.mkdir()
    (folder / "a.yaml").write_text(_policy("alpha", "org-a"))
    (folder / "b.yaml").write_text(_policy("beta", "org-b"))
    (folder / "notes.txt").write_text("not a policy")
    with FakeHub() as hub:
        files = {"config.json": b"{}", "README.md": b"card"}
        sha_a = hub.add_repo("org-a/one", files, branch="step1000")
        sha_b = hub.add_repo("org-b/two", {**files, "README.md": b"other card"}, branch="step2000")
        assert main(["poll", "--once", "--policies", str(folder), "--no-gate", "--json", "--endpoint", hub.url,
                     "--state", str(tmp_path / "state")]) == 0
        report = json.loads(capsys.readouterr().out)
        # the table at 80 columns keeps each rule's watermark (a time) whole, never `2026-…`
        monkeypatch.setenv("COLUMNS", "80")
        assert main(["poll", "--once", "--policies", str(folder), "--no-gate", "--endpoint", hub.url,
                     "--state", str(tmp_path / "state")]) == 0
        table = capsys.readouterr().out
    watermarks = [r["watermark"] for r in report["rules"]]
    assert all(watermarks) and "…" not in table
    assert all(any(w in line for line in table.splitlines()) for w in watermarks), table
    assert sorted((r["rule"], r["new"]) for r in report["rules"]) == [("alpha-steps", 1), ("beta-steps", 1)]
    assert main(["checkpoints", "--json", "--state", str(tmp_path / "state")]) == 0
    rows = json.loads(capsys.readouterr().out)["items"]
    assert sorted((r["repo"], r["sha"]) for r in rows) == sorted([("org-a/one", sha_a), ("org-b/two", sha_b)])

    assert main(["poll", "--once", "--policies", str(folder), "--policy", str(folder / "a.yaml"),
                 "--state", str(tmp_path / "state")]) != 0
    assert "exactly one of --policy FILE, --policies DIR or --rule-file FILE" in capsys.readouterr().err


# -- item 10: the API's 404 names its endpoints --------------------------------------------------
def test_an_unknown_api_path_answers_404_with_the_endpoints_as_hint(tmp_path: Path) -> None:
    import httpx

    from monitor.service.api import ApiServer

    class StandIn:   # what the API reads of a daemon; a 404 reads none of it
        config = SimpleNamespace(state_dir=tmp_path, policies_dir=tmp_path, webhook_secret_file=None)
        metrics = SimpleNamespace(render=lambda: b"")

        def health(self) -> tuple[bool, list[str]]:
            return True, []

    with ApiServer(StandIn(), port=0, token="t" * 32, workers=2, idle_timeout=5, lifetime=30) as server:
        answers = [httpx.get(f"{server.url}{path}", timeout=10) for path in ("/alert", "/alerts/abc", "/statuspage")]
    for answer in answers:
        assert answer.status_code == 404
        body = answer.json()
        assert body["error"].startswith("no such endpoint")
        hint = body["hint"]
        assert hint is not None and hint.startswith("the endpoints are ")
        # the routes the module's docstring lists, written out here by hand
        for line in ("GET /", "GET /watchlist", "GET /health", "GET /metrics", "GET /status", "GET /checkpoints", "GET /report/latest",
                     "GET /alerts/{ident}", "POST /silences", "POST /silences/{ident}/expire", "POST /hooks/hub"):
            assert line in hint, (line, hint)


# -- item 10: the curve summary in plain words; validate says when raw CE beats L* -------------
def test_curve_summary_says_how_many_resamples_cross_in_words(capsys: pytest.CaptureFixture[str],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from monitor.commands.curves import resamples_crossing

    curve = ROOT / "tests" / "fixtures" / "policies" / "curves" / "cloze.json"
    assert json.loads(curve.read_text())["threshold"]["never_share"] == 0.0
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["curves", "show", str(curve)]) == 0
    (line,) = [line for line in capsys.readouterr().out.splitlines() if "η̂ (threshold)" in line]
    assert "every bootstrap resample crosses the threshold" in line and "never in 0" not in line
    assert resamples_crossing(0.25) == "25.0% of bootstrap resamples never cross the threshold"
    assert resamples_crossing(1.0) == "no bootstrap resample crosses the threshold"


def _lofo(rmse_lstar: float, rmse_raw: float) -> object:
    from monitor.curves.artifact import LofoRow
    from monitor.curves.validation import LofoResult

    def row(predictor: str, label: str, rmse: float) -> LofoRow:
        return LofoRow(predictor=predictor, label=label, rmse=rmse, crossing_error=0.1, brier=0.2, n_heldout=6,
                       n_folds=2, extrapolated=0.0)

    return LofoResult(rows=[row("lstar", "L*", rmse_lstar), row("raw_ce", "raw CE", rmse_raw)],
                      families=["a", "b"], per_family=[], level=0.3, confidence=0.9)


def test_validate_says_so_when_raw_ce_beats_lstar(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    verdict = _lofo(0.05, 0.03).raw_ce_verdict()
    assert verdict is not None and "raw CE predicts the held-out families better than L*" in verdict
    assert "RMSE 0.0300 against 0.0500" in verdict
    assert _lofo(0.03, 0.05).raw_ce_verdict() is None    # L* better: nothing to say
    assert _lofo(0.04, 0.04).raw_ce_verdict() is None    # a tie is not "better"

    # the command prints it. Two families whose tokenizers differ by a constant L* offset and whose
    # raw CE lines up: raw CE predicts each held-out family exactly, L* off by the offset.
    rows = ["checkpoint,family,task,metric,value,n,lstar,raw_ce"]
    for family, offset in (("a", 0.0), ("b", 2.0)):
        for i in range(1, 6):
            rows.append(f"org/{family}@{i},{family},t,acc,{0.1 + 0.15 * i:.2f},200,{5.0 - i - offset},{7.0 - i}")
    labels = tmp_path / "labels.csv"
    labels.write_text("\n".join(rows) + "\n")
    args = ["curves", "validate", "--labels", str(labels), "--task", "t", "--metric", "acc", "--baseline", "0.25", "--margin", "0.05",
            "--n-boot", "50", "--state", str(tmp_path / "state")]
    assert main([*args, "--json"]) == 0
    table = {r["predictor"]: r["rmse"] for r in json.loads(capsys.readouterr().out)["rows"]}
    assert table["raw_ce"] < table["lstar"], table
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "warning: raw CE predicts the held-out families better than L*" in err, err


# -- item 8: lstar receiver ----------------------------------------------------------------------
SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


def _signed(body: bytes, *, secret: str = SECRET, msg_id: str = "msg_1", at: int | None = None) -> dict[str, str]:
    """Standard Webhooks headers computed here by hand (HMAC-SHA256 of "id.timestamp.body")."""
    import base64
    import hashlib
    import hmac

    at = int(time.time()) if at is None else at
    key = base64.b64decode(secret.removeprefix("whsec_"))
    mac = hmac.new(key, f"{msg_id}.{at}.".encode() + body, hashlib.sha256).digest()
    return {"webhook-id": msg_id, "webhook-timestamp": str(at),
            "webhook-signature": "v1," + base64.b64encode(mac).decode(), "content-type": "application/json"}


def test_the_receiver_accepts_a_good_signature_and_refuses_every_bad_one() -> None:
    from starlette.testclient import TestClient

    from monitor.alerts.receiver import MAX_BODY_BYTES, receiver_app

    printed: list[str] = []
    client = TestClient(receiver_app(SECRET, printed.append))
    body = json.dumps({"status": "firing", "receiver": "oncall", "alerts": [{"labels": {"a": "b"}}]}).encode()
    assert client.post("/lstar", content=body, headers=_signed(body)).status_code == 204
    assert printed[-1].startswith("POST /lstar · signature ok · webhook-id msg_1")
    assert "status firing, 1 alert(s), receiver oncall" in printed[-1] and '"a": "b"' in printed[-1]

    other = "whsec_" + "QUJD" * 8
    refused = {
        "tampered body": (body + b" ", _signed(body)),
        "other secret": (body, _signed(body, secret=other)),
        "stale timestamp": (body, _signed(body, at=int(time.time()) - 3600)),
        "unsigned": (body, {"content-type": "application/json"}),
    }
    for what, (sent, headers) in refused.items():
        answer = client.post("/lstar", content=sent, headers=headers)
        assert answer.status_code == 401, what
        assert "signature REFUSED" in printed[-1], what
    # a second v1 value (a rotated key) is accepted when one of them matches
    two = _signed(body)
    two["webhook-signature"] = _signed(body, secret=other)["webhook-signature"] + " " + two["webhook-signature"]
    assert client.post("/", content=body, headers=two).status_code == 204
    assert client.post("/big", content=b"x" * (MAX_BODY_BYTES + 1), headers=_signed(b"")).status_code == 413
    assert client.get("/").status_code == 405


def test_lstar_alerts_test_reaches_lstar_receiver(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from monitor.demo.receivers import free_port

    port = free_port()
    policy = tmp_path / "watch.yaml"
    policy.write_text("name: watch\nwatch:\n  - name: s\n    author: demo-org\nroute: {receiver: oncall}\n"
                      "receivers:\n  - name: oncall\n    webhook:\n"
                      f"      url: http://127.0.0.1:{port}/lstar\n      secret_env: LSTAR_WEBHOOK_SECRET\n")
    monkeypatch.setenv("LSTAR_WEBHOOK_SECRET", SECRET)
    server = subprocess.Popen([sys.executable, "-m", "monitor.cli", "receiver", "--port", str(port),
                               "--secret-env", "LSTAR_WEBHOOK_SECRET"], cwd=tmp_path,
                              env=_env(LSTAR_WEBHOOK_SECRET=SECRET), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    try:
        assert server.stderr is not None and "listening on" in server.stderr.readline()
        time.sleep(0.5)   # bound before the line; uvicorn accepts once its loop runs
        assert main(["alerts", "test", "oncall", "--policy", str(policy)]) == 0
        assert "delivered: oncall (webhook)" in capsys.readouterr().out
    finally:
        server.terminate()
        out, _ = server.communicate(timeout=30)
    assert "POST /lstar · signature ok · webhook-id msg_test_" in out, out
    assert '"alertname": "LstarTest"' in out


def test_receiver_without_a_secret_says_which_variable(capsys: pytest.CaptureFixture[str],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LSTAR_WEBHOOK_SECRET", raising=False)
    assert main(["receiver", "--port", "1", "--secret-env", "LSTAR_WEBHOOK_SECRET"]) != 0
    assert "LSTAR_WEBHOOK_SECRET is not set" in capsys.readouterr().err
    assert main(["receiver", "--port", "1"]) != 0
    assert "give exactly one of --secret-env NAME or --secret-file FILE" in capsys.readouterr().err


# -- item 6: progress measured as it goes ------------------------------------------------------
def test_pace_estimates_what_is_left_from_what_it_measured() -> None:
    from monitor.demo.progress import Pace, duration_text

    now = [100.0]
    pace = Pace(8, clock=lambda: now[0])
    assert pace.remaining_s() is None and pace.describe("checkpoints") == "0 of 8 checkpoints in 0 s"
    now[0] += 90.0
    pace.advance_to(3)
    # by hand: 90 s for 3, so 30 s each, 5 left -> 150 s
    assert pace.remaining_s() == pytest.approx(150.0)
    assert pace.describe("checkpoints") == "3 of 8 checkpoints in 1 min 30 s; about 2 min 30 s left at that pace"
    now[0] += 150.0
    pace.advance_to(8)
    assert pace.describe("checkpoints") == "8 of 8 checkpoints in 4 min 00 s; done"
    assert [duration_text(s) for s in (0.4, 59.4, 61, 3600 + 125)] == ["0 s", "59 s", "1 min 01 s", "1 h 02 min"]


def test_pace_says_each_quarter_once() -> None:
    from monitor.demo.progress import Pace

    now = [0.0]
    pace = Pace(0, clock=lambda: now[0])
    said = []
    for step in range(5, 101, 5):          # the lab reports every fifth step
        now[0] += 1.0
        pace.advance_to(step, 100)
        line = pace.milestone("training steps")
        if line is not None:
            said.append(line)
    assert said == ["25 of 100 training steps in 5 s; about 15 s left at that pace",
                    "50 of 100 training steps in 10 s; about 10 s left at that pace",
                    "75 of 100 training steps in 15 s; about 5 s left at that pace",
                    "100 of 100 training steps in 20 s; done"]


def test_the_progress_bars_count_and_estimate_on_stderr() -> None:
    from rich.progress import MofNCompleteColumn, TimeRemainingColumn

    from monitor.demo.progress import progress_bar

    bar = progress_bar(True)
    kinds = {type(column) for column in bar.columns}
    assert MofNCompleteColumn in kinds and TimeRemainingColumn in kinds
    assert bar.console.stderr and not bar.disable
    assert progress_bar(False).disable


def test_the_demo_reports_training_progress_measured_not_a_constant(tmp_path: Path, shared_dir: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    import monitor.lab.demo as lab_demo
    from monitor.demo import run_demo
    from monitor.demo.failure import DemoFailed

    def fake_training(out: Path, *, on_step=None, **kwargs):   # the lab's reports, then a stop
        assert on_step is not None, "the demo must follow training as it goes"
        for step in range(5, 41, 5):
            on_step("words-s1", step, 40)
        raise RuntimeError("stopped by the test after training")

    monkeypatch.setattr(lab_demo, "train_demo_lineages", fake_training)
    lines: list[str] = []
    with pytest.raises(DemoFailed):
        run_demo(tmp_path / "demo", shared_dir=shared_dir, log=lines.append)
    text = "\n".join(lines)
    assert "minute and a half" not in text and "2 cores" not in text
    training = [line for line in lines if line.startswith("  training: ")]
    assert [line.split(" in ")[0] for line in training] == [
        "  training: 10 of 40 training steps", "  training: 20 of 40 training steps",
        "  training: 30 of 40 training steps", "  training: 40 of 40 training steps"]
    assert training[-1].endswith("; done") and "left at that pace" in training[0]


def test_lab_training_tells_its_steps_and_draws_its_bars_on_stderr(tmp_path: Path, shared_dir: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from monitor.lab.config import reduced_config
    from monitor.lab.model import ArchConfig
    from monitor.lab.pipeline import train_lab

    config = reduced_config(families=("spm-unigram-toy",), byte_budget=30_000,
                            arch=ArchConfig(hidden=32, layers=1, heads=2, intermediate=64, context=32),
                            fractions=(0.25, 0.5, 1.0), warmup_steps=3, lr=3e-3,
                            tokenizers_dir=shared_dir / "tokenizers", text_corpus=shared_dir / "corpus" / "calib-v0-alt",
                            calib_corpus=shared_dir / "corpus" / "calib-v0",
                            cloze_task=shared_dir / "tasks" / "cloze-v0.jsonl")
    told: list[tuple[str, int, int]] = []
    lineages = train_lab(config, tmp_path / "lab", workers=1, progress=True,
                         on_step=lambda *report: told.append(report))
    ((name, checkpoints),) = lineages.items()
    last = max(checkpoints)
    assert told and told[-1] == (name, last, last)            # the last step, of the total the lineage trains
    assert [t[1] for t in told] == sorted(t[1] for t in told) and all(t[2] == last for t in told)
    out, err = capsys.readouterr()
    assert out == "" and f"{last}/{last}" in err              # the bar on stderr, with its count
