"""Reading and changing state from the command line while a daemon may hold the database.

DuckDB allows one writer per file and no reader beside it, so while `lstar run` holds the
state directory, a command asks the daemon through its local API instead of opening the file;
with no daemon running it opens the file itself (docs/reliability.md, row 5).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from monitor.store import Store

# The service client and the store (httpx, duckdb) load when a command reads, not when the
# command modules that use this one are imported for `--help`.

T = TypeVar("T")


def daemon_url(db: Path) -> str | None:
    """The API URL of a daemon running on `db`'s state directory, else None."""
    from monitor.service.client import live_daemon_url

    return live_daemon_url(Path(db).parent)


def through_daemon(db: Path, ask: Callable[[str], T], read: Callable[[Store], T], *,
                   read_only: bool = True) -> T:
    """`ask(url)` of the daemon running on `db`'s state directory, else `read(store)` on the
    file itself (opened read-only unless `read_only` is False)."""
    from monitor.store import Store

    url = daemon_url(db)
    if url is not None:
        return ask(url)
    with Store.open(db, read_only=read_only) as store:
        return read(store)


def change_through_daemon(db: Path, route: str, payload: dict[str, Any], answer: Callable[[Any], T],
                          change: Callable[[Store], T]) -> T:
    """A change of the state: POST `payload` to the daemon's `route` and read its reply with
    `answer`, else `change(store)` on the file opened for writing (the daemon makes the same
    change with the same code, so the result reads alike either way)."""
    from monitor.service import api_post

    return through_daemon(db, lambda url: answer(api_post(url, route, payload, state_dir=Path(db).parent)),
                          change, read_only=False)
