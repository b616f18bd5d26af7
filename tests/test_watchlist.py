"""Issue 38 item 3, "which watched models are at risk right now?": `lstar watchlist` and the
API's `/watchlist` list each watched lineage × task at its current checkpoint (the last in
training order, whatever order it was scored in), with P̂, its interval, the level, the
distance to it and the last alert, closest to the level first; `/alerts` takes `state=`.

The state is the report tests' (`support.report_state`: built by the poller's, scorer's and
outbox's own functions, scored out of training order); every number is checked against the
rows read straight from the predictions and alerts tables by plain loops."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest

from monitor.cli import main
from monitor.errors import CursorError
from monitor.service.api import ApiServer
from monitor.reports.watchlist import watchlist_page
from monitor.store import Store
from support.report_state import BASELINE, MARGIN, build_report_state
from support.listing_daemon import ListingDaemon

LEVEL = BASELINE + MARGIN
# The current checkpoint of each lineage, from the facts the state was built with: the
# largest step (pythia: scored third of five), the newest gate commit date (llama: scored
# first), the newest listing date of a `main` head (neox: scored first).
CURRENT = {"org/pythia-tiny": "step20000", "org/llama-tiny": "c3", "org/neox-small": "n2"}


@pytest.fixture(scope="module")
def state(tmp_path_factory):
    built = build_report_state(tmp_path_factory.mktemp("watch"))
    built.store.close()   # every reader below opens the file read-only, as the command does
    return SimpleNamespace(db=built.folder / "lstar.duckdb", shas=built.shas)


def rows(db: Path, sql: str, params=()) -> list[dict]:
    with Store.open(db, read_only=True) as store:
        return store.query(sql, list(params))


def expected_items(state) -> list[dict]:
    """The watchlist by hand: each lineage's newest prediction of its current checkpoint, its
    newest alert, sorted by |P̂ − level| with a plain sort."""
    preds = rows(state.db, "SELECT * FROM predictions ORDER BY evaluated_at, id")
    alerts = rows(state.db, "SELECT * FROM alerts ORDER BY created_at, id")
    out = []
    for lineage, label in CURRENT.items():
        sha = state.shas[(lineage, label)]
        newest = [p for p in preds if p["repo"] == lineage and p["commit_sha"] == sha][-1]
        last = [a for a in alerts if a["lineage"] == lineage][-1]
        assert newest["threshold"] == pytest.approx(LEVEL)
        state_by_hand = ("emerged" if newest["lo"] >= LEVEL else "at_risk" if newest["hi"] >= LEVEL else "clear")
        out.append({"lineage": lineage, "commit": sha, "state": state_by_hand, "p_hat": newest["p_hat"],
                    "lo": newest["lo"], "hi": newest["hi"], "level": LEVEL, "distance": newest["p_hat"] - LEVEL,
                    "prediction_id": newest["id"], "last_alert_id": last["id"]})
    return sorted(out, key=lambda item: abs(item["distance"]))


def shown(item: dict) -> dict:
    return {"lineage": item["lineage"], "commit": item["commit"], "state": item["state"], "p_hat": item["p_hat"],
            "lo": item["lo"], "hi": item["hi"], "level": item["level"], "distance": item["distance"],
            "prediction_id": item["prediction_id"], "last_alert_id": item["last_alert"]["id"]}


def test_each_lineage_is_shown_at_its_current_checkpoint_closest_to_the_level_first(state):
    expected = expected_items(state)
    with Store.open(state.db, read_only=True) as store:
        page = watchlist_page(store)
        # scoring order is not training order: the newest prediction of two lineages is another checkpoint
        newest_scored = {r["lineage"]: r["commit_sha"] for r in store.query(
            "SELECT lineage, arg_max(commit_sha, evaluated_at) AS commit_sha FROM predictions GROUP BY lineage")}
    assert newest_scored["org/pythia-tiny"] != state.shas[("org/pythia-tiny", "step20000")]
    assert page.total == 3 and page.next_cursor is None
    assert [shown(i) for i in page.items] == \
        [{**e, "level": pytest.approx(e["level"]), "distance": pytest.approx(e["distance"])} for e in expected]
    assert [i["checkpoint"] for i in page.items if i["lineage"] == "org/pythia-tiny"] == \
        [f"org/pythia-tiny@step20000 ({state.shas[('org/pythia-tiny', 'step20000')][:7]})"]
    assert all(i["policy"] == "governance" and i["task"] == "cloze" for i in page.items)


def test_filters_and_pages(state):
    expected = expected_items(state)
    with Store.open(state.db, read_only=True) as store:
        at_risk = watchlist_page(store, status="at_risk")
        assert [i["lineage"] for i in at_risk.items] == [e["lineage"] for e in expected if e["state"] == "at_risk"]
        assert at_risk.total == len(at_risk.items) >= 1
        assert [i["lineage"] for i in watchlist_page(store, repo="org/*-tiny").items] == \
            [e["lineage"] for e in expected if e["lineage"].endswith("-tiny")]
        assert watchlist_page(store, task="other").total == 0
        assert watchlist_page(store, policy="other").total == 0
        assert watchlist_page(store, policy="governance", task="cloze").total == 3
        seen, cursor = [], None
        while True:
            page = watchlist_page(store, limit=1, cursor=cursor)
            assert page.total == 3 and len(page.items) == 1
            seen.append(page.items[0]["lineage"])
            cursor = page.next_cursor
            if cursor is None:
                break
        assert seen == [e["lineage"] for e in expected]
        with pytest.raises(CursorError):
            watchlist_page(store, cursor="AAAA")
        with pytest.raises(ValueError, match="is not a state; give one of clear, at_risk, emerged, flagged"):
            watchlist_page(store, status="at-risk")


def test_the_command_prints_the_list_and_its_json(state, capsys):
    expected = expected_items(state)
    code = main(["watchlist", "--db", str(state.db), "--json"])
    out = capsys.readouterr().out
    assert code == 0
    items = json.loads(out)["items"]
    assert [(i["lineage"], i["commit"], i["state"]) for i in items] == \
        [(e["lineage"], e["commit"], e["state"]) for e in expected]
    assert main(["watchlist", "--db", str(state.db), "--status", "emerged"]) == 0
    table = capsys.readouterr().out
    emerged = [e for e in expected if e["state"] == "emerged"]
    assert table.startswith(f"{len(emerged)} lineage(s) of governance / cloze, closest to the level first")
    for e in emerged:
        assert e["lineage"] in table and f"{abs(e['distance']):.4f} above" in table and f"{e['p_hat']:.4f}" in table
    assert "org/llama-tiny" not in table
    # `--state` names the state folder; the filter is `--status`, checked when parsed
    assert main(["watchlist", "--db", str(state.db), "--status", "at-risk"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'at-risk' is not a state; give one of clear, at_risk, emerged, flagged" in err
    assert main(["watchlist", "--db", str(state.db), "--repo", "x" * 201]) == 2
    assert "Invalid value for '--repo': the glob is 201 characters long; give at most 200" in capsys.readouterr().err
    assert main(["watchlist", "--db", str(state.db), "--repo", "org/[", "--status", "clear"]) == 0
    assert capsys.readouterr().out == "no watched lineage has a prediction with status clear, repo org/[\n"


def get(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_the_api_answers_the_watchlist_and_filters_alerts_by_state(state):
    expected = expected_items(state)
    alerts = rows(state.db, "SELECT id, state FROM alerts ORDER BY created_at DESC, id DESC")
    with ApiServer(ListingDaemon(state.db), port=0, token="t" * 32) as server:
        status, body = get(server.url + "/watchlist?status=at_risk&policy=governance&task=cloze&repo=org/*")
        assert status == 200
        assert [i["lineage"] for i in body["items"]] == [e["lineage"] for e in expected if e["state"] == "at_risk"]
        status, body = get(server.url + "/watchlist?limit=2")
        assert status == 200 and len(body["items"]) == 2 and body["total"] == 3 and body["next_cursor"]
        status, rest = get(server.url + f"/watchlist?limit=2&cursor={body['next_cursor']}")
        assert [i["lineage"] for i in body["items"] + rest["items"]] == [e["lineage"] for e in expected]
        status, body = get(server.url + "/watchlist?status=firing")
        assert status == 400 and "status must be one of clear, at_risk, emerged, flagged" in body["error"]
        for wanted in ("at_risk", "clear"):
            status, body = get(server.url + f"/alerts?state={wanted}")
            assert status == 200
            assert [a["id"] for a in body["items"]] == [a["id"] for a in alerts if a["state"] == wanted]
        status, body = get(server.url + "/alerts?state=bogus")
        assert status == 400
