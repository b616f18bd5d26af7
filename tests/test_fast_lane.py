"""The fast lane (`python3 -m pytest -q -m "not slow"`) loads every module of the package.

The tests marked `slow` (the demo, the lab, Ray, the daemon in subprocesses, the real models)
are the only ones that reach some modules at run time; importing each module here keeps a
syntax error, a broken import or a name that no longer exists out of no lane at all.
"""

from __future__ import annotations

import importlib

import pytest
from import_graph import all_modules

MODULES = sorted(all_modules())


def test_the_package_has_modules_to_import() -> None:
    assert "monitor.cli" in MODULES and "monitor.sandbox.fakehub" in MODULES


@pytest.mark.parametrize("name", MODULES)
def test_every_module_imports(name: str) -> None:
    module = importlib.import_module(name)
    assert module.__name__ == name
