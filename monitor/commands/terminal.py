"""Terminal output: values printed as they are, tables that keep model names whole.

`plain_console` is the console every command prints through: it reads no rich markup and no
emoji codes in what it prints, so a value such as `[none, 6.25]` or `:warning:` (a webhook
error, a curve warning, a repo id) reaches the terminal verbatim instead of being taken for
a style tag. Styling is given explicitly (`Text`, `style=`) where a command wants it.

`name_column` adds a column of model names (repo ids, `org/name@sha`) that is never broken
inside a name, and `print_table` prints a table so: the other columns wrap first, and
where even that leaves too little room the table is drawn wider than the terminal (each
name stays on one line, so it can be copied or grepped whole).
"""

from __future__ import annotations

from typing import Any

from rich.cells import cell_len
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text


def plain_console(**kwargs: Any) -> Console:
    """A rich console that prints text literally (no markup, no emoji codes)."""
    return Console(markup=False, emoji=False, **kwargs)


def name_column(table: Table, header: str, **kwargs: Any) -> None:
    """A column of model names: `print_table` keeps each of its lines whole."""
    table.add_column(header, no_wrap=True, **kwargs)


def _longest_line(cell: Any) -> int:
    text = cell.plain if isinstance(cell, Text) else cell if isinstance(cell, str) else None
    if text is None:
        return 0
    return max((cell_len(line) for line in text.splitlines()), default=0)


def print_table(console: Console, table: Table) -> None:
    """Print `table` with each no-wrap column (`name_column`) as wide as its longest value,
    widening the output past the console's width only when the names need it."""
    for column in table.columns:
        if column.no_wrap:
            longest = max((_longest_line(c) for c in column.cells), default=0)
            column.min_width = max(column.min_width or 0, longest)
    needed = Measurement.get(console, console.options.update_width(10**6), table).minimum
    if needed <= console.width:
        console.print(table)
        return
    # Too narrow for the names: every column at its narrowest (wrappable ones wrap at their
    # longest word), drawn `needed` cells wide. Fixed widths, because rich's own squeeze may
    # take a column below its longest word and cut it (`thresho…`).
    wide = console.options.update_width(needed)
    for i, column in enumerate(table.columns):
        if column.width is None:
            narrowest = table._measure_column(console, wide, column).minimum
            column.width = max(narrowest - table._get_padding_width(i), 1)
    width = console.width
    console.width = needed
    try:
        console.print(table)
    finally:
        console.width = width


__all__ = ["name_column", "plain_console", "print_table"]
