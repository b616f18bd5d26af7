"""`print_table`: model names stay whole on one line; other columns wrap first; the table is
drawn wider than the terminal only when the names need it, and nothing is cut."""

from __future__ import annotations

from rich.cells import cell_len
from rich.table import Table

from monitor.commands.options import id_column
from monitor.commands.terminal import name_column, plain_console, print_table

NAME = "EleutherAI/pythia-160m@0123456789ab"


def _table(name: str) -> Table:
    table = Table(title="t")
    table.add_column("id", justify="right")
    name_column(table, "model")
    id_column(table, "refs")
    table.add_column("status")
    table.add_column("reason")
    table.add_row("1", name, "main, step1000", "scored", "a reason that can wrap between its words")
    return table


def _print(table: Table, width: int) -> str:
    console = plain_console(width=width, record=True)
    print_table(console, table)
    return console.export_text()


def test_a_name_that_fits_stays_whole_and_the_table_fits() -> None:
    out = _print(_table(NAME), 80)
    assert max(cell_len(line) for line in out.splitlines()) <= 80, out
    assert any(NAME in line for line in out.splitlines()), out
    assert "…" not in out


def test_a_name_wider_than_the_terminal_widens_the_table_and_cuts_nothing() -> None:
    long = "org/" + "x" * 90
    out = _print(_table(long), 80)
    lines = out.splitlines()
    assert any(long in line for line in lines), out
    assert "…" not in out and "status" in out and "reason" in out
    assert len({cell_len(line) for line in lines[1:]}) == 1  # the table's lines are all as wide
