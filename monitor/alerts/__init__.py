"""Alerts: predictions against task curves, rule evaluation, the outbox, the dispatcher, silences,
the message payload and the channels."""

from monitor.alerts.channels.base import Outgoing, Sender, SendResult
from monitor.alerts.channels.email import EmailSender, compose_email
from monitor.alerts.channels.filesink import FileSender
from monitor.alerts.channels.webhook import WebhookSender
from monitor.alerts.dispatcher import Dispatcher, DispatchReport, default_senders, run_pass
from monitor.alerts.operator import operator_alerts, raise_hub_outage_alerts
from monitor.alerts.outbox import CurvePredictor, EvaluationReport, evaluate_pending, watches
from monitor.alerts.payload import build_body
from monitor.alerts.predict import load_task_curve, predict_task, public_corpus
from monitor.alerts.rules import route_alert, task_labels
from monitor.alerts.silences import (add_silence, current_user, expire_silence, list_silences, parse_time,
                                     parse_until)

__all__ = ["CurvePredictor", "DispatchReport", "Dispatcher", "EmailSender", "EvaluationReport",
           "FileSender", "Outgoing", "SendResult", "Sender", "WebhookSender", "add_silence", "build_body",
           "compose_email", "current_user", "default_senders", "evaluate_pending", "expire_silence",
           "list_silences", "load_task_curve", "operator_alerts", "parse_time", "parse_until",
           "predict_task", "public_corpus", "raise_hub_outage_alerts", "route_alert", "run_pass",
           "task_labels", "watches"]
