"""The DuckDB state file: opening it, transactions, applying the migrations, retention.

One process writes the file; readers open it read-only. Every migration (an SQL file of
`monitor.store.migrations`) runs in one transaction together with its record in
`schema_migrations`, so a crash mid-migration leaves the previous version intact. DDL happens
only here, at start-up, and is followed by a CHECKPOINT (a WAL holding DDL has failed to replay
after unclean exits).
"""

from __future__ import annotations

import contextlib
import errno
import json
import threading
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeVar

import duckdb

from monitor.constants import DB_NAME
from monitor.errors import StoreError
from monitor.store.migrations import MIGRATIONS, Migration

DEFAULT_DB_PATH = Path("state") / DB_NAME

_S = TypeVar("_S", bound="StoreConnection")


def utcnow() -> datetime:
    """Timezone-aware now in UTC (the only clock store code uses by default)."""
    return datetime.now(timezone.utc)


def storage_error(path: Path, exc: BaseException, *, doing: str) -> StoreError:
    """One clear StoreError for an OS or DuckDB failure on the state file (or folder) `path`.

    A full disk, a folder this user cannot write, and a file DuckDB cannot read (truncated,
    corrupt, or not a database) each get the fix that applies; none of them suggests
    deleting anything, least of all the WAL.
    """
    lines = str(exc).strip().splitlines()
    detail = " ".join(lines[0].split()) if lines else type(exc).__name__
    if isinstance(exc, OSError) and exc.strerror:
        detail = exc.strerror
    code = exc.errno if isinstance(exc, OSError) else None
    text = str(exc).lower()
    if code == errno.ENOSPC or "no space left" in text or "disk full" in text:
        return StoreError(f"no space left on the device holding {path} ({doing})",
                          hint="free space there and run it again; what was already written is intact")
    if code in (errno.EACCES, errno.EPERM, errno.EROFS) or "permission denied" in text \
            or "read-only file system" in text:
        return StoreError(f"cannot write {path} ({doing}): {detail}",
                          hint="make the state directory writable by the user running lstar, "
                               "or point --state/--db at one that is")
    if isinstance(exc, OSError):
        return StoreError(f"cannot use {path} ({doing}): {detail}")
    # What reading a damaged file raises; a parser or binder error (a faulty migration) is
    # not the file's fault and is not reported as such.
    damaged = (duckdb.IOException, duckdb.SerializationException, duckdb.FatalException)
    if isinstance(exc, damaged) or type(exc) is duckdb.Error or "corrupt" in text:
        wal = path.name + ".wal"
        return StoreError(f"cannot read {path} ({doing}): {detail}",
                          hint=f"the file is truncated, corrupt or not a DuckDB database: stop lstar, move "
                               f"{path.name} and {wal} (if any) aside, never deleting the WAL, and restore a "
                               f"backup or start a new state directory")
    return StoreError(f"{doing} {path} failed: {detail}")


def _is_lock_conflict(exc: BaseException) -> bool:
    text = str(exc).lower()
    return "conflicting lock" in text or "could not set lock" in text


def held_error(path: Path) -> StoreError:
    return StoreError(f"{path} is held by another process (the daemon?)",
                      hint="stop it, or use the read commands, which ask the running daemon")


def refuse_if_held(path: str | Path) -> None:
    """Raise at once when another process (the daemon) holds the state file at `path` for
    writing, so a command that would write to it stops before its slow work (loading a model)
    rather than after. A missing file is not created."""
    path = Path(path)
    if not path.is_file():
        return
    try:
        duckdb.connect(str(path), read_only=True).close()   # a read-only open needs no writer's lock
    except duckdb.IOException as exc:
        if _is_lock_conflict(exc):
            raise held_error(path) from exc
    except duckdb.Error:
        pass   # a damaged file is reported by the open that reads it, with its own hint


class StoreConnection:
    """The connection to a DuckDB state file: opening, transactions, migrations, retention.

    `monitor.store.Store` adds the rows of each domain; use `Store.open(...)` and close it
    (or use `with`)."""

    def __init__(self, conn: duckdb.DuckDBPyConnection, path: Path, read_only: bool) -> None:
        self._conn = conn
        self.path = path
        self.read_only = read_only
        self._lock = threading.RLock()
        self._refused = False
        self._depth = 0          # open transaction() blocks (the lock is held while > 0)

    # -- opening ---------------------------------------------------------------------
    @classmethod
    def open(cls: type[_S], path: str | Path = DEFAULT_DB_PATH, *, read_only: bool = False,
             migrate: bool = True) -> _S:
        """Open (and by default migrate) the state file at `path`.

        Read-only opens never create or migrate; they fail if the file is missing or behind
        the code's schema. A read-write open fails clearly when another process holds it.
        Either fails before writing anything when the file carries a migration this version
        does not know, and every other failure (a truncated or corrupt file, a folder that
        cannot be written, a full disk) is a StoreError naming the file and the fix.
        """
        path = Path(path)
        if read_only and not path.exists():
            raise StoreError(f"no database at {path}",
                             hint="score something first, or run `lstar db migrate --db PATH`")
        if not read_only:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise storage_error(path.parent, exc, doing="creating the folder of the database") from exc
        try:
            conn = duckdb.connect(str(path), read_only=read_only)
        except duckdb.IOException as exc:
            text = str(exc).lower()
            if _is_lock_conflict(exc):
                raise held_error(path) from exc
            raise storage_error(path, exc, doing="opening") from exc
        except duckdb.Error as exc:
            raise storage_error(path, exc, doing="opening") from exc
        # DuckDB draws a progress bar on standard output for a statement running past two
        # seconds (a migration, a 10^5-row report): bytes inside a `--json` answer or a log
        with contextlib.suppress(duckdb.Error):
            conn.execute("SET enable_progress_bar = false")
        store = cls(conn, path, read_only)
        try:
            if read_only:
                pending = store.pending_migrations()
                if pending:
                    raise StoreError(f"{path} is at an older schema (pending: {', '.join(pending)})",
                                     hint="run `lstar db migrate` with no daemon running")
            elif migrate:
                store.migrate()
        except BaseException as exc:
            with contextlib.suppress(Exception):
                store.abandon()
            if isinstance(exc, (duckdb.Error, OSError)):
                raise storage_error(path, exc, doing="reading the schema" if read_only else "migrating") \
                    from exc
            raise
        return store

    def close(self) -> None:
        """Checkpoint (when writable) and close the connection; a file this version refused
        is closed as it was (`abandon`)."""
        self._close("PRAGMA disable_checkpoint_on_shutdown" if self._refused else "CHECKPOINT")

    def abandon(self) -> None:
        """Close without checkpointing: a file this version refused (written by a newer one,
        or whose migration failed) keeps its WAL and its bytes as they were. DuckDB would
        otherwise fold the WAL into the file when a writable connection closes."""
        self._close("PRAGMA disable_checkpoint_on_shutdown")

    def _close(self, last_statement: str) -> None:
        with self._lock:
            if self._conn is None:
                return
            if not self.read_only:
                with contextlib.suppress(duckdb.Error):
                    self._conn.execute(last_statement)
            self._conn.close()
            self._conn = None  # type: ignore[assignment]

    def __enter__(self: _S) -> _S:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- low level ---------------------------------------------------------------------
    @property
    def conn(self) -> duckdb.DuckDBPyConnection:
        if self._conn is None:
            raise StoreError(f"{self.path} is closed")
        return self._conn

    def cursor(self) -> duckdb.DuckDBPyConnection:
        """A cursor for another thread (a DuckDB connection is not thread-safe)."""
        return self.conn.cursor()

    def track_cursor(self, cursor: duckdb.DuckDBPyConnection) -> Callable[[], None]:
        """Tell whoever may have to stop this store's queries about a cursor a read opened of its
        own (a report's ranks); returns the call that forgets it. Here nobody is told; the
        daemon's job and request stores hand it to the daemon, which interrupts it at its drain
        deadline as it does their own cursor."""
        return lambda: None

    @contextlib.contextmanager
    def transaction(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """BEGIN ... COMMIT, rolled back on any exception.

        Opened inside another transaction of this store (the same thread: the lock is held),
        it joins that one: its writes commit, or roll back, with the outer one. That lets a
        caller write many rows in one commit through methods that each open a transaction."""
        with self._lock:
            conn = self.conn
            if self._depth:
                self._depth += 1
                try:
                    yield conn
                finally:
                    self._depth -= 1
                return
            conn.execute("BEGIN TRANSACTION")
            self._depth = 1
            try:
                yield conn
            except BaseException:
                self._depth = 0
                with contextlib.suppress(duckdb.Error):
                    conn.execute("ROLLBACK")
                raise
            self._depth = 0
            conn.execute("COMMIT")

    @property
    def in_transaction(self) -> bool:
        """Whether a `transaction()` of this store is open (in the thread holding it)."""
        return self._depth > 0

    def checkpoint(self) -> None:
        """Fold the WAL into the main file (after batches and on shutdown)."""
        if not self.read_only:
            with self._lock:
                self.conn.execute("CHECKPOINT")

    def query(self, sql: str, params: Sequence[Any] | None = None) -> list[dict[str, Any]]:
        """Run a read query and return rows as dicts."""
        with self._lock:
            cur = self.conn.execute(sql, params or [])
            description = cur.description
            if description is None:
                # What DuckDB leaves when the connection this cursor came from was closed
                # after the statement ran (a shutdown past its drain deadline): no result set.
                raise StoreError(f"{self.path} was closed while a query on it ran",
                                 hint="the daemon is stopping; the job runs again on the next start")
            cols = [d[0] for d in description]
            return [dict(zip(cols, row)) for row in cur.fetchall()]

    def query_json(self, sql: str, params: Sequence[Any] | None, json_columns: Sequence[str]) -> list[dict[str, Any]]:
        """`query`, with the JSON text of `json_columns` decoded."""
        rows = self.query(sql, params)
        for row in rows:
            for column in json_columns:
                row[column] = json.loads(row[column])
        return rows

    # -- migrations --------------------------------------------------------------------
    def applied_migrations(self) -> list[str]:
        """Names of the migrations already applied, oldest first."""
        exists = self.conn.execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_name = 'schema_migrations'"
        ).fetchone()[0]
        if not exists:
            return []
        rows = self.conn.execute("SELECT name FROM schema_migrations ORDER BY name").fetchall()
        return [r[0] for r in rows]

    def pending_migrations(self) -> list[str]:
        """Names of the code's migrations not yet applied to this file."""
        applied = set(self.applied_migrations())
        unknown = applied - {m.name for m in MIGRATIONS}
        if unknown:
            self._refused = True   # closing it must not fold the newer version's WAL into the file
            raise StoreError(
                f"{self.path} has migrations this version does not know: {', '.join(sorted(unknown))}",
                hint="it was written by a newer lstar-monitor; upgrade rather than downgrade")
        return [m.name for m in MIGRATIONS if m.name not in applied]

    def migrate(self, migrations: Sequence[Migration] | None = None) -> list[str]:
        """Apply pending migrations, each in one transaction with its record. Idempotent."""
        if self.read_only:
            raise StoreError(f"{self.path} is open read-only; cannot migrate")
        migrations = MIGRATIONS if migrations is None else migrations
        with self._lock:
            done: list[str] = []
            try:
                self.pending_migrations()  # a file from a newer version is refused before anything is written
                self.conn.execute(
                    "CREATE TABLE IF NOT EXISTS schema_migrations ("
                    " name VARCHAR PRIMARY KEY, applied_at TIMESTAMPTZ NOT NULL)")
                applied = set(self.applied_migrations())
                for m in migrations:
                    if m.name in applied:
                        continue
                    with self.transaction() as conn:
                        conn.execute(m.sql)
                        conn.execute("INSERT INTO schema_migrations VALUES (?, ?)", [m.name, utcnow()])
                    done.append(m.name)
                self.conn.execute("CHECKPOINT")
            except (duckdb.Error, OSError) as exc:  # each migration is all or nothing: the file stays usable
                applied_now = f" after applying {', '.join(done)}" if done else ""
                raise storage_error(self.path, exc, doing=f"migrating{applied_now}") from exc
        return done

    def info(self) -> dict[str, Any]:
        """Schema version and row counts, for `lstar db info`."""
        try:  # fixed SQL over every table: a failure here is the file's
            tables = [r[0] for r in self.conn.execute(
                "SELECT table_name FROM information_schema.tables "
                "WHERE table_schema = 'main' ORDER BY table_name").fetchall()]
            counts = {t: self.conn.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0] for t in tables}
        except duckdb.Error as exc:
            raise storage_error(self.path, exc, doing="counting rows") from exc
        applied = self.applied_migrations()
        return {"path": str(self.path), "migrations": applied,
                "pending": [m.name for m in MIGRATIONS if m.name not in set(applied)],
                "tables": counts}

    # -- retention: log rows that grow with time ------------------------------------------------
    def prune_logs(self, cutoff: datetime) -> dict[str, int]:
        """Delete log rows older than `cutoff` that nothing reads any more, in one transaction;
        returns the rows deleted per table.

        - hub_polls: polls before the cutoff, except each rule's newest one;
        - delivery_attempts: every attempt of a notification delivered (or silenced) before the
          cutoff; attempts of pending or dead-lettered notifications stay, they explain an
          undelivered alert;
        - hub_outages: outages that ended before the cutoff and whose meta-alert was raised; an
          open or not yet alerted outage stays.

        Watermarks, checkpoints, scores, labels, predictions, alerts, deliveries and
        notifications are state (de-duplication, repeat intervals, provenance): never pruned.
        """
        with self.transaction() as conn:
            polls = conn.execute(
                "DELETE FROM hub_polls WHERE polled_at < ? AND id NOT IN "
                "(SELECT max(id) FROM hub_polls GROUP BY rule_key)", [cutoff]).fetchone()[0]
            attempts = conn.execute(
                "DELETE FROM delivery_attempts WHERE notification_id IN (SELECT id FROM notifications "
                "WHERE (status = 'delivered' AND delivered_at < ?) OR (status = 'silenced' AND updated_at < ?))",
                [cutoff, cutoff]).fetchone()[0]
            outages = conn.execute(
                "DELETE FROM hub_outages WHERE ended_at IS NOT NULL AND ended_at < ? AND alerted_at IS NOT NULL",
                [cutoff]).fetchone()[0]
        return {"hub_polls": int(polls), "delivery_attempts": int(attempts), "hub_outages": int(outages)}
