"""Bounded listings: a page of rows, the total, and an opaque cursor for the next page.

Every listing (of the commands and of the daemon's API) answers at most `limit` rows
(`DEFAULT_LIMIT` unless asked, never more than `MAX_LIMIT`), so a state of any size costs
one page to list. Pages are keyset pages: the cursor holds the sort key of the page's last
row, and the next page is the rows strictly after it in the listing's order, so rows added
meanwhile never shift a page (no row is skipped or shown twice the way OFFSET would).

A cursor is base64url JSON naming its listing and its key; one from another listing, or
edited by hand, is refused with a one-line `CursorError` (the API answers 400).
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from monitor.constants import DEFAULT_LIMIT, MAX_LIMIT
from monitor.errors import CursorError

MAX_CURSOR_CHARS = 1000


@dataclass(frozen=True)
class Key:
    """A listing's sort key: its columns (SQL) and the type of each (`time`, `int`, `float` or `str`),
    all ascending or all descending."""

    listing: str
    columns: tuple[str, ...]
    kinds: tuple[str, ...]
    descending: bool = False

    def order_by(self) -> str:
        """The ORDER BY clause of the listing."""
        way = " DESC" if self.descending else ""
        return "ORDER BY " + ", ".join(f"{c}{way}" for c in self.columns)

    def after(self, values: Sequence[Any]) -> tuple[str, list[Any]]:
        """The WHERE condition of the rows after `values` in this order, and its parameters.

        Spelled out as `a > x OR (a = x AND b > y)`: DuckDB prunes on the first column."""
        op = "<" if self.descending else ">"
        clauses, params = [], []
        for i, column in enumerate(self.columns):
            equal = [f"{c} = ?" for c in self.columns[:i]]
            clauses.append("(" + " AND ".join([*equal, f"{column} {op} ?"]) + ")")
            params += [*values[:i], values[i]]
        return "(" + " OR ".join(clauses) + ")", params

    def encode(self, values: Sequence[Any]) -> str:
        """The cursor that continues after a row with these key values."""
        shown = [v.isoformat() if isinstance(v, datetime) else v for v in values]
        text = json.dumps({"l": self.listing, "k": shown}, separators=(",", ":"))
        return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")

    def decode(self, cursor: str) -> list[Any]:
        """The key values a cursor of this listing holds (CursorError when it is not one)."""
        hint = f"use the next_cursor a `{self.listing}` listing printed, or leave the cursor out for the first page"
        bad = CursorError(f"cursor {cursor[:40]!r} is not a cursor of the {self.listing} listing", hint=hint)
        if not cursor or len(cursor) > MAX_CURSOR_CHARS:
            raise bad
        try:
            data = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode())
        except (ValueError, binascii.Error, UnicodeDecodeError):
            raise bad from None
        if not isinstance(data, dict) or data.get("l") != self.listing or not isinstance(data.get("k"), list) \
                or len(data["k"]) != len(self.columns):
            raise bad
        values: list[Any] = []
        for value, kind in zip(data["k"], self.kinds):
            if kind == "time":
                try:
                    moment = datetime.fromisoformat(value) if isinstance(value, str) else None
                except ValueError:
                    moment = None
                if moment is None or moment.tzinfo is None:
                    raise bad
                values.append(moment)
            elif kind == "int" and isinstance(value, int) and not isinstance(value, bool) and abs(value) < 2**63:
                values.append(value)
            elif kind == "float" and isinstance(value, (int, float)) and not isinstance(value, bool) \
                    and math.isfinite(value):
                values.append(float(value))
            elif kind == "str" and isinstance(value, str) and len(value) <= 500:
                values.append(value)
            else:
                raise bad
        return values


@dataclass
class Page:
    """One page of a listing: its rows, how many rows the listing has in all (with the same
    filters), and the cursor of the next page (None on the last)."""

    items: list[dict[str, Any]]
    total: int
    next_cursor: str | None
    limit: int
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """The JSON the API answers and `--json` prints."""
        return {"items": self.items, "total": self.total, "next_cursor": self.next_cursor, "limit": self.limit}


def check_limit(limit: int | None) -> int:
    """`limit`, or the default when None; a CursorError when it is out of range."""
    if limit is None:
        return DEFAULT_LIMIT
    if not 1 <= int(limit) <= MAX_LIMIT:
        raise CursorError(f"limit must be a whole number from 1 to {MAX_LIMIT}, got {limit}")
    return int(limit)


def page_query(store: Any, key: Key, *, select: str, where: Sequence[str], params: Sequence[Any],
               limit: int | None, cursor: str | None) -> tuple[list[dict[str, Any]], int, str | None, int]:
    """Run a keyset page: `select` is `SELECT ... FROM ...` (no WHERE), `where` its filters.

    Returns (rows, total, next_cursor, limit). The key's columns must be selected under the
    names after their last dot (`c.id` as `id`). One row beyond the page is read to know
    whether there is a next page; the total is a count with the same filters."""
    limit = check_limit(limit)
    clauses, args = list(where), list(params)
    filters = f"WHERE {' AND '.join(clauses)} " if clauses else ""
    total = int(store.query(f"SELECT count(*) AS n FROM ({select} {filters})", args)[0]["n"])
    if cursor is not None:
        condition, extra = key.after(key.decode(cursor))
        clauses.append(condition)
        args += extra
    filters = f"WHERE {' AND '.join(clauses)} " if clauses else ""
    rows = store.query(f"{select} {filters}{key.order_by()} LIMIT ?", [*args, limit + 1])
    more = len(rows) > limit
    rows = rows[:limit]
    names = [c.rsplit(".", 1)[-1] for c in key.columns]
    next_cursor = key.encode([rows[-1][n] for n in names]) if more and rows else None
    return rows, total, next_cursor, limit


def more_note(shown: int, total: int, next_cursor: str | None, *, what: str) -> str | None:
    """The line under a table that says how to see the rest, or None when all are shown."""
    if next_cursor is None:
        return None
    return (f"showing {shown:,} of {total:,} {what}; more with --cursor {next_cursor} "
            f"(and --limit up to {MAX_LIMIT:,})")


__all__ = ["DEFAULT_LIMIT", "Key", "Page", "check_limit", "page_query", "more_note"]
