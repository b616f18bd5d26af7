"""The fast lane (`python3 -m pytest -q -m "not slow"`) loads every module of the package.

The tests marked `slow` (the demo, the lab, Ray, the daemon in subprocesses, the real models)
are the only ones that reach some modules at run time; importing each module here keeps a
syntax error, a broken import or a name that no longer exists out of no lane at all.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest
from import_graph import all_modules

MODULES = sorted(all_modules())


def test_the_package_has_modules_to_import() -> None:
    assert "monitor.cli" in MODULES and "monitor.demo.fakehub" in MODULES


@pytest.mark.parametrize("name", MODULES)
def test_every_module_imports(name: str) -> None:
    module = importlib.import_module(name)
    assert module.__name__ == name


def test_the_tests_that_fetch_smollm2_from_pypi_stay_out_of_the_fast_lane() -> None:
    """Offline, `-m "not slow"` must not reach for the package index (docs/setup.md)."""
    tests = Path(__file__).resolve().parent
    fetching = [p for p in sorted(tests.glob("test_*.py"))
                if p.name != Path(__file__).name and re.search(r"ensure_smollm2|builtin:smollm2", p.read_text())]
    assert fetching, "no test fetches SmolLM2 any more: update this check"
    for path in fetching:
        module = importlib.import_module(path.stem)
        marks = getattr(module, "pytestmark", [])
        marks = marks if isinstance(marks, list) else [marks]
        assert any(m.name == "slow" for m in marks), f"{path.name}: add `pytestmark = pytest.mark.slow`"
