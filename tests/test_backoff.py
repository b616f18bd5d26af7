"""The one Retry-After reader and jittered backoff (monitor.backoff), and its callers."""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone
from email.utils import format_datetime

import pytest

from monitor.alerts.channels.webhook import classify_response
from monitor.alerts.rules import backoff_delay
from monitor.backoff import MAX_RETRY_AFTER_S, backoff_seconds, parse_retry_after
from monitor.hub.client import HubClient, rate_limit_wait

NOW = datetime(2026, 3, 1, 12, 0, 0, tzinfo=timezone.utc)


def test_delta_seconds():
    assert parse_retry_after("120", now=NOW) == 120.0
    assert parse_retry_after("  0 ", now=NOW) == 0.0


def test_http_date_is_seconds_from_now():
    # RFC 9110's IMF-fixdate, written by the standard library for a time 90 s ahead
    assert parse_retry_after(format_datetime(NOW + timedelta(seconds=90), usegmt=True), now=NOW) == 90.0
    assert parse_retry_after("Sun, 01 Mar 2026 12:05:00 GMT", now=NOW) == 300.0
    # the obsolete RFC 850 form is still a date
    assert parse_retry_after("Sunday, 01-Mar-26 12:01:00 GMT", now=NOW) == 60.0


def test_a_past_date_means_now():
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now=NOW) == 0.0


@pytest.mark.parametrize("garbage", [None, "", "   ", "soon", "-5", "1.5", "nan", "inf", "1e9", "0x10",
                                     "Mon, 99 Foo 2026 99:99:99 GMT", "١٢", "9" * 5000])
def test_garbage_is_no_answer(garbage):
    # RFC 9110 delta-seconds are ASCII digits only; a 5,000-character value is no header
    assert parse_retry_after(garbage, now=NOW) is None


def test_huge_values_are_capped():
    assert parse_retry_after("99999999999999999999999", now=NOW) == MAX_RETRY_AFTER_S
    assert parse_retry_after("86401", now=NOW) == MAX_RETRY_AFTER_S
    assert parse_retry_after("Fri, 31 Dec 9999 23:59:59 GMT", now=NOW) == MAX_RETRY_AFTER_S
    assert parse_retry_after("600", now=NOW, cap_s=60.0) == 60.0


def test_the_hub_client_reads_http_dates_too():
    """The Hub client's reader knew only delta-seconds; an HTTP date was ignored."""
    headers = {"retry-after": format_datetime(NOW + timedelta(seconds=42), usegmt=True)}
    assert rate_limit_wait(headers, now=NOW) == 42.0
    assert rate_limit_wait({"ratelimit": '"api";r=0;t=55', "retry-after": "3"}, now=NOW) == 55.0
    assert rate_limit_wait({"retry-after": "bogus"}, now=NOW) is None


def test_the_webhook_channel_and_the_hub_agree_on_every_header():
    for value in ("30", "Sun, 01 Mar 2026 12:00:30 GMT", "Wed, 21 Oct 2015 07:28:00 GMT", "x", "999999999"):
        result = classify_response(503, {"retry-after": value}, now=NOW, url="http://127.0.0.1/h", text="")
        assert result.retry_after_s == rate_limit_wait({"retry-after": value}, now=NOW) \
            == parse_retry_after(value, now=NOW)


def test_full_jitter_is_uniform_below_the_ceiling():
    # hand-worked: base 30 s, attempt 5 -> ceiling 30 * 2^4 = 480 s, capped by 6 h
    assert backoff_seconds(5, base_s=30, cap_s=21600, uniform=0.0) == 0.0
    assert backoff_seconds(5, base_s=30, cap_s=21600, uniform=0.25) == 120.0
    assert backoff_seconds(20, base_s=30, cap_s=21600, uniform=0.5) == 10800.0   # capped: 6 h / 2
    assert backoff_delay(5, initial=timedelta(seconds=30), cap=timedelta(hours=6), uniform=0.25) == \
        timedelta(seconds=120)


def test_equal_jitter_waits_at_least_half_the_ceiling():
    # base 1 s, attempt 3 -> ceiling 4 s: 2 s fixed plus U(0, 2 s)
    assert backoff_seconds(3, base_s=1, cap_s=60, uniform=0.0, jitter="equal") == 2.0
    assert backoff_seconds(3, base_s=1, cap_s=60, uniform=0.5, jitter="equal") == 3.0
    assert backoff_seconds(10, base_s=1, cap_s=60, uniform=0.0, jitter="equal") == 30.0


def test_any_attempt_number_gives_a_finite_capped_delay():
    # 2 ** 2000 as a float overflows; the helper stops doubling long before
    assert backoff_seconds(2000, base_s=1, cap_s=60, uniform=0.999, jitter="equal") < 60.0
    with pytest.raises(ValueError, match="attempt counts from 1"):
        backoff_seconds(0, base_s=1, cap_s=60, uniform=0.5)
    with pytest.raises(ValueError, match="unknown jitter"):
        backoff_seconds(1, base_s=1, cap_s=60, uniform=0.5, jitter="none")  # type: ignore[arg-type]


def test_the_hub_client_draws_its_backoff_from_the_helper():
    client = HubClient("http://127.0.0.1:9", token=False, rng=random.Random(3))
    draws = [client._backoff(a) for a in range(1, 12)]
    rng = random.Random(3)
    expected = [min(60.0, 2.0 ** (a - 1)) / 2 + rng.random() * min(60.0, 2.0 ** (a - 1)) / 2 for a in range(1, 12)]
    assert draws == pytest.approx(expected)
    assert client._backoff(5000) <= 60.0
