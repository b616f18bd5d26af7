"""The stress-test registry and the `lstar-stress/1` document (`monitor.stress.subject`).

Each test module registers one function under its name in `TESTS`; `run_stress` runs the
asked ones on one subject and assembles the document `lstar stress` prints and stores.
The tests import torch and transformers only when they run, so importing this is cheap.
"""

from __future__ import annotations

import math
import platform
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from monitor.errors import SpecError
from monitor.stress.subject import SCHEMA, StressOptions, StressSubject, StressTest
from monitor.stress.registers import register_stress
from monitor.stress.task_format import format_stress
from monitor.stress.tokenization import tokenization_stress

TESTS: dict[str, StressTest] = {
    "tokenization": tokenization_stress,
    "registers": register_stress,
    "task_format": format_stress,
}


def parse_tests(text: str | None) -> list[str]:
    """Test names from a comma-separated list (None or empty: every registered test), in the
    order given, each once; an unknown or not yet registered name is an error."""
    if not text or not text.strip():
        return list(TESTS)
    names = list(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    unknown = [n for n in names if n not in TESTS]
    if unknown:
        raise SpecError(f"unknown stress test(s) {', '.join(unknown)} in --tests {text!r}",
                        hint=f"choose from: {', '.join(TESTS)}")
    return names


def subject_dict(subject: StressSubject) -> dict[str, Any]:
    """The subject as it appears in the document (paths as strings)."""
    return {"kind": subject.kind, "name": subject.name, "corpus": str(subject.corpus),
            "curve_id": subject.curve_id, "proxy_note": subject.proxy_note,
            "checkpoints": [{"ref": c.ref, "label": c.label,
                             "tokenizer_dir": None if c.tokenizer_dir is None else str(c.tokenizer_dir),
                             "note": c.note} for c in subject.checkpoints]}


def options_dict(options: StressOptions) -> dict[str, Any]:
    """The options as they appear in the document (paths as strings, tuples as lists)."""
    out = asdict(options)
    for key, value in out.items():
        if isinstance(value, tuple):
            out[key] = [str(v) if not isinstance(v, (int, float)) else v for v in value]
        elif value is not None and not isinstance(value, (int, float, str, bool, dict, list)):
            out[key] = str(value)
    return out


def check_inputs(options: StressOptions, tests: Sequence[str]) -> None:
    """Refuse, before any model is loaded, a test without its inputs and a perturbation out of
    range: each test would otherwise find out only after the ones before it had scored (and an
    out-of-range rate used to be noted as a skip of every BPE perturbation, pruning included)."""
    if "registers" in tests and not options.register_corpora:
        raise SpecError("the registers test needs at least one register corpus besides the primary corpus",
                        hint="pass --register DIR (built by `lstar corpus build-registers OUT`), or leave "
                             "registers out of --tests")
    if "task_format" in tests and options.task_file is None:
        raise SpecError("the task_format test needs a task file",
                        hint="pass --task-file PATH (e.g. ../shared/tasks/cloze-v0.jsonl), or leave task_format "
                             "out of --tests")
    if "tokenization" in tests:
        bad = [r for r in options.dropout_rates if not (isinstance(r, (int, float)) and 0.0 <= r < 1.0)]
        if bad:
            raise SpecError(f"BPE-dropout rate(s) {', '.join(map(str, bad))} outside [0, 1)",
                            hint="e.g. --dropout-rates 0.05,0.1")
        fraction = options.extra.get("prune_fraction", 0.1)
        if not (isinstance(fraction, (int, float)) and math.isfinite(fraction) and 0.0 < fraction < 1.0):
            raise SpecError(f"merge-pruning fraction (--prune-fraction) {fraction} is outside (0, 1)",
                            hint="e.g. --prune-fraction 0.1")


def run_stress(subject: StressSubject, options: StressOptions, tests: Sequence[str]) -> dict[str, Any]:
    """Run `tests` (names in `TESTS`) on `subject` and return the `lstar-stress/1` document."""
    if not subject.checkpoints:
        raise SpecError("a stress run needs at least one checkpoint", hint="pass --model or --lab-lineage")
    unknown = [t for t in tests if t not in TESTS]
    if unknown:
        raise SpecError(f"unknown stress test(s) {', '.join(unknown)}", hint=f"choose from: {', '.join(TESTS)}")
    labels = [c.label for c in subject.checkpoints]
    twins = sorted({label for label in labels if labels.count(label) > 1})
    if twins:   # every result is keyed by label: a second checkpoint would overwrite the first
        raise SpecError(f"two checkpoints share the label {', '.join(map(repr, twins))}",
                        hint="label each checkpoint once (pass each model once)")
    check_inputs(options, tests)
    from monitor import __version__

    sections = {name: TESTS[name](subject, options) for name in tests}
    return {"schema": SCHEMA, "subject": subject_dict(subject), "options": options_dict(options),
            "versions": {"lstar-monitor": __version__, "python": platform.python_version()},
            "sections": sections}
