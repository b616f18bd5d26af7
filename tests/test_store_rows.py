"""Typed rows: built from a query by column name, refused when the query and the class differ,
and turned back into exactly the dict of columns the JSON output has always carried."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest

from monitor.errors import StoreError
from monitor.store import Store
from monitor.store.rows import HubOutageRow, HubStateRow

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def test_a_row_read_back_carries_the_columns_written(tmp_path):
    with Store.open(tmp_path / "s.duckdb") as store:
        outage_id = store.open_hub_outage("https://hub", now=T0, failures=3, error="503")
        store.close_hub_outage("https://hub", now=T0 + timedelta(minutes=5))
        [row] = store.hub_outages()
        raw = store.query("SELECT * FROM hub_outages")
    assert isinstance(row, HubOutageRow)
    assert (row.id, row.endpoint, row.failures, row.last_error) == (outage_id, "https://hub", 3, "503")
    assert row.ended_at == T0 + timedelta(minutes=5) and row.alerted_at is None
    assert row.as_dict() == raw[0] and list(row.as_dict()) == list(raw[0])   # same keys, same order


def test_a_query_lacking_a_column_is_refused():
    with pytest.raises(StoreError) as err:
        HubStateRow.from_row({"consecutive_failures": 0, "circuit_open_until": None})
    assert err.value.message == ("the query for HubStateRow lacks blocked_until, last_error, "
                                 "last_success_at")
    assert "monitor/store/rows.py" in err.value.hint


def test_a_query_with_a_column_the_class_does_not_name_is_refused():
    row = {"consecutive_failures": 0, "circuit_open_until": None, "blocked_until": None,
           "last_error": None, "last_success_at": None, "endpoint": "https://hub"}
    with pytest.raises(StoreError, match="the query for HubStateRow has endpoint that it does not name"):
        HubStateRow.from_row(row)


def test_rows_are_frozen():
    row = HubStateRow(consecutive_failures=0, circuit_open_until=None, blocked_until=None,
                      last_error=None, last_success_at=None)
    with pytest.raises(AttributeError):
        row.consecutive_failures = 1  # type: ignore[misc]


# -- the nested rows of `lstar alerts list|show` keep the JSON they always had -------------------
def _alert_in_outbox(store: Store) -> int:
    """One prediction with its alert, a delivery frozen into a notification, and one failed attempt."""
    alert = {"alert_key": "p|t|org/a|abc|at_risk", "kind": "fire", "policy": "p", "task": "t", "repo": "org/a",
             "commit_sha": "abc", "lineage": "org/a", "state": "at_risk", "status": "firing",
             "labels": {"alertname": "X", "repo": "org/a"}, "annotations": {"summary": "s"},
             "numbers": {"lstar": -1.5}, "fingerprint": "f" * 16, "starts_at": T0, "ends_at": None,
             "created_at": T0, "deliveries": [{"receiver": "hook", "group_key": "g", "group_labels": {"policy": "p"},
                                               "group_wait_s": 0.0, "group_interval_s": 60.0}]}
    prediction = {"policy": "p", "task": "t", "run_id": "run1", "repo": "org/a", "commit_sha": "abc",
                  "lineage": "org/a", "corpus_sha256": "c" * 64, "lstar": -1.5, "se": 0.01, "p_hat": 0.4,
                  "lo": 0.3, "hi": 0.5, "threshold": 0.5, "state": "at_risk", "curve_id": "k",
                  "detail": {"why": "test"}, "evaluated_at": T0, "alerts": [alert]}
    assert store.write_outbox([prediction], now=T0)["deliveries"] == 1
    [delivery] = store.pending_deliveries()
    assert store.create_notification({"id": "msg_1", "policy": "p", "receiver": "hook", "group_key": "g",
                                      "body": "{}", "n_alerts": 1, "is_meta": False}, [delivery.id], now=T0)
    assert store.claim_notification("msg_1", "me", now=T0, lease_s=60) is not None
    assert store.finish_notification("msg_1", "me", status="dead", now=T0, error="HTTP 400",
                                     attempt={"started_at": T0, "outcome": "dead", "status_code": 400,
                                              "error": "HTTP 400"})
    return delivery.alert_id


def _decoded(rows, *columns):
    return [{**r, **{c: json.loads(r[c]) for c in columns}} for r in rows]


def test_alert_detail_as_dict_is_the_columns_of_each_table(tmp_path):
    with Store.open(tmp_path / "s.duckdb") as store:
        alert_id = _alert_in_outbox(store)
        detail = store.alert_detail(alert_id).as_dict()
        listed = [r.as_dict() for r in store.list_alerts()]
        [alert] = _decoded(store.query("SELECT * FROM alerts"), "labels", "annotations", "numbers")
        deliveries = store.query("SELECT * FROM deliveries")
        [note] = store.query("SELECT id, receiver, status, attempts, next_attempt_at, last_error, dead_reason, "
                             "created_at, delivered_at FROM notifications")
        attempts = store.query("SELECT * FROM delivery_attempts")
        [prediction] = _decoded(store.query("SELECT * FROM predictions"), "detail")
        assert store.alert_detail(alert_id + 1) is None
    expected = {**alert, "deliveries": deliveries, "notifications": [{**note, "attempts_log": attempts}],
                "prediction": prediction}
    assert detail == expected and list(detail) == list(expected)
    assert list(detail["prediction"]) == list(prediction)
    assert detail["notifications"][0]["attempts_log"][0]["status_code"] == 400
    assert listed == [{"id": alert_id, "created_at": T0, "kind": "fire", "policy": "p", "task": "t",
                       "repo": "org/a", "commit_sha": "abc", "state": "at_risk", "status": "firing",
                       "deliveries": [{"receiver": "hook", "status": "dead", "reason": "HTTP 400",
                                       "notification_id": "msg_1"}]}]
    assert list(listed[0]) == ["id", "created_at", "kind", "policy", "task", "repo", "commit_sha", "state",
                               "status", "deliveries"]


def test_from_row_holds_when_another_thread_is_half_way_through_its_first_call(monkeypatch) -> None:
    # The state a first `from_row` of a class leaves between recording its field names and its
    # field set: a second thread (the daemon's API beside a job) reading then must still work.
    from dataclasses import dataclass, fields

    from monitor.store import rows

    @dataclass(frozen=True)
    class Pair(rows.Row):
        a: int
        b: str

    monkeypatch.setitem(rows._FIELD_NAMES, Pair, tuple(f.name for f in fields(Pair)))
    assert Pair.from_row({"b": "x", "a": 1}) == Pair(1, "x")
