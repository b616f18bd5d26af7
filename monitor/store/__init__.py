"""The DuckDB state file: connection and migrations, and one module of rows per domain."""

from monitor.store.connection import DB_NAME, DEFAULT_DB_PATH, refuse_if_held, storage_error, utcnow
from monitor.store.database import Store
from monitor.store.migrations import MIGRATIONS, Migration

__all__ = ["DB_NAME", "DEFAULT_DB_PATH", "MIGRATIONS", "Migration", "Store", "refuse_if_held", "storage_error", "utcnow"]
