"""A test's Python script run as `__main__` in the test's own process, as its child would run.

A child that trains or scores a lab lineage imports torch, its compiler stack (the lab turns on
torch's deterministic algorithms, which imports torch._dynamo and torch._inductor) and
transformers: about 8 of the 9.3 CPU-seconds one run of tests/test_lab.py's training script
used (`/usr/bin/time`, and cProfile of the same run in one process). Where a test checks what the script does, not how a
process starts or dies, this runs it here, where those modules are already imported: with its
argv and environment, and afterwards puts back what a child's exit would have discarded:
the module attributes the script replaces, the environment, and the process-wide torch
settings a lineage sets for itself (its thread count, deterministic algorithms).
"""

from __future__ import annotations

import contextlib
import runpy
import sys
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest


@contextlib.contextmanager
def torch_settings_kept() -> Iterator[None]:
    """Put back torch's thread count and deterministic mode after the block."""
    import torch

    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)


def run_script(script: Path, args: Iterable[Any], monkeypatch: pytest.MonkeyPatch, *,
               env: Mapping[str, str | None] | None = None, replaced: Iterable[tuple[Any, str]] = ()) -> None:
    """`python script *args` in this process; `env` sets (or with None removes) variables, and
    each (module, attribute) of `replaced`, which the script assigns, is put back after it."""
    with monkeypatch.context() as patch, torch_settings_kept():
        for name, value in (env or {}).items():
            if value is None:
                patch.delenv(name, raising=False)
            else:
                patch.setenv(name, value)
        for module, attribute in replaced:
            patch.setattr(module, attribute, getattr(module, attribute))
        patch.setattr(sys, "argv", [str(script), *map(str, args)])
        runpy.run_path(str(script), run_name="__main__")
