"""`lab.json` (schema `lstar-lab/1`): what a lab run produced, one record per checkpoint.

The file is the interface between training/labelling and the analysis: the run's config,
one entry per family (a family is a tokenizer) and one per checkpoint with its progress
metrics and task results. Strict pydantic models: unknown keys, non-finite numbers and
checkpoints of an unlisted family are errors naming the file and the key.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from monitor.errors import LabelError, PolicyError
from monitor.policy_files import read_policy_bytes

SCHEMA = "lstar-lab/1"
# A lab run has at most a few thousand checkpoints (a few KiB each); far larger is not one.
LAB_MAX_BYTES = 64 << 20


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, populate_by_name=True)


class FamilyRecord(_Strict):
    family: str = Field(min_length=1, max_length=200)
    tokenizer: str
    tokenizer_fingerprint: str
    vocab_used: int = Field(ge=0)


class CheckpointMetrics(_Strict):
    ce: float
    ce_uni: float
    lstar: float
    lstar_se: float = Field(ge=0.0)
    l_rel: float
    l_gain: float
    bits_per_byte: float
    unigram_bits_per_byte: float
    bpb_minus_unigram: float


class TaskResult(_Strict):
    acc: float = Field(ge=0.0, le=1.0)
    prob_correct: float = Field(ge=0.0, le=1.0)
    brier: float = Field(ge=0.0)
    exact_match: float | None = Field(default=None, ge=0.0, le=1.0)
    n: int = Field(gt=0)
    baseline: float = Field(ge=0.0, lt=1.0)


class CheckpointRecord(_Strict):
    family: str
    seed: int
    step: int = Field(ge=0)
    bytes_seen: int = Field(ge=0)
    tokens_seen: int = Field(ge=0)
    path: str
    metrics: CheckpointMetrics
    tasks: dict[str, TaskResult]


class LabRecord(_Strict):
    """A whole `lab.json`."""

    schema_: Literal["lstar-lab/1"] = Field(alias="schema")
    config: dict[str, Any]
    families: list[FamilyRecord]
    checkpoints: list[CheckpointRecord]

    @model_validator(mode="after")
    def _consistent(self) -> "LabRecord":
        names = [f.family for f in self.families]
        if len(set(names)) != len(names):
            raise ValueError("a family is listed more than once in families")
        seen: set[tuple[str, int, int]] = set()
        for i, c in enumerate(self.checkpoints):
            if c.family not in names:
                raise ValueError(f"checkpoints[{i}] has family {c.family!r}, which families does not list")
            key = (c.family, c.seed, c.step)
            if key in seen:
                raise ValueError(f"checkpoints[{i}]: family {c.family!r} seed {c.seed} step {c.step} "
                                 "is listed more than once")
            seen.add(key)
        return self

    def to_json(self) -> str:
        return json.dumps(self.model_dump(mode="json", by_alias=True), indent=2, allow_nan=False) + "\n"


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
    if err["type"] == "extra_forbidden":
        text = f"unknown key {loc!r}"
    else:
        text = f"{loc}: {err['msg']}"
    more = len(exc.errors()) - 1
    return text + (f" (and {more} more)" if more > 0 else "")


def load_lab(path: str | Path) -> LabRecord:
    """Read and validate a `lab.json`; errors name the file and the key at fault."""
    path = Path(path)
    try:  # a regular file of bounded size, read without blocking (a FIFO cannot hang us)
        raw = read_policy_bytes(path, str(path), limit=LAB_MAX_BYTES)
    except PolicyError as exc:
        raise LabelError(exc.message.replace("not a policy file", "not a lab.json"),
                         hint="pass the lab.json a lab run wrote") from None
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise LabelError(f"{path} is not JSON: {' '.join(str(exc).split())[:200]}",
                         hint="pass the lab.json a lab run wrote") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        found = data.get("schema") if isinstance(data, dict) else type(data).__name__
        raise LabelError(f"{path} is not a lab record: schema {found!r}, expected {SCHEMA!r}",
                         hint="pass the lab.json a lab run wrote")
    try:
        return LabRecord.model_validate(data)
    except ValidationError as exc:
        raise LabelError(f"{path}: {_first_error(exc)}", hint=f"fix the file to the {SCHEMA} schema") from None
