"""The tests' in-process `lstar` (tests/support/cli_run.py) answers what the subprocess answers."""

from __future__ import annotations

import os
import subprocess
import sys

from support.cli_run import REPO_ROOT, lstar_in_process

from monitor.store import Store


def test_in_process_output_and_exit_code_are_the_subprocesses(tmp_path) -> None:
    Store.open(tmp_path / "lstar.duckdb").close()
    for args in (["alerts", "list", "--db", str(tmp_path / "missing.duckdb"), "--json"],   # an error line, code 3
                 ["runs", "--db", str(tmp_path / "lstar.duckdb")],                        # a table on stdout
                 ["checkpoints", "--db", str(tmp_path / "lstar.duckdb"), "--json"]):
        spawned = subprocess.run([sys.executable, "-m", "monitor.cli", *args], capture_output=True, text=True,
                                 cwd=REPO_ROOT, timeout=120, env={**os.environ, "COLUMNS": "120"})
        here = lstar_in_process(*args, env={"COLUMNS": "120"})
        assert (here.returncode, here.stdout, here.stderr) == (spawned.returncode, spawned.stdout, spawned.stderr)
        assert here.stdout or here.stderr


def test_a_command_run_in_process_leaves_the_environment_as_it_found_it(tmp_path, monkeypatch) -> None:
    # `lstar` sets these for its own process (monitor.environment.harden_environment); a test
    # process that ran one command in-process must not carry them into the next test
    for name in ("DISABLE_SAFETENSORS_CONVERSION", "HF_HUB_DISABLE_TELEMETRY", "TOKENIZERS_PARALLELISM"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LSTAR_REVIEW_KEPT", "yes")
    before = dict(os.environ)
    proc = lstar_in_process("checkpoints", "--db", str(tmp_path / "missing.duckdb"), env={"COLUMNS": "99"})
    assert proc.returncode != 0 and "missing.duckdb" in proc.stderr    # the command did run
    assert dict(os.environ) == before
