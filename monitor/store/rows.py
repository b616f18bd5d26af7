"""Typed rows: what the store's read methods return, one frozen dataclass per query shape.

A row is built from a query result by column name (`Row.from_row`), and a query that gives a
column the class does not name, or lacks one it does, is refused at once rather than read
wrongly later. The fields follow the columns' order, so `as_dict()` gives the keys and values
the JSON output of the API and the CLI has always had. JSON columns arrive decoded, except
where a class says it keeps the stored text (a notification's body, a score run's JSON columns).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any, TypeVar

from monitor.errors import StoreError

_R = TypeVar("_R", bound="Row")

# The `score_runs` columns added with per-axis standard errors (migration 0009).
AXIS_COLUMNS = ("lstar_per_byte", "se_bits_per_byte", "se_lstar_per_byte", "se_l_rel", "se_l_gain")
# What an evaluation candidate carries besides L* and its SE, to read any axis.
EVALUATION_AXIS_COLUMNS = ("ce", "ce_unigram", "l_rel", "l_gain", "bits_per_byte", "tokens_per_byte",
                           *AXIS_COLUMNS, "model")


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}   # each row class's field names, read once
_FIELD_SETS: dict[type, frozenset[str]] = {}     # the same, as a set


@dataclass(frozen=True)
class Row:
    """Base of the typed rows: construction by column name and the dict view for JSON."""

    @classmethod
    def from_row(cls: type[_R], row: Mapping[str, Any]) -> _R:
        """The row of `cls` holding the columns of `row`, which must be exactly its fields."""
        names, keys = _FIELD_NAMES.get(cls), _FIELD_SETS.get(cls)
        if names is None or keys is None:   # the first call (or another thread's, half done)
            names = tuple(f.name for f in fields(cls))
            keys = _FIELD_SETS[cls] = frozenset(names)
            _FIELD_NAMES[cls] = names
        if row.keys() == keys:  # the common case, compared as sets (a report reads 10^5 rows)
            return cls(**row)
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
        """The row as a dict of its columns, in column order (the JSON output's keys); rows
        nested in it (an alert's deliveries) become dicts too."""
        return {f.name: _plain(getattr(self, f.name)) for f in fields(self)}


def _plain(value: Any) -> Any:
    if isinstance(value, Row):
        return value.as_dict()
    if isinstance(value, list) and value and isinstance(value[0], Row):
        return [v.as_dict() for v in value]
    return value


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
    meta: dict[str, Any]


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


# -- notifications ------------------------------------------------------------------------------
@dataclass(frozen=True)
class DueNotificationRow(Row):
    """A pending notification whose next attempt is due (the columns the dispatcher picks by)."""

    id: str
    policy: str
    receiver: str
    attempts: int
    next_attempt_at: datetime
    created_at: datetime


@dataclass(frozen=True)
class NotificationRow(Row):
    """One message to one receiver (`notifications` table). `body` stays the JSON text frozen at
    creation, the bytes every retry sends; `payload()` decodes it."""

    id: str
    policy: str
    receiver: str
    group_key: str
    status: str
    body: str
    n_alerts: int
    is_meta: bool
    attempts: int
    next_attempt_at: datetime
    lease_owner: str | None
    lease_expires_at: datetime | None
    last_error: str | None
    dead_reason: str | None
    created_at: datetime
    updated_at: datetime
    delivered_at: datetime | None
    lease_started_at: datetime | None   # when the lease's attempt started (None: no lease)

    def payload(self) -> dict[str, Any]:
        """The body decoded."""
        return json.loads(self.body)


@dataclass(frozen=True)
class DeliveryAttemptRow(Row):
    """One attempt to send a notification (`delivery_attempts` table)."""

    id: int
    notification_id: str
    policy: str
    receiver: str
    attempt: int
    started_at: datetime
    outcome: str
    status_code: int | None
    error: str | None
    retry_after_s: float | None
    next_attempt_at: datetime | None


@dataclass(frozen=True)
class EndpointRow(Row):
    """Whether a policy's receiver is disabled (410 Gone) or throttled (`endpoints` table)."""

    policy: str
    receiver: str
    disabled_at: datetime | None
    disabled_reason: str | None
    blocked_until: datetime | None
    updated_at: datetime


@dataclass(frozen=True)
class SilenceRow(Row):
    """A silence (`silences` table; matchers decoded, as "name=value" / "name=~regex" strings)."""

    id: str
    matchers: list[str]
    starts_at: datetime
    ends_at: datetime
    comment: str
    created_by: str
    created_at: datetime
    expired_at: datetime | None


@dataclass(frozen=True)
class ReclaimedLease(Row):
    """A lease a starting daemon freed because its holder had died: the attempt it was making."""

    table: str               # checkpoints | notifications
    id: str                  # the checkpoint id, or the notification id (its webhook-id)
    owner: str               # the dead holder
    attempt: int
    started_at: datetime     # when that attempt started


# -- checkpoints --------------------------------------------------------------------------------
@dataclass(frozen=True)
class CheckpointRow(Row):
    """A checkpoint and its place in the queue (`checkpoints` table; refs and meta decoded)."""

    id: int
    repo: str
    sha: str
    source: str
    refs: list[str]
    lineage: str
    rule: str | None
    discovered_at: datetime
    updated_at: datetime
    status: str
    reason: str | None
    attempts: int
    lease_owner: str | None
    lease_expires_at: datetime | None
    meta: dict[str, Any]


# -- scores -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ScoreRunRow(Row):
    """One score run (`score_runs` table). The JSON columns (slices, tcb, spec, model,
    library_versions) stay the stored JSON text."""

    run_id: str
    checkpoint_id: int | None
    model_repo: str
    model_sha: str
    model_source: str
    tokenizer_fingerprint: str
    corpus_sha256: str
    spec_version: str
    window_len: int
    stride: int
    prefix_policy: str
    dtype: str
    device: str
    n_tokens: int
    n_bytes: int
    nll_sum: float
    ce: float
    ce_unigram: float
    lstar: float
    l_rel: float
    l_gain: float
    bits_per_byte: float
    tokens_per_byte: float
    se_ce: float
    weighted_ppl: float | None
    reference_fingerprint: str | None
    slices: str
    tcb: str | None
    spec: str
    model: str
    library_versions: str
    wall_s: float
    tokens_per_s: float
    finished_at: datetime
    lstar_per_byte: float | None = None
    se_bits_per_byte: float | None = None
    se_lstar_per_byte: float | None = None
    se_l_rel: float | None = None
    se_l_gain: float | None = None
    partial: bool = False            # a sequential score that stopped before the selection's end
    sequential: str | None = None    # its record (JSON text): documents, tokens, reason, bound


@dataclass(frozen=True)
class ScoredRunRef(Row):
    """A score run that measured given content (`score_digests` joined to `score_runs`): what a
    checkpoint with the same weights, files, options and corpus links its score to."""

    run_id: str
    checkpoint_id: int | None


@dataclass(frozen=True)
class ScoreDocumentRow(Row):
    """One document's share of a score run (`score_documents` table)."""

    doc_id: str
    slice: str
    n_tokens: int
    nll: float
    n_bytes: int


@dataclass(frozen=True)
class CheckpointScoreRow(Row):
    """A score run as joining labels reads it: L*, its SE, raw CE, corpus, spec and model info
    (model decoded)."""

    run_id: str
    model_repo: str
    model_sha: str
    corpus_sha256: str
    spec_version: str
    window_len: int
    stride: int
    prefix_policy: str
    lstar: float
    se_ce: float
    ce: float
    model: dict[str, Any]
    finished_at: datetime
    ce_unigram: float
    l_rel: float
    l_gain: float
    bits_per_byte: float
    tokens_per_byte: float
    lstar_per_byte: float | None
    se_bits_per_byte: float | None
    se_lstar_per_byte: float | None
    se_l_rel: float | None
    se_l_gain: float | None
    partial: bool = False


# -- alerts -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class EvaluationCandidateRow(Row):
    """A score run a (policy, task) has not evaluated: its numbers, spec, and the checkpoint's
    lineage (else the repo) and watch rule."""

    run_id: str
    repo: str
    commit_sha: str
    lstar: float
    se: float
    corpus_sha256: str
    finished_at: datetime
    lineage: str
    rule: str | None
    spec_version: str
    window_len: int
    stride: int
    prefix_policy: str
    # every score axis (monitor.curves.axes), the curve's axis is read from these
    ce: float | None = None
    ce_unigram: float | None = None
    l_rel: float | None = None
    l_gain: float | None = None
    bits_per_byte: float | None = None
    tokens_per_byte: float | None = None
    lstar_per_byte: float | None = None
    se_bits_per_byte: float | None = None
    se_lstar_per_byte: float | None = None
    se_l_rel: float | None = None
    se_l_gain: float | None = None
    model: str | None = None

    def axis_columns(self) -> dict[str, Any]:
        """The columns `monitor.curves.axes.axis_value` reads, by name."""
        return {"run_id": self.run_id, "lstar": self.lstar, "se_ce": self.se,
                **{k: getattr(self, k) for k in EVALUATION_AXIS_COLUMNS}}
    partial: bool = False
    sequential: str | None = None


@dataclass(frozen=True)
class LatestScoreRow(Row):
    """The newest score run of a commit on a corpus: its id, L* and SE."""

    run_id: str
    lstar: float
    se: float
    finished_at: datetime


@dataclass(frozen=True)
class FiringAlertRow(Row):
    """The newest firing alert of a lineage, as alert decisions read it (labels decoded)."""

    id: int
    labels: dict[str, str]
    starts_at: datetime
    state: str
    commit_sha: str


@dataclass(frozen=True)
class ReceiverSends(Row):
    """When a receiver was last sent a firing and a resolved alert of a lineage."""

    last_firing_at: datetime | None
    last_resolved_at: datetime | None


@dataclass(frozen=True)
class LineageHistory:
    """What alert decisions for (policy, task, lineage) depend on: the lineage's state (that of
    its current checkpoint in training order, `monitor.training_order`; None if never
    evaluated), the newest firing alert (or None), and the sends per receiver over deliveries
    that were not silenced.

    `current` is the commit of that current checkpoint; `behind_current` is true when the
    checkpoint being evaluated is EARLIER in training order than it (an earlier checkpoint
    scored late): its prediction is recorded, but it does not change the lineage's alert state."""

    state: str | None
    last_firing: FiringAlertRow | None
    receivers: dict[str, ReceiverSends]
    current: str | None = None
    behind_current: bool = False


@dataclass(frozen=True)
class PendingDeliveryRow(Row):
    """A delivery not yet put into a notification, with its alert's labels and kind
    (group_labels and labels decoded)."""

    id: int
    alert_id: int
    policy: str
    receiver: str
    group_key: str
    group_labels: dict[str, str]
    group_wait_s: float
    group_interval_s: float
    created_at: datetime
    labels: dict[str, str]
    kind: str


@dataclass(frozen=True)
class AlertRow(Row):
    """One alert (`alerts` table; labels, annotations and numbers decoded)."""

    id: int
    alert_key: str
    kind: str
    policy: str
    task: str
    repo: str
    commit_sha: str
    lineage: str
    state: str
    status: str
    prediction_id: int | None
    labels: dict[str, str]
    annotations: dict[str, str]
    numbers: dict[str, Any]
    fingerprint: str
    starts_at: datetime
    ends_at: datetime | None
    created_at: datetime


@dataclass(frozen=True)
class DeliverySummaryRow(Row):
    """Where one delivery of an alert stands, as `lstar alerts list` shows it."""

    receiver: str
    status: str
    reason: str | None
    notification_id: str | None


@dataclass(frozen=True)
class AlertSummaryRow(Row):
    """An alert as `lstar alerts list` shows it, with its deliveries."""

    id: int
    created_at: datetime
    kind: str
    policy: str
    task: str
    repo: str
    commit_sha: str
    state: str
    status: str
    deliveries: list[DeliverySummaryRow]


@dataclass(frozen=True)
class DeliveryRow(Row):
    """One delivery of an alert to a receiver (`deliveries` table; group_labels as stored)."""

    id: int
    alert_id: int
    policy: str
    receiver: str
    group_key: str
    group_labels: str
    group_wait_s: float
    group_interval_s: float
    status: str
    notification_id: str | None
    silence_id: str | None
    reason: str | None
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True)
class NotificationAttemptsRow(Row):
    """A notification carrying an alert, with every attempt to send it."""

    id: str
    receiver: str
    status: str
    attempts: int
    next_attempt_at: datetime
    last_error: str | None
    dead_reason: str | None
    created_at: datetime
    delivered_at: datetime | None
    attempts_log: list[DeliveryAttemptRow]


@dataclass(frozen=True)
class AlertDetailRow(AlertRow):
    """One alert with its deliveries, the notifications that carry it (each with its attempts)
    and the prediction that raised it, as `lstar alerts show` shows it."""

    deliveries: list[DeliveryRow]
    notifications: list[NotificationAttemptsRow]
    prediction: PredictionRow | None


# -- scores that could not be evaluated ---------------------------------------------------------
@dataclass(frozen=True)
class NotEvaluatedRow(Row):
    """A (score run, policy, task) recorded `not_evaluated`, with the reason (`predictions`)."""

    policy: str
    task: str
    run_id: str
    repo: str
    commit_sha: str
    lineage: str
    curve_id: str | None
    reason: str
    evaluated_at: datetime


@dataclass(frozen=True)
class EvaluationGapRow(Row):
    """A stretch of time in which a policy's scores could not be evaluated (`evaluation_gaps`)."""

    id: int
    policy: str
    reason: str
    started_at: datetime
    ended_at: datetime | None
    alerted_at: datetime | None
