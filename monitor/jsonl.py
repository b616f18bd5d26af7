"""JSON lines files read with errors that name the file and the line."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from monitor.errors import LstarError


def json_lines(lines: Iterable[str], path: str | Path, error: type[LstarError], *,
               not_json: str = "invalid JSON") -> Iterator[tuple[int, Any]]:
    """(line number, value) of each non-blank line; a line that is not JSON raises `error`
    as `PATH:LINE: <not_json> (<why>)`.

    The decoder's other refusals are the same error on one line: nesting too deep for the
    decoder (`[` * 100000 is a RecursionError) and integers of more digits than Python
    converts (a ValueError), so hostile lines never escape as anything but `error`."""
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            yield number, json.loads(line)
        except json.JSONDecodeError as exc:
            raise error(f"{path}:{number}: {not_json} ({exc.msg})") from exc
        except RecursionError:
            raise error(f"{path}:{number}: {not_json} (nested too deeply to decode)") from None
        except ValueError as exc:   # e.g. an integer over sys.get_int_max_str_digits() digits
            raise error(f"{path}:{number}: {not_json} ({' '.join(str(exc).split())[:120]})") from None


def split_lines(text: str) -> list[str]:
    """The lines of a JSON-lines text: split on '\\n' only (a trailing '\\r' dropped), never on
    the other characters `str.splitlines` breaks at (U+2028, U+0085, form feed...), which JSON
    allows raw inside strings."""
    return [line[:-1] if line.endswith("\r") else line for line in text.split("\n")]
