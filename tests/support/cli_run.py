"""`lstar ARGS` run in the test's own process, answered as `subprocess.run` would answer it.

A `python -m monitor.cli` subprocess costs about 0.5 CPU-seconds before the command does
anything (the interpreter, typer, duckdb and the package's imports, measured with `time` on
`lstar checkpoints` of an empty file, `lstar db migrate` and `lstar status`), more when the
command imports torch. Where the tests read what a command prints and returns, not how a
process starts or ends (signals, the environment at import, the console script), this runs
the same entry point, `monitor.cli.main`, in this process: its stdout and stderr are captured
apart (neither is a terminal, as with a pipe), the environment can be overridden for the call,
and the current folder is the one given (the repository root by default, as the subprocess
helpers it replaces ran there). What the command changes in the process's environment (lstar
sets a few variables for itself, `monitor.environment`) and the root logger's handlers (which
would keep writing to the call's closed capture) are put back after the call, as a child
process's would vanish with it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from click.testing import CliRunner

REPO_ROOT = Path(__file__).resolve().parents[2]


def lstar_in_process(*args: str, env: Mapping[str, str | None] | None = None,
                     cwd: str | Path = REPO_ROOT) -> subprocess.CompletedProcess[str]:
    """Run `lstar *args` through `monitor.cli.main`; returncode, stdout and stderr as text."""
    from monitor.cli import main

    environment = dict(os.environ)
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        with contextlib.chdir(cwd), CliRunner().isolation(env=env) as (out, err, _both):
            try:
                code = main([str(a) for a in args])
            finally:   # the text streams over the captured bytes buffer what was printed
                sys.stdout.flush()
                sys.stderr.flush()
    finally:
        os.environ.clear()
        os.environ.update(environment)
        root.handlers[:] = handlers
        root.setLevel(level)
    return subprocess.CompletedProcess(["lstar", *map(str, args)], code,
                                       out.getvalue().decode("utf-8", "replace"),
                                       err.getvalue().decode("utf-8", "replace"))
