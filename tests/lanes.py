"""Parameter lists split between the fast lane and the full run.

A parametrized check over many cases (every tokenizer, every extreme range, every batch
size) keeps its first cases in the fast lane (`-m "not slow"`), so each code path is still
exercised there, and marks the rest `slow`: CI (`python3 -m pytest -q`) runs them all.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest


def fast_first(values: Iterable[Any], keep: int = 1) -> list[Any]:
    """`values` for `pytest.mark.parametrize`, with all but the first `keep` marked slow.

    A tuple value is spread over the parametrize names, as pytest does; a value that is
    already a `pytest.param` keeps its id and marks.
    """
    out: list[Any] = []
    for index, value in enumerate(values):
        if index < keep:
            out.append(value)
        elif isinstance(value, type(pytest.param(None))):
            out.append(pytest.param(*value.values, id=value.id, marks=(*value.marks, pytest.mark.slow)))
        else:
            args = value if isinstance(value, tuple) else (value,)
            out.append(pytest.param(*args, marks=pytest.mark.slow))
    return out
