"""The state file against hostile conditions, through the real CLI (`lstar db`, `lstar run`) in
subprocesses: a database written by a newer version, a truncated file, a read-only state
directory and a full disk (both real, in a mount namespace of the command's own) each end
in one line on stderr naming the file and the fix, with a non-zero exit and the file
untouched; and pruning of log rows by age on a real DuckDB file."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import duckdb
import pytest

from monitor.store import MIGRATIONS, Store
from support.daemon_harness import REPO_ROOT, WATCHER_POLICY, DaemonProcess
from support.fs_faults import full_disk, namespaces_work, read_only

LSTAR = (sys.executable, "-m", "monitor.cli")
needs_namespaces = pytest.mark.skipif(not namespaces_work(),
                                      reason="needs `unshare -Urm` (user and mount namespaces)")


def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, cwd=REPO_ROOT, timeout=120)


def one_line_error(done: subprocess.CompletedProcess[str], code: int = 3) -> str:
    """The single `error: ...` line of a failed command (and nothing else on stderr)."""
    assert done.returncode == code, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    return lines[0]


def fingerprint(db: Path) -> tuple[str, bool]:
    """sha256 of the file, and whether a WAL exists beside it."""
    return hashlib.sha256(db.read_bytes()).hexdigest(), db.with_name(db.name + ".wal").exists()


def daemon_argv(policies: Path, state: Path) -> list[str]:
    return DaemonProcess(policies, state, args=["--once"], fast=False).command()


@pytest.fixture()
def policies(tmp_path: Path) -> Path:
    folder = tmp_path / "policies"
    folder.mkdir()
    (folder / "watcher.yaml").write_text(WATCHER_POLICY)
    return folder


@pytest.mark.slow
def test_a_database_from_a_newer_version_is_refused_and_left_untouched(tmp_path, policies):
    state = tmp_path / "state"
    db = state / "lstar.duckdb"
    with Store.open(db) as store:
        store.conn.execute("INSERT INTO schema_migrations VALUES ('9000_from_a_newer_version', now())")
    before = fingerprint(db)

    for argv in ([*LSTAR, "db", "migrate", "--db", str(db)], daemon_argv(policies, state),
                 [*LSTAR, "db", "info", "--db", str(db)]):
        line = one_line_error(run(argv))
        assert f"{db} has migrations this version does not know: 9000_from_a_newer_version" in line
        assert "written by a newer lstar-monitor; upgrade" in line
    assert fingerprint(db) == before
    with duckdb.connect(str(db), read_only=True) as conn:
        assert conn.execute("SELECT max(name) FROM schema_migrations").fetchone()[0] == "9000_from_a_newer_version"


@pytest.mark.slow
def test_a_newer_versions_database_with_a_wal_is_refused_and_left_untouched(tmp_path, policies):
    """A newer version stopped with writes still in the WAL: refusing the file must not fold
    the WAL into it (DuckDB checkpoints when a writable connection closes)."""
    state = tmp_path / "state"
    db = state / "lstar.duckdb"
    with Store.open(db):
        pass
    newer = f"""
import duckdb, os
conn = duckdb.connect({str(db)!r})
conn.execute("PRAGMA disable_checkpoint_on_shutdown")
conn.execute("SET wal_autocheckpoint='1TB'")
conn.execute("INSERT INTO schema_migrations VALUES ('9000_from_a_newer_version', now())")
conn.execute("CREATE TABLE from_the_future (x INTEGER)")
os._exit(0)   # as a killed process: the WAL stays
"""
    subprocess.run([sys.executable, "-c", newer], check=True)
    wal = db.with_name(db.name + ".wal")
    assert wal.exists()
    before = (hashlib.sha256(db.read_bytes()).hexdigest(), hashlib.sha256(wal.read_bytes()).hexdigest())
    for argv in ([*LSTAR, "db", "migrate", "--db", str(db)], daemon_argv(policies, state)):
        line = one_line_error(run(argv))
        assert "has migrations this version does not know: 9000_from_a_newer_version" in line
    assert wal.exists()
    assert (hashlib.sha256(db.read_bytes()).hexdigest(), hashlib.sha256(wal.read_bytes()).hexdigest()) == before


HEADER, BLOCK = 3 * 4096, 256 * 1024  # DuckDB's file header, and its default block size


@pytest.mark.slow
@pytest.mark.parametrize("keep", [HEADER, HEADER + BLOCK + BLOCK // 2], ids=["header-only", "mid-block"])
def test_a_truncated_database_is_a_one_line_error(tmp_path, policies, keep):
    state = tmp_path / "state"
    db = state / "lstar.duckdb"
    with Store.open(db) as store:
        store.record_hub_poll("rule", "rule", now=datetime.now(timezone.utc), ok=True, listed=0, new=0,
                              requests=1)
    # Cut right after the header (opening fails), or in the middle of the second block:
    # opening works and reading the catalog fails later.
    assert db.stat().st_size > keep
    with open(db, "r+b") as f:
        f.truncate(keep)
    before = fingerprint(db)

    for argv in ([*LSTAR, "db", "info", "--db", str(db)], [*LSTAR, "db", "migrate", "--db", str(db)],
                 daemon_argv(policies, state)):
        line = one_line_error(run(argv))
        assert line.startswith(f"error: cannot read {db}")
        assert "truncated, corrupt or not a DuckDB database" in line and "never deleting the WAL" in line
    assert fingerprint(db) == before


@pytest.mark.slow
@needs_namespaces
def test_a_read_only_state_directory_is_a_one_line_error(tmp_path, policies):
    current, old = tmp_path / "current", tmp_path / "old"
    Store.open(current / "lstar.duckdb").close()
    with Store.open(old / "lstar.duckdb", migrate=False) as store:
        store.migrate(MIGRATIONS[:1])          # a schema behind the code's: `db migrate` must write
    prints = {folder: fingerprint(folder / "lstar.duckdb") for folder in (current, old)}

    for folder in (current, old):
        line = one_line_error(run(read_only(folder, daemon_argv(policies, folder))))
        assert line.startswith(f"error: cannot write {folder} ") and "Read-only file system" in line
        assert "make the state directory writable" in line
    line = one_line_error(run(read_only(old, [*LSTAR, "db", "migrate", "--db", str(old / "lstar.duckdb")])))
    assert f"cannot write {old / 'lstar.duckdb'}" in line and "make the state directory writable" in line

    # Reading needs no write: `db info` still answers from a read-only state directory.
    info = run(read_only(current, [*LSTAR, "db", "info", "--db", str(current / "lstar.duckdb"), "--json"]))
    assert info.returncode == 0, info.stderr
    assert json.loads(info.stdout)["pending"] == []
    assert {folder: fingerprint(folder / "lstar.duckdb") for folder in (current, old)} == prints


@pytest.mark.slow
@needs_namespaces
def test_start_up_on_a_full_disk_is_a_one_line_error(tmp_path, policies):
    seed, state = tmp_path / "seed", tmp_path / "state"
    with Store.open(seed / "lstar.duckdb", migrate=False) as store:
        store.migrate(MIGRATIONS[:1])
    state.mkdir()

    for argv in (daemon_argv(policies, state), [*LSTAR, "db", "migrate", "--db", str(state / "lstar.duckdb")]):
        line = one_line_error(run(full_disk(state, argv, seed=seed)))
        assert line.startswith(f"error: no space left on the device holding {state}")
        assert "free space there and run it again" in line
    # a new database on a full disk, too
    line = one_line_error(run(full_disk(state, [*LSTAR, "db", "migrate", "--db", str(state / "new.duckdb")])))
    assert line.startswith(f"error: no space left on the device holding {state / 'new.duckdb'}")


# -- retention ------------------------------------------------------------------------------------
NOW = datetime(2026, 6, 1, tzinfo=timezone.utc)


def _notification(store: Store, nid: str, status: str, when: datetime, attempts: int) -> None:
    """A notification in `status` last touched at `when`, with `attempts` delivery attempts."""
    store.conn.execute(
        "INSERT INTO notifications (id, policy, receiver, group_key, status, body, n_alerts, is_meta, attempts, "
        "next_attempt_at, created_at, updated_at, delivered_at) VALUES (?, 'p', 'hook', 'g', ?, '{}', 1, false, "
        "?, ?, ?, ?, ?)", [nid, status, attempts, when, when, when, when if status == "delivered" else None])
    for i in range(attempts):
        store.conn.execute(
            "INSERT INTO delivery_attempts (notification_id, policy, receiver, attempt, started_at, outcome) "
            "VALUES (?, 'p', 'hook', ?, ?, ?)",
            [nid, i + 1, when - timedelta(hours=attempts - i), "delivered" if i + 1 == attempts else "retry"])


def test_prune_logs_removes_old_log_rows_and_keeps_what_is_still_needed(tmp_path):
    days = lambda n: NOW - timedelta(days=n)  # noqa: E731
    with Store.open(tmp_path / "lstar.duckdb") as store:
        for rule, ages in (("busy", (200, 120, 5)), ("idle", (300, 150))):
            for age in ages:
                store.record_hub_poll(rule, rule, now=days(age), ok=True, listed=0, new=0, requests=1)
        store.conn.execute("INSERT INTO hub_watermarks VALUES ('idle', 'idle', 'http://hub', ?, '[]', ?)",
                           [days(300), days(300)])
        _notification(store, "msg_old_delivered", "delivered", days(120), attempts=3)
        _notification(store, "msg_new_delivered", "delivered", days(10), attempts=2)
        _notification(store, "msg_old_dead", "dead", days(200), attempts=4)
        _notification(store, "msg_old_pending", "pending", days(200), attempts=1)
        _notification(store, "msg_old_silenced", "silenced", days(100), attempts=0)
        outage = "INSERT INTO hub_outages (endpoint, started_at, ended_at, failures, alerted_at) VALUES (?, ?, ?, 5, ?)"
        store.conn.execute(outage, ["ended-and-told", days(130), days(120), days(129)])
        store.conn.execute(outage, ["still-open", days(200), None, days(199)])
        store.conn.execute(outage, ["ended-untold", days(130), days(120), None])
        store.conn.execute(outage, ["ended-recently", days(30), days(20), days(29)])

        deleted = store.prune_logs(NOW - timedelta(days=90))

        assert deleted == {"hub_polls": 3, "delivery_attempts": 3, "hub_outages": 1}
        polls = store.query("SELECT rule_key, polled_at FROM hub_polls ORDER BY rule_key, polled_at")
        assert [(p["rule_key"], p["polled_at"]) for p in polls] == [("busy", days(5)), ("idle", days(150))]
        attempts = store.query("SELECT notification_id, count(*) AS n FROM delivery_attempts "
                               "GROUP BY notification_id ORDER BY notification_id")
        assert {a["notification_id"]: a["n"] for a in attempts} == {
            "msg_new_delivered": 2, "msg_old_dead": 4, "msg_old_pending": 1}
        assert len(store.notifications()) == 5                       # the outbox itself is state
        assert [o.endpoint for o in store.hub_outages()] == ["still-open", "ended-untold", "ended-recently"]
        assert store.get_watermark("idle").last_modified == days(300)
        assert store.prune_logs(NOW - timedelta(days=90)) == {"hub_polls": 0, "delivery_attempts": 0,
                                                              "hub_outages": 0}
