"""One migrated, empty state file per test process, copied for each new state file a test opens.

Nearly every store test starts with `Store.open(tmp_path / "x.duckdb")` on a file that does
not exist yet, which runs all the migrations (one transaction each, then a CHECKPOINT): about
0.10 CPU-seconds a time, against 0.04 for copying a file that already holds them and opening
that (measured on the test machine, ten opens each). `use_template` makes such an open start
from a copy of a file the real `Store.open` migrated once in this process, so the schema is the
code's own, byte for byte what a fresh open writes; the open itself (connect, the check for
unknown migrations, `migrate()` finding nothing pending, the CHECKPOINT) still runs as written.

Only a plain first open is redirected: read-write, `migrate=True`, no file at the path yet (nor
a WAL beside it), its folder already there and writable, and
`monitor.store.migrations.MIGRATIONS` not replaced by the test. Everything else (`migrate=False` and a partial `migrate([...])`, read-only opens,
missing or read-only folders, the fault tests' own processes) takes the real path unchanged,
and so does every module listed in `FRESH_MIGRATION_MODULES`, whose tests are about migrating.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# Test modules whose every store open runs the migrations for real: the migrations' and the
# state file's fault tests, and the tests of this helper (which install it themselves).
FRESH_MIGRATION_MODULES = frozenset({"test_migrations", "test_store_faults", "test_store_template"})


class StoreTemplate:
    """The migrated empty file, made on first use in `folder`."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self._path: Path | None = None
        self._lock = threading.Lock()
        self.copies = 0   # opens that started from the template (for the tests of this helper)

    def path(self, real_open: Any, cls: type) -> Path:
        with self._lock:
            if self._path is None:
                path = self.folder / "template.duckdb"
                real_open(cls, path).close()   # migrated, checkpointed and closed: no WAL beside it
                self._path = path
            return self._path

    def seed(self, real_open: Any, cls: type, path: Path) -> None:
        """Copy the template to `path` when the open would otherwise create and migrate it."""
        if path.exists() or not path.parent.is_dir() or not os.access(path.parent, os.W_OK):
            return
        if Path(f"{path}.wal").exists():   # a left-over WAL: what the real open makes of it is the test's
            return
        template = self.path(real_open, cls)
        try:
            shutil.copyfile(template, path)
        except OSError:
            with contextlib.suppress(OSError):
                path.unlink()
            return
        self.copies += 1


@contextlib.contextmanager
def use_template(template: StoreTemplate) -> Iterator[StoreTemplate]:
    """While inside, a plain first `Store.open(path)` (see the module's docstring) starts from a
    copy of `template`."""
    from monitor.store import connection, migrations

    real_open = connection.StoreConnection.__dict__["open"].__func__
    original_migrations = migrations.MIGRATIONS

    def open_from_template(cls, path=connection.DEFAULT_DB_PATH, *, read_only=False, migrate=True):
        if (not read_only and migrate and connection.MIGRATIONS is original_migrations
                and migrations.MIGRATIONS is original_migrations):
            template.seed(real_open, cls, Path(path))
        return real_open(cls, path, read_only=read_only, migrate=migrate)

    open_from_template.__doc__ = real_open.__doc__
    connection.StoreConnection.open = classmethod(open_from_template)
    try:
        yield template
    finally:
        connection.StoreConnection.open = classmethod(real_open)
