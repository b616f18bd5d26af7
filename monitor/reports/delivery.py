"""Send a written governance report through a policy's receivers (best effort, one attempt).

file: one JSON line (the report's headline and where its files are); webhook: the JSON
report, signed per Standard Webhooks like alerts (`webhook-id` = `rpt_<hash>`); email: the
Markdown report as text with the self-contained HTML report as the alternative part.
Reports are kept on disk and recorded whatever happens here; each outcome is returned and
stored with the report, so a failed delivery is visible (`lstar report` lists them).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from monitor.alerts import EmailSender, FileSender, Outgoing, SendResult, WebhookSender, compose_email
from monitor.errors import PolicyError
from monitor.policy import Policy, Report
from monitor.reports.report import json_default


def report_message_id(policy: str, name: str, period_end: datetime) -> str:
    """A stable id per (policy, report, period end): a re-send carries the same id."""
    blob = f"{policy}\n{name}\n{period_end.isoformat()}"
    return "rpt_" + hashlib.sha256(blob.encode()).hexdigest()[:32]


def _send_email(message: Outgoing, receiver: Any, policy: Policy, *, subject: str, text: str, html: str,
                now: datetime) -> SendResult:
    mail = compose_email(receiver.email, subject=subject, text=text, html=html, now=now,
                         message_id=f"<{message.id}@lstar-monitor>", headers={"X-Lstar-Report": message.id})
    return EmailSender().send_mail(mail, receiver, policy)


def report_body_text(data: Mapping[str, Any], paths: Mapping[str, Path]) -> str:
    """The webhook body of a report: its JSON (`report.iter_json`'s content) with `files` added,
    in the canonical spelling alerts are sent in (`canonical_json`), encoded once from the data."""
    body = {**{k: v for k, v in data.items() if not k.startswith("_")}, "files": {k: str(v) for k, v in paths.items()}}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=json_default)


def deliver_report(policy: Policy, spec: Report, data: Mapping[str, Any], paths: Mapping[str, Path], *,
                   now: datetime) -> list[dict[str, Any]]:
    """Send the report to each of `spec.receivers`; returns [{receiver, kind, outcome, error}].

    The report is encoded once, and only when a webhook receives it (`report_body_text`); the
    file channel writes its headline, email its Markdown and HTML files."""
    files = {k: str(v) for k, v in paths.items()}
    headline = json.loads(json.dumps({**{k: data[k] for k in ("schema", "policy", "report", "period", "summary")},
                                       "files": files}, default=json_default))
    message = Outgoing(id=report_message_id(policy.name, spec.name, now), policy=policy.name,
                       receiver="", body=headline)
    encoded: list[str] = []   # the webhook body, once encoded
    subject = (f"report {spec.name} of {policy.name}: {data['summary']['at_risk']} at risk, "
               f"{data['summary']['emerged']} emerged")
    results = []
    for name in spec.receivers:
        try:
            receiver = policy.receiver(name)
        except PolicyError as exc:
            results.append({"receiver": name, "kind": None, "outcome": "dead", "error": exc.one_line()})
            continue
        try:
            if receiver.kind == "webhook":
                encoded = encoded or [report_body_text(data, paths)]
                addressed = Outgoing(id=message.id, policy=policy.name, receiver=name, body=headline,
                                     encoded=encoded[0])
                sender = WebhookSender()
                try:
                    result = sender.send(addressed, receiver, policy, now=now)
                finally:
                    sender.close()
            elif receiver.kind == "email":
                addressed = Outgoing(id=message.id, policy=policy.name, receiver=name, body=headline)
                result = _send_email(addressed, receiver, policy, subject=subject,
                                     text=paths["markdown"].read_text(encoding="utf-8"),
                                     html=paths["html"].read_text(encoding="utf-8"), now=now)
            else:
                result = FileSender().send(Outgoing(id=message.id, policy=policy.name, receiver=name,
                                                    body=headline), receiver, policy, now=now)
        except Exception as exc:  # one broken channel must not lose the report for the others
            result = SendResult("retry", None, f"internal error in the {receiver.kind} channel: {exc!r}"[:300])
        results.append({"receiver": name, "kind": receiver.kind, "outcome": result.outcome,
                        "error": result.error})
    return results
