"""Hostile policy files in the daemon's folder (docs/reliability.md row 18): at start-up the bad file is
reported in /status and the others load; on reload a file that turns bad keeps its last good
version, and a new valid file beside it still loads. Start-up checks: a missing folder stops the start,
no policy in force and a receiver secret that does not resolve keep /health at 503 (and `--once` exits 2),
and a watch rule two policies define differently is refused naming both files."""

from __future__ import annotations

import json
import logging
import os
import subprocess
from pathlib import Path

import pytest

from monitor.service.daemon import Daemon, DaemonConfig
from monitor.yamlio import NESTING_LIMIT
from support.daemon_harness import REPO_ROOT, DaemonProcess, wait_for

DEEP = "[" * 100_000
DEEP_ERROR = f"lists and mappings nested more than {NESTING_LIMIT} levels deep; flatten the structure"
NOT_A_FILE = "not a policy file; policy files are regular YAML files; rename or remove it"


def policy(name: str, receiver: str = "log") -> str:
    """A policy without watch rules (nothing to poll), alerting into a file."""
    return (f"name: {name}\nroute: {{receiver: {receiver}}}\n"
            f"receivers:\n  - name: {receiver}\n    file: {{path: alerts.jsonl}}\n")


def test_reload_keeps_the_last_good_version_and_loads_new_files_beside_a_bad_one(tmp_path: Path) -> None:
    folder = tmp_path / "policies"
    folder.mkdir()
    (folder / "a.yaml").write_text(policy("a"))
    (folder / "b.yaml").write_text(policy("b"))
    daemon = Daemon(DaemonConfig(policies_dir=folder, state_dir=tmp_path / "state"))
    assert daemon._reload_policies(force=True)
    assert [p.name for p in daemon.policies()] == ["a", "b"] and daemon.policy_set.errors == {}

    (folder / "b.yaml").write_text(DEEP)                 # b turns hostile ...
    (folder / "c.yaml").write_text(policy("c"))          # ... and a new good file sorts after it
    (folder / "d.yaml").mkdir()                          # not files: reported, not skipped
    os.mkfifo(folder / "e.yaml")
    (folder / "f.yaml").symlink_to("/dev/zero")
    assert daemon._reload_policies()
    assert [p.name for p in daemon.policies()] == ["a", "b", "c"]
    assert daemon.policy_set.policies[folder / "b.yaml"].receivers[0].name == "log"  # the last good b
    assert {Path(k).name: v for k, v in daemon.policy_set.errors.items()} == {
        "b.yaml": f"{folder / 'b.yaml'}:1: {DEEP_ERROR}",
        "d.yaml": f"{folder / 'd.yaml'}: is a directory, {NOT_A_FILE}",
        "e.yaml": f"{folder / 'e.yaml'}: is a named pipe (FIFO), {NOT_A_FILE}",
        "f.yaml": f"{folder / 'f.yaml'}: is a character device, {NOT_A_FILE}"}
    assert not daemon._reload_policies()                 # nothing changed: not re-read

    (folder / "b.yaml").write_text(policy("b", receiver="mail"))  # fixed: the new version rules
    assert daemon._reload_policies()
    assert daemon.policy_set.policies[folder / "b.yaml"].receivers[0].name == "mail"
    assert set(daemon.policy_set.errors) == {folder / "d.yaml", folder / "e.yaml", folder / "f.yaml"}


@pytest.mark.slow
def test_daemon_starts_with_a_deeply_nested_policy_beside_a_good_one(tmp_path: Path) -> None:
    folder = tmp_path / "policies"
    folder.mkdir()
    (folder / "deep.yaml").write_text(DEEP)
    (folder / "good.yaml").write_text(policy("good"))
    with DaemonProcess(folder, tmp_path / "state") as daemon:
        status = daemon.status()
        assert [p["name"] for p in status["policies"]] == ["good"]
        assert status["policy_errors"] == {str(folder / "deep.yaml"): f"{folder / 'deep.yaml'}:1: {DEEP_ERROR}"}
        # It keeps running: later reload ticks pass, and it reports itself healthy.
        wait_for(lambda: daemon.status()["jobs"]["reload"]["runs"] >= 2, timeout=60, what="two reload ticks")
        assert daemon.status()["jobs"]["reload"]["failures"] == 0
        assert daemon.request("/health")[0] == 200
        assert daemon.stop() == 0
    assert "Traceback" not in daemon.log()


# -- start-up checks: the rules of every policy, a policy in force, the receivers' secrets --------
def rule(author: str) -> str:
    return f"watch:\n  - {{name: shared, author: {author}}}\n"


def once(folder: Path, state: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`lstar run --once` on `folder`, as an operator would start it."""
    argv = DaemonProcess(folder, state, args=["--once"], fast=False).command()
    return subprocess.run(argv, capture_output=True, text=True, cwd=REPO_ROOT, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO_ROOT), **(env or {})})


def test_a_watch_rule_two_policies_define_differently_is_refused_naming_both_files(tmp_path: Path) -> None:
    folder = tmp_path / "policies"
    folder.mkdir()
    (folder / "a.yaml").write_text(policy("a") + rule("org-a"))
    (folder / "b.yaml").write_text(policy("b") + rule("org-b"))
    daemon = Daemon(DaemonConfig(policies_dir=folder, state_dir=tmp_path / "state"))
    daemon.job_reload()
    assert [p.name for p in daemon.policies()] == ["a"]
    assert daemon.policy_set.errors == {folder / "b.yaml": (
        f"{folder / 'b.yaml'}: watch[0].name: watch rule 'shared' is also defined, differently, by "
        f"{folder / 'a.yaml'}; rename one of them or make both the same")}
    assert [r.author for r in daemon.watch_rules()] == ["org-a"]

    (folder / "b.yaml").write_text(policy("b") + rule("org-a"))   # the same rule: one rule, both in force
    daemon.job_reload()
    assert [p.name for p in daemon.policies()] == ["a", "b"] and daemon.policy_set.errors == {}
    assert [r.author for r in daemon.watch_rules()] == ["org-a"]


def test_a_missing_policy_folder_stops_the_start_with_one_line(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    done = once(missing, tmp_path / "state")
    assert (done.returncode, done.stderr) == (
        2, f"error: --policies {missing}: does not exist; create it, or point --policies at the folder of "
           "policy files (*.yaml)\n")
    assert not (tmp_path / "state").exists()          # nothing was created or opened


def test_no_policy_in_force_is_unhealthy_until_one_loads(tmp_path: Path) -> None:
    folder = tmp_path / "policies"
    folder.mkdir()
    done = once(folder, tmp_path / "state-empty")
    assert done.returncode == 2
    assert f"--once: not ready: no policy in force: no policy files (*.yaml, *.yml) in {folder}" in done.stderr

    (folder / "bad.yaml").write_text("name: [\n")
    done = once(folder, tmp_path / "state-bad")
    assert done.returncode == 2 and "no policy in force: no file of" in done.stderr

    with DaemonProcess(folder, tmp_path / "state") as daemon:
        status, body = daemon.request("/health")
        assert (status, json.loads(body)) == (503, {"ok": False, "reasons": [
            f"no policy in force: no file of {folder} loads (bad.yaml); see policy_errors in /status or "
            f"run `lstar policy check {folder}`"]})
        (folder / "good.yaml").write_text(policy("good"))     # fixed while it runs: health recovers
        wait_for(lambda: daemon.request("/health") == (200, json.dumps({"ok": True, "reasons": []},
                                                                       separators=(",", ":")).encode()),
                 timeout=60, what="/health to recover after a valid policy loads")
        assert daemon.stop() == 0
    assert "no policy in force" in daemon.log() and "Traceback" not in daemon.log()


SECRET = "whsec_c2VjcmV0LXZhbHVlLW5ldmVyLWxvZ2dlZA=="
HOOKS = """\
  - name: hook
    webhook: {url: "http://127.0.0.1:9/hook", secret_env: LSTAR_TEST_UNSET_SECRET}
  - name: signed
    webhook: {url: "http://127.0.0.1:9/signed", secret_file: hook-secret}
"""


def test_a_receiver_secret_that_does_not_resolve_is_named_and_unhealthy(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    folder = tmp_path / "policies"
    folder.mkdir()
    (folder / "hook-secret").write_text("")
    (folder / "p.yaml").write_text(policy("p") + HOOKS)
    monkeypatch.delenv("LSTAR_TEST_UNSET_SECRET", raising=False)
    expected = [
        f"receiver secret missing: {folder / 'p.yaml'}: receiver 'hook': webhook.secret_env: environment "
        "variable LSTAR_TEST_UNSET_SECRET is not set; export LSTAR_TEST_UNSET_SECRET in the daemon's environment",
        f"receiver secret missing: {folder / 'p.yaml'}: receiver 'signed': webhook.secret_file: "
        f"{folder / 'hook-secret'} is empty; write the secret into the file"]
    daemon = Daemon(DaemonConfig(policies_dir=folder, state_dir=tmp_path / "state"))
    with caplog.at_level(logging.ERROR, logger="lstar.daemon"):
        daemon.job_reload()
        daemon.job_reload()                                    # told once, not on every tick
    assert [p.name for p in daemon.policies()] == ["p"]        # the other receivers still work
    assert daemon.health() == (False, expected)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == expected

    (folder / "hook-secret").write_text(SECRET + "\n")        # fixed: the next tick sees it
    monkeypatch.setenv("LSTAR_TEST_UNSET_SECRET", SECRET)
    daemon.job_reload()
    assert daemon.health() == (True, [])

    done = once(folder, tmp_path / "state", env={"LSTAR_TEST_UNSET_SECRET": ""})
    assert done.returncode == 2
    assert (f"receiver 'hook': webhook.secret_env: environment variable LSTAR_TEST_UNSET_SECRET is empty"
            in done.stderr)
    assert SECRET not in done.stderr + done.stdout
