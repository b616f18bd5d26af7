"""Every listing is bounded (docs/reliability.md row 48): a default page size, keyset cursors
that walk every row exactly once in the listing's order, the total, and a clear refusal of a
cursor it did not hand out, in the library, the commands and the daemon's API (served
in-process here over a stub daemon)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from monitor.cli import main
from monitor.errors import CursorError
from monitor.service.api import ApiServer
from monitor.store import Store
from monitor.store.listings import alerts_page, checkpoints_page, runs_page, silences_page
from monitor.store.pages import DEFAULT_LIMIT
from support.listing_daemon import ListingDaemon

N = 120
T0 = datetime(2030, 1, 1, tzinfo=timezone.utc)
NOW = T0 + timedelta(days=30)


def _at(i: int) -> datetime:
    # Three rows share each time, so the tie-breaking column decides their order across pages.
    return T0 + timedelta(minutes=i // 3)


RUN = ("INSERT INTO score_runs (run_id, checkpoint_id, model_repo, model_sha, model_source, tokenizer_fingerprint, "
       "corpus_sha256, spec_version, window_len, stride, prefix_policy, dtype, device, n_tokens, n_bytes, nll_sum, "
       "ce, ce_unigram, lstar, l_rel, l_gain, bits_per_byte, tokens_per_byte, se_ce, slices, spec, model, "
       "library_versions, wall_s, tokens_per_s, finished_at) VALUES (?, ?, ?, ?, 'hub', 'tok', 'corpus', '1', 8, 8, "
       "'none', 'float32', 'cpu', 100, 400, 1.0, 2.0, 3.0, ?, 0.5, 0.5, 1.0, 0.25, 0.01, '{}', '{}', '{}', '{}', "
       "1.0, 100.0, ?)")


def build_state(path: Path) -> Path:
    """A state of N checkpoints (ids shuffled against discovery time), N score runs, N alerts with
    a delivery each, N silences (a third expired), and one `not_evaluated` record."""
    # One executemany a table, each table's rows in the same order: the same state for 0.95 CPU-seconds
    # instead of 1.3 (one execute a row).
    ids = [(i * 7) % N + 1 for i in range(N)]  # ids out of discovery order: the cursor must hold both keys
    with Store.open(path) as store, store.transaction() as conn:
        conn.executemany("INSERT INTO checkpoints (id, repo, sha, source, lineage, discovered_at, updated_at, status) "
                         "VALUES (?, ?, ?, 'hub', ?, ?, ?, ?)",
                         [[ids[i], f"org/m{i % 4}", f"{i:040x}", f"org/m{i % 4}", _at(i), _at(i),
                           "scored" if i % 2 else "failed"] for i in range(N)])
        conn.executemany(RUN, [[f"run-{(i * 11) % N:03d}", ids[i], f"org/m{i % 4}", f"{i:040x}", 4.0 - i / N, _at(i)]
                               for i in range(N)])
        conn.executemany("INSERT INTO alerts (id, alert_key, kind, policy, task, repo, commit_sha, lineage, "
                         "state, status, labels, annotations, numbers, fingerprint, starts_at, created_at) VALUES "
                         "(?, ?, 'fire', ?, 't', 'org/m', ?, 'org/m', 'at_risk', 'firing', '{}', '{}', '{}', 'f', "
                         "?, ?)",
                         [[(i * 13) % N + 1, f"k{i}", "p1" if i % 3 else "p2", f"{i:040x}", _at(i), _at(i)]
                          for i in range(N)])
        conn.executemany("INSERT INTO deliveries (id, alert_id, policy, receiver, group_key, group_labels, "
                         "group_wait_s, group_interval_s, status, created_at, updated_at) VALUES "
                         "(?, ?, 'p', 'ops', 'g', '{}', 0, 0, 'queued', ?, ?)",
                         [[i + 1, (i * 13) % N + 1, _at(i), _at(i)] for i in range(N)])
        conn.executemany("INSERT INTO silences (id, matchers, starts_at, ends_at, comment, created_by, created_at) "
                         "VALUES (?, '[\"policy=p\"]', ?, ?, 'c', 'me', ?)",
                         [[f"sil-{(i * 17) % N:03d}", T0,
                           NOW - timedelta(hours=1) if i % 3 == 0 else NOW + timedelta(days=1), _at(i)]
                          for i in range(N)])
        conn.execute("INSERT INTO predictions (policy, task, run_id, repo, commit_sha, lineage, corpus_sha256, lstar, "
                     "se, state, detail, evaluated_at) VALUES ('p1', 't', 'run-000', 'org/m1', ?, 'org/m1', 'corpus', "
                     "1, 0.1, 'not_evaluated', '{\"reason\": \"no curve\"}', ?)", [f"{101:040x}", T0])
    return path


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> Path:
    return build_state(tmp_path_factory.mktemp("pages") / "state.duckdb")


def naive(db: Path, sql: str) -> list[tuple]:
    """Every row of a listing, in its order, read in one query (no pages)."""
    with Store.open(db, read_only=True) as store:
        return [tuple(r.values()) for r in store.query(sql)]


EXPECTED = {
    "checkpoints": "SELECT id FROM checkpoints ORDER BY discovered_at, id",
    "runs": "SELECT run_id FROM score_runs ORDER BY finished_at DESC, run_id DESC",
    "alerts": "SELECT id FROM alerts ORDER BY created_at DESC, id DESC",
    "silences": "SELECT id FROM silences ORDER BY created_at DESC, id DESC",
}
KEY = {"checkpoints": "id", "runs": "run_id", "alerts": "id", "silences": "id"}
LISTINGS = {
    "checkpoints": lambda store, **kw: checkpoints_page(store, **kw),
    "runs": lambda store, **kw: runs_page(store, **kw),
    "alerts": lambda store, **kw: alerts_page(store, **kw),
    "silences": lambda store, **kw: silences_page(store, now=NOW, include_expired=True, **kw),
}


@pytest.mark.parametrize("name", list(LISTINGS))
def test_pages_walk_every_row_exactly_once_in_order(db, name):
    expected = [row[0] for row in naive(db, EXPECTED[name])]
    assert len(expected) == N
    seen, cursor, pages = [], None, 0
    with Store.open(db, read_only=True) as store:
        first = LISTINGS[name](store)
        assert (len(first.items), first.total, first.limit) == (DEFAULT_LIMIT, N, DEFAULT_LIMIT)
        while True:
            page = LISTINGS[name](store, limit=50, cursor=cursor)
            pages += 1
            assert page.total == N
            seen += [item[KEY[name]] for item in page.items]
            cursor = page.next_cursor
            if cursor is None:
                break
    assert pages == 3 and seen == expected


def test_filters_page_with_their_own_total_and_the_page_carries_its_notes(db):
    with Store.open(db, read_only=True) as store:
        failed = checkpoints_page(store, status="failed", limit=30)
        rest = checkpoints_page(store, status="failed", limit=30, cursor=failed.next_cursor)
        live = silences_page(store, now=NOW, limit=1000)
        p2 = alerts_page(store, policy="p2", limit=1000)
        second = checkpoints_page(store, limit=50, cursor=checkpoints_page(store, limit=50).next_cursor)
    assert failed.total == N // 2 and len(failed.items) + len(rest.items) == N // 2 and rest.next_cursor is None
    assert all(r["status"] == "failed" for r in failed.items + rest.items)
    assert live.total == N - N // 3 and {r["state"] for r in live.items} == {"active"}
    assert p2.total == N // 3 and all(len(r["deliveries"]) == 1 for r in p2.items)
    # checkpoint 101 (discovered 101st) is on the third page only; the second carries no notes
    assert all(r["not_evaluated"] == [] for r in second.items)
    with Store.open(db, read_only=True) as store:
        third = checkpoints_page(store, limit=50, cursor=second.next_cursor)
    noted = [r for r in third.items if r["not_evaluated"]]
    assert [(r["sha"], r["not_evaluated"]) for r in noted] == [(f"{101:040x}", ["p1/t: no curve"])]


@pytest.mark.parametrize("cursor", ["garbage", "", "x" * 2000])
def test_a_cursor_the_listing_did_not_hand_out_is_refused(db, cursor):
    with Store.open(db, read_only=True) as store:
        runs_cursor = runs_page(store, limit=5).next_cursor
        with pytest.raises(CursorError, match="is not a cursor of the checkpoints listing"):
            checkpoints_page(store, cursor=cursor)
        with pytest.raises(CursorError, match="is not a cursor of the checkpoints listing"):
            checkpoints_page(store, cursor=runs_cursor)


def lstar(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(("command", "key"), [(["checkpoints"], "id"), (["runs"], "run_id"),
                                              (["alerts", "list"], "id"), (["silence", "list", "--all"], "id")])
def test_commands_page_and_say_how_to_see_more(db, command, key, capsys):
    name = {"checkpoints": "checkpoints", "runs": "runs", "alerts": "alerts", "silence": "silences"}[command[0]]
    expected = [row[0] for row in naive(db, EXPECTED[name])]
    now = ["--now", NOW.isoformat()] if command[0] == "silence" else []
    code, out, err = lstar(capsys, *command, "--db", str(db), *now)
    assert code == 0, err
    default = 20 if name == "runs" else 50  # `lstar runs` shows 20 unless asked
    assert f"{default} of {N:,}" in out
    assert f"showing {default} of {N:,} {name if name != 'runs' else 'score runs'}; more with --cursor " in out
    seen, cursor = [], None
    while True:
        code, out, err = lstar(capsys, *command, "--db", str(db), *now, "--json", "--limit", "50",
                               *(["--cursor", cursor] if cursor else []))
        assert code == 0, err
        page = json.loads(out)
        assert page["total"] == N and page["limit"] == 50
        seen += [item[key] for item in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == expected
    code, out, err = lstar(capsys, *command, "--db", str(db), *now, "--cursor", "nonsense")
    assert (code, out) == (2, "")
    assert err == (f"error: cursor 'nonsense' is not a cursor of the {name} listing; use the next_cursor a "
                   f"`{name}` listing printed, or leave the cursor out for the first page\n")
    code, out, err = lstar(capsys, *command, "--db", str(db), *now, "--limit", "1001")
    assert code == 2 and "1 to 1,000" in err


@pytest.fixture(scope="module")
def api(db):
    with ApiServer(ListingDaemon(db), port=0, token="t" * 32) as server:
        yield server.url


def get(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.mark.parametrize(("path", "name"), [("/checkpoints", "checkpoints"), ("/runs", "runs"),
                                            ("/alerts", "alerts"), (f"/silences?all=1&now={NOW:%Y-%m-%dT%H:%M:%SZ}",
                                                                    "silences")])
def test_api_listings_answer_pages(api, db, path, name):
    expected = [row[0] for row in naive(db, EXPECTED[name])]
    joiner = "&" if "?" in path else "?"
    status, first = get(api + path)
    assert status == 200 and len(first["items"]) == DEFAULT_LIMIT and first["total"] == N
    seen, cursor = [], None
    while True:
        status, page = get(api + path + joiner + "limit=50" + (f"&cursor={cursor}" if cursor else ""))
        assert status == 200 and page["total"] == N
        seen += [item[KEY[name]] for item in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == expected
    status, body = get(api + path + joiner + "cursor=AAAA")
    assert status == 400 and body["kind"] == "CursorError"
    assert body["error"] == f"cursor 'AAAA' is not a cursor of the {name} listing"
    status, body = get(api + path + joiner + "limit=1001")
    assert status == 400 and body["error"] == "limit must be a whole number from 1 to 1000, got '1001'"
