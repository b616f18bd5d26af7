"""Email delivery against aiosmtpd on 127.0.0.1 (docs/reliability.md row 10): SMTP down / 4xx retry,
5xx and bad credentials dead-letter with a clear error; STARTTLS and implicit TLS; the
Message-ID is derived from the notification; plain text and HTML come from the templates."""

from __future__ import annotations

import hashlib
import json
import random
import ssl
import subprocess
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from monitor.alerts import Dispatcher, evaluate_pending
from monitor.alerts.channels.base import Outgoing
from monitor.alerts.channels.email import EmailSender, render
from monitor.alerts.payload import build_body, message_id
from monitor.demo.receivers import SmtpReceiver, free_port
from monitor.policy.load import load_policy
from monitor.policy.schema import Policy
from monitor.store import Store
from monitor.store.rows import NotificationRow
from support.scores import record_fake_score

CURVES = Path(__file__).resolve().parent / "fixtures" / "policies" / "curves"
T0 = datetime(2025, 6, 1, 12, 0, tzinfo=timezone.utc)
PASSWORD = "correct horse battery staple"


def write_policy(tmp: Path, port: int, *, tls: str = "none", auth: bool = False, ca_file: str | None = None,
                 attempts: int = 4) -> Policy:
    (tmp / "smtp-password").write_text(PASSWORD + "\n")
    creds = "username: lstar, password_file: smtp-password, " if auth else ""
    ca = f"ca_file: {ca_file}, " if ca_file else ""
    path = tmp / "policy.yaml"
    path.write_text(f"""\
name: mailed
tasks:
  - name: arith
    curve: {CURVES / "arith.json"}
route:
  receiver: mail
  group_wait: 0s
  group_interval: 0s
receivers:
  - name: mail
    email: {{to: [gov@example.org, ops@example.org], from: lstar@example.org, host: 127.0.0.1,
             port: {port}, tls: {tls}, {creds}{ca}timeout: 5s}}
    retry: {{max_attempts: {attempts}, initial_backoff: 10s, max_backoff: 1m}}
  - name: ops-log
    file: {{path: ops.jsonl}}
meta_receivers: [ops-log]
""")
    return load_policy(path)


class Run:
    def __init__(self, tmp: Path, policy: Policy) -> None:
        self.tmp, self.policy = tmp, policy
        self.store = Store.open(tmp / "state.duckdb")
        self.rng = random.Random(1)

    def tick(self, now: datetime) -> None:
        evaluate_pending(self.store, [self.policy], now=now)
        Dispatcher(self.store, [self.policy], rng=self.rng, owner="t").run_once(now)

    def note(self) -> NotificationRow:
        [row] = [n for n in self.store.notifications() if n.receiver == "mail"]
        return row

    def ops_log(self) -> list[dict]:
        path = self.tmp / "ops.jsonl"
        return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture
def run(tmp_path: Path):  # type: ignore[no-untyped-def]
    runs: list[Run] = []

    def make(port: int, **kw: object) -> Run:
        r = Run(tmp_path, write_policy(tmp_path, port, **kw))  # type: ignore[arg-type]
        record_fake_score(r.store, repo="org/model", sha="c" * 40, lstar=-2.0, se=0.02, finished_at=T0)
        runs.append(r)
        return r

    yield make
    for r in runs:
        r.store.close()


def test_delivered_with_text_html_and_a_deterministic_message_id(run) -> None:  # type: ignore[no-untyped-def]
    with SmtpReceiver() as smtp:
        r = run(smtp.port)
        r.tick(T0)
        [mail] = smtp.mails
    note = r.note()
    assert note.status == "delivered"
    msg = mail.message
    assert mail.rcpt_tos == ["gov@example.org", "ops@example.org"]
    assert msg["Message-ID"] == f"<{hashlib.sha256(note.id.encode()).hexdigest()[:32]}@lstar-monitor>"
    assert msg["X-Lstar-Notification"] == note.id
    assert msg["Subject"] == "[lstar] [FIRING:1] mailed — arith at risk for org/model@cccccccccccc"
    text = msg.get_body(preferencelist=("plain",)).get_content()
    html = msg.get_body(preferencelist=("html",)).get_content()
    assert "[FIRING] arith at risk for org/model@cccccccccccc" in text
    assert "state at_risk" in text and "L*         -2.0000 (SE 0.0200)" in text
    assert "<table" in html and "org/model@cccccccccccc" in html


def test_a_resend_carries_the_same_message_id(tmp_path: Path) -> None:
    policy = write_policy(tmp_path, 25)
    body = build_body(policy="mailed", receiver="mail", group_key="g", group_labels={},
                      alerts=[{"status": "firing", "labels": {"alertname": "X"}, "annotations": {"summary": "s"},
                               "numbers": {}, "starts_at": T0, "ends_at": None, "fingerprint": "0" * 16}])
    message = Outgoing(id="msg_abc", policy="mailed", receiver="mail", body=body)
    with SmtpReceiver() as smtp:
        cfg = policy.receiver("mail").model_copy(
            update={"email": policy.receiver("mail").email.model_copy(update={"port": smtp.port})})
        for _ in range(2):
            assert EmailSender().send(message, cfg, policy, now=T0).outcome == "delivered"
        assert [m.message["Message-ID"] for m in smtp.mails] == [message_id("msg_abc")] * 2


def test_html_is_escaped(tmp_path: Path) -> None:
    body = build_body(policy="p", receiver="mail", group_key="g", group_labels={},
                      alerts=[{"status": "firing", "labels": {"repo": "<script>alert(1)</script>"},
                               "annotations": {"summary": "a <b>bold</b> claim"}, "numbers": {},
                               "starts_at": T0, "ends_at": None, "fingerprint": "0" * 16}])
    subject, text, html = render(Outgoing(id="msg_x", policy="p", receiver="mail", body=body))
    assert "<script>" not in html and "&lt;script&gt;" in html and "&lt;b&gt;bold" in html
    assert "<script>alert(1)</script>" in text   # plain text is not HTML


def test_smtp_down_is_retried_until_it_is_up(run) -> None:  # type: ignore[no-untyped-def]
    port = free_port()
    r = run(port)
    r.tick(T0)
    note = r.note()
    assert note.status == "pending" and f"cannot talk to 127.0.0.1:{port}" in note.last_error
    with SmtpReceiver(port=port) as smtp:
        r.tick(note.next_attempt_at)
        assert len(smtp.mails) == 1
    assert r.note().status == "delivered" and r.note().attempts == 2


def test_4xx_is_retried(run) -> None:  # type: ignore[no-untyped-def]
    with SmtpReceiver() as smtp:
        smtp.script(["451 4.3.0 mailbox busy, try later"])
        r = run(smtp.port)
        r.tick(T0)
        note = r.note()
        assert note.status == "pending"
        assert note.last_error == f"127.0.0.1:{smtp.port} answered 451 4.3.0 mailbox busy, try later"
        r.tick(note.next_attempt_at)
        assert smtp.data_calls == 2 and len(smtp.mails) == 1
    assert r.note().status == "delivered"


def test_5xx_is_dead_lettered_and_the_operator_told(run) -> None:  # type: ignore[no-untyped-def]
    with SmtpReceiver() as smtp:
        smtp.script(["554 5.7.1 message rejected"])
        r = run(smtp.port)
        r.tick(T0)
        r.tick(T0 + timedelta(hours=5))
        assert smtp.data_calls == 1 and smtp.mails == []
    note = r.note()
    assert note.status == "dead"
    assert note.dead_reason == f"127.0.0.1:{smtp.port} answered 554 5.7.1 message rejected"
    [told] = r.ops_log()
    assert told["message"]["alerts"][0]["annotations"]["description"] == note.dead_reason


def test_bad_credentials_dead_letter_with_a_clear_error(run) -> None:  # type: ignore[no-untyped-def]
    with SmtpReceiver(users={"lstar": "something else"}) as smtp:
        r = run(smtp.port, auth=True)
        r.tick(T0)
        assert smtp.mails == []
    note = r.note()
    assert note.status == "dead"
    assert note.dead_reason == (
        f"SMTP authentication failed for user 'lstar' on 127.0.0.1:{smtp.port}: 535 5.7.8 Authentication "
        "credentials invalid; check the username and the password source of receiver 'mail'")
    assert PASSWORD not in json.dumps(r.store.query("SELECT * FROM delivery_attempts"), default=str)


def test_good_credentials_from_a_file(run) -> None:  # type: ignore[no-untyped-def]
    with SmtpReceiver(users={"lstar": PASSWORD}) as smtp:
        r = run(smtp.port, auth=True)
        r.tick(T0)
        assert len(smtp.mails) == 1
    assert r.note().status == "delivered"


def test_missing_password_variable_is_a_clear_permanent_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LSTAR_NO_SUCH_PASSWORD", raising=False)
    policy = write_policy(tmp_path, 25)
    mail = policy.receiver("mail")
    cfg = mail.model_copy(update={"email": mail.email.model_copy(
        update={"username": "u", "password_env": "LSTAR_NO_SUCH_PASSWORD"})})
    message = Outgoing(id="msg_y", policy="mailed", receiver="mail",
                       body=build_body(policy="p", receiver="mail", group_key="g", group_labels={}, alerts=[]))
    result = EmailSender().send(message, cfg, policy, now=T0)
    assert result.outcome == "dead"
    assert result.error == ("receiver 'mail' SMTP password: environment variable LSTAR_NO_SUCH_PASSWORD is "
                            "not set; export LSTAR_NO_SUCH_PASSWORD in the daemon's environment")


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return cert, key


def _server_context(cert: Path, key: Path) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    return ctx


def test_starttls_with_a_trusted_ca(run, tls_files) -> None:  # type: ignore[no-untyped-def]
    cert, key = tls_files
    with SmtpReceiver(starttls_context=_server_context(cert, key)) as smtp:
        r = run(smtp.port, tls="starttls", ca_file=str(cert))
        r.tick(T0)
        assert len(smtp.mails) == 1   # the server requires STARTTLS before MAIL
    assert r.note().status == "delivered"


def test_untrusted_certificate_is_dead_lettered(run, tls_files) -> None:  # type: ignore[no-untyped-def]
    cert, key = tls_files
    with SmtpReceiver(starttls_context=_server_context(cert, key)) as smtp:
        r = run(smtp.port, tls="starttls")
        r.tick(T0)
        assert smtp.mails == []
    note = r.note()
    assert note.status == "dead" and "TLS certificate of 127.0.0.1" in note.dead_reason


def test_implicit_tls(run, tls_files) -> None:  # type: ignore[no-untyped-def]
    cert, key = tls_files
    with SmtpReceiver(ssl_context=_server_context(cert, key)) as smtp:
        r = run(smtp.port, tls="ssl", ca_file=str(cert))
        r.tick(T0)
        assert len(smtp.mails) == 1
    assert r.note().status == "delivered"
