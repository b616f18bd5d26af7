"""The `lstar` command: a thin shell over the library.

Command groups live in `monitor/commands/<name>.py`, each exposing `register(app)`. This
module is the only place where errors become exit codes: library code raises
`LstarError`; here it becomes one line on stderr and the error's exit code.
"""

from __future__ import annotations

import importlib
import os
import sys

import typer

from monitor.errors import LstarError

# Command modules, registered in this order (each defines `register(app: typer.Typer)`).
COMMAND_MODULES = ("db",)

app = typer.Typer(
    name="lstar",
    help="Tokenizer-calibrated progress (L*) for new language-model releases.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def _register_commands() -> None:
    for name in COMMAND_MODULES:
        module = importlib.import_module(f"monitor.commands.{name}")
        module.register(app)


_register_commands()


def _harden_environment() -> None:
    """Settings that must hold before transformers or huggingface_hub are imported."""
    # Without this, transformers may send the repo (and token) to an external conversion
    # service and load weights from the bot's PR ref.
    os.environ["DISABLE_SAFETENSORS_CONVERSION"] = "1"
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `lstar` console script."""
    _harden_environment()
    try:
        app(args=argv, standalone_mode=False)
    except LstarError as exc:
        print(f"error: {exc.one_line()}", file=sys.stderr)
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
    except Exception as exc:  # click usage errors arrive here in non-standalone mode
        import click

        if isinstance(exc, click.exceptions.ClickException):
            print(f"error: {exc.format_message()}", file=sys.stderr)
            return exc.exit_code
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
