"""The `lstar` group that imports a command's module only when that command is used.

`lstar --help` lists the commands from `monitor.commands.catalog` (names and one-line
summaries, no import); `lstar checkpoints ...` imports `monitor.commands.checkpoints` alone,
calls its `register(app)` on a Typer of its own and hands click the command it made, the same
command an eager registration would have built. Whoever reads `group.commands` (tests,
documentation generators walking the tree) gets every command, all modules imported.
"""

from __future__ import annotations

import importlib
from collections.abc import MutableMapping
from typing import Any

import typer
from typer.core import TyperCommand, TyperGroup

from monitor.commands.catalog import COMMANDS

_MODULE_OF = {entry.name: entry.module for entry in COMMANDS}
_SUMMARY_OF = {entry.name: entry.summary for entry in COMMANDS}


def commands_of_module(module_name: str) -> dict[str, Any]:
    """The click commands `monitor.commands.<module_name>` registers, by name."""
    module = importlib.import_module(f"monitor.commands.{module_name}")
    holder = typer.Typer()
    module.register(holder)
    return dict(typer.main.get_group(holder).commands)


class LazyCommandGroup(TyperGroup):
    """A TyperGroup whose commands come from their modules on first use (see the module doc)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._loaded: dict[str, Any] = {}
        self._listing = False
        super().__init__(*args, **kwargs)

    # click and typer keep commands in `self.commands`; here it fills itself on first read.
    @property  # type: ignore[override]
    def commands(self) -> MutableMapping[str, Any]:
        for name in _MODULE_OF:
            self._load(name)
        return self._loaded

    @commands.setter
    def commands(self, value: MutableMapping[str, Any]) -> None:
        self._loaded.update(value)

    def _load(self, name: str) -> Any | None:
        if name not in self._loaded and name in _MODULE_OF:
            self._loaded.update(commands_of_module(_MODULE_OF[name]))
        return self._loaded.get(name)

    def list_commands(self, ctx: Any) -> list[str]:
        return [*_MODULE_OF, *(name for name in self._loaded if name not in _MODULE_OF)]

    def get_command(self, ctx: Any, cmd_name: str) -> Any | None:
        if self._listing and cmd_name not in self._loaded and cmd_name in _SUMMARY_OF:
            # Only the summary line is shown: a stand-in that carries it, nothing imported.
            return TyperCommand(cmd_name, help=_SUMMARY_OF[cmd_name])
        return self._load(cmd_name)

    def format_help(self, ctx: Any, formatter: Any) -> None:
        self._listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing = False
