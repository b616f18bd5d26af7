"""The schema as forward-only migrations, one SQL file each, applied in order and recorded by name
in `schema_migrations`.

Each migration is a file `NNNN_name.sql` in this folder (shipped as package data): the number
orders it, `NNNN_name` is the name recorded in `schema_migrations`. Numbers start at 0001 and
run without a gap or a repeat; `load_migrations` refuses anything else, so a new migration is a
new file with the next number. `StoreConnection.migrate` applies each file in one transaction
together with its record.

Every migration today is plain SQL; none is Python logic (a data backfill). Were one needed, it
would be registered here by number beside the files, so that one sequence orders both.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING

from monitor.errors import StoreError

if TYPE_CHECKING:  # importlib.resources.abc is 3.11+; the annotations only name it
    from importlib.resources.abc import Traversable

_FILE = re.compile(r"^(?P<number>\d{4})_(?P<label>[a-z0-9_]+)\.sql$")


@dataclass(frozen=True)
class Migration:
    """One named, forward-only schema step."""

    name: str
    sql: str


def load_migrations(folder: Traversable | None = None) -> list[Migration]:
    """The migrations in `folder` (by default this package's), in order.

    Raises StoreError, naming the file, for a `.sql` file whose name is not `NNNN_name.sql`,
    for two files with one number, and for a number that skips one.
    """
    folder = resources.files(__name__) if folder is None else folder
    return _ordered(entry for entry in folder.iterdir() if entry.name.endswith(".sql"))


def _ordered(files: Iterable[Traversable]) -> list[Migration]:
    numbered: dict[int, Traversable] = {}
    for entry in sorted(files, key=lambda e: e.name):
        match = _FILE.match(entry.name)
        if match is None:
            raise StoreError(f"migration file {entry.name} is not named NNNN_name.sql",
                             hint="name it with the next four-digit number and a lower-case name, "
                                  "e.g. 0007_add_column.sql")
        number = int(match["number"])
        if number in numbered:
            raise StoreError(f"migration files {numbered[number].name} and {entry.name} share the "
                             f"number {match['number']}",
                             hint="give the newer one the next free number; applied ones keep theirs")
        numbered[number] = entry
    migrations: list[Migration] = []
    for expected, number in enumerate(sorted(numbered), start=1):
        entry = numbered[number]
        if number != expected:
            raise StoreError(f"migration file {entry.name} skips number {expected:04d}",
                             hint=f"renumber it {expected:04d}: migrations run in order without a gap")
        migrations.append(Migration(entry.name.removesuffix(".sql"), entry.read_text(encoding="utf-8")))
    return migrations


MIGRATIONS: list[Migration] = load_migrations()
