"""The outbox and the dispatcher against a real webhook receiver on 127.0.0.1, with an
injected clock (docs/reliability.md rows 1 in-process, 8, 9, 11, 12, 13; silences; resolved
notifications; Standard Webhooks signatures; the Alertmanager body format)."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Literal

import pytest
from pydantic import BaseModel, ConfigDict
from standardwebhooks.webhooks import Webhook

from monitor.alerts import Dispatcher, evaluate_pending
from monitor.alerts.silences import add_silence
from monitor.cli import main
from monitor.demo.receivers import Reply, WebhookReceiver
from monitor.policy.load import load_policy
from monitor.policy.schema import Policy
from monitor.store import Store
from support.scores import fake_sha, record_fake_score

CURVES = Path(__file__).resolve().parent / "fixtures" / "policies" / "curves"
SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
T0 = datetime(2025, 6, 1, 12, 0, tzinfo=timezone.utc)
S = timedelta(seconds=1)
AT_RISK, EMERGED, CLEAR = -2.0, -2.6, -1.2   # arith's states at these L* (SE 0.02)


# -- Alertmanager's webhook format, written down independently -------------------------------------
class _AM(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class AMAlert(_AM):
    status: Literal["firing", "resolved"]
    labels: dict[str, str]
    annotations: dict[str, str]
    startsAt: str
    endsAt: str
    generatorURL: str
    fingerprint: str


class AMMessage(_AM):
    model_config = ConfigDict(extra="allow", strict=True)  # extra top-level keys (ours: lstar)
    version: Literal["4"]
    groupKey: str
    truncatedAlerts: int
    status: Literal["firing", "resolved"]
    receiver: str
    groupLabels: dict[str, str]
    commonLabels: dict[str, str]
    commonAnnotations: dict[str, str]
    externalURL: str
    alerts: list[AMAlert]


def _rfc3339(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def validate_alertmanager(body: dict[str, Any]) -> AMMessage:
    msg = AMMessage.model_validate(body)
    for a in msg.alerts:
        _rfc3339(a.startsAt), _rfc3339(a.endsAt)
        assert len(a.fingerprint) == 16 and int(a.fingerprint, 16) >= 0
    # commonLabels are exactly the labels all alerts share (Alertmanager's definition)
    shared = {k: v for k, v in msg.alerts[0].labels.items() if all(x.labels.get(k) == v for x in msg.alerts)}
    assert msg.commonLabels == shared
    assert msg.status == ("firing" if any(a.status == "firing" for a in msg.alerts) else "resolved")
    return msg


# -- a small world: a policy, a store, scores, a clock -----------------------------------------
@dataclass
class World:
    tmp: Path
    hook: WebhookReceiver
    store: Store
    policy: Policy | None = None
    rng: random.Random = field(default_factory=lambda: random.Random(0))

    def use_policy(self, *, group_by: str = "[policy, repo, commit]", group_wait: str = "0s",
                   group_interval: str = "0s", repeat_interval: str = "4h", timeout: str = "2s",
                   rate: str = "{max: 100, per: 1h}", attempts: int = 5, hook_url: str | None = None,
                   max_alerts: int = 0,
                   extra_receivers: str = "", routes: str = "") -> Policy:
        path = self.tmp / "policy.yaml"
        path.write_text(f"""\
name: frontier
tasks:
  - name: arith
    curve: {CURVES / "arith.json"}
route:
  receiver: hook
  group_by: {group_by}
  group_wait: {group_wait}
  group_interval: {group_interval}
  repeat_interval: {repeat_interval}
{routes}
receivers:
  - name: hook
    webhook: {{url: "{hook_url or self.hook.url}", secret_env: LSTAR_TEST_WEBHOOK_SECRET, timeout: {timeout},
               max_alerts: {max_alerts}}}
    rate_limit: {rate}
    retry: {{max_attempts: {attempts}, initial_backoff: 10s, max_backoff: 1h}}
  - name: ops-log
    file: {{path: ops.jsonl}}
{extra_receivers}
meta_receivers: [ops-log]
""")
        self.policy = load_policy(path)
        return self.policy

    def score(self, repo: str, lstar: float, at: datetime, *, commit: str | None = None, se: float = 0.02) -> str:
        return record_fake_score(self.store, repo=repo, sha=commit or fake_sha(f"{repo}{at}"),
                                 lstar=lstar, se=se, finished_at=at)

    def tick(self, now: datetime) -> tuple[Any, Any]:
        assert self.policy is not None
        evaluated = evaluate_pending(self.store, [self.policy], now=now)
        sent = Dispatcher(self.store, [self.policy], rng=self.rng, owner="test").run_once(now)
        return evaluated, sent

    def ops_log(self) -> list[dict[str, Any]]:
        path = self.tmp / "ops.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def next_attempt(self) -> datetime:
        rows = [r for r in self.store.notifications(status="pending") if r.receiver == "hook"]
        return min(r.next_attempt_at for r in rows)


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    monkeypatch.setenv("LSTAR_TEST_WEBHOOK_SECRET", SECRET)
    with WebhookReceiver() as hook:
        store = Store.open(tmp_path / "state.duckdb")
        try:
            yield World(tmp_path, hook, store)
        finally:
            store.close()


def ids(hook: WebhookReceiver) -> list[str]:
    return [r.headers["webhook-id"] for r in hook.requests]


# -- the happy path: signature, format, numbers ------------------------------------------------------
def test_alert_is_signed_alertmanager_shaped_and_carries_the_numbers(world: World) -> None:
    from monitor.curves.artifact import load_curve, predict

    now = datetime.now(timezone.utc).replace(microsecond=0)  # real time: the verifier checks freshness
    world.use_policy(group_wait="30s")
    world.score("org/model", AT_RISK, now - timedelta(minutes=1), commit="a" * 40)
    evaluated, sent = world.tick(now)
    assert (evaluated.predictions, evaluated.alerts, evaluated.deliveries) == (1, 1, 1)
    assert world.hook.requests == [] and sent.waiting  # group_wait holds the first message back
    world.tick(now + 29 * S)
    assert world.hook.requests == []
    world.tick(now + 30 * S)
    [request] = world.hook.requests

    # Standard Webhooks: verified with the reference library, signature over id.timestamp.body
    body = Webhook(SECRET).verify(request.body, request.headers)
    assert request.headers["webhook-id"].startswith("msg_")
    assert request.headers["webhook-timestamp"] == str(int((now + 30 * S).timestamp()))
    assert request.headers["content-type"] == "application/json"
    tampered = dict(request.headers, **{"webhook-timestamp": str(int(now.timestamp()) - 1)})
    with pytest.raises(Exception):
        Webhook(SECRET).verify(request.body, tampered)

    msg = validate_alertmanager(body)
    assert msg.receiver == "hook" and msg.status == "firing" and msg.truncatedAlerts == 0
    [alert] = msg.alerts
    assert alert.labels == {"alertname": "LstarTaskEmergence", "policy": "frontier", "task": "arith",
                            "repo": "org/model", "lineage": "org/model", "commit": "a" * 40,
                            "state": "at_risk", "severity": "warning", "axis": "lstar"}
    assert msg.groupLabels == {"policy": "frontier", "repo": "org/model", "commit": "a" * 40}
    assert alert.endsAt == "0001-01-01T00:00:00Z"
    assert _rfc3339(alert.startsAt) == now
    expected = predict(load_curve(CURVES / "arith.json"), AT_RISK, 0.02)
    [numbers] = body["lstar"]["alerts"]
    assert body["lstar"]["policy"] == "frontier"
    assert numbers["lstar"] == AT_RISK and numbers["se"] == 0.02
    assert numbers["p_hat"] == pytest.approx(expected.p_hat)
    assert numbers["interval"] == pytest.approx([expected.lower, expected.upper])
    assert numbers["threshold"] == pytest.approx(0.30) and numbers["state"] == "at_risk"
    assert numbers["curve_id"] == expected.curve_id
    assert numbers["corpus_sha256"] == "9f269a7db0b131d819be2e51974914a3cf715cc388cceb82885f7a5a21e644d8"


def test_the_secret_is_never_stored(world: World) -> None:
    world.use_policy()
    world.score("org/model", AT_RISK, T0)
    world.tick(T0)
    assert len(world.hook.requests) == 1
    world.store.checkpoint()
    raw = world.store.path.read_bytes()
    assert SECRET.encode() not in raw and SECRET[6:].encode() not in raw
    for table in ("alerts", "deliveries", "notifications", "delivery_attempts", "predictions", "endpoints"):
        assert SECRET[6:] not in json.dumps(world.store.query(f"SELECT * FROM {table}"), default=str)


# -- row 1, in process: evaluating the same score twice writes nothing new -------------------------
def test_reevaluation_finds_the_key_and_sends_once(world: World) -> None:
    world.use_policy()
    world.score("org/model", AT_RISK, T0, commit="b" * 40)
    first, _ = world.tick(T0)
    again, _ = world.tick(T0 + S)
    assert (first.predictions, first.alerts, first.deliveries) == (1, 1, 1)
    assert (again.predictions, again.alerts, again.deliveries) == (0, 0, 0)
    # the same commit scored again (a new run): a prediction, but the alert key already exists
    world.score("org/model", AT_RISK, T0 + 2 * S, commit="b" * 40)
    rescored, _ = world.tick(T0 + 5 * H)
    assert (rescored.predictions, rescored.alerts, rescored.deliveries) == (1, 0, 0)
    assert len(world.hook.requests) == 1


H = timedelta(hours=1)


# -- row 8: 500 K times, then 200 -------------------------------------------------------------------
def test_500_k_times_then_200_delivers_exactly_once_with_one_id(world: World) -> None:
    world.use_policy(attempts=10)
    world.hook.script([Reply(500, body="boom")] * 4)
    world.score("org/model", AT_RISK, T0)
    now = T0
    world.tick(now)
    previous = now
    for _ in range(4):
        due = world.next_attempt()
        # full-jitter backoff: within [0, 10s·2^(n−1)] after the failed attempt
        n = len(world.hook.requests)
        assert previous <= due <= previous + timedelta(seconds=10 * 2 ** (n - 1))
        world.tick(due - timedelta(milliseconds=1) if due > previous else due)
        assert len(world.hook.requests) == n + (0 if due > previous else 1)
        world.tick(due)
        previous = due
    assert [r.answered for r in world.hook.requests] == [500, 500, 500, 500, 200]
    assert len(set(ids(world.hook))) == 1
    assert len({r.body for r in world.hook.requests}) == 1   # byte-identical body on every try
    [note] = world.store.notifications()
    assert note.status == "delivered" and note.attempts == 5
    attempts = world.store.delivery_attempts(note.id)
    assert [a.outcome for a in attempts] == ["retry"] * 4 + ["delivered"]
    assert [a.status_code for a in attempts] == [500] * 4 + [200]
    world.tick(previous + 10 * H)
    assert len(world.hook.requests) == 5  # nothing more once delivered


# -- row 9: 429, 410, 3xx, 400, hang ----------------------------------------------------------------
def test_429_retry_after_throttles_the_channel(world: World) -> None:
    world.use_policy()
    world.hook.script([Reply(429, headers={"Retry-After": "120"})])
    world.score("org/a", AT_RISK, T0)
    world.tick(T0)
    assert [r.answered for r in world.hook.requests] == [429]
    world.score("org/b", AT_RISK, T0 + S)   # another message for the same receiver
    world.tick(T0 + 119 * S)
    assert len(world.hook.requests) == 1    # nothing before Retry-After, not even the other message
    world.tick(T0 + 120 * S)
    assert [r.answered for r in world.hook.requests] == [429, 200, 200]
    first, other, retried = ids(world.hook)
    assert retried == first != other   # the throttled message went again under its own id


def test_410_disables_the_endpoint_and_tells_the_operator(world: World) -> None:
    world.use_policy()
    world.hook.script([Reply(410)])
    world.score("org/a", AT_RISK, T0)
    world.tick(T0)
    [note] = [n for n in world.store.notifications() if n.receiver == "hook"]
    assert note.status == "dead" and "410" in note.dead_reason and "disabled" in note.dead_reason
    assert world.store.endpoint("frontier", "hook").disabled_at == T0
    [told] = world.ops_log()  # the operator hears through the other receiver, in the same pass
    meta = told["message"]["alerts"][0]
    assert meta["labels"]["alertname"] == "LstarDeliveryFailed" and meta["labels"]["receiver"] == "hook"
    assert told["message"]["lstar"]["meta"][0]["notification_id"] == note.id
    # later alerts for the disabled receiver are dead-lettered, never sent
    world.score("org/b", EMERGED, T0 + H)
    world.tick(T0 + H)
    assert len(world.hook.requests) == 1
    dead = world.store.query("SELECT reason FROM deliveries WHERE receiver = 'hook' AND status = 'dead' "
                             "ORDER BY id")
    assert len(dead) == 2 and dead[1]["reason"].startswith("receiver hook is disabled")
    assert len(world.ops_log()) == 1  # one operator message per disabling, not per alert
    # once fixed, `lstar alerts enable` lets it receive again
    world.store.enable_endpoint("frontier", "hook", now=T0 + 2 * H)
    world.score("org/c", AT_RISK, T0 + 2 * H)
    world.tick(T0 + 2 * H)
    assert [r.answered for r in world.hook.requests] == [410, 200]


def test_redirect_is_a_failure_and_is_not_followed(world: World) -> None:
    with WebhookReceiver() as elsewhere:
        world.use_policy()
        world.hook.script([Reply(302, headers={"Location": elsewhere.url})])
        world.score("org/a", AT_RISK, T0)
        world.tick(T0)
        assert elsewhere.requests == []
        [note] = world.store.notifications()
        assert note.status == "pending" and "302" in note.last_error and "not followed" in note.last_error
        world.tick(world.next_attempt())
        assert [r.answered for r in world.hook.requests] == [302, 200]
        assert elsewhere.requests == []


def test_400_is_dead_lettered_at_once_with_the_reason(world: World) -> None:
    world.use_policy()
    world.hook.script([Reply(400, body="bad payload")])
    world.score("org/a", AT_RISK, T0)
    world.tick(T0)
    world.tick(T0 + 10 * H)
    assert [r.answered for r in world.hook.requests] == [400]
    [note] = [n for n in world.store.notifications() if n.receiver == "hook"]
    assert note.status == "dead"
    assert note.dead_reason.startswith("HTTP 400 from http://127.0.0.1:")
    assert "bad payload" in note.dead_reason
    assert world.store.endpoint("frontier", "hook") is None  # a 400 does not disable the receiver
    assert [m["message"]["alerts"][0]["annotations"]["description"] for m in world.ops_log()] == [note.dead_reason]


def test_hang_times_out_and_is_retried_with_the_same_id(world: World) -> None:
    world.use_policy(timeout="300ms")
    world.hook.script([Reply(200, hang_s=5)])
    world.score("org/a", AT_RISK, T0)
    world.tick(T0)
    [note] = world.store.notifications()
    assert note.status == "pending" and "within 0.3 s" in note.last_error
    world.tick(world.next_attempt())
    assert len(world.hook.requests) == 2 and len(set(ids(world.hook))) == 1
    assert world.store.notifications()[0].status == "delivered"


# -- row 11: retry budget exhausted -----------------------------------------------------------------
def test_retry_budget_exhausted_dead_letters_and_raises_a_meta_alert(world: World) -> None:
    world.use_policy(attempts=3)
    world.hook.default = Reply(503, body="down")
    world.score("org/a", AT_RISK, T0)
    world.tick(T0)
    for _ in range(2):
        world.tick(world.next_attempt())
    assert [r.answered for r in world.hook.requests] == [503] * 3
    [note] = [n for n in world.store.notifications() if n.receiver == "hook"]
    assert note.status == "dead"
    assert note.dead_reason.startswith("gave up after 3 attempts: HTTP 503 from http://127.0.0.1:")
    delivery = world.store.query("SELECT status, reason FROM deliveries WHERE receiver = 'hook'")[0]
    assert delivery == {"status": "dead", "reason": note.dead_reason}
    [told] = world.ops_log()
    assert told["message"]["alerts"][0]["labels"]["state"] == "dead"
    assert told["message"]["alerts"][0]["annotations"]["description"] == note.dead_reason
    assert [a.outcome for a in world.store.delivery_attempts(note.id)] == ["retry", "retry", "dead"]


def test_a_failed_meta_alert_raises_no_further_meta_alert(world: World, tmp_path: Path) -> None:
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("")
    world.use_policy(extra_receivers=f"  - name: broken-log\n    file: {{path: {blocked}/x.jsonl}}\n")
    world.policy = world.policy.model_copy(update={"meta_receivers": ["broken-log"]})  # type: ignore[union-attr]
    world.hook.script([Reply(400)])
    world.score("org/a", AT_RISK, T0)
    world.tick(T0)
    rows = {n.receiver: n for n in world.store.notifications()}
    assert rows["hook"].status == "dead"
    assert rows["broken-log"].status == "dead" and rows["broken-log"].is_meta
    assert len(world.store.notifications()) == 2  # no third message about the second failure


# -- row 12: many checkpoints at once ------------------------------------------------------------------
def test_many_flags_at_once_are_grouped_per_policy(world: World) -> None:
    world.use_policy(group_by="[policy]", group_wait="30s")
    for i in range(6):
        world.score(f"org/model-{i}", AT_RISK, T0 + i * S)
    world.tick(T0 + 10 * S)
    world.tick(T0 + 40 * S)
    [request] = world.hook.requests
    msg = validate_alertmanager(request.json())
    assert sorted(a.labels["repo"] for a in msg.alerts) == [f"org/model-{i}" for i in range(6)]
    assert msg.groupLabels == {"policy": "frontier"}
    assert msg.commonLabels["state"] == "at_risk" and "repo" not in msg.commonLabels


def test_max_alerts_splits_a_group_instead_of_truncating(world: World) -> None:
    world.use_policy(group_by="[policy]", max_alerts=2)
    for i in range(5):
        world.score(f"org/model-{i}", AT_RISK, T0)
    world.tick(T0)
    sizes = sorted(len(r.json()["alerts"]) for r in world.hook.requests)
    assert sizes == [1, 2, 2]
    assert all(r.json()["truncatedAlerts"] == 0 for r in world.hook.requests)
    repos = sorted(a["labels"]["repo"] for r in world.hook.requests for a in r.json()["alerts"])
    assert repos == [f"org/model-{i}" for i in range(5)]


def test_per_channel_rate_limit_spreads_a_flood(world: World) -> None:
    world.use_policy(rate="{max: 2, per: 1h}")
    for i in range(5):
        world.score(f"org/model-{i}", AT_RISK, T0)
    _, sent = world.tick(T0)
    assert len(world.hook.requests) == 2 and len([w for w in sent.waiting if "rate limit" in w]) == 3
    world.tick(T0 + 59 * timedelta(minutes=1))
    assert len(world.hook.requests) == 2
    world.tick(T0 + H + S)
    assert len(world.hook.requests) == 4
    world.tick(T0 + 2 * H + S)
    assert len(world.hook.requests) == 5
    assert len(set(ids(world.hook))) == 5   # each message once
    repos = sorted(r.json()["alerts"][0]["labels"]["repo"] for r in world.hook.requests)
    assert repos == [f"org/model-{i}" for i in range(5)]


# -- row 13: a condition that persists ------------------------------------------------------------------
def test_no_repeat_within_repeat_interval_across_restarts(world: World) -> None:
    world.use_policy(repeat_interval="4h")
    for hour in range(10):   # a new at-risk commit of the same lineage every hour
        now = T0 + hour * H
        world.score("org/model", AT_RISK, now)
        world.tick(now)
        if hour % 3 == 2:    # restart: a fresh store handle and dispatcher
            world.store.close()
            world.store = Store.open(world.tmp / "state.duckdb")
    sent_at = [T0 + h * H for h in (0, 4, 8)]
    commits = [r.json()["alerts"][0]["labels"]["commit"] for r in world.hook.requests]
    assert len(world.hook.requests) == 3
    assert commits == [fake_sha(f"org/model{t}") for t in sent_at]
    kinds = [a.kind for a in reversed(world.store.list_alerts())]
    assert kinds == ["fire", "repeat", "repeat"]


def test_state_change_fires_at_once_and_resolve_keeps_the_labels(world: World) -> None:
    world.use_policy(repeat_interval="4h")
    world.score("org/model", AT_RISK, T0)
    world.tick(T0)
    world.score("org/model", EMERGED, T0 + H)       # state change: no waiting for repeat_interval
    world.tick(T0 + H)
    world.score("org/model", CLEAR, T0 + 2 * H)
    world.tick(T0 + 2 * H)
    world.score("org/model", CLEAR, T0 + 3 * H)     # still clear: nothing
    world.tick(T0 + 3 * H)
    bodies = [r.json() for r in world.hook.requests]
    assert [b["alerts"][0]["labels"]["state"] for b in bodies] == ["at_risk", "emerged", "emerged"]
    assert [b["status"] for b in bodies] == ["firing", "firing", "resolved"]
    fired, resolved = bodies[1]["alerts"][0], bodies[2]["alerts"][0]
    assert resolved["labels"] == fired["labels"] and resolved["fingerprint"] == fired["fingerprint"]
    assert resolved["startsAt"] == fired["startsAt"]
    assert _rfc3339(resolved["endsAt"]) == T0 + 2 * H
    assert bodies[2]["lstar"]["alerts"][0]["state"] == "clear"
    validate_alertmanager(bodies[2])


# -- silences ---------------------------------------------------------------------------------------
def test_nothing_is_sent_while_silenced(world: World) -> None:
    world.use_policy(repeat_interval="1h")
    add_silence(world.store, ["task=arith", "repo=~org/.*"], until=T0 + 3 * H, comment="maintenance", now=T0)
    for hour in range(3):
        world.score("org/model", AT_RISK, T0 + hour * H)
        world.tick(T0 + hour * H)
    assert world.hook.requests == []
    statuses = {r["status"] for r in world.store.query("SELECT status FROM deliveries")}
    assert statuses == {"silenced"}
    # after the silence ends, the still-firing lineage is told at its next evaluation
    world.score("org/model", AT_RISK, T0 + 3 * H)
    world.tick(T0 + 3 * H)
    assert len(world.hook.requests) == 1
    assert world.hook.requests[0].json()["alerts"][0]["labels"]["state"] == "at_risk"


def test_a_silence_added_after_grouping_still_stops_the_send(world: World) -> None:
    world.use_policy()
    world.hook.script([Reply(500)])
    world.score("org/model", AT_RISK, T0)
    world.tick(T0)
    assert len(world.hook.requests) == 1
    add_silence(world.store, ["policy=frontier"], until=T0 + 10 * H, comment="noisy", now=T0 + S)
    world.tick(world.next_attempt())
    assert len(world.hook.requests) == 1
    assert world.store.notifications()[0].status == "silenced"


def test_silences_do_not_match_other_alerts(world: World) -> None:
    world.use_policy()
    add_silence(world.store, ["repo=org/quiet"], until=T0 + H, comment="known", now=T0)
    world.score("org/quiet", AT_RISK, T0)
    world.score("org/loud", AT_RISK, T0)
    world.tick(T0)
    assert [r.json()["alerts"][0]["labels"]["repo"] for r in world.hook.requests] == ["org/loud"]


# -- invariants over what the receiver recorded --------------------------------------------------------
def test_invariants_over_a_mixed_run(world: World) -> None:
    world.use_policy(attempts=4, group_wait="10s", repeat_interval="2h")
    world.hook.script([Reply(500), Reply(429, headers={"Retry-After": "30"}), Reply(500), Reply(400)])
    rng = random.Random(5)
    now = T0
    for step in range(12):
        now = T0 + step * timedelta(minutes=40)
        for repo in ("org/a", "org/b", "org/c"):
            if rng.random() < 0.6:
                world.score(repo, rng.choice([AT_RISK, EMERGED, CLEAR]), now)
        world.tick(now)
    for _ in range(10):   # let retries finish, jumping the clock to each next attempt
        pending = world.store.notifications(status="pending")
        if not pending and not world.store.pending_deliveries():
            break
        now = max(now + 11 * S, min([p.next_attempt_at for p in pending], default=now))
        world.tick(now)
    deliveries = world.store.query("SELECT d.status, d.reason, d.notification_id FROM deliveries d "
                                   "WHERE d.receiver = 'hook'")
    assert {d["status"] for d in deliveries} == {"delivered", "dead"}   # both paths were exercised
    for d in deliveries:   # every alert delivered or dead-lettered with a reason
        assert d["status"] in ("delivered", "dead")
        assert d["status"] == "delivered" or d["reason"]
    seen: dict[str, str] = {}
    for r in world.hook.requests:    # one webhook-id per alert: no alert travels under two ids
        for a in r.json()["alerts"]:
            key = a["labels"]["commit"] + a["status"]
            assert seen.setdefault(key, r.headers["webhook-id"]) == r.headers["webhook-id"]
    delivered = {d["notification_id"] for d in deliveries if d["status"] == "delivered"}
    assert delivered <= set(ids(world.hook))


# -- CLI over the same state ----------------------------------------------------------------------
def test_alerts_and_silence_commands(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    world.use_policy()
    world.hook.script([Reply(400)])
    world.score("org/model", AT_RISK, T0)
    world.tick(T0)
    world.store.close()
    db = str(world.tmp / "state.duckdb")
    assert main(["alerts", "list", "--db", db, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["items"]
    task_alert = next(r for r in rows if r["kind"] == "fire")
    assert task_alert["deliveries"] == [{"receiver": "hook", "status": "dead", "reason": task_alert["deliveries"][0]["reason"],
                                         "notification_id": task_alert["deliveries"][0]["notification_id"]}]
    assert main(["alerts", "show", str(task_alert["id"]), "--json"] + ["--db", db]) == 0
    detail = json.loads(capsys.readouterr().out)
    assert detail["prediction"]["state"] == "at_risk"
    assert [a["outcome"] for a in detail["notifications"][0]["attempts_log"]] == ["dead"]
    assert main(["alerts", "show", str(task_alert["id"]), "--db", db]) == 0
    shown = capsys.readouterr().out
    assert "dead" in shown and "400" in shown
    assert main(["alerts", "retry", str(task_alert["id"]), "--db", db, "--now", (T0 + H).isoformat()]) == 0
    assert capsys.readouterr().out.startswith("requeued msg_")
    assert main(["alerts", "dispatch", "--policy", str(world.tmp / "policy.yaml"), "--db", db,
                 "--now", (T0 + H).isoformat()]) == 0
    assert "delivered: hook" in capsys.readouterr().out
    assert [r.answered for r in world.hook.requests] == [400, 200]
    assert main(["alerts", "retry", str(task_alert["id"]), "--db", db]) == 2
    assert "nothing to retry" in capsys.readouterr().err

    assert main(["silence", "add", "--match", "task=arith", "--match", "repo=~org/.*", "--until", "2h",
                 "--comment", "upgrade", "--db", db, "--now", T0.isoformat()]) == 0
    sid = capsys.readouterr().out.strip()
    assert main(["silence", "list", "--db", db, "--json", "--now", (T0 + H).isoformat()]) == 0
    [listed] = json.loads(capsys.readouterr().out)["items"]
    assert listed["id"] == sid and listed["state"] == "active" and listed["comment"] == "upgrade"
    assert listed["matchers"] == ['task="arith"', 'repo=~"org/.*"']
    assert main(["silence", "expire", sid, "--db", db, "--now", (T0 + H).isoformat()]) == 0
    capsys.readouterr()
    assert main(["silence", "list", "--db", db, "--json", "--now", (T0 + H).isoformat()]) == 0
    assert json.loads(capsys.readouterr().out)["items"] == []
    assert main(["silence", "add", "--match", "task=~.*", "--until", "1h", "--comment", "x", "--db", db]) == 2
    assert "would silence every alert" in capsys.readouterr().err
    world.store = Store.open(world.tmp / "state.duckdb")


def test_alerts_test_sends_through_one_receiver(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    world.use_policy()
    policy_file = str(world.tmp / "policy.yaml")
    assert main(["alerts", "test", "hook", "--policy", policy_file, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["outcome"] == "delivered" and out["status_code"] == 200
    [request] = world.hook.requests
    body = Webhook(SECRET).verify(request.body, request.headers)
    assert body["alerts"][0]["labels"]["alertname"] == "LstarTest"
    world.hook.script([Reply(404)])
    assert main(["alerts", "test", "hook", "--policy", policy_file]) == 2
    assert "HTTP 404" in capsys.readouterr().err
    assert main(["alerts", "test", "ops-log", "--policy", policy_file]) == 0
    assert world.ops_log()[0]["message"]["alerts"][0]["labels"]["alertname"] == "LstarTest"


def test_once_waits_for_a_resolve_until_its_groups_interval(world: World) -> None:
    """What `lstar run --once` waits for (`outbox_due_times`) is when the dispatcher sends: a
    resolve in a group that has already sent waits group_interval after that message, not
    group_wait after the resolve (else --once waits for nothing and names a time in the past)."""
    world.use_policy(group_by="[policy, repo]", group_wait="30s", group_interval="5m")
    world.score("org/model", AT_RISK, T0)
    world.tick(T0)
    assert world.store.outbox_due_times() == [T0 + 30 * S]          # a new group: group_wait
    world.tick(T0 + 30 * S)
    assert len(world.hook.requests) == 1 and world.store.outbox_due_times() == []
    world.score("org/model", CLEAR, T0 + 60 * S)
    world.tick(T0 + 60 * S)                                          # the resolve is queued
    first_sent, interval = T0 + 30 * S, 300 * S
    assert world.store.outbox_due_times() == [first_sent + interval]   # not T0 + 90 s
    world.tick(first_sent + interval - S)
    assert len(world.hook.requests) == 1
    world.tick(first_sent + interval)
    assert [r.json()["status"] for r in world.hook.requests] == ["firing", "resolved"]
