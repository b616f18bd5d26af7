"""Typed rows: what the store's read methods return, one frozen dataclass per query shape.

A row is built from a query result by column name (`Row.from_row`), and a query that gives a
column the class does not name, or lacks one it does, is refused at once rather than read
wrongly later. The fields follow the columns' order, so `as_dict()` gives the keys and values
the JSON output of the API and the CLI has always had. JSON columns arrive decoded.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any, TypeVar

from monitor.errors import StoreError

_R = TypeVar("_R", bound="Row")


@dataclass(frozen=True)
class Row:
    """Base of the typed rows: construction by column name and the dict view for JSON."""

    @classmethod
    def from_row(cls: type[_R], row: Mapping[str, Any]) -> _R:
        """The row of `cls` holding the columns of `row`, which must be exactly its fields."""
        names = [f.name for f in fields(cls)]
        missing = [n for n in names if n not in row]
        extra = [c for c in row if c not in names]
        if missing or extra:
            what = "; ".join(part for part in (
                f"lacks {', '.join(missing)}" if missing else "",
                f"has {', '.join(extra)} that it does not name" if extra else "") if part)
            raise StoreError(f"the query for {cls.__name__} {what}",
                             hint=f"make the query's columns and the fields of {cls.__name__} "
                                  f"(monitor/store/rows.py) the same")
        return cls(**{n: row[n] for n in names})

    def as_dict(self) -> dict[str, Any]:
        """The row as a dict of its columns, in column order (the JSON output's keys)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


# -- reports ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ReportRow(Row):
    """A recorded governance report (`reports` table; summary and deliveries decoded)."""

    id: int
    policy: str
    name: str
    period_start: datetime
    period_end: datetime
    folder: str
    summary: dict[str, Any]
    deliveries: list[dict[str, Any]]
    created_at: datetime


@dataclass(frozen=True)
class ReportScoreRow(Row):
    """A score run as a report reads it: the numbers, with its checkpoint's lineage, rule, refs
    and discovery time (tcb and refs decoded)."""

    run_id: str
    repo: str
    commit_sha: str
    tokenizer_fingerprint: str
    corpus_sha256: str
    n_tokens: int
    ce: float
    ce_unigram: float
    lstar: float
    se_ce: float
    bits_per_byte: float
    tcb: dict[str, Any] | None
    finished_at: datetime
    lineage: str
    rule: str | None
    refs: list[str]
    discovered_at: datetime | None


@dataclass(frozen=True)
class PredictionRow(Row):
    """One evaluation of a policy's task on a score run (`predictions` table; detail decoded)."""

    id: int
    policy: str
    task: str
    run_id: str
    repo: str
    commit_sha: str
    lineage: str
    corpus_sha256: str
    lstar: float
    se: float
    p_hat: float | None
    lo: float | None
    hi: float | None
    threshold: float | None
    state: str
    curve_id: str | None
    detail: dict[str, Any]
    evaluated_at: datetime


# -- labels -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LabelRow(Row):
    """A task label of one checkpoint (`labels` table; details decoded)."""

    id: int
    repo: str
    sha: str
    checkpoint: str
    family: str | None
    task: str
    metric: str
    value: float
    stderr: float | None
    n: int | None
    source: str
    source_ref: str
    eval_run_id: str | None
    score_run_id: str | None
    details: dict[str, Any]
    created_at: datetime


@dataclass(frozen=True)
class EvalRunRow(Row):
    """A run of the built-in task evaluator (`eval_runs` table; metrics and model decoded)."""

    run_id: str
    model_repo: str
    model_sha: str
    model_source: str
    task: str
    task_sha256: str
    n_items: int
    item_limit: int | None
    tokenizer_fingerprint: str
    dtype: str
    device: str
    metrics: dict[str, Any]
    model: dict[str, Any]
    wall_s: float
    finished_at: datetime


# -- hub ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class WatermarkRow(Row):
    """Where a watch rule's last completed poll stopped: the newest lastModified, and the repo
    ids listed at exactly that time (boundary decoded)."""

    last_modified: datetime
    boundary: list[str]


@dataclass(frozen=True)
class HubPollRow(Row):
    """One poll of one watch rule (`hub_polls` table)."""

    id: int
    rule_key: str
    rule_name: str
    polled_at: datetime
    ok: bool
    listed: int
    new_rows: int
    requests: int
    error: str | None


@dataclass(frozen=True)
class HubStateRow(Row):
    """The circuit and rate-limit state of a Hub endpoint (the saved columns of `hub_state`)."""

    consecutive_failures: int
    circuit_open_until: datetime | None
    blocked_until: datetime | None
    last_error: str | None
    last_success_at: datetime | None


@dataclass(frozen=True)
class HubOutageRow(Row):
    """One Hub outage: from the circuit opening to the first success (`hub_outages` table)."""

    id: int
    endpoint: str
    started_at: datetime
    ended_at: datetime | None
    failures: int
    last_error: str | None
    alerted_at: datetime | None
