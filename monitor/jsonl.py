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
    as `PATH:LINE: <not_json> (<why>)`."""
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            yield number, json.loads(line)
        except json.JSONDecodeError as exc:
            raise error(f"{path}:{number}: {not_json} ({exc.msg})") from exc
