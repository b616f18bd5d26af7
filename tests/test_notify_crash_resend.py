"""Crash tests (docs/reliability.md rows 2 and 13): the outbox pass runs as a subprocess, is killed with
SIGKILL after the receiver answered 2xx but before the delivery was marked, and is restarted;
invariants are checked over what the webhook receiver recorded."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from monitor.demo.receivers import WebhookReceiver
from monitor.store import Store
from test_notify_crash import T0, dispatch, killed, score, write_policy

pytestmark = pytest.mark.slow


def test_kill_after_2xx_before_mark_resends_once_with_the_same_id(tmp_path: Path) -> None:
    with WebhookReceiver() as hook:
        policy = write_policy(tmp_path, hook.url)
        score(tmp_path, "org/model", "b" * 40, T0)

        result = dispatch(tmp_path, policy, T0, failpoint="after_send_before_mark")
        assert killed(result), result.stderr
        assert [r.answered for r in hook.requests] == [200]

        # restarted while the dead process's lease still runs: nothing is sent
        result = dispatch(tmp_path, policy, T0 + timedelta(minutes=1))
        assert result.returncode == 0, result.stderr
        assert len(hook.requests) == 1

        # once the lease expired: one re-send, byte-identical, same webhook-id
        result = dispatch(tmp_path, policy, T0 + timedelta(minutes=6))
        assert result.returncode == 0, result.stderr
        assert len(hook.requests) == 2
        first, second = hook.requests
        assert first.headers["webhook-id"] == second.headers["webhook-id"]
        assert first.body == second.body

        with Store.open(tmp_path / "state.duckdb", read_only=True) as store:
            [note] = store.notifications()
            assert note.status == "delivered"
            attempts = store.delivery_attempts(note.id)
        assert [a.outcome for a in attempts] == ["lease_expired", "delivered"]
        assert "expired during attempt 1" in attempts[0].error

        # row 13 across restarts: the same condition on a new commit within repeat_interval
        # is not repeated; after it, it is (each pass a fresh process)
        score(tmp_path, "org/model", "c" * 40, T0 + timedelta(hours=1))
        assert dispatch(tmp_path, policy, T0 + timedelta(hours=1)).returncode == 0
        assert len(hook.requests) == 2
        score(tmp_path, "org/model", "d" * 40, T0 + timedelta(hours=4))
        assert dispatch(tmp_path, policy, T0 + timedelta(hours=4)).returncode == 0
        assert len(hook.requests) == 3
        assert hook.requests[2].json()["alerts"][0]["labels"]["commit"] == "d" * 40
        assert len({r.headers["webhook-id"] for r in hook.requests}) == 2  # one id per alert message
