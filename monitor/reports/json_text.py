"""A report's JSON text: encoded once, as pieces, so that a file or a response is written as
it is produced and no second whole copy of a report is held as text.

The layout: the report and its sections are indented by two spaces per level, as
`json.dumps(indent=2)` would write them, and each row of a table (an object in a list that
holds no list of objects itself: a `lineage_history` or `lstar_table` row, a task's lineage, a
crossing) is one line, encoded compactly by the json module's C encoder. A week's report at
10^5 checkpoints has 10^5 history rows: the pure-Python indenting encoder took three times the
C encoder's time for them and wrote a third more bytes. Keys are sorted, times are ISO 8601,
non-ASCII is escaped, as before; decoding gives what it gave.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from datetime import datetime, timezone
from json.encoder import encode_basestring_ascii
from pathlib import Path
from typing import Any

CHUNK_CHARS = 1 << 16   # characters handed on at a time while encoding
INDENT = "  "


def json_default(value: Any) -> Any:
    """How a report's JSON spells what `json` cannot (times in ISO 8601)."""
    if isinstance(value, datetime):
        return value.astimezone(timezone.utc).isoformat()
    raise TypeError(f"cannot encode {type(value).__name__}")


# `encode` of an encoder without indentation runs the C encoder over the whole value at once
_ROW_ENCODER = json.JSONEncoder(sort_keys=True, default=json_default)


def public(data: Mapping[str, Any]) -> dict[str, Any]:
    """A report without its private `_` keys (the loaded curves, plot bytes)."""
    return {k: v for k, v in data.items() if not k.startswith("_")}


def _holds_table(row: Mapping[str, Any]) -> bool:
    """Whether an object has a list of objects among its values (then it is a section, indented,
    and its list's objects are the rows)."""
    for value in row.values():
        if type(value) in (list, tuple) and value and isinstance(value[0], Mapping):
            return True
    return False


def _pieces(value: Any, depth: int) -> Iterator[str]:
    """`value`'s JSON text as pieces: containers indented, rows of tables on one line each."""
    if isinstance(value, Mapping):
        if not value:
            yield "{}"
            return
        if not all(type(key) is str for key in value):   # json's own key conversions, on one line
            yield _ROW_ENCODER.encode(dict(value))
            return
        inner, outer = "\n" + INDENT * (depth + 1), "\n" + INDENT * depth
        separator = "{" + inner
        for key in sorted(value):
            yield separator + encode_basestring_ascii(key) + ": "
            yield from _pieces(value[key], depth + 1)
            separator = "," + inner
        yield outer + "}"
    elif isinstance(value, (list, tuple)):
        if not value:
            yield "[]"
            return
        inner, outer = "\n" + INDENT * (depth + 1), "\n" + INDENT * depth
        separator = "[" + inner
        for item in value:
            if isinstance(item, dict) and not _holds_table(item):
                yield separator + _ROW_ENCODER.encode(item)
            else:
                yield separator
                yield from _pieces(item, depth + 1)
            separator = "," + inner
        yield outer + "]"
    else:
        yield _ROW_ENCODER.encode(value)


def iter_json(value: Any) -> Iterator[str]:
    """`value` (a report, or a list of them) encoded once, as pieces of about 64 K characters,
    ending with a newline: what `to_json` returns, for writing to a file or a response as it is
    produced (a report's private `_` keys and plot bytes left out)."""
    if isinstance(value, Mapping):
        value = public(value)
    elif isinstance(value, list):
        value = [public(v) if isinstance(v, Mapping) else v for v in value]
    buffer: list[str] = []
    size = 0
    for piece in _pieces(value, 0):
        buffer.append(piece)
        size += len(piece)
        if size >= CHUNK_CHARS:
            yield "".join(buffer)
            buffer, size = [], 0
    buffer.append("\n")
    yield "".join(buffer)


def to_json(data: Mapping[str, Any]) -> str:
    """The report as JSON (times in ISO 8601, no plot bytes)."""
    return "".join(iter_json(data))


def write_json(data: Mapping[str, Any], path: Path) -> None:
    """The report's JSON written to `path` as it is encoded (`iter_json`)."""
    with open(path, "w", encoding="utf-8") as f:
        for chunk in iter_json(data):
            f.write(chunk)


__all__ = ["CHUNK_CHARS", "iter_json", "json_default", "public", "to_json", "write_json"]
