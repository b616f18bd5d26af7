"""The CLI while a real daemon (`lstar run`, a subprocess) holds the database: reads and
runtime-state writes (silences, retries) go through the daemon's API, with the output the
direct database path prints, and the daemon's refusals as the usual one-line errors.

The commands run in this process (`support.cli_run`, the same `monitor.cli.main` the console
script runs): the daemon is another process either way, and what is checked is what they print
and return."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest

from monitor.demo.fakehub import FakeHub
from monitor.store import Store
from support.cli_run import lstar_in_process
from support.daemon_harness import WATCHER_POLICY as POLICY, DaemonProcess, wait_for

pytestmark = pytest.mark.slow

NOW = "2030-01-01T00:00:00+00:00"
CURVES = Path(__file__).resolve().parent / "fixtures" / "policies" / "curves"


def lstar(*args: str) -> subprocess.CompletedProcess[str]:
    return lstar_in_process(*args)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    """One daemon on an empty fake Hub (nothing to fetch or score: the test stays light)."""
    tmp = tmp_path_factory.mktemp("daemon-cli")
    (tmp / "policies").mkdir()
    (tmp / "policies" / "watcher.yaml").write_text(POLICY)
    with FakeHub() as hub:
        process = DaemonProcess(tmp / "policies", tmp / "state", endpoint=hub.url,
                                args=["--poll-every", "1h", "--score-every", "1h",
                                      "--cache-dir", str(tmp / "cache")])
        with process:
            wait_for(lambda: process.status()["jobs"]["poll"]["runs"] >= 1, timeout=60,
                     what="the start-up poll")
            yield process


def test_alerts_and_report_are_answered_through_the_api(daemon):
    db = str(daemon.state_dir / "lstar.duckdb")
    with pytest.raises(Exception, match="(?i)lock|held"):  # the daemon holds the file
        Store.open(db, read_only=True)

    listed = lstar("alerts", "list", "--db", db, "--json")
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout)["items"] == []

    # The daemon's refusals come back as the command's own one-line errors.
    shown = lstar("alerts", "show", "7", "--db", db, "--json")
    assert (shown.returncode, shown.stdout) == (2, "")
    assert shown.stderr == "error: no alert with id 7; see `lstar alerts list`\n"
    retried = lstar("alerts", "retry", "7", "--db", db)
    assert (retried.returncode, retried.stderr) == (2, "error: no alert with id 7; see `lstar alerts list`\n")
    retried = lstar("alerts", "retry", "seven", "--db", db)
    assert (retried.returncode, retried.stderr) == (
        2, "error: 'seven' is neither an alert id nor a notification id\n")

    report = lstar("report", "--policy", str(daemon.policies_dir), "--db", db, "--json")
    assert report.returncode == 0, report.stderr
    data = json.loads(report.stdout)
    assert (data["schema"], data["policy"], data["report"]) == ("lstar-report/2", "watcher", "adhoc")
    assert data["summary"] == {"new_checkpoints": 0, "new_scores": 0, "lineages": 0, "at_risk": 0,
                               "emerged": 0, "crossings": 0}
    assert data["period"]["end"] == data["generated_at"]
    assert "_curves" not in data


def test_a_report_of_another_version_of_the_daemons_policy_is_refused_not_answered_for_it(tmp_path):
    """`lstar report --policy FILE` while the daemon has another version of FILE's policy in
    force (same name): refused in one line naming both versions, never the daemon's report shown
    as FILE's; the same text elsewhere, or the daemon's after it reloads, is answered."""
    import hashlib

    policies, elsewhere = tmp_path / "policies", tmp_path / "elsewhere"
    policies.mkdir()
    elsewhere.mkdir()
    edited = POLICY.replace("route:", f"tasks:\n  - name: arith\n    curve: {CURVES / 'arith.json'}\nroute:")
    (policies / "watcher.yaml").write_text(POLICY)
    (elsewhere / "watcher.yaml").write_text(edited)
    (elsewhere / "copy.yaml").write_text(POLICY)
    db = str(tmp_path / "state" / "lstar.duckdb")
    with FakeHub() as hub, DaemonProcess(policies, tmp_path / "state", endpoint=hub.url,
                                         args=["--poll-every", "1h", "--score-every", "1h"]) as daemon:
        refused = lstar("report", "--policy", str(elsewhere / "watcher.yaml"), "--db", db, "--json")
        assert (refused.returncode, refused.stdout) == (2, ""), refused.stderr
        assert refused.stderr.count("\n") == 1, refused.stderr
        old_sha = hashlib.sha256(POLICY.encode()).hexdigest()[:12]
        new_sha = hashlib.sha256(edited.encode()).hexdigest()[:12]
        assert refused.stderr.startswith("error: the running daemon has another version of policy 'watcher' in "
                                         f"force: version "), refused.stderr
        assert f"({policies / 'watcher.yaml'} sha256 {old_sha}), loaded 20" in refused.stderr
        assert "; the file read here is version " in refused.stderr
        assert f"({elsewhere / 'watcher.yaml'} sha256 {new_sha}; curves arith " in refused.stderr
        assert f"`lstar report --policy {policies / 'watcher.yaml'}` reports the daemon's version" in refused.stderr

        # The same text in another file is the same version: the daemon answers, and says whose file it read.
        same = lstar("report", "--policy", str(elsewhere / "copy.yaml"), "--db", db, "--json")
        assert same.returncode == 0, same.stderr
        version = json.loads(same.stdout)["policy_version"]
        assert (version["file"], version["sha256"][:12], version["curves"]) == (
            str(policies / "watcher.yaml"), old_sha, {})

        # Once the daemon has read the edit, the edited file's report is its report.
        (policies / "watcher.yaml").write_text(edited)
        wait_for(lambda: lstar("report", "--policy", str(elsewhere / "watcher.yaml"), "--db", db).returncode == 0,
                 timeout=30, what="the daemon to load the edited policy")
        served = json.loads(lstar("report", "--policy", str(elsewhere / "watcher.yaml"), "--db", db,
                                  "--json").stdout)
        assert [t["task"] for t in served["tasks"]] == ["arith"]
        assert served["policy_version"]["sha256"][:12] == new_sha
        assert daemon.stop(signal.SIGTERM, timeout=60) == 0
    direct = lstar("report", "--policy", str(elsewhere / "watcher.yaml"), "--db", db, "--json")
    assert direct.returncode == 0, direct.stderr
    local = json.loads(direct.stdout)
    assert [t["task"] for t in local["tasks"]] == ["arith"]
    assert local["policy_version"]["fingerprint"] == served["policy_version"]["fingerprint"]
    assert local["policy_version"]["file"] == str(elsewhere / "watcher.yaml")


def test_silences_are_written_by_the_daemon_and_match_a_direct_read_after_it_stops(daemon, tmp_path):
    db = str(daemon.state_dir / "lstar.duckdb")
    added = lstar("silence", "add", "--match", "policy=watcher", "--match", "task=~arc.*", "--until", "2h",
                  "--comment", "  maintenance  ", "--now", NOW, "--db", db, "--json")
    assert added.returncode == 0, added.stderr
    row = json.loads(added.stdout)
    assert row["matchers"] == ['policy="watcher"', 'task=~"arc.*"']
    assert (row["starts_at"], row["ends_at"]) == ("2030-01-01 00:00:00+00:00", "2030-01-01 02:00:00+00:00")
    assert row["comment"] == "maintenance" and row["expired_at"] is None

    other = lstar("silence", "add", "--match", "policy=other", "--until", "2030-01-02T00:00Z",
                  "--comment", "second", "--now", NOW, "--db", db)
    assert other.returncode == 0, other.stderr
    other_id = other.stdout.strip()

    listed = lstar("silence", "list", "--now", NOW, "--db", db, "--json")
    assert listed.returncode == 0, listed.stderr
    assert sorted((r["id"], r["state"]) for r in json.loads(listed.stdout)["items"]) == sorted(
        [(row["id"], "active"), (other_id, "active")])

    # a unique prefix of the id, as git takes a commit's: the daemon expires the silence it names
    prefix = next(row["id"][:n] for n in range(4, 37) if not other_id.startswith(row["id"][:n]))  # at least 4, as git
    expired = lstar("silence", "expire", prefix, "--now", "2030-01-01T01:00:00Z", "--db", db)
    assert (expired.returncode, expired.stdout) == (0, f"expired {row['id']}\n"), expired.stderr
    again = lstar("silence", "expire", row["id"], "--now", "2030-01-01T01:00:00Z", "--db", db)
    assert (again.returncode, again.stderr) == (
        2, f"error: no active or pending silence with id {row['id']}; see `lstar silence list`\n")

    # Input the daemon refuses fails exactly as it does on a database nobody holds.
    bad = ["silence", "add", "--match", "policy=~", "--until", "2h", "--comment", "x", "--now", NOW]
    through_daemon = lstar(*bad, "--db", db)
    (tmp_path / "alone").mkdir()
    direct = lstar(*bad, "--db", str(tmp_path / "alone" / "lstar.duckdb"))
    assert through_daemon.returncode == direct.returncode == 2
    assert through_daemon.stderr == direct.stderr
    assert direct.stderr.startswith("error: these matchers would silence every alert")

    later = ["silence", "list", "--all", "--now", "2030-01-01T01:30:00Z", "--db", db, "--json"]
    served = lstar(*later)
    assert served.returncode == 0, served.stderr
    states = {r["id"]: r["state"] for r in json.loads(served.stdout)["items"]}
    assert states == {row["id"]: "expired", other_id: "active"}
    served_table = lstar(*later[:-1])
    assert served_table.returncode == 0, served_table.stderr

    # With the daemon gone the commands open the file themselves and print the same.
    assert daemon.stop(signal.SIGTERM, timeout=60) == 0
    wait_for(lambda: not (daemon.state_dir / "daemon.json").exists(), timeout=10, what="daemon.json removed")
    assert lstar(*later).stdout == served.stdout
    assert lstar(*later[:-1]).stdout == served_table.stdout
    with Store.open(Path(db), read_only=True) as store:
        stored = {s.id: s for s in store.silences()}
    assert stored[row["id"]].expired_at.isoformat() == "2030-01-01T01:00:00+00:00"
    assert stored[other_id].comment == "second"


def test_runs_are_listed_through_the_api_as_a_direct_read_lists_them(tmp_path):
    from datetime import datetime, timedelta, timezone

    from support.scores import fake_sha, record_fake_score

    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "watcher.yaml").write_text(POLICY)
    start = datetime(2024, 5, 1, tzinfo=timezone.utc)
    with Store.open(tmp_path / "state" / "lstar.duckdb") as store:
        run_ids = [record_fake_score(store, repo=f"org/m{i}", sha=fake_sha(str(i)), lstar=-1.0 - i, se=0.01,
                                     finished_at=start + timedelta(minutes=i)) for i in range(4)]
    state = str(tmp_path / "state")
    with FakeHub() as hub:
        process = DaemonProcess(tmp_path / "policies", tmp_path / "state", endpoint=hub.url,
                                args=["--poll-every", "1h", "--score-every", "1h", "--cache-dir", str(tmp_path / "c")])
        with process:
            with pytest.raises(Exception, match="(?i)lock|held"):  # so the command must ask the daemon
                Store.open(tmp_path / "state" / "lstar.duckdb", read_only=True)
            through_api = lstar("runs", "--state", state, "--limit", "3", "--json")
            table = lstar("runs", "--state", state)
            assert process.request("/runs?limit=0")[0] == 400
            status, body = process.request("/runs?repo=org/m1")
            assert status == 400 and b"unknown query parameter" in body
            process.stop()
    assert through_api.returncode == 0, through_api.stderr
    rows = json.loads(through_api.stdout)["items"]
    assert [r["run_id"] for r in rows] == run_ids[::-1][:3]
    assert [r["lstar"] for r in rows] == [-4.0, -3.0, -2.0]
    assert table.returncode == 0 and "3 score run(s)" not in table.stdout and "4 score run(s)" in table.stdout
    direct = lstar("runs", "--state", state, "--limit", "3", "--json")
    assert direct.returncode == 0, direct.stderr
    assert direct.stdout == through_api.stdout
