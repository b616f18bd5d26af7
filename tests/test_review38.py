"""An adversarial pass over issue 38's surfaces: hostile inputs that crashed, and surfaces
that disagreed about one lineage's state. Each test failed before its fix."""

from __future__ import annotations

import time
from datetime import datetime, timezone
from types import SimpleNamespace

import pytest
from starlette.testclient import TestClient

from monitor.alerts.channels.webhook import sign
from monitor.alerts.receiver import receiver_app
from monitor.reports.window import WindowError, parse_moment, report_window

SECRET = "whsec_" + "QUJDREVGR0hJSktMTU5PUFFSU1RVVldY"
NOW = datetime(2026, 11, 29, 12, tzinfo=timezone.utc)


# -- the receiver ------------------------------------------------------------------------------
def _post(headers: dict, body: bytes = b'{"alerts": []}') -> tuple[int, list[str]]:
    printed: list[str] = []
    client = TestClient(receiver_app(SECRET, printed.append), raise_server_exceptions=False)
    answer = client.post("/hook", content=body, headers=headers)
    return answer.status_code, printed


@pytest.mark.parametrize("signature", ["v1,\xff\xfe", "v1,ok v1,\xe9t\xe9"])
def test_a_signature_header_with_non_ascii_bytes_is_refused_not_a_crash(signature: str) -> None:
    stamp = str(int(time.time()))
    status, printed = _post({"webhook-id": "msg_1", "webhook-timestamp": stamp,
                             "webhook-signature": signature.encode("latin-1")})
    assert status == 401
    assert printed and "signature REFUSED: no v1 signature matches the secret" in printed[0]


def test_a_good_signature_beside_a_non_ascii_one_is_accepted() -> None:
    stamp = int(time.time())
    body = '{"alerts": []}'
    good = sign(SECRET, "msg_2", stamp, body)
    status, printed = _post({"webhook-id": "msg_2", "webhook-timestamp": str(stamp),
                             "webhook-signature": ("v1,\xe9 " + good).encode("latin-1")}, body.encode())
    assert status == 204 and "signature ok" in printed[0]


def test_a_non_ascii_webhook_id_is_checked_not_a_crash() -> None:
    stamp = str(int(time.time()))
    status, _ = _post({"webhook-id": "m\xe9g".encode("latin-1"), "webhook-timestamp": stamp,
                       "webhook-signature": "v1,AAAA"})
    assert status == 401


# -- report windows ----------------------------------------------------------------------------
@pytest.mark.parametrize("text", ["0001-01-01T00:00+01:00", "9999-12-31T23:59-01:00", "0001-01-01T00:30+00:45"])
def test_a_moment_whose_offset_leaves_the_calendar_is_refused_in_one_line(text: str) -> None:
    with pytest.raises(WindowError) as caught:
        parse_moment(text, now=NOW)
    assert text in str(caught.value) and "\n" not in str(caught.value)
    with pytest.raises(WindowError):
        report_window(since=text, until=None, now=NOW)


def test_offsets_and_dst_changes_name_the_same_instant_in_utc() -> None:
    # Europe/Berlin left summer time on 2026-10-25 at 03:00 CEST (01:00 UTC): both sides of the
    # change written with their own offset name instants an hour apart, as UTC says.
    before = parse_moment("2026-10-25T02:30+02:00", now=NOW)
    after = parse_moment("2026-10-25T02:30+01:00", now=NOW)
    assert before == datetime(2026, 10, 25, 0, 30, tzinfo=timezone.utc)
    assert (after - before).total_seconds() == 3600
    assert parse_moment("2026-10-25T00:30Z", now=NOW) == before
