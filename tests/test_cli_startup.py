"""`lstar` starts without the stages it does not use (issue 41).

Each check runs the command in a fresh interpreter and counts `sys.modules` once it is done,
standard library included: what an import costs is only visible in a process that has not
imported it yet. For scale, typer's own floor is measured the same way (a one-command typer
app printing its help: typer's help renderer loads rich's Markdown and Traceback, hence
markdown_it, pygments and attrs, and a command's parameters are built with pydantic); `lstar`
imports that renderer without the two (`monitor.commands.help_render`), so it stays under it.

The command counts come from one interpreter that imports `monitor.cli` (the first thing every
`lstar` does, in a fresh interpreter too) and forks a child per command: the child's
`sys.modules` is what a fresh `lstar ARGS` ends with, and the ~30 counts no longer pay Python's
start and the command line's imports each (11.3 CPU-seconds for the file before).
`test_a_forked_count_equals_a_fresh_interpreters` checks the two against each other.
"""

from __future__ import annotations

import functools
import inspect
import json
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from monitor.commands.catalog import COMMAND_MODULES, COMMANDS

ROOT = Path(__file__).resolve().parents[1]
# Never loaded by a `--help`, nor by a read of the state file.
HEAVY = ("torch", "transformers", "scipy", "sklearn", "pandas")

_COUNT = textwrap.dedent("""
    import contextlib, io, json, sys
    args = json.loads(sys.argv[1])
    sys.argv = ["lstar", *args]
    from monitor.cli import main
    with contextlib.redirect_stdout(io.StringIO()):
        code = main(args)
    print(json.dumps({"code": code, "modules": sorted(sys.modules)}))
""")

# The same count, for every line of ARGS (JSON) read from stdin, in a child forked once
# `monitor.cli` is imported; nothing else is loaded before the fork that _COUNT does not load.
_FORKING_COUNT = textwrap.dedent("""
    import contextlib, io, json, os, sys
    from monitor.cli import main
    for line in sys.stdin:
        pid = os.fork()
        if pid == 0:
            args = json.loads(line)
            sys.argv = ["lstar", *args]
            try:
                with contextlib.redirect_stdout(io.StringIO()):
                    code = main(args)
                answer = {"code": code, "modules": sorted(sys.modules)}
            except BaseException as exc:
                answer = {"error": repr(exc)}
            sys.stdout.write(json.dumps(answer) + "\\n")
            sys.stdout.flush()
            os._exit(0)
        os.waitpid(pid, 0)
""")

_TYPER_FLOOR = textwrap.dedent("""
    import contextlib, io, json, sys
    from pathlib import Path
    import typer
    app = typer.Typer()
    @app.callback()
    def root() -> None:
        "A root."
    @app.command()
    def cmd(n: int = typer.Option(1, "--n", help="A count."), path: Path = typer.Option(Path("x"), "--path"),
            flag: bool = typer.Option(False, "--flag")) -> None:
        "A command."
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            app(json.loads(sys.argv[1]), standalone_mode=False)
        except SystemExit:
            pass
    print(json.dumps({"modules": sorted(sys.modules)}))
""")


def _run(script: str, args: list[str], cwd: Path = ROOT) -> dict:
    proc = subprocess.run([sys.executable, "-c", script, json.dumps(args)], cwd=cwd, capture_output=True,
                          text=True, timeout=120, env={**_env(), "COLUMNS": "120"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _env() -> dict[str, str]:
    import os

    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


def lstar_modules(*args: str, cwd: Path = ROOT) -> set[str]:
    """The modules loaded by `lstar ARGS` in a fresh interpreter (it must exit 0)."""
    answer = _run(_COUNT, list(args), cwd)
    assert answer["code"] == 0, args
    return set(answer["modules"])


class _Counter:
    """One `_FORKING_COUNT` interpreter, asked for one command at a time."""

    def __init__(self) -> None:
        # stderr to a file, not a pipe no one reads while the commands run: a command that
        # wrote more than a pipe holds would block the counter
        self.err = tempfile.TemporaryFile(mode="w+", encoding="utf-8")
        self.proc = subprocess.Popen([sys.executable, "-c", _FORKING_COUNT], cwd=ROOT, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.err, text=True,
                                     env={**_env(), "COLUMNS": "120"})

    def stderr(self) -> str:
        self.err.seek(0)
        return self.err.read()[-3000:]

    def modules(self, *args: str) -> set[str]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(list(args)) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, self.stderr() if self.proc.poll() is not None else args
        answer = json.loads(line)
        assert answer.get("code") == 0, (args, answer.get("error"))
        return set(answer["modules"])

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            assert self.proc.wait(timeout=60) == 0, self.stderr()
        finally:
            self.err.close()


@pytest.fixture(scope="module")
def counter() -> Iterator[_Counter]:
    started = _Counter()
    try:
        yield started
    finally:
        started.close()


@functools.cache
def typer_floor(*args: str) -> int:
    return len(_run(_TYPER_FLOOR, list(args))["modules"])


def test_the_catalog_lists_what_the_command_modules_register() -> None:
    """Names, order and summaries of `lstar --help` come from the catalog without importing the
    modules: every module imported eagerly must register exactly those commands."""
    import importlib

    import typer
    import typer.main

    registered, is_group = {}, {}
    for module in COMMAND_MODULES:
        holder = typer.Typer()
        importlib.import_module(f"monitor.commands.{module}").register(holder)
        for name, command in typer.main.get_group(holder).commands.items():
            summary = inspect.cleandoc(command.short_help or command.help or "").split("\n\n")[0]
            registered[name] = (module, summary, command.hidden)
            is_group[name] = hasattr(command, "commands")
    assert {e.name: (e.module, e.summary, False) for e in COMMANDS} == registered
    # the order of `lstar --help`: typer lists single commands before groups
    kinds = [is_group[e.name] for e in COMMANDS]
    assert kinds == sorted(kinds) and any(kinds)


def test_the_lazy_group_builds_the_same_commands_as_an_eager_registration() -> None:
    """`group.commands` (what tests and documentation walk) holds every command, each the one
    its module registers, in the catalog's order."""
    import typer.main

    from monitor.cli import app

    group = typer.main.get_command(app)
    assert list(group.commands) == [e.name for e in COMMANDS]
    assert group.commands["db"].commands.keys() >= {"migrate", "info"}


def test_lstar_help_imports_only_the_command_line() -> None:
    modules = lstar_modules("--help")
    ours = sorted(m for m in modules if m.startswith("monitor"))
    assert ours == ["monitor", "monitor.cli", "monitor.commands", "monitor.commands.catalog",
                    "monitor.commands.help_render", "monitor.commands.lazy", "monitor.commands.options", "monitor.constants",
                    "monitor.environment", "monitor.errors", "monitor.escape"]
    assert not {m.split(".")[0] for m in modules} & {*HEAVY, "numpy", "duckdb", "httpx", "pydantic", "yaml"}
    # 222 here (880 before the command line was made lazy); a one-command typer app's --help: 321
    assert len(modules) <= 300, len(modules)
    assert len(modules) < typer_floor("--help"), (len(modules), typer_floor("--help"))


# The most modules a command's `--help` may load (a one-command typer app's `cmd --help`: 421
# here, pydantic included). Measured 326-341 for the command modules that import their stages
# in the command body; `watchlist` (405) prints the lineage states of `monitor.reports.watchlist`
# in its help, and `run`/`status` (410) build `lstar run`'s flags from the daemon's settings
# model (pydantic-settings). About 15 of margin each.
HELP_BOUND = {"watchlist": 420, "run": 425, "status": 425}
DEFAULT_BOUND = 355


@pytest.mark.parametrize("command", [e.name for e in COMMANDS])
def test_each_command_help_stays_within_its_bound(command: str, counter: _Counter) -> None:
    modules = counter.modules(command, "--help")
    assert f"monitor.commands.{dict((e.name, e.module) for e in COMMANDS)[command]}" in modules
    assert not {m.split(".")[0] for m in modules} & set(HEAVY), sorted({m.split(".")[0] for m in modules} & set(HEAVY))
    assert len(modules) <= HELP_BOUND.get(command, DEFAULT_BOUND), len(modules)


def test_checkpoints_reads_an_empty_state_without_the_scoring_stack(tmp_path: Path, counter: _Counter) -> None:
    state = tmp_path / "state"
    counter.modules("db", "migrate", "--state", str(state))
    help_modules = counter.modules("checkpoints", "--help")
    read_modules = counter.modules("checkpoints", "--state", str(state))
    for modules in (help_modules, read_modules):
        assert not {m.split(".")[0] for m in modules} & set(HEAVY)
    assert not {"duckdb", "httpx", "numpy"} & {m.split(".")[0] for m in help_modules}
    assert "duckdb" in read_modules   # it did read the file
    assert "httpx" not in read_modules   # no daemon runs on it: nothing to ask


def test_the_help_renderer_stand_ins_give_the_real_classes() -> None:
    """typer's Markdown and Traceback names stand in for rich's until used: once called or read
    they are rich's own, and a later `import rich.markdown` gets the real module."""
    script = textwrap.dedent("""
        import json, sys
        import monitor.cli
        import typer.rich_utils as typer_rich
        loaded = {m: m in sys.modules for m in ("rich.markdown", "rich.traceback", "markdown_it", "pygments")}
        from rich.markdown import Markdown
        from rich.traceback import Traceback
        made = typer_rich.Markdown("*x*")
        try:
            raise ValueError("probe")
        except ValueError as exc:
            trace = typer_rich.Traceback.from_exception(type(exc), exc, exc.__traceback__)
        print(json.dumps({"loaded": loaded, "markdown": type(made) is Markdown,
                          "traceback": type(trace) is Traceback, "module": type(sys.modules["rich.markdown"]).__name__}))
    """)
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env=_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    answer = json.loads(proc.stdout.strip().splitlines()[-1])
    assert answer["loaded"] == {"rich.markdown": False, "rich.traceback": False, "markdown_it": False,
                                "pygments": False}
    assert answer["markdown"] and answer["traceback"] and answer["module"] == "module"


def test_a_forked_count_equals_a_fresh_interpreters(tmp_path: Path, counter: _Counter) -> None:
    """The forked counts above are those of fresh interpreters: the same modules for a command's
    help that loads the most (`run`), one that defers its stage (`score`) and a read of a state."""
    state = tmp_path / "state"
    counter.modules("db", "migrate", "--state", str(state))
    for args in (["run", "--help"], ["score", "--help"], ["checkpoints", "--state", str(state)]):
        assert counter.modules(*args) == lstar_modules(*args), args
