"""The daemon's live status page (`GET /`): each watched lineage × task shows the state of its
current checkpoint (the latest in training order) as the predictions table holds it, the
distance to the level as the table's numbers give it, the page is bounded and escaped, it is
served with a strict CSP beside busy workers, and it renders in headless Chromium with no
request leaving 127.0.0.1 (its screenshot is docs/img/status-page.png)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from html.parser import HTMLParser
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import urlsplit

import httpx
import pytest

from monitor.escape import plain_text
from monitor.service.api import ApiServer
from monitor.service.status_page import CSS_HASH, MAX_AGE, gather, render, sparkline
from support.report_state import build_report_state
from support.status_daemon import StatusDaemon

ROOT = Path(__file__).resolve().parents[1]
# The current checkpoint of each lineage, from the fixture's facts (support/report_state.py):
# Pythia's largest step, Llama's newest commit date, NeoX's newest listing date; each was
# scored before an older checkpoint of its lineage, so "newest scored" would name another.
CURRENT = {"org/pythia-tiny": "pythia step 20000", "org/llama-tiny": "llama c3", "org/neox-small": "neox n2"}


class Rows(HTMLParser):
    """The lineage rows of a status page: each row's data- attributes and its cells' text;
    every start tag seen, to check no markup came from a value."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[dict] = []
        self.tags: list[str] = []
        self.cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list) -> None:
        self.tags.append(tag)
        attrs = dict(attrs)
        if tag == "tr" and attrs.get("class") == "lineage":
            self.rows.append({"attrs": attrs, "cells": []})
        elif tag == "td" and self.rows and self.cell is None:
            self.cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "td" and self.cell is not None:
            self.rows[-1]["cells"].append("".join(self.cell).strip())
            self.cell = None
        elif tag == "tr" and self.cell is not None:
            self.cell = None

    def handle_data(self, data: str) -> None:
        if self.cell is not None:
            self.cell.append(data)


def parse(html: str) -> Rows:
    parser = Rows()
    parser.feed(html)
    return parser


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    from support.scores import fake_sha

    state = build_report_state(tmp_path_factory.mktemp("status"))
    state.current = {lineage: fake_sha(label) for lineage, label in CURRENT.items()}
    yield state
    state.store.close()


def expected_from_database(store, current: dict[str, str]) -> dict[str, dict]:
    """Straight from the predictions table: the newest prediction of each lineage's current
    checkpoint."""
    out = {}
    for lineage, sha in current.items():
        (row,) = store.query("SELECT state, p_hat, threshold, lstar FROM predictions WHERE lineage = ? AND "
                             "commit_sha = ? ORDER BY evaluated_at DESC, id DESC LIMIT 1", [lineage, sha])
        out[lineage] = row
    return out


def test_each_row_shows_the_current_checkpoint_state_the_database_holds(world) -> None:
    daemon = StatusDaemon(world.store, [world.policy], world.folder)
    data = gather(daemon, now=world.now)
    expected = expected_from_database(world.store, world.current)
    assert data["database_error"] is None and data["rows_total"] == 3
    shown = {r["lineage"]: r for r in data["rows"]}
    assert {k: (r["commit"], r["state"]) for k, r in shown.items()} == \
        {k: (world.current[k], v["state"]) for k, v in expected.items()}
    # the newest-scored checkpoints say otherwise: the page is not reading those
    newest_scored = {r["lineage"]: r["state"] for r in world.store.query(
        "SELECT lineage, arg_max(state, (evaluated_at, id)) AS state FROM predictions GROUP BY lineage")}
    assert newest_scored != {k: v["state"] for k, v in expected.items()}
    for lineage, row in shown.items():
        assert row["distance"] == pytest.approx(expected[lineage]["p_hat"] - expected[lineage]["threshold"], abs=1e-12)
    # sorted by |P̂ − level|, closest first
    distances = [abs(r["distance"]) for r in data["rows"]]
    assert distances == sorted(distances)
    # the L* trend: the lineage's checkpoints in step order (L* read from score_runs)
    pythia = sorted(world.store.query("SELECT lstar FROM score_runs WHERE model_repo = 'org/pythia-tiny'"),
                    key=lambda r: -r["lstar"])   # this fixture's L* falls with the step
    assert shown["org/pythia-tiny"]["spark"]["first_value"] == pythia[0]["lstar"]
    assert shown["org/pythia-tiny"]["spark"]["last_value"] == pythia[-1]["lstar"]
    html = render(data).decode()
    page = parse(html)
    assert {r["attrs"]["data-lineage"]: r["attrs"]["data-state"] for r in page.rows} == \
        {k: v["state"] for k, v in expected.items()}
    assert "<td id=\"last-poll\">2025-03-01 18:55 UTC</td>" in html   # LAST_POLL, as the report prints times
    (outbox,) = world.store.query("SELECT count(*) AS n FROM deliveries WHERE status = 'pending'")
    assert f"deliveries pending {outbox['n']} ·" in html


def test_the_page_is_bounded_and_counts_the_rest(world) -> None:
    daemon = StatusDaemon(world.store, [world.policy], world.folder)
    (count,) = world.store.query("SELECT count(DISTINCT (task, lineage, commit_sha)) AS n FROM predictions "
                                 "WHERE state != 'not_evaluated'")
    data = gather(daemon, now=world.now, max_rows=2)
    assert data["candidates_read"] == data["candidates_total"] == count["n"] == 10
    assert len(data["rows"]) == 2 and data["rows_total"] == 3
    assert "1 more lineage × task rows, further from their level, not shown" in render(data).decode()
    data = gather(daemon, now=world.now, max_candidates=4)
    assert data["candidates_read"] == 4 and data["candidates_total"] == 10
    assert "Read the 4 most recently evaluated of 10 checkpoint predictions" in render(data).decode()


def test_a_sparkline_draws_lower_lstar_higher() -> None:
    spark = sparkline([3.0, 2.0, 1.0], width=100, height=20)
    points = [tuple(map(float, p.split(","))) for p in spark["points"].split()]
    assert [x for x, _ in points] == [3.0, 50.0, 97.0]
    assert [y for _, y in points] == [17.0, 10.0, 3.0]   # SVG y grows downward: L* 1.0 is drawn highest
    assert sparkline([]) is None and sparkline([1.5])["n"] == 1


HOSTILE_REPO = "org/<script>alert(1)</script>\u202egnp.exe"
HOSTILE_LINEAGE = 'lin"><img src=x onerror=alert(2)>\x1b[31m'
HOSTILE_TASK = "<svg onload=alert(3)>&amp;"
HOSTILE_POLICY = "pol</td><b>bold</b>"


def test_hostile_repo_task_and_policy_names_are_escaped(tmp_path) -> None:
    from monitor.store import Store

    store = Store.open(tmp_path / "lstar.duckdb")
    store.conn.execute(
        "INSERT INTO predictions (policy, task, run_id, repo, commit_sha, lineage, corpus_sha256, lstar, se, p_hat, "
        "lo, hi, threshold, state, curve_id, detail, evaluated_at) VALUES (?, ?, 'r1', ?, ?, ?, 'c', 1.0, 0.1, 0.4, "
        "0.3, 0.5, 0.45, 'at_risk', 'k', '{}', now())",
        [HOSTILE_POLICY, HOSTILE_TASK, HOSTILE_REPO, "a" * 40, HOSTILE_LINEAGE])
    policy = SimpleNamespace(name=HOSTILE_POLICY, tasks=[SimpleNamespace(name=HOSTILE_TASK)])
    daemon = StatusDaemon(store, [policy], tmp_path, healthy=False, reasons=("<b>stuck</b> \x1b[2J",))
    from monitor.store import utcnow

    html = render(gather(daemon, now=utcnow())).decode()
    store.close()
    page = parse(html)
    assert set(page.tags) <= {"html", "head", "meta", "title", "style", "body", "h1", "h2", "p", "table", "thead",
                              "tbody", "tr", "th", "td", "span", "br", "svg", "polyline", "circle"}
    (row,) = page.rows
    assert row["attrs"]["data-lineage"] == plain_text(HOSTILE_LINEAGE)
    assert row["attrs"]["data-repo"] == plain_text(HOSTILE_REPO)
    assert row["cells"][:3] == [plain_text(HOSTILE_POLICY), plain_text(HOSTILE_TASK), plain_text(HOSTILE_LINEAGE)]
    assert row["cells"][3].startswith(plain_text(HOSTILE_REPO))
    for raw in ("<script", "<img", "<svg onload", "<b>", "\x1b", "\u202e"):
        assert raw not in html
    assert "\\u202e" in html and "&lt;b&gt;stuck&lt;/b&gt; \\x1b[2J" in html


class BlockingDaemon(StatusDaemon):
    """Its /db/info read waits for `release`: every worker can be held busy."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.release = threading.Event()

    def read_store(self):
        import contextlib

        outer = super().read_store()
        daemon = self

        @contextlib.contextmanager
        def held():
            with outer as store:
                store.info = lambda: daemon.release.wait(30) and {}
                yield store
        return held()


def test_the_page_answers_with_a_strict_csp_while_every_worker_is_busy(world) -> None:
    daemon = BlockingDaemon(world.store, [world.policy], world.folder)
    with ApiServer(daemon, port=0, token="t" * 32, workers=2, idle_timeout=5, lifetime=30) as server:
        try:
            busy = [threading.Thread(target=httpx.get, args=(f"{server.url}/db/info",), kwargs={"timeout": 30})
                    for _ in range(2)]
            for t in busy:
                t.start()
            deadline = time.monotonic() + 10
            while server.server.slots.taken < 2 and time.monotonic() < deadline:
                time.sleep(0.02)
            assert server.server.slots.taken == 2
            assert httpx.get(f"{server.url}/checkpoints", timeout=10).status_code == 503   # the workers are busy
            answers = []
            threads = [threading.Thread(target=lambda: answers.append(httpx.get(f"{server.url}/", timeout=20)))
                       for _ in range(8)]
            started = time.monotonic()
            for t in threads:
                t.start()
            for t in threads:
                t.join(30)
            elapsed = time.monotonic() - started
            assert [a.status_code for a in answers] == [200] * 8
            # shared by the concurrent requests: one render, and one more per MAX_AGE they took
            assert server.server.status_page_render.renders <= 1 + int(elapsed / MAX_AGE) < 8
            csp = answers[0].headers["content-security-policy"]
            assert csp.startswith("default-src 'none'") and f"'sha256-{CSS_HASH}'" in csp
            assert answers[0].headers["content-type"].startswith("text/html")
            assert 'data-lineage="org/pythia-tiny"' in answers[0].text
            assert httpx.get(f"{server.url}/?x=1", timeout=10).status_code == 400
        finally:
            daemon.release.set()
        for t in busy:
            t.join(30)


def netlog_requests(path: Path) -> list[tuple[str, str]]:
    """(url, network isolation key) of every request Chromium's network log saw start. The key
    names the top frame's site: the page's own requests (its sub-resources, anything its markup
    or a script would fetch) carry the page's site; the browser's own background requests
    (updates, accounts) carry another or none."""
    text = path.read_text()
    try:
        log = json.loads(text)
    except ValueError:   # a log cut short at exit lacks its closing
        log = json.loads(text.rstrip().rstrip(",") + "]}")
    start = log["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"]
    return [(e["params"]["url"], e["params"].get("network_isolation_key", ""))
            for e in log.get("events", []) if e.get("type") == start and "url" in (e.get("params") or {})]


CHROMIUM = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-default-apps",
            # the browser's own clock query to Google, not the page's: off, so what is left is the page's
            "--disable-features=NetworkTimeServiceQuerying",
            # and none of the browser's own requests reach beyond this machine either
            "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"]
needs_chromium = pytest.mark.skipif(shutil.which("chromium") is None,
                                    reason="headless Chromium missing: apt-get install -y chromium")


@needs_chromium
def test_the_network_log_catches_a_page_reaching_beyond_loopback(tmp_path) -> None:
    """The check below can fail: a page with no CSP that loads an image and a stylesheet from
    other hosts shows both among its own requests."""
    import http.server

    body = b'<html><body><img src="http://example.org/x.png"><link rel=stylesheet href="https://cdn.example.net/a.css">'

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        netlog = tmp_path / "netlog.json"
        subprocess.run([*CHROMIUM, f"--user-data-dir={tmp_path / 'profile'}", f"--log-net-log={netlog}",
                        "--net-log-capture-mode=Everything", "--dump-dom", f"http://127.0.0.1:{server.server_port}/"],
                       check=True, capture_output=True, timeout=120)
    finally:
        server.shutdown()
        server.server_close()
    from_page = {urlsplit(u).hostname for u, key in netlog_requests(netlog) if key.split(" ")[0] == "http://127.0.0.1"}
    assert {"example.org", "cdn.example.net"} <= from_page, from_page


@needs_chromium
def test_the_page_in_chromium_shows_the_database_states_and_stays_on_loopback(world, tmp_path) -> None:
    from PIL import Image
    import numpy as np

    from monitor.alerts.state_ops import add_silence_from_args

    add_silence_from_args(world.store, match=["lineage=org/neox-small"], until="2099-01-01T00:00:00+00:00",
                          comment="retraining this week", start=None, now=world.now, created_by="oncall")
    daemon = StatusDaemon(world.store, [world.policy], world.folder)
    expected = expected_from_database(world.store, world.current)
    common = CHROMIUM
    with ApiServer(daemon, port=0, token="t" * 32, workers=2, idle_timeout=5, lifetime=30) as server:
        url = f"{server.url}/"
        netlog = tmp_path / "netlog.json"
        dom = subprocess.run([*common, f"--user-data-dir={tmp_path / 'profile'}", f"--log-net-log={netlog}",
                              "--net-log-capture-mode=Everything", "--dump-dom", url],
                             check=True, capture_output=True, text=True, timeout=120).stdout
        shot = tmp_path / "status-page.png"
        subprocess.run([*common, f"--user-data-dir={tmp_path / 'profile2'}", f"--screenshot={shot}",
                        "--window-size=1400,900", url], check=True, capture_output=True, timeout=120)
    page = parse(dom)
    assert {r["attrs"]["data-lineage"]: (r["attrs"]["data-commit"], r["attrs"]["data-state"]) for r in page.rows} == \
        {k: (world.current[k], v["state"]) for k, v in expected.items()}
    assert "retraining this week" in dom
    requests = netlog_requests(netlog)
    from_page = [u for u, key in requests if key.split(" ")[0] == "http://127.0.0.1"]
    assert url in from_page   # the log saw the page itself…
    assert {(urlsplit(u).scheme, urlsplit(u).hostname, urlsplit(u).port) for u in from_page} == \
        {("http", "127.0.0.1", urlsplit(url).port)}   # …and nothing it asked for beyond the loopback API
    # The stylesheet passed the CSP (by its hash): the state badges are drawn in their colours.
    pixels = np.asarray(Image.open(shot).convert("RGB")).astype(int)
    for colour in ((253, 226, 225), (255, 241, 214)):   # .emerged and .at_risk backgrounds
        assert np.all(np.abs(pixels - np.array(colour)) <= 2, axis=2).sum() > 100, colour
    keep = ROOT / "state" / "test-artifacts"
    keep.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(shot, keep / "status-page.png")
    if os.environ.get("LSTAR_WRITE_DOC_IMAGES") == "1":   # refresh the documented screenshot
        shutil.copyfile(shot, ROOT / "docs" / "img" / "status-page.png")
