"""Delivery of alerts: the outbox (write side), the dispatcher (send side), the channels
(webhook, email, file) and silences.

    evaluate_pending(store, policies, now=...)      # scores -> predictions, alerts, deliveries
    Dispatcher(store, policies).run_once(now)       # deliveries -> notifications -> sends

Both are idempotent reconcilers over the database; run them after each score, on start-up
and on a schedule.
"""

from monitor.notify.base import Outgoing, Sender, SendResult
from monitor.notify.dispatcher import DispatchReport, Dispatcher, default_senders
from monitor.notify.outbox import CurvePredictor, EvaluationReport, evaluate_pending
from monitor.notify.silences import add_silence, expire_silence, list_silences, parse_until

__all__ = ["Outgoing", "Sender", "SendResult", "Dispatcher", "DispatchReport", "default_senders",
           "CurvePredictor", "EvaluationReport", "evaluate_pending", "add_silence", "expire_silence",
           "list_silences", "parse_until"]
