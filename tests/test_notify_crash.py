"""Crash tests (docs/reliability.md row 1): the outbox pass (`lstar alerts dispatch`) runs as a
subprocess and is killed with SIGKILL at named fail points; invariants are checked over what
the webhook receiver recorded and what the database holds after each restart."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from monitor.demo.receivers import WebhookReceiver
from monitor.store import Store
from support.scores import record_fake_score

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
CURVES = REPO / "tests" / "fixtures" / "policies" / "curves"
SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
T0 = datetime(2025, 6, 1, 12, 0, tzinfo=timezone.utc)
AT_RISK = -2.0


def write_policy(tmp: Path, url: str) -> Path:
    path = tmp / "policy.yaml"
    path.write_text(f"""\
name: crashy
corpora: {{public: 9f269a7db0b131d819be2e51974914a3cf715cc388cceb82885f7a5a21e644d8}}
tasks:
  - name: arith
    curve: {CURVES / "arith.json"}
route:
  receiver: hook
  group_wait: 0s
  group_interval: 0s
  repeat_interval: 4h
receivers:
  - name: hook
    webhook: {{url: "{url}", secret_env: LSTAR_TEST_WEBHOOK_SECRET, timeout: 5s}}
""")
    return path


def dispatch(tmp: Path, policy: Path, now: datetime, failpoint: str | None = None) -> subprocess.CompletedProcess[str]:
    """One outbox pass in a fresh process (a restart each time)."""
    env = {**os.environ, "LSTAR_TEST_WEBHOOK_SECRET": SECRET, "PYTHONPATH": str(REPO)}
    env.pop("LSTAR_FAILPOINT", None)
    if failpoint:
        env["LSTAR_FAILPOINT"] = failpoint
    return subprocess.run([sys.executable, "-m", "monitor.cli", "alerts", "dispatch", "--policy", str(policy),
                           "--db", str(tmp / "state.duckdb"), "--now", now.isoformat(), "--json"],
                          cwd=tmp, env=env, capture_output=True, text=True, timeout=120)


def score(tmp: Path, repo: str, commit: str, at: datetime) -> None:
    with Store.open(tmp / "state.duckdb") as store:
        record_fake_score(store, repo=repo, sha=commit, lstar=AT_RISK, se=0.02, finished_at=at)


def counts(tmp: Path) -> dict[str, int]:
    with Store.open(tmp / "state.duckdb", read_only=True) as store:
        return {t: store.query(f"SELECT count(*) AS n FROM {t}")[0]["n"]
                for t in ("predictions", "alerts", "deliveries", "notifications")}


def killed(result: subprocess.CompletedProcess[str]) -> bool:
    return result.returncode == -signal.SIGKILL


def test_kill_between_score_and_outbox_then_exactly_one_delivery(tmp_path: Path) -> None:
    with WebhookReceiver() as hook:
        policy = write_policy(tmp_path, hook.url)
        score(tmp_path, "org/model", "a" * 40, T0)

        result = dispatch(tmp_path, policy, T0, failpoint="after_score_before_outbox")
        assert killed(result), result.stderr
        assert counts(tmp_path) == {"predictions": 0, "alerts": 0, "deliveries": 0, "notifications": 0}

        # killed inside the outbox transaction, before COMMIT: still nothing half-written
        result = dispatch(tmp_path, policy, T0, failpoint="mid_outbox_write")
        assert killed(result), result.stderr
        assert counts(tmp_path) == {"predictions": 0, "alerts": 0, "deliveries": 0, "notifications": 0}
        assert hook.requests == []

        # committed, grouped and leased, then killed before the send: nothing went out ...
        result = dispatch(tmp_path, policy, T0 + timedelta(seconds=1), failpoint="after_claim_before_send")
        assert killed(result), result.stderr
        assert counts(tmp_path) == {"predictions": 1, "alerts": 1, "deliveries": 1, "notifications": 1}
        assert hook.requests == []

        # ... and nothing is lost: once the lease expires the restarted pass sends it, once
        result = dispatch(tmp_path, policy, T0 + timedelta(minutes=6))
        assert result.returncode == 0, result.stderr
        assert counts(tmp_path) == {"predictions": 1, "alerts": 1, "deliveries": 1, "notifications": 1}
        assert len(hook.requests) == 1

        # a further restart re-evaluates nothing and sends nothing
        result = dispatch(tmp_path, policy, T0 + timedelta(minutes=7))
        assert result.returncode == 0, result.stderr
        assert counts(tmp_path)["alerts"] == 1 and len(hook.requests) == 1
