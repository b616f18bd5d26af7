"""Hostile policy files in the daemon's folder (docs/reliability.md row 18): at start-up the bad file is
reported in /status and the others load; on reload a file that turns bad keeps its last good
version, and a new valid file beside it still loads."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from monitor.yamlio import NESTING_LIMIT
from monitor.service.daemon import Daemon, DaemonConfig
from monitor.testing.daemon_harness import DaemonProcess, wait_for

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
