"""Lazy re-exports for the stage packages' `__init__` files.

A package lists `{name: module}` and gets a module-level `__getattr__`/`__dir__` pair: importing
the package (or one light module in it, which imports the package first) does not import every
stage module and their libraries; a name loads its module when first used (PEP 562). One
definition for every package, so they cannot drift apart.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, exports: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """`(__getattr__, __dir__)` for `package`, loading each name of `exports` from its module."""

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(exports[name]), name)
        setattr(sys.modules[package], name, value)   # later lookups skip this function
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *exports})

    return __getattr__, __dir__
