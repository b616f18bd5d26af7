"""The `lstar` command: a thin shell over the library.

Command groups live in `monitor/commands/<name>.py`, each exposing `register(app)`; a module
is imported only when one of its commands runs (`monitor.commands.lazy`), so `lstar --help`
and a read command start without the stages they do not use. This module is the only place where errors become exit codes: library code raises
`LstarError`; here it becomes one line on stderr and the error's exit code.
"""

from __future__ import annotations

import sys

import typer

from monitor.commands.catalog import COMMAND_MODULES
from monitor.commands.help_render import import_help_renderer
from monitor.commands.lazy import LazyCommandGroup
from monitor.commands.options import show_flags_as_flags
from monitor.environment import harden_environment
from monitor.errors import LstarError, StoreError
from monitor.escape import terminal_text

try:  # typer >= 0.20 vendors click: every usage error a command raises derives from its ClickException
    from typer._click.exceptions import ClickException as _ClickException
except ImportError:  # pragma: no cover - older typer uses click itself
    from click.exceptions import ClickException as _ClickException  # type: ignore[assignment]

# Usage errors: typer's own (unknown flags, missing arguments, range checks) and ours, all
# under one class (`monitor.commands.options.CommandLineError` / `OptionError`).
_CLICK_ERRORS: tuple[type[BaseException], ...] = (_ClickException,)

__all__ = ["COMMAND_MODULES", "app", "main"]   # COMMAND_MODULES: each defines `register(app: typer.Typer)`

app = typer.Typer(
    name="lstar",
    cls=LazyCommandGroup,  # commands listed from monitor.commands.catalog, each module imported when used
    help="Tokenizer-calibrated progress (L*) for new language-model releases.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=True,   # --install-completion and --show-completion for bash, zsh, fish, PowerShell
)


def package_version() -> str:
    """The installed package's version, else the one the source tree declares."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("lstar-monitor")
    except PackageNotFoundError:  # run from a checkout that was never installed
        from monitor import __version__

        return __version__


def _print_version(value: bool) -> None:
    if value:
        print(f"lstar-monitor {package_version()}")
        raise typer.Exit(0)


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                       help="Print the package version and exit.")) -> None:
    """Tokenizer-calibrated progress (L*) for new language-model releases."""


show_flags_as_flags()
import_help_renderer()


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `lstar` console script."""
    harden_environment()
    try:
        # In non-standalone mode click returns the exit code of a `typer.Exit(code)`.
        return int(app(args=argv, prog_name="lstar", standalone_mode=False) or 0)
    except LstarError as exc:
        # the message may quote a Hub name or a file's contents: no escape sequence reaches the terminal
        print(f"error: {terminal_text(exc.one_line())}", file=sys.stderr)
        return exc.exit_code
    except (typer.Exit, SystemExit) as exc:  # --help, explicit exits
        code = getattr(exc, "exit_code", getattr(exc, "code", 0))
        return int(code or 0)
    except typer.Abort:
        print("aborted", file=sys.stderr)
        return 130
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except _CLICK_ERRORS as exc:  # usage errors (bad flags) arrive here in non-standalone mode
        if type(exc).__name__ == "NoArgsIsHelpError":
            # `lstar` alone: the help is the answer (rich has printed it already; plain click
            # carries it as the message), not an error line.
            text = exc.format_message().strip()
            if text:
                print(text)
            return int(exc.exit_code)
        print(f"error: {terminal_text(' '.join(exc.format_message().split()))}", file=sys.stderr)
        return int(exc.exit_code)
    except Exception as exc:
        if not _is_duckdb_error(exc):
            raise
        # A read that reaches a damaged part of the file fails only when it runs; the store
        # names the file for every failure it can foresee, this is the net under the rest.

        lines = str(exc).strip().splitlines() or [type(exc).__name__]
        error = StoreError(f"the database failed: {lines[0]}",
                           hint="if the state file is truncated or corrupt, stop lstar, move the .duckdb "
                                "and .wal files aside (never delete the WAL) and restore a backup")
        print(f"error: {terminal_text(error.one_line())}", file=sys.stderr)
        return error.exit_code
    return 0


def _is_duckdb_error(exc: BaseException) -> bool:
    return any(cls.__module__ in ("duckdb", "_duckdb") and cls.__name__ == "Error" for cls in type(exc).__mro__)


if __name__ == "__main__":
    sys.exit(main())
