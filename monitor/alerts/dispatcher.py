"""The send side of the outbox: group, lease, send, record — at least once, never a flood.

Every notification goes through one pipeline, in this order (Alertmanager's notification
pipeline), each stage a small function below that either hands the next stage what it needs
or says why it stopped:

    silence → disabled receiver → throttle → rate limit → claim → send → record

One pass (`Dispatcher.run_once(now)`) runs it in two halves:

1. flush groups (`flush_groups`), per pending delivery: `silence_delivery` marks one
   matching an active silence silenced (never sent); `disabled_delivery` dead-letters one
   for a disabled receiver; the rest are grouped per (policy, receiver, group labels) and
   `group_throttle` holds each group until it is due (group_wait after its first alert,
   group_interval after its previous message; repeat_interval is applied earlier, when the
   outbox enqueues a delivery); a due group is cut by `group_chunks` (the receiver's
   max_alerts) and frozen by `form_notification` into notifications whose id and body never
   change again;
2. send due notifications (`send_due`), per due notification: `silence_notification`
   (every alert in it silenced now: never sent), `disabled_notification` (the receiver
   was disabled: dead-letter), `throttle` (the receiver asked us to back off until
   `blocked_until`), `rate_limit` (the receiver's per-period budget is spent), `claim`
   (lease it, compare-and-set), `send`, and only then `record` the outcome. A crash between
   the send and the record leaves a lease that expires (a restarted daemon frees it at
   start); the next pass sends the same body with the same webhook-id (at most one re-send, never a loss). Silence comes first, so a
   notification whose alerts are all silenced is marked silenced at once, even while its
   receiver is disabled, throttled or over its rate limit.

Failures retry with full-jitter exponential backoff, never before the server's
Retry-After; 429 (and 502/503/504 with Retry-After) throttle the whole receiver; a
per-receiver rate limit spreads floods out. 410 disables the receiver; permanent errors
and an exhausted retry budget dead-letter the notification with the reason and raise a
meta-alert to another receiver (the policy's `meta_receivers`, else any other one).
Every attempt is recorded. The clock is always passed in.

Fail points: `after_claim_before_send`, `after_send_before_mark`.
"""

from __future__ import annotations

import os
import random
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from monitor.alerts.channels.base import Outgoing, Sender, SendResult, canonical_json
from monitor.alerts.channels.email import EmailSender
from monitor.alerts.channels.filesink import FileSender
from monitor.alerts.channels.webhook import WebhookSender
from monitor.alerts.model import operator_alert
from monitor.alerts.evaluation_tick import evaluate_pending
from monitor.alerts.payload import build_body, notification_id
from monitor.alerts.rules import Silence, group_due_at, next_attempt_at, rate_limit_free_at, silenced_by
from monitor.errors import PolicyError
from monitor.events import event
from monitor.failpoints import failpoint
from monitor.policy import Policy, parse_matcher
from monitor.policy.schema import Receiver
from monitor.store import Store
from monitor.store.rows import DueNotificationRow, NotificationRow, PendingDeliveryRow, SilenceRow

DEFAULT_LEASE = timedelta(minutes=5)

Row = dict[str, Any]
MetaAlert = Callable[..., "dict[str, Any] | None"]  # Dispatcher.meta_alert's signature


def default_senders() -> dict[str, Sender]:
    """One sender per channel kind."""
    return {"webhook": WebhookSender(), "email": EmailSender(), "file": FileSender()}


def silence_from_row(row: SilenceRow) -> Silence:
    """A `Silence` from a `silences` table row (ValueError when a matcher no longer parses)."""
    return Silence(id=row.id, matchers=tuple(parse_matcher(m) for m in row.matchers),
                   starts_at=row.starts_at, ends_at=row.ends_at, comment=row.comment,
                   created_by=row.created_by, expired_at=row.expired_at)


# Ids of stored silences already reported as unreadable by this process (said once, not every pass).
_UNREADABLE_SILENCES: set[str] = set()


def readable_silences(rows: Sequence[SilenceRow]) -> list[Silence]:
    """The silences of `rows` whose matchers parse today.

    A silence stored by an older release may hold a pattern RE2 refuses (a backreference, a
    lookaround): it silences nothing, and an event says so once, so the alerts it would have
    held are sent rather than the dispatcher failing on every pass."""
    silences = []
    for row in rows:
        try:
            silences.append(silence_from_row(row))
        except ValueError as exc:
            if row.id not in _UNREADABLE_SILENCES:
                _UNREADABLE_SILENCES.add(row.id)
                event("silence_unreadable", silence=row.id, reason=str(exc),
                      fix="expire it (lstar silence expire ID) and add it again with an RE2 pattern")
    return silences


@dataclass
class DispatchReport:
    """What one pass did: notifications formed, and each send's outcome."""

    formed: list[str] = field(default_factory=list)
    silenced: int = 0
    sent: list[dict[str, Any]] = field(default_factory=list)
    waiting: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"formed": self.formed, "silenced": self.silenced, "sent": self.sent,
                "waiting": self.waiting}

    def stopped(self, stop: Stop) -> None:
        """Count what a stage that dropped something says about it."""
        self.silenced += stop.silenced
        if stop.waiting is not None:
            self.waiting.append(stop.waiting)


@dataclass(frozen=True)
class Stop:
    """Why a stage dropped a delivery or a notification for this pass.

    waiting: a line for the report's `waiting` list (None: nothing to say, e.g. another
    dispatcher holds the notification); silenced: how many alerts the stage silenced.
    """

    waiting: str | None = None
    silenced: int = 0


def receiver_disabled(store: Store, policy: str, receiver: str) -> str | None:
    """Why `receiver` of `policy` is disabled (410 Gone), or None while it is enabled."""
    state = store.endpoint(policy, receiver)
    if state is not None and state.disabled_at is not None:
        return state.disabled_reason or "disabled"
    return None


def all_silenced(body: Mapping[str, Any], silences: Sequence[Silence], now: datetime) -> Silence | None:
    """A silence covering every alert of a notification body (None: at least one is not silenced)."""
    found = None
    for alert in body.get("alerts", []):
        found = silenced_by(silences, alert["labels"], now)
        if found is None:
            return None
    return found


# -- stages for a pending delivery (before it is grouped) ------------------------------------------
def silence_delivery(store: Store, delivery: PendingDeliveryRow, silences: Sequence[Silence],
                     now: datetime) -> Stop | None:
    """Stage silence: a delivery whose labels match an active silence is marked silenced."""
    silence = silenced_by(silences, delivery.labels, now)
    if silence is None:
        return None
    n = store.set_deliveries_status([delivery.id], "silenced", now=now, silence_id=silence.id,
                                    reason=f"silenced by {silence.id}")
    return Stop(silenced=n)


def disabled_delivery(store: Store, delivery: PendingDeliveryRow, now: datetime) -> Stop | None:
    """Stage disabled receiver: a delivery to a disabled receiver is dead-lettered."""
    disabled = receiver_disabled(store, delivery.policy, delivery.receiver)
    if disabled is None:
        return None
    store.set_deliveries_status([delivery.id], "dead", now=now,
                                reason=f"receiver {delivery.receiver} is disabled: {disabled}")
    return Stop()


def group_throttle(key: str, receiver: str, last: datetime | None, members: Sequence[PendingDeliveryRow],
                   now: datetime) -> Stop | None:
    """Stage throttle for a group: it waits group_wait after its first alert and
    group_interval after its previous notification (`last`: when that was created, or None)."""
    due = group_due_at(min(m.created_at for m in members), last,
                       group_wait=timedelta(seconds=min(m.group_wait_s for m in members)),
                       group_interval=timedelta(seconds=min(m.group_interval_s for m in members)))
    if due > now:
        return Stop(f"group {key} of {receiver}: due at {due.isoformat()}")
    return None


def group_chunks(policy: Policy, receiver: str,
                 members: list[PendingDeliveryRow]) -> list[list[PendingDeliveryRow]] | Stop:
    """A due group cut into notifications of at most the receiver's `max_alerts` alerts."""
    try:
        found = policy.receiver(receiver)
    except PolicyError:
        return Stop(f"receiver {receiver} is no longer in policy {policy.name}")
    size = found.webhook.max_alerts if found.webhook is not None else 0
    return [members[i:i + size] for i in range(0, len(members), size)] if size else [members]


def form_notification(store: Store, policy: Policy, receiver: str, key: str,
                      members: Sequence[PendingDeliveryRow], now: datetime) -> str | None:
    """Freeze grouped deliveries into one notification; its id (None: it already exists)."""
    alerts = store.alerts_by_id([m.alert_id for m in members])
    body = build_body(policy=policy.name, receiver=receiver, group_key=key,
                      group_labels=members[0].group_labels, alerts=[a.as_dict() for a in alerts],
                      external_url=policy.external_url)
    metas = [a for a in alerts if a.kind == "meta"]
    if metas:
        body["lstar"]["meta"] = [a.numbers for a in metas]
    nid = notification_id(policy.name, receiver, key, [a.alert_key for a in alerts])
    created = store.create_notification(
        {"id": nid, "policy": policy.name, "receiver": receiver, "group_key": key,
         "body": canonical_json(body), "n_alerts": len(alerts), "is_meta": bool(metas)},
        [m.id for m in members], now=now)
    return nid if created else None


# -- stages for a due notification -------------------------------------------------------------------
def silence_notification(store: Store, notification: str, silences: Sequence[Silence],
                         now: datetime) -> NotificationRow | Stop:
    """Stage silence: the notification's row, unless every alert in it is silenced now
    (then it is marked silenced and never sent)."""
    row = store.notification(notification)
    if row is None:
        return Stop()
    silence = all_silenced(row.payload(), silences, now)
    if silence is None:
        return row
    silenced = store.silence_notification(row.id, silence_id=silence.id, now=now)
    return Stop(silenced=row.n_alerts if silenced else 0)


def disabled_notification(store: Store, policy: Policy, receiver: str, now: datetime) -> Stop | None:
    """Stage disabled receiver: every pending notification of a disabled receiver is dead-lettered."""
    disabled = receiver_disabled(store, policy.name, receiver)
    if disabled is None:
        return None
    reason = f"receiver {receiver} is disabled: {disabled}"
    for nid in store.kill_notifications(policy.name, receiver, now=now, reason=reason):
        event("dead_lettered", notification=nid, policy=policy.name, receiver=receiver, reason=reason)
    return Stop()


def throttle(store: Store, policy: Policy, receiver: str, notification: str, now: datetime) -> Stop | None:
    """Stage throttle: nothing goes to a receiver before the `blocked_until` its Retry-After set."""
    state = store.endpoint(policy.name, receiver)
    if state is not None and state.blocked_until is not None and state.blocked_until > now:
        return Stop(f"{notification}: {receiver} throttled until {state.blocked_until.isoformat()}")
    return None


def rate_limit(store: Store, policy: Policy, receiver: str, notification: str,
               now: datetime) -> Receiver | Stop:
    """Stage rate limit: the receiver's settings, unless its `max` sends `per` period are spent."""
    try:
        found = policy.receiver(receiver)
    except PolicyError:
        return Stop(f"{notification}: receiver {receiver} is no longer in policy {policy.name}")
    limit = found.rate_limit
    free_at = rate_limit_free_at(store.attempt_times(policy.name, receiver, since=now - limit.per),
                                 now=now, max_count=limit.max, per=limit.per)
    if free_at is not None:
        return Stop(f"{notification}: {receiver} rate limit ({limit.max} per {limit.per}) frees at "
                    f"{free_at.isoformat()}")
    return found


def claim(store: Store, notification: str, owner: str, lease: timedelta, now: datetime) -> NotificationRow | Stop:
    """Stage claim: lease the notification (compare-and-set); a Stop when another owner holds it."""
    claimed = store.claim_notification(notification, owner, now=now, lease_s=lease.total_seconds())
    return Stop() if claimed is None else claimed


def send(senders: Mapping[str, Sender], policy: Policy, receiver: Receiver, row: NotificationRow,
         now: datetime) -> SendResult:
    """Stage send: one attempt through the receiver's channel; a sender bug costs an attempt."""
    message = Outgoing(id=row.id, policy=policy.name, receiver=receiver.name, body=row.payload())
    failpoint("after_claim_before_send")
    try:
        result = senders[receiver.kind].send(message, receiver, policy, now=now)
    except Exception as exc:  # a sender bug must cost an attempt, not wedge the notification
        result = SendResult("retry", None, f"internal error in the {receiver.kind} sender: {exc!r}"[:300])
    failpoint("after_send_before_mark")
    return result


def record(store: Store, owner: str, rng: random.Random, policy: Policy, receiver: Receiver,
           row: NotificationRow, result: SendResult, now: datetime, meta_alert: MetaAlert) -> Row:
    """Stage record: the attempt and what follows from it (delivered, retry later, dead-lettered
    with a meta-alert from `meta_alert`); returns the outcome for the report."""
    attempts = int(row.attempts)
    attempt = {"started_at": now, "outcome": result.outcome, "status_code": result.status_code,
               "error": result.error, "retry_after_s": result.retry_after_s}
    outcome = {"id": row.id, "receiver": receiver.name, "attempt": attempts,
               "outcome": result.outcome, "status_code": result.status_code, "error": result.error}
    ids = {"notification": row.id, "policy": policy.name, "receiver": receiver.name, "attempt": attempts,
           "alerts": int(row.n_alerts)}
    if result.outcome == "delivered":
        store.finish_notification(row.id, owner, status="delivered", attempt=attempt, now=now)
        event("delivered", **ids, status_code=result.status_code)
        return outcome
    if result.outcome == "retry" and attempts < receiver.retry.max_attempts:
        retry_after = timedelta(seconds=result.retry_after_s) if result.retry_after_s is not None else None
        when = next_attempt_at(now, attempts, initial=receiver.retry.initial_backoff,
                               cap=receiver.retry.max_backoff, uniform=rng.random(),
                               retry_after=retry_after)
        endpoint = {"blocked_until": when} if result.throttle else None
        store.finish_notification(row.id, owner, status="pending", attempt=attempt, now=now,
                                  next_attempt_at=when, error=result.error, endpoint=endpoint)
        outcome["next_attempt_at"] = when
        event("retried", **ids, status_code=result.status_code, error=result.error, next_attempt_at=when)
        return outcome
    if result.outcome == "retry":
        reason = f"gave up after {attempts} attempts: {result.error}"
        attempt["outcome"] = "dead"
    elif result.outcome == "gone":
        reason = result.error or "HTTP 410 Gone"
    else:
        reason = result.error or "permanent failure"
    meta = meta_alert(policy, receiver.name, row.id, reason, now=now,
                      is_meta=bool(row.is_meta), disabled=result.outcome == "gone")
    endpoint = {"disabled_reason": reason} if result.outcome == "gone" else None
    if meta is None and not row.is_meta:
        reason += "; no other receiver to tell the operator"
    store.finish_notification(row.id, owner, status="dead", attempt=attempt, now=now,
                              error=reason, endpoint=endpoint, meta_alert=meta)
    event("dead_lettered", **ids, status_code=result.status_code, reason=reason)
    if result.outcome == "gone":
        gone = f"receiver {receiver.name} is disabled: {reason}"
        for nid in store.kill_notifications(policy.name, receiver.name, now=now, reason=gone):
            event("dead_lettered", notification=nid, policy=policy.name, receiver=receiver.name, reason=gone)
    outcome["dead_reason"] = reason
    return outcome


class Dispatcher:
    """Sends the outbox of `policies` through their receivers.

    senders: {"webhook"|"email"|"file": Sender}; rng: the jitter source (seed it in tests);
    lease: how long a claimed notification is ours (longer than any send's timeout).
    """

    def __init__(self, store: Store, policies: Sequence[Policy], *, senders: Mapping[str, Sender] | None = None,
                 owner: str | None = None, lease: timedelta = DEFAULT_LEASE,
                 rng: random.Random | None = None) -> None:
        self.store = store
        self.policies = {p.name: p for p in policies}
        self.senders = dict(senders) if senders is not None else default_senders()
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}"
        self.lease = lease
        self.rng = rng or random.Random()

    # -- 1. deliveries -> notifications: silence, disabled receiver, throttle, form ----------------
    def flush_groups(self, now: datetime, report: DispatchReport | None = None) -> DispatchReport:
        """Silence, dead-letter or group pending deliveries; freeze due groups into notifications."""
        report = report or DispatchReport()
        silences = readable_silences(self.store.silences(active_at=now))
        groups: dict[tuple[str, str, str], list[PendingDeliveryRow]] = {}
        for d in self.store.pending_deliveries():
            if d.policy not in self.policies:
                report.waiting.append(f"delivery {d.id}: policy {d.policy} is not loaded")
                continue
            stop = silence_delivery(self.store, d, silences, now) or disabled_delivery(self.store, d, now)
            if stop is not None:
                report.stopped(stop)
                continue
            groups.setdefault((d.policy, d.receiver, d.group_key), []).append(d)
        # each group's previous notification, read at once (forming one group changes only its own)
        last_sent = self.store.last_notification_times(list(groups))
        for (policy_name, receiver, key), members in groups.items():
            policy = self.policies[policy_name]
            stop = group_throttle(key, receiver, last_sent.get((policy_name, receiver, key)), members, now)
            chunks = stop if stop is not None else group_chunks(policy, receiver, members)
            if isinstance(chunks, Stop):
                report.stopped(chunks)
                continue
            for chunk in chunks:
                nid = form_notification(self.store, policy, receiver, key, chunk, now)
                if nid is not None:
                    report.formed.append(nid)
        return report

    # -- 2. due notifications: the pipeline, one notification at a time ----------------------------
    def send_due(self, now: datetime, report: DispatchReport | None = None) -> DispatchReport:
        """Run every due notification through the pipeline (silence → disabled receiver →
        throttle → rate limit → claim → send → record); a stage that drops one ends its pass."""
        report = report or DispatchReport()
        silences = readable_silences(self.store.silences(active_at=now))
        for cand in self.store.due_notifications(now):
            outcome = self.deliver(cand, silences, now)
            if isinstance(outcome, Stop):
                report.stopped(outcome)
            else:
                report.sent.append(outcome)
        return report

    def deliver(self, cand: DueNotificationRow, silences: Sequence[Silence], now: datetime) -> Row | Stop:
        """The pipeline for one due notification: its send outcome, or the first stage's Stop."""
        policy = self.policies.get(cand.policy)
        if policy is None:
            return Stop(f"{cand.id}: policy {cand.policy} is not loaded")
        row = silence_notification(self.store, cand.id, silences, now)
        if isinstance(row, Stop):
            return row
        name = row.receiver
        stop = (disabled_notification(self.store, policy, name, now)
                or throttle(self.store, policy, name, row.id, now))
        if stop is not None:
            return stop
        receiver = rate_limit(self.store, policy, name, row.id, now)
        if isinstance(receiver, Stop):
            return receiver
        claimed = claim(self.store, row.id, self.owner, self.lease, now)
        if isinstance(claimed, Stop):
            return claimed
        result = send(self.senders, policy, receiver, claimed, now)
        return record(self.store, self.owner, self.rng, policy, receiver, claimed, result, now,
                      self.meta_alert)

    # -- meta-alerts --------------------------------------------------------------------------
    def operator_receiver(self, policy: Policy, failed: str) -> str | None:
        """Who hears about a failure of `failed`: the first usable meta receiver, else any other."""
        names = policy.meta_receivers or [r.name for r in policy.receivers]
        for name in names:
            if name != failed and receiver_disabled(self.store, policy.name, name) is None:
                return name
        return None

    def meta_alert(self, policy: Policy, failed: str, notification: str, reason: str, *, now: datetime,
                   is_meta: bool, disabled: bool) -> dict[str, Any] | None:
        """The alert telling the operator a notification was dead-lettered (None: nobody to tell).

        A failed meta-alert raises no further meta-alert, so two broken receivers cannot
        ping-pong.
        """
        if is_meta:
            return None
        target = self.operator_receiver(policy, failed)
        if target is None:
            return None
        what = "disabled" if disabled else "dead"
        summary = (f"receiver {failed} of policy {policy.name} was disabled" if disabled else
                   f"a notification to receiver {failed} of policy {policy.name} was dead-lettered")
        numbers = {"failed_receiver": failed, "notification_id": notification, "reason": reason,
                   "disabled": disabled}
        return operator_alert(policy.name, subject=failed, key=(failed, notification, what), state=what,
                              receiver=target, summary=summary, description=reason, numbers=numbers,
                              now=now, labels={"receiver": failed}).as_row()

    def run_once(self, now: datetime) -> DispatchReport:
        """Flush due groups and send what is due; a meta-alert raised by a failure in this
        pass is flushed and sent in the same pass (its group has no wait)."""
        report = self.flush_groups(now)
        for _ in range(3):
            before = len(report.sent)
            self.send_due(now, report)
            if not any(s.get("dead_reason") for s in report.sent[before:]):
                break
            formed = len(report.formed)
            self.flush_groups(now, report)
            if len(report.formed) == formed:
                break
        return report


def run_pass(store: Store, policies: Sequence[Policy], *, now: datetime, evaluate: bool = True,
             dispatcher: Dispatcher | None = None) -> dict[str, Any]:
    """One outbox pass: evaluate new scores (optional), flush due groups, send what is due."""
    evaluated = evaluate_pending(store, policies, now=now).as_dict() if evaluate else None
    report = (dispatcher or Dispatcher(store, policies)).run_once(now)
    return {"evaluated": evaluated, **report.as_dict()}
