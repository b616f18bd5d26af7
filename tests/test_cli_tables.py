"""The tables of the listing commands: identifier columns wrap whole, counts are right-justified."""

from __future__ import annotations

from rich.table import Table

from monitor.commands.options import add_columns


def test_add_columns_sets_each_kind_of_column_in_order() -> None:
    table = Table()
    add_columns(table, ("id", "repo", "sha", "status", "attempts"), ids=("repo", "sha"), right=("id", "attempts"))
    assert [c.header for c in table.columns] == ["id", "repo", "sha", "status", "attempts"]
    assert [c.justify for c in table.columns] == ["right", "left", "left", "left", "right"]
    # identifier columns fold a long value onto the next line instead of cutting it
    assert [c.overflow for c in table.columns] == ["ellipsis", "fold", "fold", "ellipsis", "ellipsis"]
    assert [c.no_wrap for c in table.columns] == [False, False, False, False, False]
    assert table.columns[1].min_width == len("repo")
