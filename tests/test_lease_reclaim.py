"""Leases left by a dead process (docs/reliability.md rows 40 and 41, store side): a starting
daemon frees them at once, recording each interrupted attempt with the time it started, without
counting it twice; a lease that expires in the ordinary way is recorded with its start as well."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from monitor.hub.queue import claim_next
from monitor.store import Store
from tests.test_queue import LEASE_S, add_gated

T0 = datetime(2025, 6, 1, 12, 0, tzinfo=timezone.utc)


@pytest.fixture
def store(tmp_path):
    with Store.open(tmp_path / "state.duckdb") as s:
        yield s


def pending_notification(store: Store, notification_id: str = "msg_1") -> str:
    """One alert with one delivery frozen into a pending notification, due at T0."""
    alert = {"alert_key": "p|t|org/a|abc|at_risk", "kind": "fire", "policy": "p", "task": "t", "repo": "org/a",
             "commit_sha": "abc", "lineage": "org/a", "state": "at_risk", "status": "firing",
             "labels": {"alertname": "X"}, "annotations": {}, "numbers": {"lstar": -1.5},
             "fingerprint": "f" * 16, "starts_at": T0, "ends_at": None, "created_at": T0,
             "deliveries": [{"receiver": "hook", "group_key": "g", "group_labels": {"policy": "p"},
                             "group_wait_s": 0.0, "group_interval_s": 60.0}]}
    prediction = {"policy": "p", "task": "t", "run_id": "run1", "repo": "org/a", "commit_sha": "abc",
                  "lineage": "org/a", "corpus_sha256": "c" * 64, "lstar": -1.5, "se": 0.01, "p_hat": 0.4,
                  "lo": 0.3, "hi": 0.5, "threshold": 0.5, "state": "at_risk", "curve_id": "k",
                  "detail": {}, "evaluated_at": T0, "alerts": [alert]}
    store.write_outbox([prediction], now=T0)
    [delivery] = store.pending_deliveries()
    assert store.create_notification({"id": notification_id, "policy": "p", "receiver": "hook", "group_key": "g",
                                      "body": "{}", "n_alerts": 1, "is_meta": False}, [delivery.id], now=T0)
    return notification_id


def test_a_dead_delivery_lease_is_freed_at_once_and_recorded_with_its_start(store):
    nid = pending_notification(store)
    assert store.claim_notification(nid, "dead:1", now=T0 + timedelta(seconds=1), lease_s=300).attempts == 1

    restart = T0 + timedelta(seconds=20)   # long before the 5-minute lease would expire
    assert store.due_notifications(restart) == []
    [freed] = store.reclaim_notification_leases("new:2", now=restart)
    assert (freed.table, freed.id, freed.owner, freed.attempt) == ("notifications", nid, "dead:1", 1)
    assert freed.started_at == T0 + timedelta(seconds=1)

    row = store.notification(nid)
    assert (row.attempts, row.lease_owner, row.lease_expires_at, row.lease_started_at) == (1, None, None, None)
    assert [d.id for d in store.due_notifications(restart)] == [nid]
    [lost] = store.delivery_attempts(nid)
    assert (lost.attempt, lost.outcome, lost.started_at) == (1, "lease_expired", T0 + timedelta(seconds=1))
    assert "dead:1 died during attempt 1" in lost.error and "reclaimed by new:2" in lost.error

    # the re-send is attempt 2 of the same notification (same webhook-id), recorded once
    again = store.claim_notification(nid, "new:2", now=restart, lease_s=300)
    assert (again.id, again.attempts, again.lease_owner, again.lease_started_at) == (nid, 2, "new:2", restart)
    assert len(store.delivery_attempts(nid)) == 1
    assert store.reclaim_notification_leases("new:2", now=restart) == []   # its own lease stays
    assert store.notification(nid).lease_owner == "new:2"


def test_an_expired_delivery_lease_is_recorded_with_the_attempts_start_not_its_expiry(store):
    nid = pending_notification(store)
    store.claim_notification(nid, "dead:1", now=T0, lease_s=300)
    store.claim_notification(nid, "other:2", now=T0 + timedelta(minutes=6), lease_s=300)
    [lost] = store.delivery_attempts(nid)
    assert (lost.outcome, lost.attempt, lost.started_at) == ("lease_expired", 1, T0)


def test_a_dead_scoring_lease_is_freed_keeping_status_and_attempts(store):
    (only,) = add_gated(store, "org/a")
    started = T0 + timedelta(seconds=5)
    job = claim_next(store, "dead:1", started, LEASE_S)
    assert store.advance_checkpoint(job.id, "dead:1", status="fetched", meta={"files": 3},
                                    now=started + timedelta(seconds=30))

    restart = started + timedelta(seconds=60)
    [freed] = store.reclaim_checkpoint_leases("new:2", now=restart)
    assert (freed.table, freed.id, freed.owner, freed.attempt, freed.started_at) == \
        ("checkpoints", str(only), "dead:1", 1, started)
    row = store.get_checkpoint(only)
    assert (row.status, row.attempts, row.lease_owner, row.lease_expires_at) == ("fetched", 1, None, None)
    assert row.reason == (f"dead:1 died during attempt 1 (started {started.isoformat()}); "
                          "its lease was reclaimed by new:2 at start")
    assert row.meta["files"] == 3
    assert row.meta["interrupted"] == [{"attempt": 1, "owner": "dead:1", "started_at": started.isoformat(),
                                        "reclaimed_at": restart.isoformat(), "reclaimed_by": "new:2"}]

    again = claim_next(store, "new:2", restart, LEASE_S, statuses=("fetched",))
    assert (again.id, again.attempts, again.lease_owner) == (only, 2, "new:2")
    assert store.reclaim_checkpoint_leases("new:2", now=restart) == []   # its own lease stays


def test_a_third_dead_attempt_still_fails_the_row_with_its_reason(store):
    (only,) = add_gated(store, "org/a")
    now = T0
    for n in (1, 2, 3):
        assert claim_next(store, f"dead:{n}", now, LEASE_S).attempts == n
        now += timedelta(seconds=10)
        assert len(store.reclaim_checkpoint_leases(f"new:{n}", now=now)) == 1
    assert claim_next(store, "new:4", now, LEASE_S) is None
    row = store.get_checkpoint(only)
    assert (row.status, row.attempts, row.lease_owner) == ("failed", 3, None)
    assert row.reason.startswith("gave up after 3 attempts: dead:3 died during attempt 3 (started ")
    assert [i["attempt"] for i in row.meta["interrupted"]] == [1, 2, 3]
