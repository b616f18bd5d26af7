"""A checkpoint listing reads and sends only what it shows (issue 39): each row's `meta` holds
only `LISTING_META_KEYS`, the whole meta comes with `fields=meta` / `--meta` or from
GET /checkpoints/ID, and the API encodes compactly. Checked against the meta text read back
straight from the table."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from monitor.cli import main
from monitor.service.api import ApiServer
from monitor.store import Store
from monitor.store.placing import META_COLUMNS, META_VALUES
from monitor.store.listings import checkpoint_detail, checkpoints_page
from support.listing_daemon import ListingDaemon

T0 = datetime(2030, 1, 1, tzinfo=timezone.utc)
N = 6


def _meta(i: int) -> dict:
    """A daemon-like meta: the gate's and fetch's facts (not listed), the score, and on some rows
    the keys the listing shows."""
    meta = {"gate": {"files": [f"model-{k}.safetensors" for k in range(40)], "ok": True},
            "fetched_at": "2030-01-01T00:00:00Z", "files_digest": "ab" * 32, "worker": f"w{i}"}
    if i % 2:
        meta.update(run_id=f"run-{i}", lstar=2.0 + i / 10, se=0.01 * i)
    if i == 3:
        meta.update(linked_from_run_id="run-1", linked_from_checkpoint_id=2)
    if i == 4:
        meta["reference_base"] = {"reason": "the base of org/m-ft", "lineage": "org/m"}
    return meta


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("rows") / "state.duckdb"
    with Store.open(path) as store, store.transaction() as conn:
        for i in range(N):
            meta = json.dumps(_meta(i))
            conn.execute("INSERT INTO checkpoints (id, repo, sha, source, refs, lineage, discovered_at, updated_at, "
                         f"status, {META_COLUMNS}) VALUES (?, 'org/m', ?, 'hub', ?, 'org/m', ?, ?, 'scored', {META_VALUES})",
                         [i + 1, f"{i:040x}", json.dumps([f"step{i}"]), T0 + timedelta(hours=i),
                          T0 + timedelta(hours=i), meta, meta])
    return path


def stored_metas(db: Path) -> dict[int, dict]:
    with Store.open(db, read_only=True) as store:
        return {r["id"]: json.loads(r["meta"]) for r in store.query("SELECT id, meta FROM checkpoints")}


EXPECTED_LISTED = {  # by hand, from _meta: what a listing row's meta holds
    1: {}, 2: {"run_id": "run-1", "lstar": 2.1, "se": 0.01}, 3: {},
    4: {"run_id": "run-3", "lstar": 2.3, "se": 0.03, "linked_from_run_id": "run-1", "linked_from_checkpoint_id": 2},
    5: {"reference_base": {"reason": "the base of org/m-ft", "lineage": "org/m"}},
    6: {"run_id": "run-5", "lstar": 2.5, "se": 0.05},
}


def test_a_listing_row_carries_only_the_meta_keys_it_shows(db):
    with Store.open(db, read_only=True) as store:
        slim = checkpoints_page(store).items
        full = checkpoints_page(store, with_meta=True).items
        detail = {c["id"]: checkpoint_detail(store, c["id"]) for c in full}
        assert checkpoint_detail(store, 999) is None
    assert {r["id"]: r["meta"] for r in slim} == EXPECTED_LISTED
    assert {r["id"]: r["meta"] for r in full} == stored_metas(db)
    strip = [{k: v for k, v in r.items() if k != "meta"} for r in full]
    assert [{k: v for k, v in r.items() if k != "meta"} for r in slim] == strip   # every other field kept
    assert [detail[r["id"]] for r in full] == full


@pytest.fixture(scope="module")
def api(db):
    with ApiServer(ListingDaemon(db), port=0, token="t" * 32) as server:
        yield server.url


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_the_api_sends_listing_rows_compactly_and_the_whole_meta_on_request(api, db):
    status, body = get(api + "/checkpoints")
    assert status == 200 and b"\n" not in body and b'": ' not in body   # no indent, no spaces
    listed = json.loads(body)["items"]
    assert {r["id"]: r["meta"] for r in listed} == EXPECTED_LISTED
    status, with_meta = get(api + "/checkpoints?fields=meta")
    assert status == 200 and {r["id"]: r["meta"] for r in json.loads(with_meta)["items"]} == stored_metas(db)
    assert len(body) < len(with_meta) / 2
    status, one = get(api + "/checkpoints/4")
    assert status == 200 and json.loads(one)["meta"] == stored_metas(db)[4] and json.loads(one)["refs"] == ["step3"]
    status, missing = get(api + "/checkpoints/999")
    assert status == 404 and json.loads(missing)["error"] == "no checkpoint with id 999"
    status, bad = get(api + "/checkpoints?fields=all")
    assert status == 400 and json.loads(bad)["error"] == "fields must be one of meta, got 'all'"
    assert get(api + "/checkpoints/x1")[0] == 404


def test_lstar_checkpoints_json_prints_the_same_rows_and_meta_on_request(db, capsys, api, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")   # the reason column unwrapped
    assert main(["checkpoints", "--db", str(db), "--json"]) == 0
    offline = json.loads(capsys.readouterr().out)["items"]
    assert offline == json.loads(get(api + "/checkpoints")[1])["items"]
    assert main(["checkpoints", "--db", str(db), "--json", "--meta"]) == 0
    assert {r["id"]: r["meta"] for r in json.loads(capsys.readouterr().out)["items"]} == stored_metas(db)
    assert main(["checkpoints", "--db", str(db)]) == 0
    table = capsys.readouterr().out
    assert "same weights as checkpoint 2 (run run-1)" in table and "reference: the base of org/m-ft" in table
