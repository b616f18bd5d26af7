"""The daemon's side of the database: stores on per-thread cursors that notice commits that
reach the files, the store fail points of the crash tests, and what a failure means (a full
disk, an invalidated database, a state directory that cannot be written).

A commit "reaches the files" when the database file or its WAL changed across it: that,
not a job that merely succeeded, is what proves that writes work again after a full disk.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb

from monitor.failpoints import failpoint_values
from monitor.store import Store, storage_error

PROBE_NAME = ".write-probe"


class _TrackedConnection:
    """A transaction's connection that notes whether a statement changing rows ran (only
    while a store fail point is set: it decides which commits the fail point fails)."""

    _CHANGES = ("INSERT", "UPDATE", "DELETE")

    def __init__(self, conn: Any) -> None:
        self._conn = conn
        self.changed = False

    def execute(self, sql: str, *args: Any, **kwargs: Any) -> Any:
        self._note(sql)
        return self._conn.execute(sql, *args, **kwargs)

    def executemany(self, sql: str, *args: Any, **kwargs: Any) -> Any:
        self._note(sql)
        return self._conn.executemany(sql, *args, **kwargs)

    def _note(self, sql: str) -> None:
        words = sql.split(None, 1)
        if words and words[0].upper() in self._CHANGES:
            self.changed = True

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


class StoreFailpoints:
    """`enospc_writes=N`, `enospc_while=PATH` and `fatal_while=PATH` (see the module doc)."""

    def __init__(self) -> None:
        values = failpoint_values()
        value = values.get("enospc_writes")
        self.enospc_left = (int(value) if value else 1 << 30) if value is not None else 0
        self.enospc_while = Path(values["enospc_while"]) if values.get("enospc_while") else None
        self.fatal_while = Path(values["fatal_while"]) if values.get("fatal_while") else None
        self.active = bool(self.enospc_left or self.enospc_while or self.fatal_while)
        self.invalidated: str | None = None
        self.lock = threading.Lock()

    def check_use(self) -> None:
        """Raise as an invalidated DuckDB database does on any use."""
        if self.invalidated is not None:
            raise duckdb.FatalException(
                "FATAL Error: Failed: database has been invalidated because of a previous fatal error. "
                f'The database must be restarted prior to being used again.\nOriginal error: "{self.invalidated}"')

    def before_commit(self, changed: bool, wal: Path) -> None:
        """Fail a commit that would write, as DuckDB does when it cannot."""
        self.check_use()
        if not changed:
            return  # a commit that changes nothing writes nothing: it works on a full disk too
        if self.fatal_while is not None and self.fatal_while.exists():
            self.invalidated = f"fail point fatal_while: could not write {wal}"
            raise duckdb.FatalException(f"FATAL Error: Failed to commit: {self.invalidated}")
        with self.lock:
            full = self.enospc_while is not None and self.enospc_while.exists()
            if not full and self.enospc_left > 0:
                self.enospc_left -= 1
                full = True
        if full:
            raise duckdb.TransactionException(
                f'TransactionContext Error: Failed to commit: Could not write file "{wal}": '
                f"{os.strerror(errno.ENOSPC)} (fail point)")

    def check_reopen(self) -> None:
        """Re-opening fails while `fatal_while` holds; once it works the connection is new."""
        if self.fatal_while is not None and self.fatal_while.exists():
            raise duckdb.FatalException("FATAL Error: the database cannot be restarted yet (fail point fatal_while)")
        self.invalidated = None


class DaemonStore(Store):
    """A Store on one cursor of the daemon's connection. It tells `on_write` about every
    commit that reached the database files (the WAL or the file itself changed), and
    carries the store fail points."""

    faults: StoreFailpoints | None = None
    on_write: Callable[[], None] | None = None
    # the daemon's record of the cursors its drain interrupts (`Daemon._cursor_store`)
    cursor_tracker: Callable[[Any], Callable[[], None]] | None = None

    def track_cursor(self, cursor: Any) -> Callable[[], None]:
        if self.cursor_tracker is None:
            return lambda: None
        return self.cursor_tracker(cursor)

    def _file_marks(self) -> tuple[Any, ...]:
        marks = []
        for path in (self.path, self.path.with_name(self.path.name + ".wal")):
            try:
                st = os.stat(path)
                marks.append((st.st_ino, st.st_size, st.st_mtime_ns))
            except OSError:
                marks.append(None)
        return tuple(marks)

    @contextlib.contextmanager
    def transaction(self):  # type: ignore[override]
        faults = self.faults if self.faults is not None and self.faults.active else None
        if faults is not None:
            faults.check_use()
        before = self._file_marks()
        with super().transaction() as conn:
            if faults is None:
                yield conn
            else:
                tracked = _TrackedConnection(conn)
                yield tracked
                # inside the transaction: a failure here is rolled back, as a failed commit is
                faults.before_commit(tracked.changed, self.path.with_name(self.path.name + ".wal"))
        if self.on_write is not None and self._file_marks() != before:
            self.on_write()

    def query(self, sql: str, params: Any = None) -> list[dict[str, Any]]:
        if self.faults is not None and self.faults.active:
            self.faults.check_use()
        return super().query(sql, params)

    def checkpoint(self) -> None:
        """CHECKPOINT unless another job's write transaction is open (its data is committed;
        the next batch, or shutdown, folds the WAL in)."""
        if self.faults is not None and self.faults.active:
            self.faults.check_use()
        try:
            super().checkpoint()
        except duckdb.TransactionException as exc:
            if "other write transactions" not in str(exc):
                raise


def is_disk_full(exc: BaseException) -> bool:
    """An OSError ENOSPC, or DuckDB's report of one."""
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return True
    text = str(exc).lower()
    return "no space left" in text or "disk full" in text


def is_database_invalidated(exc: BaseException) -> bool:
    """A DuckDB fatal error (anywhere in the exception's chain): the database instance is
    invalidated and must be re-opened before it can be used again."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, duckdb.FatalException) or "database has been invalidated" in str(current):
            return True
        current = current.__cause__ or current.__context__
    return False


def check_writable(folder: Path) -> None:
    """Write, sync and remove a small file in `folder`: a read-only or full state directory
    is refused at start-up with the fix, instead of failing in the first job."""
    probe = folder / PROBE_NAME
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, b"\0" * 4096)
            os.fsync(fd)
        finally:
            os.close(fd)
            with contextlib.suppress(OSError):
                probe.unlink()
    except OSError as exc:
        raise storage_error(folder, exc, doing="checking that the state directory is writable") from exc


__all__ = ["DaemonStore", "StoreFailpoints", "is_disk_full", "is_database_invalidated",
           "check_writable"]
