"""Issue 38 item 4, "what changed this week?": `lstar report --since/--until` (and
`--last-week`, `--this-week`) and the API's `/report?since=&until=` report on any window, with
the state each lineage carried into it; the times are read by a one-pass parser that refuses a
bad value in one line listing the accepted forms.

The window report is checked on the report tests' state (`support.report_state`, built by the
project's own functions, scored at known times) against the score runs and predictions read
straight from the tables, by plain loops."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from datetime import datetime, timedelta, timezone
from pathlib import Path
from types import SimpleNamespace

import pytest

from monitor.cli import main
from monitor.policy.load import load_policy
from monitor.reports.report import to_json
from monitor.reports.window import (WindowError, parse_duration_back, parse_moment, report_window, week_start,
                                    window_report)
from monitor.service.api import ApiServer
from monitor.store import Store
from support.report_state import T0, build_report_state
from support.listing_daemon import ListingDaemon

NOW = datetime(2026, 11, 4, 15, 30, tzinfo=timezone.utc)   # a Wednesday
# The window: after pythia's first three runs (5.0, 5.1, 5.2 h after T0), through llama's
# first (6.0 h); neox (6.5 and 6.6 h) is scored after it.
START, END = T0 + timedelta(hours=5.25), T0 + timedelta(hours=6.05)


# -- the parser ----------------------------------------------------------------------------------
@pytest.mark.parametrize(("text", "expected"), [
    ("7d", NOW - timedelta(days=7)), ("12h", NOW - timedelta(hours=12)), ("2w", NOW - timedelta(days=14)),
    ("90m", NOW - timedelta(minutes=90)), ("30s", NOW - timedelta(seconds=30)),
    ("1d12h", NOW - timedelta(hours=36)), ("1w2d3h4m5s", NOW - timedelta(seconds=7 * 86400 + 2 * 86400 + 3 * 3600
                                                                              + 4 * 60 + 5)),
    ("now", NOW), (" 7d ", NOW - timedelta(days=7)),
    ("2026-11-01", datetime(2026, 11, 1, tzinfo=timezone.utc)),
    ("2026-11-01T12:00", datetime(2026, 11, 1, 12, tzinfo=timezone.utc)),
    ("2026-11-01T12:00+01:00", datetime(2026, 11, 1, 11, tzinfo=timezone.utc)),
    ("2026-11-01T12:00:30Z", datetime(2026, 11, 1, 12, 0, 30, tzinfo=timezone.utc)),
])
def test_accepted_forms(text, expected):
    assert parse_moment(text, now=NOW) == expected


@pytest.mark.parametrize("text", ["", "7", "d", "7x", "d7", "-7d", "7 d", "12h1d", "1d1d", "7D", "1.5d", "7days",
                                  "1" * 16 + "d", "5300w", "2026-13-01", "2026-11-01T25:00", "yesterday",
                                  "2026/11/01", "7d\x00", "１d", "1" * 100_000])
def test_refused_values_get_one_line_with_the_accepted_forms(text):
    with pytest.raises(WindowError) as caught:
        parse_moment(text, now=NOW)
    message = str(caught.value)
    assert "\n" not in message and len(message) < 400
    assert message.endswith("give a duration back from now (7d, 12h, 2w, 90m, 1d12h), a date (2026-11-01, "
                            "midnight UTC), a date and time (2026-11-01T12:00, UTC unless it gives an offset) or now")


def test_the_duration_parser_is_linear_on_hostile_input():
    # a long run of digits or of units: one pass, refused at the digit bound or the repeated unit
    for text in ("9" * 200_000 + "d", "1d" * 100_000, "1w1d1h1m1s" + "x" * 200_000):
        began = time.perf_counter()
        assert parse_duration_back(text) is None
        assert time.perf_counter() - began < 0.5
    assert parse_duration_back("100w") == timedelta(weeks=100)


def test_windows_and_shorthands():
    # NOW is Wednesday 2026-11-04 15:30 UTC: this ISO week began Monday 2026-11-02 00:00
    monday = datetime(2026, 11, 2, tzinfo=timezone.utc)
    assert week_start(NOW) == monday and monday.isoweekday() == 1
    assert report_window(since=None, until=None, now=NOW, last_week=True) == (monday - timedelta(days=7), monday)
    assert report_window(since=None, until=None, now=NOW, this_week=True) == (monday, NOW)
    assert report_window(since="7d", until=None, now=NOW) == (NOW - timedelta(days=7), NOW)
    assert report_window(since="2026-11-01", until="2026-11-03", now=NOW) == \
        (datetime(2026, 11, 1, tzinfo=timezone.utc), datetime(2026, 11, 3, tzinfo=timezone.utc))
    assert report_window(since="2d", until="2030-01-01", now=NOW) == (NOW - timedelta(days=2), NOW)  # not past now
    assert report_window(since=None, until=None, now=NOW) is None
    for kwargs, words in [({"since": "1d", "until": "2d"}, "the window is empty"),
                          ({"since": None, "until": "2d"}, "--until needs --since"),
                          ({"since": "1d", "until": None, "last_week": True}, "--last-week and --since name two"),
                          ({"since": None, "until": None, "last_week": True, "this_week": True}, "name two windows")]:
        with pytest.raises(WindowError, match=words):
            report_window(now=NOW, **kwargs)


# -- a window report over a hand-built state ----------------------------------------------------------
@pytest.fixture(scope="module")
def state(tmp_path_factory):
    built = build_report_state(tmp_path_factory.mktemp("since"))
    built.store.close()
    return SimpleNamespace(db=built.folder / "lstar.duckdb", policy=built.policy, folder=built.folder,
                           shas=built.shas)


def read(db: Path, sql: str) -> list[dict]:
    with Store.open(db, read_only=True) as store:
        return store.query(sql)


def expected_changes(db: Path) -> tuple[dict, dict, list]:
    """By plain loops over the tables: the runs in the window, the run each lineage carried in
    (the newest run of its current checkpoint at the window's start: the largest training step
    its refs name among those scored before the window, the project's training-order rule),
    and the crossings (state changes of the predictions in the window, starting from each
    lineage's newest state before it)."""
    runs = read(db, "SELECT r.run_id, r.model_sha, c.lineage, c.refs, r.finished_at FROM score_runs r "
                    "JOIN checkpoints c ON c.id = r.checkpoint_id ORDER BY r.finished_at, r.run_id")
    in_window = {r["run_id"]: r["lineage"] for r in runs if START < r["finished_at"] <= END}
    carried, carried_step = {}, {}
    for r in runs:
        if r["finished_at"] <= START:
            steps = [int(ref[4:]) for ref in json.loads(r["refs"]) if ref.startswith("step") and ref[4:].isdigit()]
            assert steps, f"{r['lineage']} is carried in: this hand count orders by step only"
            if max(steps) >= carried_step.get(r["lineage"], -1):   # a later run of the same step wins
                carried[r["lineage"]], carried_step[r["lineage"]] = r["run_id"], max(steps)
    preds = read(db, "SELECT * FROM predictions ORDER BY evaluated_at, id")
    position = training_position(db)
    crossings = []
    for lineage in sorted({p["lineage"] for p in preds}):
        # the state carried in: the current checkpoint's (latest in training order) at START
        before = [p for p in preds if p["lineage"] == lineage and p["evaluated_at"] <= START]
        top = max((position[p["commit_sha"]] for p in before), default=None)
        at_top = [p for p in before if position[p["commit_sha"]] == top]
        previous = at_top[-1]["state"] if at_top else None
        latest = top if top is not None else ("", -1)
        for p in preds:
            if p["lineage"] == lineage and START < p["evaluated_at"] <= END:
                if position[p["commit_sha"]] < latest:
                    continue   # an earlier checkpoint scored late: the lineage's state stays
                latest = position[p["commit_sha"]]
                if p["state"] != previous:
                    crossings.append((lineage, p["commit_sha"], previous, p["state"]))
                previous = p["state"]
    return in_window, carried, crossings


def training_position(db: Path) -> dict[str, tuple]:
    """Each checkpoint's place in its lineage, by hand from the checkpoints table: the step its
    refs name (every lineage of this fixture that names steps names one for each checkpoint),
    else the gate's commit date, else the listing's lastModified (a `main` head)."""
    out = {}
    for c in read(db, "SELECT sha, refs, meta FROM checkpoints"):
        refs, meta = json.loads(c["refs"]), json.loads(c["meta"] or "{}")
        steps = [int(ref[4:]) for ref in refs if ref.startswith("step") and ref[4:].isdigit()]
        date = (meta.get("gate") or {}).get("commit_date") or (meta.get("listing") or {}).get("last_modified")
        out[c["sha"]] = ("step", max(steps)) if steps else ("date", datetime.fromisoformat(date.replace("Z", "+00:00")))
    return out


def test_a_window_report_lists_exactly_the_changes_in_the_window_and_the_state_carried_in(state):
    in_window, carried, crossings = expected_changes(state.db)
    assert set(in_window.values()) == {"org/pythia-tiny", "org/llama-tiny"} and "org/pythia-tiny" in carried
    with Store.open(state.db, read_only=True) as store:
        data = json.loads(to_json(window_report(store, state.policy, start=START, end=END, now=NOW)))
    assert (data["period"]["start"], data["period"]["end"]) == (START.isoformat(), END.isoformat())
    assert data["generated_at"] == NOW.isoformat()
    assert {r["run_id"] for r in data["lstar_table"] if r["new"]} == set(in_window)
    # carried in: the newest run before the window of each lineage the policy watches
    assert {r["lineage"]: r["run_id"] for r in data["lstar_table"] if not r["new"]} == carried
    assert {f["lineage"] for f in data["families"]} == set(in_window.values()) | set(carried)
    assert sorted((c["lineage"], c["commit"], c["from"], c["to"]) for c in data["crossings"]) == sorted(crossings)
    assert data["summary"]["new_scores"] == len(in_window) and data["summary"]["crossings"] == len(crossings)
    assert data["new_checkpoints"] == []   # all were discovered 4.5 h after T0, before the window


def same_report(a: dict, b: dict) -> bool:
    """Two reports say the same, apart from when they were made and their policy was read."""
    def content(data: dict) -> dict:
        version = {k: v for k, v in data["policy_version"].items() if k != "loaded_at"}
        return {**{k: v for k, v in data.items() if k != "generated_at"}, "policy_version": version}
    return content(a) == content(b)


def lstar(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_the_command_reports_on_the_window_and_refuses_bad_values(state, capsys):
    with Store.open(state.db, read_only=True) as store:
        expected = json.loads(to_json(window_report(store, state.policy, start=START, end=END, now=NOW)))
    policy = str(state.folder / "policy.yaml")
    code, out, err = lstar(capsys, "report", "--db", str(state.db), "--policy", policy, "--since", START.isoformat(),
                           "--until", END.isoformat(), "--json")
    assert code == 0, err
    data = json.loads(out)
    assert same_report(data, expected)
    code, out, err = lstar(capsys, "report", "--db", str(state.db), "--policy", policy, "--last-week", "--json")
    assert code == 0, err
    period = json.loads(out)["period"]
    start, end = datetime.fromisoformat(period["start"]), datetime.fromisoformat(period["end"])
    assert end - start == timedelta(days=7) and start.isoweekday() == 1 and (start.hour, start.minute) == (0, 0)
    assert end <= datetime.now(timezone.utc) < end + timedelta(days=7)
    code, out, err = lstar(capsys, "report", "--db", str(state.db), "--policy", policy, "--since", "7x")
    assert (code, out) == (2, "") and err.count("\n") == 1
    assert "Invalid value for '--since': '7x' is not a time; give a duration back from now" in err
    code, out, err = lstar(capsys, "report", "--db", str(state.db), "--policy", policy, "--since", "1d",
                           "--until", "2026-02-30")
    assert code == 2 and "Invalid value for '--until': '2026-02-30' is not a time" in err


def get(url: str) -> tuple[int, object]:
    try:
        with urllib.request.urlopen(url, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_the_api_reports_on_the_window(state):
    with Store.open(state.db, read_only=True) as store:
        expected = json.loads(to_json(window_report(store, state.policy, start=START, end=END, now=NOW)))
    policy = load_policy(state.folder / "policy.yaml")
    window = urllib.parse.urlencode({"policy": "governance", "since": START.isoformat(), "until": END.isoformat()})
    with ApiServer(ListingDaemon(state.db, [policy]), port=0, token="t" * 32) as server:
        status, body = get(f"{server.url}/report?{window}")
        assert status == 200
        (data,) = body
        assert same_report(data, expected)
        status, body = get(f"{server.url}/report?policy=governance&since=7x")
        assert status == 400 and "'7x' is not a time; give a duration back from now" in body["error"]
        status, body = get(f"{server.url}/report?policy=governance&until=1d")
        assert status == 400 and body["error"].startswith("until needs since")
