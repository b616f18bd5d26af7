"""Alerts: predictions against task curves, rule evaluation, the outbox, the dispatcher, silences,
the message payload and the channels."""

from __future__ import annotations

from typing import TYPE_CHECKING

from monitor.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from monitor.alerts.channels.base import Outgoing, Sender, SendResult
    from monitor.alerts.channels.email import EmailSender, compose_email
    from monitor.alerts.channels.filesink import FileSender
    from monitor.alerts.channels.webhook import WebhookSender
    from monitor.alerts.dispatcher import Dispatcher, DispatchReport, default_senders, run_pass
    from monitor.alerts.operator import operator_alerts, raise_hub_outage_alerts
    from monitor.alerts.evaluation_tick import EvaluationReport, evaluate_pending
    from monitor.alerts.prediction_eval import CurvePredictor, watches
    from monitor.alerts.payload import build_body
    from monitor.alerts.predict import load_task_curve, predict_task, public_corpus
    from monitor.alerts.rules import route_alert, task_labels
    from monitor.alerts.silences import (add_silence, current_user, expire_silence, list_silences, parse_time,
                                         parse_until)

# Re-exported lazily: importing the package (or one light module in it, which imports the
# package first) does not import every stage module and their libraries; a name loads its
# module when first used.
_EXPORTS = {  # name: the module that defines it, imported on first use
    "Outgoing": "monitor.alerts.channels.base",
    "Sender": "monitor.alerts.channels.base",
    "SendResult": "monitor.alerts.channels.base",
    "EmailSender": "monitor.alerts.channels.email",
    "compose_email": "monitor.alerts.channels.email",
    "FileSender": "monitor.alerts.channels.filesink",
    "WebhookSender": "monitor.alerts.channels.webhook",
    "Dispatcher": "monitor.alerts.dispatcher",
    "DispatchReport": "monitor.alerts.dispatcher",
    "default_senders": "monitor.alerts.dispatcher",
    "run_pass": "monitor.alerts.dispatcher",
    "operator_alerts": "monitor.alerts.operator",
    "raise_hub_outage_alerts": "monitor.alerts.operator",
    "CurvePredictor": "monitor.alerts.prediction_eval",
    "EvaluationReport": "monitor.alerts.evaluation_tick",
    "evaluate_pending": "monitor.alerts.evaluation_tick",
    "watches": "monitor.alerts.prediction_eval",
    "build_body": "monitor.alerts.payload",
    "load_task_curve": "monitor.alerts.predict",
    "predict_task": "monitor.alerts.predict",
    "public_corpus": "monitor.alerts.predict",
    "route_alert": "monitor.alerts.rules",
    "task_labels": "monitor.alerts.rules",
    "add_silence": "monitor.alerts.silences",
    "current_user": "monitor.alerts.silences",
    "expire_silence": "monitor.alerts.silences",
    "list_silences": "monitor.alerts.silences",
    "parse_time": "monitor.alerts.silences",
    "parse_until": "monitor.alerts.silences",
}


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)


__all__ = ["CurvePredictor", "DispatchReport", "Dispatcher", "EmailSender", "EvaluationReport",
           "FileSender", "Outgoing", "SendResult", "Sender", "WebhookSender", "add_silence", "build_body",
           "compose_email", "current_user", "default_senders", "evaluate_pending", "expire_silence",
           "list_silences", "load_task_curve", "operator_alerts", "parse_time", "parse_until",
           "predict_task", "public_corpus", "raise_hub_outage_alerts", "route_alert", "run_pass",
           "task_labels", "watches"]
