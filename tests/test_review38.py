"""An adversarial pass over issue 38's surfaces: hostile inputs that crashed, and surfaces
that disagreed about one lineage's state. Each test failed before its fix."""

from __future__ import annotations

import time
from datetime import datetime, timezone
from types import SimpleNamespace

import pytest
from starlette.testclient import TestClient

from monitor.alerts.channels.webhook import sign
from monitor.alerts.receiver import receiver_app
from monitor.reports.window import WindowError, parse_moment, report_window

SECRET = "whsec_" + "QUJDREVGR0hJSktMTU5PUFFSU1RVVldY"
NOW = datetime(2026, 11, 29, 12, tzinfo=timezone.utc)


# -- the receiver ------------------------------------------------------------------------------
def _post(headers: dict, body: bytes = b'{"alerts": []}') -> tuple[int, list[str]]:
    printed: list[str] = []
    client = TestClient(receiver_app(SECRET, printed.append), raise_server_exceptions=False)
    answer = client.post("/hook", content=body, headers=headers)
    return answer.status_code, printed


@pytest.mark.parametrize("signature", ["v1,\xff\xfe", "v1,ok v1,\xe9t\xe9"])
def test_a_signature_header_with_non_ascii_bytes_is_refused_not_a_crash(signature: str) -> None:
    stamp = str(int(time.time()))
    status, printed = _post({"webhook-id": "msg_1", "webhook-timestamp": stamp,
                             "webhook-signature": signature.encode("latin-1")})
    assert status == 401
    assert printed and "signature REFUSED: no v1 signature matches the secret" in printed[0]


def test_a_good_signature_beside_a_non_ascii_one_is_accepted() -> None:
    stamp = int(time.time())
    body = '{"alerts": []}'
    good = sign(SECRET, "msg_2", stamp, body)
    status, printed = _post({"webhook-id": "msg_2", "webhook-timestamp": str(stamp),
                             "webhook-signature": ("v1,\xe9 " + good).encode("latin-1")}, body.encode())
    assert status == 204 and "signature ok" in printed[0]


def test_a_non_ascii_webhook_id_is_checked_not_a_crash() -> None:
    stamp = str(int(time.time()))
    status, _ = _post({"webhook-id": "m\xe9g".encode("latin-1"), "webhook-timestamp": stamp,
                       "webhook-signature": "v1,AAAA"})
    assert status == 401


# -- report windows ----------------------------------------------------------------------------
@pytest.mark.parametrize("text", ["0001-01-01T00:00+01:00", "9999-12-31T23:59-01:00", "0001-01-01T00:30+00:45"])
def test_a_moment_whose_offset_leaves_the_calendar_is_refused_in_one_line(text: str) -> None:
    with pytest.raises(WindowError) as caught:
        parse_moment(text, now=NOW)
    assert text in str(caught.value) and "\n" not in str(caught.value)
    with pytest.raises(WindowError):
        report_window(since=text, until=None, now=NOW)


def test_offsets_and_dst_changes_name_the_same_instant_in_utc() -> None:
    # Europe/Berlin left summer time on 2026-10-25 at 03:00 CEST (01:00 UTC): both sides of the
    # change written with their own offset name instants an hour apart, as UTC says.
    before = parse_moment("2026-10-25T02:30+02:00", now=NOW)
    after = parse_moment("2026-10-25T02:30+01:00", now=NOW)
    assert before == datetime(2026, 10, 25, 0, 30, tzinfo=timezone.utc)
    assert (after - before).total_seconds() == 3600
    assert parse_moment("2026-10-25T00:30Z", now=NOW) == before


# -- one state on every surface ----------------------------------------------------------------
def _observe(store, *, lineage: str, sha: str, observed_state: str, finished_at: datetime,
             generation: int = 0, status: str = "done") -> None:
    """An evaluation of the task on `lineage@sha`, done, with `observed_state` (the row as the
    observe job writes it, the columns the surfaces read)."""
    (p,) = store.query("SELECT * FROM predictions WHERE lineage = ? AND commit_sha = ? "
                       "ORDER BY evaluated_at DESC, id DESC LIMIT 1", [lineage, sha])
    store.conn.execute(
        "INSERT INTO observations (policy, task, run_id, prediction_id, repo, commit_sha, lineage, curve_id, "
        "predicted_state, predicted_lo, predicted_hi, level, confidence, settings, status, observed, n, k, "
        "observed_lo, observed_hi, observed_state, verdict, scheduled_day, created_at, updated_at, finished_at, "
        "generation, reason) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0.95, '{}', ?, 0.9, 100, 90, 0.83, 0.95, ?, "
        "'contradicted', ?, ?, ?, ?, ?, ?)",
        [p["policy"], p["task"], p["run_id"], p["id"], p["repo"], sha, lineage, p["curve_id"], p["state"], p["lo"],
         p["hi"], p["threshold"], status, observed_state, finished_at.date(), finished_at, finished_at, finished_at,
         generation, "task file changed" if status == "superseded" else None])


def test_the_status_page_shows_the_state_in_force_as_the_watchlist_and_report_do(tmp_path) -> None:
    from monitor.reports.report import _in_force, build_report
    from monitor.reports.watchlist import watchlist_page
    from monitor.service.status_page import gather, render
    from support.report_state import build_report_state
    from support.scores import fake_sha
    from support.status_daemon import StatusDaemon

    world = build_report_state(tmp_path)
    try:
        sha = fake_sha("pythia step 20000")   # pythia's current checkpoint (tests/test_status_page.py)
        (predicted,) = world.store.query("SELECT arg_max(state, (evaluated_at, id)) AS s FROM predictions "
                                         "WHERE commit_sha = ?", [sha])
        assert predicted["s"] != "clear"   # so that the observation changes the state in force
        _observe(world.store, lineage="org/pythia-tiny", sha=sha, observed_state="observed_clear",
                 finished_at=world.now)
        # the evaluation's own alert (kind observe), the lineage's newest
        world.store.conn.execute(
            "INSERT INTO alerts (alert_key, kind, policy, task, repo, commit_sha, lineage, state, status, labels, "
            "annotations, numbers, fingerprint, starts_at, created_at) SELECT 'observation-key', 'observe', policy, "
            "task, repo, commit_sha, lineage, 'observed_clear', 'firing', '{}', '{}', '{}', 'f', ?, ? FROM predictions "
            "WHERE commit_sha = ? LIMIT 1", [world.now, world.now, sha])
        (newest_alert,) = world.store.query("SELECT id FROM alerts WHERE alert_key = 'observation-key'")
        listed = {r["lineage"]: r for r in watchlist_page(world.store).items}
        page = {r["lineage"]: r for r in gather(StatusDaemon(world.store, [world.policy], world.folder),
                                                now=world.now)["rows"]}
        report = build_report(world.store, world.policy, now=world.now, period_start=world.now.replace(year=2000))
        reported = {x["lineage"]: _in_force(x) for t in report["tasks"] for x in t["lineages"]}
        assert listed["org/pythia-tiny"]["commit"] == page["org/pythia-tiny"]["commit"] == sha
        assert listed["org/pythia-tiny"]["state"] == reported["org/pythia-tiny"] == "clear"
        assert page["org/pythia-tiny"]["state"] == "clear"
        assert {k: r["state"] for k, r in page.items()} == {k: r["state"] for k, r in listed.items()} == reported
        assert listed["org/pythia-tiny"]["last_alert"]["id"] == newest_alert["id"]
        assert {k: r["last_alert"]["id"] for k, r in page.items()} == \
            {k: r["last_alert"]["id"] for k, r in listed.items()}
        html = render(gather(StatusDaemon(world.store, [world.policy], world.folder), now=world.now)).decode()
        assert 'data-lineage="org/pythia-tiny" data-repo="org/pythia-tiny"' in html
        assert f'data-commit="{sha}" data-state="clear"' in html
    finally:
        world.store.close()


def test_a_window_report_reads_no_evaluation_finished_after_its_end(tmp_path) -> None:
    """`lstar report --since A --until B` reports the state at B: an evaluation that finished
    after B neither changes a lineage's state in force nor shows as superseded in it."""
    from datetime import timedelta

    from monitor.reports.report import _in_force
    from monitor.reports.window import window_report
    from support.report_state import build_report_state
    from support.scores import fake_sha

    world = build_report_state(tmp_path)
    try:
        sha = fake_sha("pythia step 20000")
        end = world.now
        start = end - timedelta(days=30)
        before = window_report(world.store, world.policy, start=start, end=end, now=end)
        state_then = {x["lineage"]: _in_force(x) for t in before["tasks"] for x in t["lineages"]}
        assert state_then["org/pythia-tiny"] != "clear"
        later = end + timedelta(hours=1)
        _observe(world.store, lineage="org/pythia-tiny", sha=sha, observed_state="observed_clear", finished_at=later)
        _observe(world.store, lineage="org/pythia-tiny", sha=sha, observed_state="observed_clear", finished_at=later,
                 generation=1, status="superseded")
        (newest,) = world.store.query("SELECT max(id) AS id FROM observations")
        # the same window, asked after the evaluations finished: the same answer
        again = window_report(world.store, world.policy, start=start, end=end, now=later + timedelta(hours=1))
        assert {x["lineage"]: _in_force(x) for t in again["tasks"] for x in t["lineages"]} == state_then
        assert again["superseded_evaluations"] == before["superseded_evaluations"] == []
        # a window that holds them reads them
        now_report = window_report(world.store, world.policy, start=start, end=later, now=later)
        assert {x["lineage"]: _in_force(x) for t in now_report["tasks"] for x in t["lineages"]}[
            "org/pythia-tiny"] == "clear"
        assert [r["id"] for r in now_report["superseded_evaluations"]] == [newest["id"]]
        # an evaluation superseded exactly at a window's start belongs to the window before it
        assert window_report(world.store, world.policy, start=later, end=later + timedelta(hours=1),
                             now=later + timedelta(hours=1))["superseded_evaluations"] == []
    finally:
        world.store.close()


# -- silence id prefixes -----------------------------------------------------------------------
def test_a_silence_prefix_needs_four_characters_and_like_metacharacters_match_nothing(tmp_path) -> None:
    from monitor.alerts import expire_silence
    from monitor.alerts.silences import list_silences
    from monitor.alerts.state_ops import add_silence_from_args
    from monitor.errors import PolicyError
    from monitor.store import Store

    store = Store.open(tmp_path / "lstar.duckdb")
    try:
        ids = [add_silence_from_args(store, match=["lineage=org/x"], until="2h", comment="c", start=None,
                                     now=NOW)["id"] for _ in range(3)]
        target = ids[0]
        for hostile in ("%", "_", "%%%%", "____", "%" + target[1:], "_" + target[1:], target[:3] + "%"):
            with pytest.raises(PolicyError, match="no active or pending silence"):
                expire_silence(store, hostile, now=NOW)
        assert any(target.startswith(i[0]) for i in ids)
        # one character, even when it begins one silence alone: refused, the silence still active
        while (unique_first := next((i for i in ids if sum(j[0] == i[0] for j in ids) == 1), None)) is None:
            ids.append(add_silence_from_args(store, match=["lineage=org/y"], until="2h", comment="c", start=None,
                                             now=NOW)["id"])
        with pytest.raises(PolicyError, match="at least 4") as caught:
            expire_silence(store, unique_first[:1], now=NOW)
        assert "at least 4 characters" in caught.value.hint
        assert unique_first in {s["id"] for s in list_silences(store, now=NOW)}
        with pytest.raises(PolicyError) as caught:
            expire_silence(store, "\x1b[2J" + "a" * 5000, now=NOW)
        assert len(caught.value.message) < 300
        assert expire_silence(store, target[:8], now=NOW) == target
        assert target not in {s["id"] for s in list_silences(store, now=NOW)}
    finally:
        store.close()


# -- a malformed Hub endpoint ------------------------------------------------------------------
@pytest.mark.parametrize("endpoint", ["http://[::1", "http://127.0.0.1:99999/", "http://127.0.0.1:x/", "ftp://hub",
                                      "127.0.0.1:8080", "http://hub\n.example"])
@pytest.mark.parametrize("command", [["score", "org/model@main"], ["poll"], ["eval", "org/model@main", "task.yaml"]])
def test_a_malformed_endpoint_is_refused_in_one_line_naming_the_option(tmp_path, capsys, monkeypatch, endpoint,
                                                                         command) -> None:
    from monitor.cli import main

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main([*command, "--endpoint", endpoint, "--state", str(tmp_path / "state")]) == 2
    err = capsys.readouterr().err
    assert "--endpoint" in err and "is not a Hub endpoint" in err and "Traceback" not in err


def test_a_malformed_hf_endpoint_is_not_taken_for_a_loopback_hub(monkeypatch) -> None:
    from monitor.environment import hub_reachable, is_loopback_endpoint
    from monitor.errors import LstarError

    assert not is_loopback_endpoint("http://[::1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_ENDPOINT", "http://[::1")
    with pytest.raises(LstarError, match="cannot fetch from the Hub while HF_HUB_OFFLINE=1"):
        with hub_reachable("lstar score", None):
            pass


def test_the_receiver_prints_a_refused_bodys_path_with_control_characters_visible() -> None:
    from monitor.alerts.receiver import MAX_BODY_BYTES

    printed: list[str] = []
    client = TestClient(receiver_app(SECRET, printed.append), raise_server_exceptions=False)
    answer = client.post("/%1b%5b2J%1b%5d0;pwned%07%e2%80%ae", content=b"x" * (MAX_BODY_BYTES + 1))
    assert answer.status_code == 413
    (line,) = printed
    assert "refused: body over" in line
    assert not any(ord(c) < 32 or c == "\u202e" for c in line), repr(line)
    assert "\\x1b[2J" in line
