"""The DuckDB state file: connection and migrations, and one module of rows per domain."""

from __future__ import annotations

from typing import TYPE_CHECKING

from monitor.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from monitor.store.connection import DB_NAME, DEFAULT_DB_PATH, refuse_if_held, storage_error, utcnow
    from monitor.store.database import Store
    from monitor.store.migrations import MIGRATIONS, Migration

# Re-exported lazily: importing the package (or one light module in it, which imports the
# package first) does not import every stage module and their libraries; a name loads its
# module when first used.
_EXPORTS = {  # name: the module that defines it, imported on first use
    "DB_NAME": "monitor.store.connection",
    "DEFAULT_DB_PATH": "monitor.store.connection",
    "refuse_if_held": "monitor.store.connection",
    "storage_error": "monitor.store.connection",
    "utcnow": "monitor.store.connection",
    "Store": "monitor.store.database",
    "MIGRATIONS": "monitor.store.migrations",
    "Migration": "monitor.store.migrations",
}


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)


__all__ = ["DB_NAME", "DEFAULT_DB_PATH", "MIGRATIONS", "Migration", "Store", "refuse_if_held", "storage_error", "utcnow"]
