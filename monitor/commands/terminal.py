"""Terminal output: values printed as they are, tables that keep model names whole.

`plain_console` is the console every command prints through: it reads no rich markup and no
emoji codes in what it prints, so a value such as `[none, 6.25]` or `:warning:` (a webhook
error, a curve warning, a repo id) reaches the terminal verbatim instead of being taken for
a style tag. Styling is given explicitly (`Text`, `style=`) where a command wants it. Nor does
it pass on control characters: an ANSI escape, a carriage return or a bidirectional override
in a repo id, file name or error message is printed as a visible escape (`\x1b`, `\u202e`,
`monitor.escape.terminal_text`), so a Hub name cannot recolour, overwrite or reorder the
screen. Every string and `Text` it prints, table cells included, goes through that.
`echo` prints a line without the console (no wrapping; JSON needs neither: `json.dumps`
writes every control and non-ASCII character as `\\uXXXX`), its control characters shown
the same way and its line breaks too.

`name_column` adds a column of model names (repo ids, `org/name@sha`) that is never broken
inside a name, and `print_table` prints a table so: the other columns wrap first, and
where even that leaves too little room the table is drawn wider than the terminal (each
name stays on one line, so it can be copied or grepped whole).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderableType
from rich.measure import Measurement
from rich.segment import Segment
from rich.table import Table
from rich.text import Span, Text

from monitor.escape import plain_text, terminal_text


def literal_text(text: Text) -> Text:
    """`text` with its control characters visible (`terminal_text`), its styles kept on the
    characters they covered."""
    plain = text.plain
    pieces = [terminal_text(char) for char in plain]
    if all(len(piece) == 1 for piece in pieces):
        return text
    offsets = [0]
    for piece in pieces:
        offsets.append(offsets[-1] + len(piece))
    out = text.blank_copy("".join(pieces))
    out.spans = [Span(offsets[s.start], offsets[min(s.end, len(plain))], s.style) for s in text.spans]
    return out


def _literal(renderable: Any) -> Any:
    """A `Text`, or a table's cells, headers and title, made literal before rich measures them."""
    if isinstance(renderable, Text):
        return literal_text(renderable)
    if isinstance(renderable, Table):
        for column in renderable.columns:
            column._cells[:] = [_literal(cell) for cell in column._cells]
            column.header, column.footer = _literal(column.header), _literal(column.footer)
        renderable.title, renderable.caption = _literal(renderable.title), _literal(renderable.caption)
    return renderable


class LiteralConsole(Console):
    """A console that shows control characters as escapes wherever text reaches it: strings
    (`render_str`, which rich uses for printed strings and table cells alike) and `Text`."""

    def render_str(self, text: str, **kwargs: Any) -> Text:
        return super().render_str(terminal_text(text), **kwargs)

    def print(self, *objects: Any, **kwargs: Any) -> None:
        super().print(*(_literal(o) for o in objects), **kwargs)

    def render(self, renderable: RenderableType, options: ConsoleOptions | None = None) -> Iterable[Segment]:
        return super().render(_literal(renderable), options)


def plain_console(**kwargs: Any) -> Console:
    """A rich console that prints text literally (no markup, no emoji codes, no control
    characters)."""
    return LiteralConsole(markup=False, emoji=False, **kwargs)


def echo(line: str, *, err: bool = False) -> None:
    """Print one line as it is, without rich's wrapping (for lines that scripts read or that
    hold long paths): every control character in it, a line break included, is shown as an
    escape (`plain_text`), so a name cannot recolour the screen or forge a line of its own."""
    print(plain_text(line), file=sys.stderr if err else sys.stdout)


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
    _literal(table)
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


__all__ = ["LiteralConsole", "echo", "literal_text", "name_column", "plain_console", "print_table"]
