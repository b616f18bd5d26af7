"""The send side of the outbox: group, lease, send, record — at least once, never a flood.

One pass (`Dispatcher.run_once(now)`):

1. flush groups: pending deliveries matching an active silence are marked silenced (never
   sent); those for a disabled receiver are dead-lettered; the rest are grouped per
   (policy, receiver, group labels) and, once the group is due (group_wait after its first
   alert, group_interval after its previous message), frozen into one notification whose
   id and body never change again;
2. send due notifications: lease one (compare-and-set), send, and only then mark it
   delivered. A crash between the send and the mark leaves a lease that expires; the next
   pass sends the same body with the same webhook-id (at most one re-send, never a loss).

Failures retry with full-jitter exponential backoff, never before the server's
Retry-After; 429 (and 502/503/504 with Retry-After) throttle the whole receiver; a
per-receiver rate limit spreads floods out. 410 disables the receiver; permanent errors
and an exhausted retry budget dead-letter the notification with the reason and raise a
meta-alert to another receiver (the policy's `meta_receivers`, else any other one).
Every attempt is recorded. The clock is always passed in.

Fail points: `after_claim_before_send`, `after_send_before_mark`.
"""

from __future__ import annotations

import json
import os
import random
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from monitor.alerts.channels.base import Outgoing, Sender, SendResult, canonical_json
from monitor.alerts.channels.email import EmailSender
from monitor.alerts.channels.filesink import FileSender
from monitor.alerts.channels.webhook import WebhookSender
from monitor.alerts.model import operator_alert
from monitor.alerts.outbox import evaluate_pending
from monitor.alerts.payload import build_body, notification_id
from monitor.alerts.rules import Silence, group_due_at, next_attempt_at, rate_limit_free_at, silenced_by
from monitor.errors import PolicyError
from monitor.failpoints import failpoint
from monitor.policy import Policy, parse_matcher
from monitor.store import Store

DEFAULT_LEASE = timedelta(minutes=5)


def default_senders() -> dict[str, Sender]:
    """One sender per channel kind."""
    return {"webhook": WebhookSender(), "email": EmailSender(), "file": FileSender()}


def silence_from_row(row: Mapping[str, Any]) -> Silence:
    """A `Silence` from a `silences` table row."""
    return Silence(id=row["id"], matchers=tuple(parse_matcher(m) for m in row["matchers"]),
                   starts_at=row["starts_at"], ends_at=row["ends_at"], comment=row["comment"],
                   created_by=row["created_by"], expired_at=row["expired_at"])


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

    # -- 1. groups -> notifications ---------------------------------------------------------
    def _disabled(self, policy: str, receiver: str) -> str | None:
        state = self.store.endpoint(policy, receiver)
        if state is not None and state["disabled_at"] is not None:
            return state["disabled_reason"] or "disabled"
        return None

    def flush_groups(self, now: datetime, report: DispatchReport | None = None) -> DispatchReport:
        """Silence, dead-letter or group pending deliveries; freeze due groups into notifications."""
        report = report or DispatchReport()
        silences = [silence_from_row(r) for r in self.store.silences(active_at=now)]
        groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
        for d in self.store.pending_deliveries():
            policy = self.policies.get(d["policy"])
            if policy is None:
                report.waiting.append(f"delivery {d['id']}: policy {d['policy']} is not loaded")
                continue
            silence = silenced_by(silences, d["labels"], now)
            if silence is not None:
                report.silenced += self.store.set_deliveries_status([d["id"]], "silenced", now=now,
                                                                    silence_id=silence.id,
                                                                    reason=f"silenced by {silence.id}")
                continue
            disabled = self._disabled(d["policy"], d["receiver"])
            if disabled is not None:
                self.store.set_deliveries_status([d["id"]], "dead", now=now,
                                                 reason=f"receiver {d['receiver']} is disabled: {disabled}")
                continue
            groups.setdefault((d["policy"], d["receiver"], d["group_key"]), []).append(d)
        for (policy_name, receiver_name, key), members in groups.items():
            policy = self.policies[policy_name]
            last = self.store.last_notification_at(policy_name, receiver_name, key)
            due = group_due_at(min(m["created_at"] for m in members), last,
                               group_wait=timedelta(seconds=min(m["group_wait_s"] for m in members)),
                               group_interval=timedelta(seconds=min(m["group_interval_s"] for m in members)))
            if due > now:
                report.waiting.append(f"group {key} of {receiver_name}: due at {due.isoformat()}")
                continue
            try:
                receiver = policy.receiver(receiver_name)
            except PolicyError:
                report.waiting.append(f"receiver {receiver_name} is no longer in policy {policy_name}")
                continue
            size = receiver.webhook.max_alerts if receiver.webhook is not None else 0
            chunks = [members[i:i + size] for i in range(0, len(members), size)] if size else [members]
            for chunk in chunks:
                nid = self._form(policy, receiver_name, key, chunk, now)
                if nid is not None:
                    report.formed.append(nid)
        return report

    def _form(self, policy: Policy, receiver: str, key: str, members: Sequence[Mapping[str, Any]],
              now: datetime) -> str | None:
        alerts = self.store.alerts_by_id([m["alert_id"] for m in members])
        body = build_body(policy=policy.name, receiver=receiver, group_key=key,
                          group_labels=members[0]["group_labels"], alerts=alerts,
                          external_url=policy.external_url)
        metas = [a for a in alerts if a["kind"] == "meta"]
        if metas:
            body["lstar"]["meta"] = [a["numbers"] for a in metas]
        nid = notification_id(policy.name, receiver, key, [a["alert_key"] for a in alerts])
        created = self.store.create_notification(
            {"id": nid, "policy": policy.name, "receiver": receiver, "group_key": key,
             "body": canonical_json(body), "n_alerts": len(alerts), "is_meta": bool(metas)},
            [m["id"] for m in members], now=now)
        return nid if created else None

    # -- 2. send ------------------------------------------------------------------------------
    def send_due(self, now: datetime, report: DispatchReport | None = None) -> DispatchReport:
        """Send every due notification once (each leased first; a busy one is skipped)."""
        report = report or DispatchReport()
        silences = [silence_from_row(r) for r in self.store.silences(active_at=now)]
        for cand in self.store.due_notifications(now):
            policy = self.policies.get(cand["policy"])
            if policy is None:
                report.waiting.append(f"{cand['id']}: policy {cand['policy']} is not loaded")
                continue
            receiver_name = cand["receiver"]
            disabled = self._disabled(policy.name, receiver_name)
            if disabled is not None:
                self.store.kill_notifications(policy.name, receiver_name, now=now,
                                              reason=f"receiver {receiver_name} is disabled: {disabled}")
                continue
            state = self.store.endpoint(policy.name, receiver_name)
            if state is not None and state["blocked_until"] is not None and state["blocked_until"] > now:
                report.waiting.append(f"{cand['id']}: {receiver_name} throttled until "
                                      f"{state['blocked_until'].isoformat()}")
                continue
            try:
                receiver = policy.receiver(receiver_name)
            except PolicyError:
                report.waiting.append(f"{cand['id']}: receiver {receiver_name} is no longer in policy "
                                      f"{policy.name}")
                continue
            limit = receiver.rate_limit
            free_at = rate_limit_free_at(self.store.attempt_times(policy.name, receiver_name,
                                                                  since=now - limit.per),
                                         now=now, max_count=limit.max, per=limit.per)
            if free_at is not None:
                report.waiting.append(f"{cand['id']}: {receiver_name} rate limit "
                                      f"({limit.max} per {limit.per}) frees at {free_at.isoformat()}")
                continue
            row = self.store.notification(cand["id"])
            if row is None:
                continue
            silence = self._all_silenced(row["body"], silences, now)
            if silence is not None:
                if self.store.silence_notification(row["id"], silence_id=silence.id, now=now):
                    report.silenced += row["n_alerts"]
                continue
            claimed = self.store.claim_notification(row["id"], self.owner, now=now,
                                                    lease_s=self.lease.total_seconds())
            if claimed is None:
                continue
            report.sent.append(self._attempt(policy, receiver, claimed, now))
        return report

    @staticmethod
    def _all_silenced(body: Mapping[str, Any], silences: Sequence[Silence], now: datetime) -> Silence | None:
        found = None
        for alert in body.get("alerts", []):
            found = silenced_by(silences, alert["labels"], now)
            if found is None:
                return None
        return found

    def _attempt(self, policy: Policy, receiver: Any, row: Mapping[str, Any], now: datetime) -> dict[str, Any]:
        body = json.loads(row["body"]) if isinstance(row["body"], str) else row["body"]
        message = Outgoing(id=row["id"], policy=policy.name, receiver=receiver.name, body=body)
        failpoint("after_claim_before_send")
        try:
            result = self.senders[receiver.kind].send(message, receiver, policy, now=now)
        except Exception as exc:  # a sender bug must cost an attempt, not wedge the notification
            result = SendResult("retry", None, f"internal error in the {receiver.kind} sender: {exc!r}"[:300])
        failpoint("after_send_before_mark")
        attempts = int(row["attempts"])
        attempt = {"started_at": now, "outcome": result.outcome, "status_code": result.status_code,
                   "error": result.error, "retry_after_s": result.retry_after_s}
        outcome = {"id": row["id"], "receiver": receiver.name, "attempt": attempts,
                   "outcome": result.outcome, "status_code": result.status_code, "error": result.error}
        if result.outcome == "delivered":
            self.store.finish_notification(row["id"], self.owner, status="delivered", attempt=attempt, now=now)
            return outcome
        if result.outcome == "retry" and attempts < receiver.retry.max_attempts:
            retry_after = timedelta(seconds=result.retry_after_s) if result.retry_after_s is not None else None
            when = next_attempt_at(now, attempts, initial=receiver.retry.initial_backoff,
                                   cap=receiver.retry.max_backoff, uniform=self.rng.random(),
                                   retry_after=retry_after)
            endpoint = {"blocked_until": when} if result.throttle else None
            self.store.finish_notification(row["id"], self.owner, status="pending", attempt=attempt, now=now,
                                           next_attempt_at=when, error=result.error, endpoint=endpoint)
            outcome["next_attempt_at"] = when
            return outcome
        if result.outcome == "retry":
            reason = f"gave up after {attempts} attempts: {result.error}"
            attempt["outcome"] = "dead"
        elif result.outcome == "gone":
            reason = result.error or "HTTP 410 Gone"
        else:
            reason = result.error or "permanent failure"
        meta = self.meta_alert(policy, receiver.name, row["id"], reason, now=now,
                               is_meta=bool(row["is_meta"]), disabled=result.outcome == "gone")
        endpoint = {"disabled_reason": reason} if result.outcome == "gone" else None
        if meta is None and not row["is_meta"]:
            reason += "; no other receiver to tell the operator"
        self.store.finish_notification(row["id"], self.owner, status="dead", attempt=attempt, now=now,
                                       error=reason, endpoint=endpoint, meta_alert=meta)
        if result.outcome == "gone":
            self.store.kill_notifications(policy.name, receiver.name, now=now,
                                          reason=f"receiver {receiver.name} is disabled: {reason}")
        outcome["dead_reason"] = reason
        return outcome

    # -- meta-alerts --------------------------------------------------------------------------
    def operator_receiver(self, policy: Policy, failed: str) -> str | None:
        """Who hears about a failure of `failed`: the first usable meta receiver, else any other."""
        names = policy.meta_receivers or [r.name for r in policy.receivers]
        for name in names:
            if name != failed and self._disabled(policy.name, name) is None:
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
