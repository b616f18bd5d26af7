"""`HF_HUB_OFFLINE`: the demo reaches its own fake Hub on 127.0.0.1 with it set, the watcher
refuses to start with it set (it could never poll), and a demo that fails says at which stage
and why in one line.

huggingface_hub reads the variable once, at its import: every check that needs it set runs in
a subprocess started with it in the environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from monitor.demo.failure import diagnose
from monitor.demo.fakehub import FakeHub
from monitor.demo.hub_repos import add_lineage
from monitor.demo.receivers import free_port
from monitor.hub import HubClient, RetryPolicy, WatchRule, poll_once
from monitor.store import Store

ROOT = Path(__file__).resolve().parents[1]
RULE_FILE = "watch:\n  - name: demo-steps\n    author: demo-org\n    revisions: {branches: \"step\\\\d+\"}\n"
POLICY = RULE_FILE.replace("watch:", "name: offline\nwatch:", 1) + textwrap.dedent("""\
    route: {receiver: log, group_wait: 0s, group_interval: 0s}
    receivers:
      - name: log
        file: {path: alerts.jsonl}
    """)


def _env(**overrides: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env.update(PYTHONPATH=str(ROOT), COLUMNS="200", **overrides)
    return env


# The demo's daemon pass, in a process that imported huggingface_hub with HF_HUB_OFFLINE=1: once
# through `run_daemon_once` (what the demo runs), once through the daemon alone (what it ran before).
# The fake Hub and its lineage's tiny models are the test's (served from its process on 127.0.0.1,
# as the demo's own is on the same machine): building the models imported transformers' model
# code and torch in this child only for that, which nothing here checks.
DAEMON_PASS = """\
import json, sys
from pathlib import Path
from huggingface_hub import constants
from monitor.demo.failure import diagnose
from monitor.demo.run import run_daemon_once
from monitor.scoring import ScoreRequest
from monitor.service import Daemon, DaemonConfig
from monitor.store import Store

tmp, corpus, policy, hub_url = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4]
(tmp / "policies").mkdir()
(tmp / "policies" / "offline.yaml").write_text(policy)
out = {"offline_at_import": constants.HF_HUB_OFFLINE}
template = ScoreRequest(corpus_dir=corpus, docs=2, max_context=32, device="cpu", dtype="float32",
                        with_tcb=False, n_boot=10, progress=False)
for name in ("demo", "daemon_alone"):
    config = DaemonConfig(policies_dir=tmp / "policies", state_dir=tmp / name, endpoint=hub_url, api_port=0,
                          once=True, cache_dir=tmp / name / "cache", template=template)
    if name == "demo":
        code, errors = run_daemon_once(config)
    else:
        code, errors = Daemon(config).run(), {}
    with Store.open(tmp / name / "lstar.duckdb", read_only=True) as store:
        out[name] = {"code": code, "errors": errors, "polls": [[p.ok, p.error] for p in store.hub_polls()],
                     "rows": store.query("SELECT sha, status, reason FROM checkpoints ORDER BY id"),
                     "diagnosis": diagnose(store, org="demo-org", exit_code=code, job_errors=errors,
                                           alerts=0, alert_mails=0, reports=0)}
out["offline_after"] = constants.HF_HUB_OFFLINE
print(json.dumps(out, default=str))
"""


@pytest.mark.slow
def test_the_demo_reaches_its_fake_hub_with_hf_hub_offline_set(tmp_path: Path, calib_v0: Path) -> None:
    with FakeHub() as hub:
        refs = add_lineage(hub, "demo-org/tiny-lab", steps=(1000, 2000), build_dir=tmp_path / "build")
        proc = subprocess.run([sys.executable, "-c", DAEMON_PASS, str(tmp_path), str(calib_v0), POLICY, hub.url],
                              capture_output=True, text=True, timeout=600, cwd=tmp_path,
                              env=_env(HF_HUB_OFFLINE="1"))
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["offline_at_import"] is True and out["offline_after"] is True   # lifted only for the pass

    demo = out["demo"]
    steps = {sha for ref, sha in refs.items() if ref.startswith("step")}
    assert demo["polls"] and all(ok and error is None for ok, error in demo["polls"]), demo["polls"]
    assert {r["sha"] for r in demo["rows"]} == steps and len(demo["rows"]) == 2
    # scored too: the scoring child, which keeps HF_HUB_OFFLINE, loads the fetched files locally
    assert [r["status"] for r in demo["rows"]] == ["scored", "scored"], demo["rows"]
    assert demo["code"] == 0 and demo["errors"] == {}

    # The daemon on its own honours the variable: nothing discovered, and the demo's diagnosis
    # names the poll and huggingface_hub's reason.
    alone = out["daemon_alone"]
    assert alone["rows"] == [] and alone["polls"] and not any(ok for ok, _ in alone["polls"])
    stage, reason = alone["diagnosis"]
    assert stage == "poll" and "OfflineModeIsEnabled" in reason and "demo-steps" in reason, reason


@pytest.mark.parametrize("variable", ["HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"])
@pytest.mark.parametrize("command", ["poll", "run"])
def test_the_watcher_refuses_to_start_offline(tmp_path: Path, command: str, variable: str) -> None:
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "offline.yaml").write_text(POLICY)
    state = tmp_path / "state"
    args = (["poll", "--once", "--policy", str(tmp_path / "policies" / "offline.yaml")] if command == "poll"
            else ["run", "--once", "--policies", str(tmp_path / "policies"), "--api-port", "0"])
    # a Hub elsewhere than this machine: one on 127.0.0.1 is reached whatever the variable says
    # (tests/test_issue38_small.py)
    proc = subprocess.run([sys.executable, "-m", "monitor.cli", *args, "--state", str(state),
                           "--endpoint", "https://hub.example.org"],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path, env=_env(**{variable: "1"}))
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and proc.stdout == "", proc.stderr
    assert f"lstar {command} cannot poll the Hub while {variable}=1 is set" in lines[0]
    assert f"unset {variable}" in lines[0]
    assert not state.exists()   # nothing opened, nothing written


def test_hf_hub_offline_0_polls_as_usual(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULE_FILE)
    with FakeHub() as hub:
        add_lineage(hub, "demo-org/tiny-lab", steps=(1000,), build_dir=tmp_path / "build")
        proc = subprocess.run([sys.executable, "-m", "monitor.cli", "poll", "--once", "--rule-file", str(rules),
                               "--state", str(tmp_path / "state"), "--endpoint", hub.url, "--no-gate", "--json"],
                              capture_output=True, text=True, timeout=300, cwd=tmp_path,
                              env=_env(HF_HUB_OFFLINE="0", TRANSFORMERS_OFFLINE="1"))
    assert proc.returncode == 0, proc.stderr
    assert [r["new"] for r in json.loads(proc.stdout)["rules"]] == [1]


@pytest.mark.slow
@pytest.mark.parametrize("hub_down", ["nothing listens", "every request answered 503"])
def test_a_failed_poll_is_the_demos_diagnosis(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              hub_down: str) -> None:
    """The Hub cannot be reached, or answers 503 to everything: the poll row's error is what the
    demo says.

    huggingface_hub retries a failing listing page five times on its own, waiting 1, 2, 4, 8 and
    8 s (23 s of the test's time, in which nothing it checks happens): where nothing listens its
    waits are skipped (`time.sleep` is a no-op for this test, which runs the poll in-process),
    and the outage's `Retry-After: 0` makes each wait 1 s."""
    rule = WatchRule(name="demo-steps", author="demo-org", revisions={"branches": r"step\d+"})
    with Store.open(tmp_path / "lstar.duckdb") as store, FakeHub() as hub:
        if hub_down == "nothing listens":
            import huggingface_hub.utils._http as hub_http

            monkeypatch.setattr(hub_http.time, "sleep", lambda _s: None)
            endpoint = f"http://127.0.0.1:{free_port()}"
        else:
            hub.set_outage(True, retry_after=0)
            endpoint = hub.url
        client = HubClient(endpoint, store=store, policy=RetryPolicy(attempts=1), sleep=lambda _s: None)
        poll_once(store, client, [rule])
        stage, reason = diagnose(store, org="demo-org", exit_code=0, job_errors={}, alerts=0, alert_mails=0,
                                 reports=0)
        (poll,) = store.hub_polls()
    assert stage == "poll" and "rule demo-steps" in reason and poll.error and poll.error in reason


def test_a_demo_stage_that_fails_ends_the_demo_with_one_line(tmp_path: Path, shared_dir: Path) -> None:
    """Shared data with the corpus but without tokenizers: the shipped curve is checked against
    the corpus, then training fails at once, and says so last."""
    empty = tmp_path / "shared"
    (empty / "corpus").mkdir(parents=True)
    (empty / "corpus" / "calib-v0").symlink_to((shared_dir / "corpus" / "calib-v0").resolve())
    for as_json in (False, True):
        proc = subprocess.run([sys.executable, "-m", "monitor.cli", "demo", "--workdir", str(tmp_path / "demo"),
                               "--shared", str(empty), *(["--json"] if as_json else [])],
                              capture_output=True, text=True, timeout=300, cwd=tmp_path, env=_env())
        assert proc.returncode == 1
        last = proc.stderr.strip().splitlines()[-1]
        assert last.startswith("demo failed at train: ") and "tokenizer" in last, proc.stderr
        assert "Traceback" not in proc.stderr
        if as_json:
            summary = json.loads(proc.stdout)
            assert summary["ok"] is False and summary["failed_stage"] == "train"
            assert last == f"demo failed at train: {summary['failure']}"
    # no corpus at all: the history stage names the missing folder
    proc = subprocess.run([sys.executable, "-m", "monitor.cli", "demo", "--workdir", str(tmp_path / "demo"),
                           "--shared", str(tmp_path / "nothing")], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path, env=_env())
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 1 and last.startswith("demo failed at history: ") and "calib-v0" in last


def test_a_loop_not_closed_ends_with_its_stage(tmp_path: Path, capsys, monkeypatch) -> None:
    """The daemon ran but nothing reached the receivers: the summary, then the stage and why."""
    from test_cli_usability import fake_summary

    import monitor.commands.demo as demo_command
    from monitor.cli import main

    summary = {**fake_summary(tmp_path, tmp_path / "state", tmp_path / "policies" / "demo.yaml"), "ok": False,
               "failed_stage": "poll", "failure": "polling the fake Hub (rule demo-steps) failed: HubError: down"}
    monkeypatch.setattr(demo_command, "run_demo", lambda *a, **k: summary)
    assert main(["demo", "--workdir", str(tmp_path / "demo")]) == 1
    out, err = capsys.readouterr()
    assert out.startswith("loop NOT closed")
    assert err.strip().splitlines()[-1] == f"demo failed at poll: {summary['failure']}"
