"""The lab's record of a run: `OUT/lab.json`, schema `lstar-lab/2` (version 1 still readable).

Version 2 (`LabRecordV2`, written by `monitor.lab.race`) scores every checkpoint on two texts
(the pool's held-out text and the whole of calib-v0) and two tasks, and `race_rows` flattens
it into the rows the analysis reads. Version-1 files (`LabRecord`) still load, so old runs
can be reported, but `race_rows` refuses them in one line (they have no held-out text, sizes or
out-of-sample unigram).

The training half of the lab (`monitor.lab.pipeline`) writes it; the analysis half
(`monitor.lab.analysis`, `monitor.lab.report`) reads only it. Families are distinguished by
tokenizer; seeds are replicate runs of a family. Every number is a plain float so the file
can be read without the lab's code; unknown keys are refused so a typo in a hand-edited file
is caught, and every problem is one `LabError` line naming the file. `monitor.lab.record_file`
reads any version (`load_lab`), v3's (`monitor.lab.records_v3`) included.

Every number is bounded, so that no value of a hostile file can overflow the analysis or the
figures: losses (nats/token, bits/byte, their differences and ratios) and their standard
error lie within ±LOSS_BOUND, finite; counts (seeds, steps, bytes and tokens seen, items,
vocabulary) are integers in [0, COUNT_BOUND); task scores keep their own ranges.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, field_validator, model_validator

from monitor.errors import LabError
from monitor.files import FileKind, atomic_write_text
from monitor.lab.record_checks import (LabRecordBase, StrictModel, check_checkpoints, check_families_once,
                                       check_primary_is_lossless, first_error, validate_record)

__all__ = ["COUNT_BOUND", "LAB_FILE", "LAB_MAX_BYTES", "LAB_SCHEMA", "LOSS_BOUND", "METRIC_NAMES", "CheckpointMetrics", "CheckpointRecord",
           "FamilyRecord", "LabError", "LabRecord", "TaskMetrics", "atomic_write_text", "parse_lab", "write_lab"]

LAB_SCHEMA = "lstar-lab/1"
LAB_SCHEMA_V2 = "lstar-lab/2"
LAB_FILE = "lab.json"
# The checkpoint metrics every record carries (see CheckpointMetrics).
METRIC_NAMES = ("ce", "ce_uni", "lstar", "lstar_se", "l_rel", "l_gain", "bits_per_byte",
                "unigram_bits_per_byte", "bpb_minus_unigram")
# A lab run has at most a few thousand checkpoints (a few KiB each); far larger is not one.
LAB_MAX_BYTES = 64 << 20
LAB_RECORD = FileKind("lab.json", "lab records", "JSON")


# A real run's losses are a few nats (ratios near 1); 1e6 leaves room for any model without
# letting a sum or a span of them overflow.
LOSS_BOUND = 1e6
# A real run sees at most ~1e13 bytes; 1e18 keeps every count exact in float64 arithmetic too.
COUNT_BOUND = 10**18

Loss = Annotated[float, Field(ge=-LOSS_BOUND, le=LOSS_BOUND)]
Count = Annotated[int, Field(ge=0, lt=COUNT_BOUND)]
PositiveCount = Annotated[int, Field(ge=1, lt=COUNT_BOUND)]


_Strict = StrictModel   # the name every record type of versions 1 to 3 builds on
_first_error = first_error


class CheckpointMetrics(_Strict):
    """Scores of one checkpoint on the calibration corpus (nats/token unless said otherwise)."""

    ce: Loss
    ce_uni: Loss
    lstar: Loss
    lstar_se: float = Field(ge=0.0, le=LOSS_BOUND)
    l_rel: Loss
    l_gain: Loss
    bits_per_byte: Loss
    unigram_bits_per_byte: Loss
    bpb_minus_unigram: Loss


class TaskMetrics(_Strict):
    """One checkpoint on one task: accuracy, probability of the answer, Brier score."""

    acc: float = Field(ge=0.0, le=1.0)
    prob_correct: float = Field(ge=0.0, le=1.0)
    brier: float = Field(ge=0.0, le=2.0)
    exact_match: float | None = Field(default=None, ge=0.0, le=1.0)
    n: PositiveCount
    baseline: float = Field(ge=0.0, le=1.0)


class FamilyRecord(_Strict):
    """One family: a tokenizer and how much of its vocabulary the lab's text uses."""

    family: str = Field(min_length=1, max_length=100)
    tokenizer: str = Field(min_length=1, max_length=200)
    tokenizer_fingerprint: str = Field(min_length=1, max_length=128)
    vocab_used: PositiveCount


class CheckpointRecord(_Strict):
    """One saved checkpoint of one (family, seed) lineage, with its scores and task labels."""

    family: str = Field(min_length=1, max_length=100)
    seed: Count
    step: Count
    bytes_seen: Count
    tokens_seen: Count
    path: str = Field(min_length=1, max_length=500)   # relative to the folder holding lab.json
    metrics: CheckpointMetrics
    tasks: dict[str, TaskMetrics]

    @field_validator("path")
    @classmethod
    def _relative(cls, value: str) -> str:
        parts = Path(value).parts
        if Path(value).is_absolute() or ".." in parts:
            raise ValueError(f"path {value!r} must be relative to the lab folder, without '..'")
        return value


class LabRecord(LabRecordBase):
    """The whole of `lab.json`."""

    SCHEMA = LAB_SCHEMA
    families: list[FamilyRecord]
    checkpoints: list[CheckpointRecord]

    @model_validator(mode="after")
    def _consistent(self) -> "LabRecord":
        names = self.family_names()
        check_families_once(names)
        check_checkpoints(self.checkpoints, names, key=lambda c: (c.family, c.seed, c.step),
                          describe=lambda c: f"family {c.family!r} seed {c.seed} step {c.step}", name_known=True)
        return self


def parse_lab(data: Any, *, where: str = LAB_FILE) -> LabRecord:
    """Validate a decoded lab.json: the schema, every field, families listed once, every
    checkpoint of a listed family and each (family, seed, step) once."""
    if isinstance(data, dict) and data.get("schema") != LAB_SCHEMA:
        raise LabError(f"{where} is not a lab record: schema {data.get('schema')!r}, expected {LAB_SCHEMA_V2!r} "
                       f"(or {LAB_SCHEMA!r})",
                       hint="regenerate it with `lstar lab run`")
    return validate_record(LabRecord, data, where=where, hint="regenerate it with `lstar lab run`")


def parse_lab_v2(data: Any, *, where: str = LAB_FILE) -> "LabRecordV2":
    """Validate a decoded version-2 lab.json (one LabError line naming the first problem)."""
    return validate_record(LabRecordV2, data, where=where, hint="regenerate it with `lstar lab run`")


def write_lab(record: LabRecord, path: str | Path) -> Path:
    """Write `record` atomically (temporary file, fsync, rename): a reader never sees half a file."""
    path = Path(path)
    if path.is_dir():
        path = path / LAB_FILE
    atomic_write_text(path, record.to_json())
    return path


# ------------------------------------------------------------------------------ version 2
EVAL_TEXTS = ("heldout", "calib")
RACE_TASKS = ("add-words", "cloze")
RACE_AXES = ("lstar", "lstar_oos", "bits_per_byte", "raw_ce", "l_rel", "l_gain", "bpb_minus_unigram", "bytes_seen")


class TextScoresV2(_Strict):
    """One checkpoint on one evaluation text (nats/token unless said otherwise). `ce_uni` is
    the spec's in-sample unigram of this text, `ce_uni_oos` the out-of-sample unigram fitted
    on the pool's unigram slice (additive smoothing 0.5 over the tokenizer's ids)."""

    ce: Loss
    ce_uni: Loss
    ce_uni_oos: Loss
    lstar: Loss
    lstar_oos: Loss
    lstar_se: float = Field(ge=0.0, le=LOSS_BOUND)
    l_rel: Loss
    l_gain: Loss
    bits_per_byte: Loss
    unigram_bits_per_byte: Loss
    bpb_minus_unigram: Loss
    n_tokens: PositiveCount
    n_bytes: PositiveCount


class TaskScoresV2(_Strict):
    """One checkpoint on one task: accuracy and probability of the answer (multiple choice),
    string exact match of a greedy decode, and the chance level of each."""

    acc: float = Field(ge=0.0, le=1.0)
    exact_match: float = Field(ge=0.0, le=1.0)
    p_correct: float = Field(ge=0.0, le=1.0)
    brier: float = Field(ge=0.0, le=2.0)
    n: PositiveCount
    baselines: dict[str, float]

    @field_validator("baselines")
    @classmethod
    def _baselines(cls, value: dict[str, float]) -> dict[str, float]:
        if set(value) != {"acc", "exact_match", "p_correct"} or not all(0.0 <= v <= 1.0 for v in value.values()):
            raise ValueError("baselines must give acc, exact_match and p_correct, each in [0, 1]")
        return value


class FamilyRecordV2(_Strict):
    """One family: its tokenizer, its role (the primary race or the lossy stress test) and the
    decode round trip on the lab's texts."""

    family: str = Field(min_length=1, max_length=100)
    role: str = Field(pattern="^(primary|stress)$")
    tokenizer_fingerprint: str = Field(min_length=1, max_length=128)
    lossless: bool
    round_trip: dict[str, dict[str, int]]
    reason: str | None = Field(default=None, max_length=2000)


class CheckpointRecordV2(_Strict):
    """One saved checkpoint of one (family, size, seed) lineage."""

    family: str = Field(min_length=1, max_length=100)
    size: str = Field(min_length=1, max_length=20)
    seed: Count
    step: Count
    bytes_seen: Count
    tokens_seen: Count
    vocab_used: PositiveCount
    path: str = Field(min_length=1, max_length=500)
    texts: dict[str, TextScoresV2]
    tasks: dict[str, TaskScoresV2]

    _relative = field_validator("path")(CheckpointRecord._relative.__func__)

    @field_validator("texts")
    @classmethod
    def _texts(cls, value: dict[str, TextScoresV2]) -> dict[str, TextScoresV2]:
        if set(value) != set(EVAL_TEXTS):
            raise ValueError(f"texts must be exactly {', '.join(EVAL_TEXTS)}")
        return value

    @field_validator("tasks")
    @classmethod
    def _tasks(cls, value: dict[str, TaskScoresV2]) -> dict[str, TaskScoresV2]:
        if set(value) != set(RACE_TASKS):
            raise ValueError(f"tasks must be exactly {', '.join(RACE_TASKS)}")
        return value


class LabRecordV2(LabRecordBase):
    """The whole of a version-2 `lab.json`."""

    SCHEMA = LAB_SCHEMA_V2
    families: list[FamilyRecordV2]
    checkpoints: list[CheckpointRecordV2]

    @model_validator(mode="after")
    def _consistent(self) -> "LabRecordV2":
        names = self.family_names()
        check_families_once(names)
        check_checkpoints(self.checkpoints, names, key=lambda c: (c.family, c.size, c.seed, c.step),
                          describe=lambda c: f"{c.family!r} size {c.size} seed {c.seed} step {c.step}")
        check_primary_is_lossless(self.families)
        return self


def race_rows(lab: "LabRecordV2", *, role: str = "primary") -> list[dict[str, Any]]:
    """One dict per (checkpoint, evaluation text) of the families of `role` (the primary race
    by default; "stress" for the lossy stress test), in the file's order, as LAB_INTERFACE
    describes: family, size, seed, step, bytes_seen, tokens_seen, text, axes, metrics,
    baselines. A version-1 record has no held-out text, sizes or out-of-sample unigram: refused."""
    if not isinstance(lab, LabRecordV2):
        v3 = type(lab).__name__ == "LabRecordV3"
        raise LabError(f"race_rows needs a {LAB_SCHEMA_V2} lab record, got {type(lab).__name__}",
                       hint="a lstar-lab/3 record is read by monitor.lab.records_v3.race_rows_v3 (the v3 analysis)"
                       if v3 else "rerun the lab with `lstar lab run --pool DIR`")
    roles = {f.family: f.role for f in lab.families}
    rows: list[dict[str, Any]] = []
    for ck in lab.checkpoints:
        if roles[ck.family] != role:
            continue
        metrics = {name: {"acc": t.acc, "exact_match": t.exact_match, "p_correct": t.p_correct}
                   for name, t in ck.tasks.items()}
        baselines = {name: dict(t.baselines) for name, t in ck.tasks.items()}
        for text in EVAL_TEXTS:
            s = ck.texts[text]
            axes = {"lstar": s.lstar, "lstar_oos": s.lstar_oos, "bits_per_byte": s.bits_per_byte,
                    "raw_ce": s.ce, "l_rel": s.l_rel, "l_gain": s.l_gain,
                    "bpb_minus_unigram": s.bpb_minus_unigram, "bytes_seen": float(ck.bytes_seen)}
            rows.append({"family": ck.family, "size": ck.size, "seed": ck.seed, "step": ck.step,
                         "bytes_seen": ck.bytes_seen, "tokens_seen": ck.tokens_seen, "text": text,
                         "axes": axes, "metrics": {k: dict(v) for k, v in metrics.items()},
                         "baselines": {k: dict(v) for k, v in baselines.items()}})
    return rows


__all__ += ["EVAL_TEXTS", "LAB_SCHEMA_V2", "LabRecordV2", "parse_lab_v2", "CheckpointRecordV2", "FamilyRecordV2", "RACE_AXES",
            "RACE_TASKS", "TaskScoresV2", "TextScoresV2", "race_rows"]
