"""A stand-in daemon for the API's listings: what the API reads of a daemon to serve them, over
a real state file opened read-only for each read (and the policies given, for the report)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from monitor.store import Store


class ListingDaemon:
    def __init__(self, db: Path, policies: Sequence[Any] = ()) -> None:
        self.db = db
        self._policies = list(policies)
        self.config = SimpleNamespace(state_dir=db.parent, policies_dir=db.parent)

    def policies(self) -> list[Any]:
        return self._policies

    @contextlib.contextmanager
    def read_store(self) -> Iterator[Store]:
        with Store.open(self.db, read_only=True) as store:
            yield store
