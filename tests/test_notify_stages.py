"""The dispatcher's pipeline runs its stages in the documented order (silence → disabled
receiver → throttle → rate limit → claim → send → record) and the first stage that drops a
notification ends its pass: checked on what the database and the webhook receiver hold."""

from __future__ import annotations

import ast
import inspect
import textwrap
from datetime import timedelta
from typing import Any

from test_notify import AT_RISK, T0, World, world  # noqa: F401  (world is a fixture)

from monitor.alerts import Dispatcher, dispatcher, evaluate_pending
from monitor.alerts.silences import add_silence
from monitor.demo.receivers import Reply
from monitor.store.rows import NotificationRow

S, H = timedelta(seconds=1), timedelta(hours=1)
PIPELINE = ["silence_notification", "disabled_notification", "throttle", "rate_limit", "claim", "send",
            "record"]


def _note(world: World, repo: str) -> NotificationRow:
    rows = [world.store.notification(n.id) for n in world.store.notifications() if n.receiver == "hook"]
    [row] = [r for r in rows if r is not None and r.payload()["alerts"][0]["labels"]["repo"] == repo]
    return row


def _attempts(world: World, notification: str) -> list[dict[str, Any]]:
    return world.store.query("SELECT * FROM delivery_attempts WHERE notification_id = ?", [notification])


def _untouched(world: World, row: NotificationRow) -> None:
    """Never claimed, never sent: no lease, no attempt counted or recorded."""
    assert row.attempts == 0 and row.lease_owner is None
    assert _attempts(world, row.id) == []


def test_the_driver_calls_the_stages_in_the_documented_order() -> None:
    tree = ast.parse(textwrap.dedent(inspect.getsource(Dispatcher.deliver)))
    calls = sorted((n.lineno, n.col_offset, n.func.id) for n in ast.walk(tree)
                   if isinstance(n, ast.Call) and isinstance(n.func, ast.Name))
    called = [name for _, _, name in calls]   # in source order
    assert [c for c in called if c in PIPELINE] == PIPELINE
    documented = "silence → disabled receiver → throttle → rate limit → claim → send → record"
    assert documented in (dispatcher.__doc__ or "")


def test_throttle_stops_before_rate_limit_and_silence_before_both(world: World) -> None:
    world.use_policy(rate="{max: 1, per: 1h}")
    world.hook.script([Reply(429, headers={"Retry-After": "7200"})])
    world.score("org/a", AT_RISK, T0)
    world.tick(T0)   # one send, answered 429: the receiver is throttled 2h and its hourly budget spent
    assert [r.answered for r in world.hook.requests] == [429]
    world.score("org/b", AT_RISK, T0 + S)
    _, sent = world.tick(T0 + S)
    b = _note(world, "org/b")
    # both throttle and rate limit would drop it; throttle comes first and ends the pass
    [line] = [w for w in sent.waiting if w.startswith(b.id)]
    assert "throttled until" in line and "rate limit" not in line
    assert b.status == "pending"
    _untouched(world, b)
    # a silence now drops it at the first stage, although the receiver is throttled and rate limited
    add_silence(world.store, ["repo=org/b"], until=T0 + 10 * H, comment="known", now=T0 + 2 * S)
    _, sent = world.tick(T0 + 2 * S)
    b = _note(world, "org/b")
    assert b.status == "silenced" and sent.silenced == 1 and sent.sent == []
    _untouched(world, b)
    assert len(world.hook.requests) == 1
    a = _note(world, "org/a")   # not silenced: still waiting on the throttle
    assert a.status == "pending" and a.attempts == 1 and len(_attempts(world, a.id)) == 1


def test_a_rate_limited_notification_is_never_claimed(world: World) -> None:
    world.use_policy(rate="{max: 1, per: 1h}")
    world.score("org/a", AT_RISK, T0)
    world.score("org/b", AT_RISK, T0)
    _, sent = world.tick(T0)
    assert [r.answered for r in world.hook.requests] == [200]
    [delivered] = world.store.notifications(status="delivered")
    [held] = world.store.notifications(status="pending")
    assert [w for w in sent.waiting if w.startswith(held.id)][0].count("rate limit") == 1
    _untouched(world, held)
    assert [r["outcome"] for r in _attempts(world, delivered.id)] == ["delivered"]


def test_a_notification_leased_elsewhere_is_not_sent(world: World) -> None:
    world.use_policy()
    world.score("org/a", AT_RISK, T0)
    evaluate_pending(world.store, [world.policy], now=T0)
    d = Dispatcher(world.store, [world.policy], rng=world.rng, owner="test")
    [nid] = d.flush_groups(T0).formed
    assert world.store.claim_notification(nid, "elsewhere", now=T0, lease_s=300) is not None
    report = d.send_due(T0 + S)
    assert report.sent == [] and world.hook.requests == []
    row = world.store.notification(nid)
    assert row.lease_owner == "elsewhere" and row.status == "pending" and _attempts(world, nid) == []
