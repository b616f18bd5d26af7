"""A daemon killed with SIGKILL mid-delivery or mid-score, then restarted (docs/reliability.md
rows 40 to 42): the restart frees the dead process's leases under the state lock, so the
delivery is re-sent (same webhook-id) and the score rerun within one scheduling interval rather
than when the leases would expire (5 minutes, and the score timeout plus 10 minutes); each once.
A lease of a process that is still alive is never taken."""

from __future__ import annotations

import os
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from monitor.demo.fakehub import FakeHub
from monitor.demo.hub_repos import add_lineage
from monitor.demo.receivers import Reply, WebhookReceiver
from monitor.hub.queue import claim_next
from monitor.store import Store
from support.daemon_harness import DaemonProcess, wait_for
from support.scores import record_fake_score
from tests.test_daemon import score_args, write_policy as write_watcher_policy
from tests.test_notify_crash import AT_RISK, SECRET, write_policy as write_hook_policy

pytestmark = pytest.mark.slow  # the daemon or the scoring stack in subprocesses

# The outbox and scoring jobs' interval here. Each job also runs once at start, so a resume
# takes well under one interval; the bound is the interval (a live lease would take minutes).
INTERVAL_S = 20.0
# How long a daemon may take to come up (imports, migrations) on a loaded machine.
STARTUP_S = 60.0


def child_pids(pid: int) -> set[int]:
    """The live child processes of `pid` (Linux /proc)."""
    out: set[int] = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out.update(int(p) for p in (task / "children").read_text().split())
        except OSError:
            pass
    return out


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def restarted(daemon: DaemonProcess) -> DaemonProcess:
    """A new daemon on the same state, without fail points (start it with `with`)."""
    return DaemonProcess(daemon.policies_dir, daemon.state_dir, endpoint=daemon.endpoint, args=daemon.args,
                         env={k: v for k, v in daemon.env.items() if k != "LSTAR_FAILPOINT"}, fast=False)


def test_kill_9_mid_delivery_resends_once_within_an_interval_with_the_same_webhook_id(tmp_path):
    with WebhookReceiver() as hook:
        hook.script([Reply(200, hang_s=600)])   # the first send hangs: the daemon dies inside it
        policies = tmp_path / "policies"
        policies.mkdir()
        text = write_hook_policy(tmp_path, hook.url).read_text().replace("timeout: 5s", "timeout: 120s")
        (policies / "crashy.yaml").write_text(text)
        state = tmp_path / "state"
        with Store.open(state / "lstar.duckdb") as store:
            record_fake_score(store, repo="org/model", sha="a" * 40, lstar=AT_RISK, se=0.02,
                              finished_at=datetime.now(timezone.utc))
        # --max-context 128: the window of the recorded score and of its curve (TEST_SPEC)
        args = ["--outbox-every", f"{INTERVAL_S:g}s", "--score-every", "1h", "--poll-every", "1h",
                "--max-context", "128"]
        first = DaemonProcess(policies, state, args=args, env={"LSTAR_TEST_WEBHOOK_SECRET": SECRET}, fast=False)
        with first:
            wait_for(lambda: hook.requests, timeout=60, what=f"the first send\n{first.log()}")
            first.kill()
        assert len(hook.requests) == 1

        with restarted(first) as second:
            up = time.time()   # its API answers: start-up, and the reclaiming, are done
            # bounded: were the lease waited out, this would take 5 minutes
            resent = wait_for(lambda: len(hook.requests) > 1 and hook.requests[1], timeout=INTERVAL_S + 10,
                              what=f"the re-send\n{second.log()}")
            assert resent.received_at - up <= INTERVAL_S
            assert "reclaimed the lease of" in second.log()
            wait_for(lambda: second.get_json("/alerts")["items"][0]["deliveries"][0]["status"] == "delivered",
                     timeout=30, what="the delivery to be recorded")
            assert second.stop() == 0

    first_send, second_send = hook.requests
    assert first_send.headers["webhook-id"] == second_send.headers["webhook-id"]
    assert first_send.body == second_send.body
    with Store.open(state / "lstar.duckdb", read_only=True) as store:
        [note] = store.notifications()
        attempts = store.delivery_attempts(note.id)
    assert note.id == first_send.headers["webhook-id"]
    assert (note.status, note.attempts, note.lease_owner) == ("delivered", 2, None)
    assert [(a.attempt, a.outcome) for a in attempts] == [(1, "lease_expired"), (2, "delivered")]
    # the interrupted attempt is stamped with when it started, just before the receiver saw it
    assert 0 <= first_send.received_at - attempts[0].started_at.timestamp() < 10
    assert "died during attempt 1" in attempts[0].error


@pytest.fixture
def hub():
    with FakeHub() as server:
        # The rerun of a killed score is checked, not the model: the 1,000-id toy tokenizer
        # spares the score most of gpt-neox's 50,277-id output layer.
        add_lineage(server, "fake-org/tiny", steps=(1000,), tokenizer="spm-unigram-toy")
        yield server


def test_kill_9_mid_score_reruns_it_once_within_an_interval(hub, tmp_path, shared_dir):
    policies = write_watcher_policy(tmp_path / "policies")
    state = tmp_path / "state"
    # the default lease (score timeout 1 h + 10 min): only reclaiming resumes the job soon
    args = ["--score-every", f"{INTERVAL_S:g}s", "--poll-every", "1h", "--outbox-every", "1h",
            *score_args(tmp_path, shared_dir)]
    first = DaemonProcess(policies, state, endpoint=hub.url, args=args,
                          env={"LSTAR_FAILPOINT": "hang_score_child"}, fast=False)
    with first:
        scorers = wait_for(lambda: child_pids(first.proc.pid), timeout=120,
                           what=f"the scoring child\n{first.log()}")
        [row] = first.get_json("/checkpoints")["items"]
        assert (row["status"], row["attempts"]) == ("fetched", 1) and row["lease_owner"]
        dead_owner = row["lease_owner"]
        first.kill()
    wait_for(lambda: not any(alive(p) for p in scorers), timeout=30, what="the orphaned scorer to die")

    with restarted(first) as second:
        up = time.time()
        # bounded: were the lease waited out, this would take 70 minutes
        resumed = wait_for(lambda: second.get_json("/checkpoints")["items"][0]["attempts"] == 2 and time.time(),
                           timeout=INTERVAL_S + 10, what=f"the rerun of the score\n{second.log()}")
        assert resumed - up <= INTERVAL_S
        # asked once a second while it scores (each /status reads the store), not five times
        wait_for(lambda: second.status()["checkpoints"].get("scored") == 1, timeout=240, every=1.0,
                 what=f"the rerun score\n{second.log()}")
        assert second.stop() == 0

    with Store.open(state / "lstar.duckdb", read_only=True) as store:
        [row] = store.list_checkpoints()
        runs = store.query("SELECT checkpoint_id FROM score_runs")
    assert (row.status, row.attempts, row.lease_owner) == ("scored", 2, None)
    assert runs == [{"checkpoint_id": row.id}]
    [lost] = row.meta["interrupted"]
    assert (lost["attempt"], lost["owner"]) == (1, dead_owner)
    assert lost["reclaimed_by"] != dead_owner
    assert datetime.fromisoformat(lost["started_at"]) < datetime.fromisoformat(lost["reclaimed_at"])


def test_a_live_process_holding_a_lease_keeps_it(tmp_path):
    """`lstar score --pending` and `lstar alerts dispatch` take leases without the state lock,
    but hold the database open for writing while they do: a daemon cannot start beside them,
    so it never frees a lease whose holder is alive."""
    from tests.test_queue import add_gated

    state = tmp_path / "state"
    state.mkdir()
    with Store.open(state / "lstar.duckdb") as store:   # the live holder, in this process
        (only,) = add_gated(store, "org/a")
        claim_next(store, f"cli:{os.getpid()}", datetime.now(timezone.utc), 3600)
        daemon = DaemonProcess(write_watcher_policy(tmp_path / "policies"), state, fast=False)
        daemon.start(wait=False)
        assert daemon.wait(timeout=STARTUP_S) != 0
        assert "lstar.duckdb is held by another process" in daemon.log()
        row = store.get_checkpoint(only)
    assert (row.lease_owner, row.attempts) == (f"cli:{os.getpid()}", 1)
