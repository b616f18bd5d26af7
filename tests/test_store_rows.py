"""Typed rows: built from a query by column name, refused when the query and the class differ,
and turned back into exactly the dict of columns the JSON output has always carried."""

from __future__ import annotations

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
