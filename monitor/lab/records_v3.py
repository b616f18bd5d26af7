"""Lab v3's record: `lab.json` with schema `lstar-lab/3`, and `race_rows_v3`, the rows the v3
analysis reads (the lab v3 contract, issue 37).

What changes from version 2 (`monitor.lab.records`): one model size; the families carry their
provenance (the folder's `provenance.json`, the sha256 of its files) beside the round trip;
each (family, seed) lineage has its own pinned data assignment (`monitor.lab.assignment`); the
tasks carry `logp_correct`, the continuous primary metric, with its chance level; and the
record names the pre-registration it ran under (`preregistration_sha256`, the sha256 of
`data/lab-v3-preregistration.json` when that file exists, else None). The evaluation texts keep
v2's names: `heldout` (the pool's held-out split, the PRIMARY text, in distribution) and
`calib` (calib-v0, secondary, out of distribution). A run from a folder of families records the
family set it checked at its start (`family_set`: kept and dropped, the Jaccard matrix).

Every number is bounded as in version 2; unknown keys are refused; a file is read bounded and
every problem is one `LabError` line naming it (`monitor.lab.record_file.load_lab` reads v1, v2 and v3).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, field_validator, model_validator

from monitor.errors import LabError
from monitor.lab.record_checks import LabRecordBase, check_checkpoints, check_families_once, check_listed_family, \
    validate_record
from monitor.lab.records import (LOSS_BOUND, Count, PositiveCount, TextScoresV2, _Strict, CheckpointRecordV2,
                                 FamilyRecordV2, LAB_FILE)

LAB_SCHEMA_V3 = "lstar-lab/3"
PRIMARY_TEXT = "heldout"
SECONDARY_TEXT = "calib"
PRIMARY_METRIC = "logp_correct"
V3_METRICS = ("logp_correct", "p_correct", "acc", "exact_match")
V3_AXES = ("lstar", "lstar_oos", "bits_per_byte", "raw_ce", "bytes_seen", "tokens_seen")
SHA256_PATTERN = "^[0-9a-f]{64}$"


class TaskScoresV3(_Strict):
    """One checkpoint on one task: v2's scores and `logp_correct` (mean log-probability of the
    correct option renormalised over the item's options; ≤ 0), with each one's chance level."""

    acc: float = Field(ge=0.0, le=1.0)
    exact_match: float = Field(ge=0.0, le=1.0)
    p_correct: float = Field(ge=0.0, le=1.0)
    logp_correct: float = Field(ge=-LOSS_BOUND, le=0.0)
    brier: float = Field(ge=0.0, le=2.0)
    n: PositiveCount
    baselines: dict[str, float]

    @field_validator("baselines")
    @classmethod
    def _baselines(cls, value: dict[str, float]) -> dict[str, float]:
        if set(value) != set(V3_METRICS):
            raise ValueError(f"baselines must give exactly {', '.join(V3_METRICS)}")
        if not all(0.0 <= value[k] <= 1.0 for k in ("acc", "exact_match", "p_correct")):
            raise ValueError("baselines of acc, exact_match and p_correct must be in [0, 1]")
        if not -1000.0 <= value["logp_correct"] <= 0.0:
            raise ValueError("the logp_correct baseline (mean log(1/n_options)) must be in [-1000, 0]")
        return value


class FamilyRecordV3(FamilyRecordV2):
    """One family: v2's round trip and role, and where its tokenizer comes from."""

    tokenizer_sha256: str = Field(pattern=SHA256_PATTERN)
    provenance: dict[str, Any] | None = None     # the folder's provenance.json, when it has one


class DataAssignmentRecord(_Strict):
    """The pinned data of one (family, seed) lineage (`monitor.lab.assignment.DataAssignment`)."""

    family: str = Field(min_length=1, max_length=100)
    seed: Count
    sample: str = Field(min_length=1, max_length=200)
    spread: float = Field(ge=1.0, le=10.0)
    weights: dict[str, float]
    bytes_by_source: dict[str, Count]
    share_by_source: dict[str, float]
    chunks: PositiveCount
    stream_bytes: PositiveCount
    order_sha256: str = Field(pattern=SHA256_PATTERN)
    rule: str = Field(max_length=2000)

    @model_validator(mode="after")
    def _weights(self) -> "DataAssignmentRecord":
        if not self.weights or any(not 0.0 < w <= 1.0 for w in self.weights.values()) \
                or abs(sum(self.weights.values()) - 1.0) > 1e-9:
            raise ValueError(f"{self.sample}: weights must be in (0, 1] and sum to 1")
        if not self.sample.endswith(self.order_sha256[:12]):
            raise ValueError(f"{self.sample}: the sample id must end with its order_sha256's first 12 digits")
        return self


class FamilySetRecord(_Strict):
    """The family set a run checked at its start (`monitor.lab.family_set`): the candidates in
    pre-registered order, each one's round trip, the boundary-Jaccard matrix of the lossless
    ones (`names`) on calib-v0, which were kept and why the others were dropped, and the families
    the run raced."""

    cutoff: float = Field(gt=0.0, le=1.0)
    min_kept: Count | None = None
    candidates: list[Annotated[str, Field(min_length=1, max_length=100)]] = Field(max_length=1000)
    round_trip: dict[str, Any]
    names: list[str] = Field(max_length=1000)
    matrix: list[list[Annotated[float, Field(ge=0.0, le=1.0)]]]
    kept: list[str]
    dropped: dict[str, Annotated[str, Field(max_length=2000)]]
    raced: list[str]

    @model_validator(mode="after")
    def _consistent(self) -> "FamilySetRecord":
        if any(len(row) != len(self.names) for row in self.matrix) or len(self.matrix) != len(self.names):
            raise ValueError(f"matrix must be {len(self.names)} x {len(self.names)} (one row and column per name)")
        if not set(self.names) <= set(self.candidates) or not set(self.dropped) <= set(self.candidates):
            raise ValueError("names and dropped must be candidates")
        if not set(self.kept) <= set(self.names) or set(self.kept) & set(self.dropped):
            raise ValueError("kept must be lossless candidates (names) and none of them dropped")
        if not set(self.raced) <= set(self.kept):
            raise ValueError(f"raced families {', '.join(sorted(set(self.raced) - set(self.kept)))} are not kept")
        return self


class CheckpointRecordV3(CheckpointRecordV2):
    """One saved checkpoint of one (family, seed) lineage of the one size."""

    tasks: dict[str, TaskScoresV3]
    sample: str = Field(min_length=1, max_length=200)


class LabRecordV3(LabRecordBase):
    """The whole of a version-3 `lab.json`."""

    SCHEMA = LAB_SCHEMA_V3
    preregistration_sha256: str | None = Field(default=None, pattern=SHA256_PATTERN)
    families: list[FamilyRecordV3]
    data: list[DataAssignmentRecord]
    checkpoints: list[CheckpointRecordV3]
    family_set: FamilySetRecord | None = None    # when the run checked a folder of families

    @model_validator(mode="after")
    def _consistent(self) -> "LabRecordV3":
        names = self.family_names()
        check_families_once(names)
        for f in self.families:
            if f.role == "primary" and not f.lossless:
                raise ValueError(f"family {f.family!r} is lossy and cannot be in the primary race")
            if f.role == "primary" and self.family_set is not None and f.family not in self.family_set.kept:
                raise ValueError(f"family {f.family!r} is in the race but not in the family set's kept families")
        samples: dict[tuple[str, int], str] = {}
        for i, d in enumerate(self.data):
            check_listed_family(f"data[{i}]", d.family, names)
            if (d.family, d.seed) in samples:
                raise ValueError(f"data[{i}]: family {d.family!r} seed {d.seed} has two data assignments")
            samples[(d.family, d.seed)] = d.sample
        sizes = {c.size for c in self.checkpoints}
        if len(sizes) > 1:
            raise ValueError(f"lab v3 has one model size, the checkpoints have {', '.join(sorted(sizes))}")

        def of_its_data_assignment(i: int, c: CheckpointRecordV3) -> None:
            if samples.get((c.family, c.seed)) != c.sample:
                raise ValueError(f"checkpoints[{i}]: sample {c.sample!r} is not the data assignment of "
                                 f"{c.family!r} seed {c.seed}")

        check_checkpoints(self.checkpoints, names, key=lambda c: (c.family, c.seed, c.step),
                          describe=lambda c: f"{c.family!r} seed {c.seed} step {c.step}", also=of_its_data_assignment)
        return self


def parse_lab_v3(data: Any, *, where: str = LAB_FILE) -> LabRecordV3:
    """Validate a decoded version-3 lab.json (one LabError line naming the first problem)."""
    return validate_record(LabRecordV3, data, where=where, hint="regenerate it with `lstar lab run3`")


def race_rows_v3(lab: LabRecordV3, *, role: str = "primary") -> list[dict[str, Any]]:
    """One dict per (checkpoint, evaluation text) of the families of `role`, in the file's
    order, with the keys of the lab v3 contract: family, seed, step, bytes_seen, tokens_seen,
    size (constant), text ("heldout" primary, "calib" secondary), axes, metrics, baselines, data."""
    if not isinstance(lab, LabRecordV3):
        raise LabError(f"race_rows_v3 needs a {LAB_SCHEMA_V3} lab record, got {type(lab).__name__}",
                       hint="v2 records are read with monitor.lab.records.race_rows")
    roles = {f.family: f.role for f in lab.families}
    rows: list[dict[str, Any]] = []
    for ck in lab.checkpoints:
        if roles[ck.family] != role:
            continue
        for text in (PRIMARY_TEXT, SECONDARY_TEXT):
            s: TextScoresV2 = ck.texts[text]
            axes = {"lstar": s.lstar, "lstar_oos": s.lstar_oos, "bits_per_byte": s.bits_per_byte,
                    "raw_ce": s.ce, "bytes_seen": float(ck.bytes_seen), "tokens_seen": float(ck.tokens_seen)}
            rows.append({"family": ck.family, "seed": ck.seed, "step": ck.step, "size": ck.size,
                         "bytes_seen": ck.bytes_seen, "tokens_seen": ck.tokens_seen, "text": text, "axes": axes,
                         "metrics": {name: {m: getattr(t, m) for m in V3_METRICS} for name, t in ck.tasks.items()},
                         "baselines": {name: {m: t.baselines[m] for m in V3_METRICS} for name, t in ck.tasks.items()},
                         "data": {"sample": ck.sample}})
    return rows


__all__ = ["DataAssignmentRecord", "FamilyRecordV3", "FamilySetRecord", "LAB_SCHEMA_V3", "LabRecordV3",
           "CheckpointRecordV3",
           "PRIMARY_METRIC", "PRIMARY_TEXT", "SECONDARY_TEXT", "TaskScoresV3", "V3_AXES", "V3_METRICS",
           "parse_lab_v3", "race_rows_v3"]
