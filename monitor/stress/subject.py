"""What a stress test runs on and how its result is shaped.

Every test takes a `StressSubject` (the checkpoints of one model family or one lab lineage, the
primary calibration corpus, the curve the result qualifies) and `StressOptions`, and returns one
JSON-able section. `lstar stress` puts the sections into one document of schema `lstar-stress/1`:

    {"schema": "lstar-stress/1", "subject": {...}, "sections": {"tokenization": {...},
     "registers": {...}, "task_format": {...}}}

A section's numbers are test-specific (each test's module documents them); the limits that
turn numbers into flags live in one place (`monitor.stress.limits`), so every command, alert
and report shows the same flag for the same numbers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

SCHEMA = "lstar-stress/1"
TEST_NAMES = ("tokenization", "registers", "task_format")


@dataclass(frozen=True)
class StressCheckpoint:
    """One checkpoint a test scores: `ref` is anything `lstar score` accepts as a model (a local
    folder of safetensors, `builtin:smollm2-135m`); `label` names it in results."""

    ref: str
    label: str
    tokenizer_dir: Path | None = None  # None: the model's own tokenizer files
    note: str | None = None  # e.g. "dequantised from a Q4_K_M GGUF"


@dataclass(frozen=True)
class StressSubject:
    kind: Literal["model", "lab"]
    name: str
    checkpoints: tuple[StressCheckpoint, ...]
    corpus: Path  # the primary calibration corpus (calib-v0)
    curve_id: str | None = None  # the curve whose forecasts these results qualify
    proxy_note: str | None = None  # set where a lab proxy lineage stands in for a real model


@dataclass(frozen=True)
class StressOptions:
    seed: int = 0
    max_documents: int | None = None  # the first N documents in manifest order, for speed
    dropout_rates: tuple[float, ...] = (0.05, 0.1)
    register_corpora: tuple[Path, ...] = ()
    task_file: Path | None = None
    curve_path: Path | None = None  # a curve artifact file, when not read from a store
    extra: dict[str, Any] = field(default_factory=dict)


StressTest = Callable[[StressSubject, StressOptions], dict[str, Any]]
