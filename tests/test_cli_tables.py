"""The tables of the listing commands: identifier columns wrap whole, counts are right-justified."""

from __future__ import annotations

from rich.table import Table

from monitor.commands.options import add_columns


def test_add_columns_sets_each_kind_of_column_in_order() -> None:
    table = Table()
    add_columns(table, ("id", "repo", "sha", "status", "attempts"), ids=("repo", "sha"), right=("id", "attempts"))
    assert [c.header for c in table.columns] == ["id", "repo", "sha", "status", "attempts"]
    assert [c.justify for c in table.columns] == ["right", "left", "left", "left", "right"]
    # no column cuts a value to `…`: a word too long for its column folds onto the next line
    assert [c.overflow for c in table.columns] == ["fold", "fold", "fold", "fold", "fold"]
    assert [c.no_wrap for c in table.columns] == [False, False, False, False, False]
    assert table.columns[1].min_width == len("repo")


def test_whole_columns_stay_on_one_line() -> None:
    table = Table()
    add_columns(table, ("id", "until", "comment"), whole=("id", "until"), right=("id",))
    assert [c.no_wrap for c in table.columns] == [True, True, False]
    assert [c.justify for c in table.columns] == ["right", "left", "left"]
