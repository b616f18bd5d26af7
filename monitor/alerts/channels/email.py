"""Email channel: SMTP with STARTTLS or implicit TLS, plain-text and HTML bodies from the
Jinja2 templates in `monitor/alerts/templates/`, and a Message-ID derived from the notification id so a
re-sent mail threads with (and can be de-duplicated against) the first.

Outcomes: connection errors, timeouts and 4xx replies retry; 5xx replies are permanent;
failed authentication is permanent with an error that says which user and server.
"""

from __future__ import annotations

import smtplib
import socket
import ssl
from datetime import datetime
from email.message import EmailMessage
from email.utils import format_datetime
from pathlib import Path
from typing import Any

import jinja2

from monitor.alerts.channels.base import Outgoing, SendResult
from monitor.alerts.payload import message_id
from monitor.errors import DeliveryError
from monitor.escape import plain_text, template_value
from monitor.policy.secrets import read_secret

DEFAULT_TEMPLATES = Path(__file__).resolve().parents[1] / "templates"
TEMPLATE_NAMES = ("email_subject.txt.j2", "email.txt.j2", "email.html.j2")


def template_context(message: Outgoing) -> dict[str, Any]:
    """What the templates see: the body, and each alert next to its numbers."""
    body = message.body
    numbers = body.get("lstar", {}).get("alerts", [])
    alerts = [{**alert, "numbers": numbers[i] if i < len(numbers) else {}}
              for i, alert in enumerate(body.get("alerts", []))]
    return {"body": body, "alerts": alerts, "policy": message.policy, "receiver": message.receiver,
            "status": body.get("status", "firing"), "notification_id": message.id,
            "n_firing": sum(a["status"] == "firing" for a in alerts),
            "n_resolved": sum(a["status"] == "resolved" for a in alerts),
            "external_url": body.get("externalURL", ""), "meta": body.get("lstar", {}).get("meta")}


def render(message: Outgoing, templates: Path | None = None) -> tuple[str, str, str]:
    """(subject, plain text, HTML) of a notification."""
    folders = [str(p) for p in (templates, DEFAULT_TEMPLATES) if p is not None]
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(folders), undefined=jinja2.StrictUndefined,
                             autoescape=jinja2.select_autoescape(["html", "html.j2"]),
                             trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True,
                             # every value on its line: control, line-break and bidi characters shown
                             finalize=template_value)
    context = template_context(message)
    try:
        subject, text, html = (env.get_template(name).render(context) for name in TEMPLATE_NAMES)
    except jinja2.TemplateNotFound as exc:
        raise DeliveryError(f"email template {exc.name} not found in {', '.join(folders)}") from None
    except jinja2.TemplateError as exc:
        raise DeliveryError(f"email template error: {exc}") from None
    return " ".join(subject.split()), text, html


def compose_email(cfg: Any, *, subject: str, text: str, html: str, now: datetime, message_id: str,
                  headers: dict[str, str]) -> EmailMessage:
    """A MIME message to `cfg`'s recipients (multipart/alternative: text, then HTML), with
    the receiver's subject prefix and the given Message-ID and extra headers."""
    mail = EmailMessage()
    mail["Subject"] = plain_text(f"{cfg.subject_prefix} {subject}".strip())   # a line break would end the header
    mail["From"] = cfg.from_
    mail["To"] = ", ".join(cfg.to)
    mail["Date"] = format_datetime(now)
    mail["Message-ID"] = message_id
    for name, value in headers.items():
        mail[name] = value
    mail.set_content(text)
    mail.add_alternative(html, subtype="html")
    return mail


def build_email(message: Outgoing, cfg: Any, *, now: datetime, templates: Path | None = None) -> EmailMessage:
    """The MIME message of a notification, rendered from the templates."""
    subject, text, html = render(message, templates)
    return compose_email(cfg, subject=subject, text=text, html=html, now=now,
                         message_id=message_id(message.id), headers={"X-Lstar-Notification": message.id})


def _reply(code: int, text: Any) -> str:
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    return f"{code} {' '.join(str(text).split())}"


class EmailSender:
    """Sends through `receiver.email` with smtplib."""

    def send(self, message: Outgoing, receiver: Any, policy: Any, *, now: datetime) -> SendResult:
        cfg = receiver.email
        try:
            templates = policy.resolve_path(cfg.templates) if cfg.templates else None
            mail = build_email(message, cfg, now=now, templates=templates)
        except DeliveryError as exc:
            return SendResult("dead", None, exc.one_line())
        return self.send_mail(mail, receiver, policy)

    def send_mail(self, mail: EmailMessage, receiver: Any, policy: Any) -> SendResult:
        """One SMTP session for a built message: credentials, TLS, login, and the reply
        classified as delivered, retry (4xx, connection errors) or dead (5xx, auth)."""
        cfg = receiver.email
        server = f"{cfg.host}:{cfg.port}"
        try:
            username = cfg.username or read_secret(cfg.username_env, None, policy,
                                                   f"receiver {receiver.name!r} SMTP username")
            password = read_secret(cfg.password_env, cfg.password_file, policy,
                                   f"receiver {receiver.name!r} SMTP password")
        except DeliveryError as exc:
            return SendResult("dead", None, exc.one_line())
        context = ssl.create_default_context(cafile=policy.resolve_path(cfg.ca_file) if cfg.ca_file else None)
        timeout = cfg.timeout.total_seconds()
        try:
            if cfg.tls == "ssl":
                smtp: smtplib.SMTP = smtplib.SMTP_SSL(cfg.host, cfg.port, timeout=timeout, context=context)
            else:
                smtp = smtplib.SMTP(cfg.host, cfg.port, timeout=timeout)
            with smtp:
                smtp.ehlo()
                if cfg.tls == "starttls":
                    smtp.starttls(context=context)
                    smtp.ehlo()
                if username is not None:
                    smtp.login(username, password or "")
                refused = smtp.send_message(mail)
        except smtplib.SMTPAuthenticationError as exc:
            return SendResult("dead", exc.smtp_code,
                              f"SMTP authentication failed for user {username!r} on {server}: "
                              f"{_reply(exc.smtp_code, exc.smtp_error)}; check the username and the "
                              f"password source of receiver {receiver.name!r}")
        except smtplib.SMTPNotSupportedError as exc:
            return SendResult("dead", None, f"{server} does not support what receiver "
                                            f"{receiver.name!r} asks for (tls: {cfg.tls}, login): {exc}")
        except smtplib.SMTPRecipientsRefused as exc:
            codes = [code for code, _ in exc.recipients.values()]
            detail = "; ".join(f"{rcpt}: {_reply(c, t)}" for rcpt, (c, t) in exc.recipients.items())
            transient = all(400 <= c < 500 for c in codes)
            return SendResult("retry" if transient else "dead", max(codes),
                              f"{server} refused every recipient: {detail}")
        except smtplib.SMTPResponseException as exc:
            transient = 400 <= exc.smtp_code < 500
            return SendResult("retry" if transient else "dead", exc.smtp_code,
                              f"{server} answered {_reply(exc.smtp_code, exc.smtp_error)}")
        except ssl.SSLCertVerificationError as exc:
            return SendResult("dead", None, f"TLS certificate of {server} not trusted: "
                                            f"{exc.verify_message}; set ca_file or fix the server")
        except (smtplib.SMTPException, socket.timeout, TimeoutError, OSError) as exc:
            return SendResult("retry", None, f"cannot talk to {server}: "
                                             f"{type(exc).__name__}: {exc}"[:300])
        if refused:
            detail = "; ".join(f"{rcpt}: {_reply(c, t)}" for rcpt, (c, t) in refused.items())
            return SendResult("delivered", 250, f"some recipients refused: {detail}")
        return SendResult("delivered", 250)
