"""The daemon's local API against hostile clients: the real daemon (`lstar run`) in a
subprocess, spoken to over raw sockets where a well-behaved client library would not go.

Framing is checked before any body byte is read, the Host and Origin must name the API
(DNS rebinding), state changes need the owner-only token, `/report` takes policy names and
never paths, query parameters are validated, 500s carry no internals, a silent, trickling,
surplus or endlessly busy connection cannot hold a worker, /health and /metrics answer
while other clients hold every worker and many connections wait, and a port already in use
is one line that changes nothing."""

from __future__ import annotations

import json
import os
import select
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from monitor.demo.fakehub import FakeHub
from monitor.errors import StoreError
from monitor.service.api_guard import (RequestRefused, body_length, check_host_and_origin, create_api_token,
                                       read_api_token)
from support.cli_run import lstar_in_process
from support.daemon_harness import REPO_ROOT
from support.daemon_harness import WATCHER_POLICY as POLICY
from support.daemon_harness import DaemonProcess, wait_for

pytestmark = pytest.mark.slow

IDLE_TIMEOUT_S = 2
LIFETIME_S = 3
WORKERS = 3
MAX_REQUESTS = 100  # answers on one connection (the server's default)
SILENCE = {"match": ["policy=watcher"], "until": "2h", "comment": "api test", "now": "2030-01-01T00:00:00Z"}
INTERNALS = ("Traceback", "Error:", "SELECT", "LIMIT", "duckdb", "Exception", "File \"")


def lstar(*args: str) -> subprocess.CompletedProcess[str]:
    """A client command, run in this process (`support.cli_run`): what it prints and returns is
    what is checked, and the daemon it asks is another process either way."""
    return lstar_in_process(*args)


def lstar_process(*args: str) -> subprocess.CompletedProcess[str]:
    """`lstar run` in a process of its own, as a user starts it."""
    return subprocess.run([sys.executable, "-m", "monitor.cli", *args], capture_output=True, text=True,
                          cwd=REPO_ROOT, timeout=120)


@pytest.fixture(scope="module")
def hub():
    with FakeHub() as server:  # empty: nothing to fetch or score, the daemon stays light
        yield server


def start_daemon(tmp: Path, hub: FakeHub, **kwargs) -> DaemonProcess:
    (tmp / "policies").mkdir(parents=True, exist_ok=True)
    (tmp / "policies" / "watcher.yaml").write_text(POLICY)
    return DaemonProcess(tmp / "policies", tmp / "state", endpoint=hub.url,
                         args=["--poll-every", "1h", "--score-every", "1h", "--cache-dir", str(tmp / "cache"),
                               "--api-idle-timeout", f"{IDLE_TIMEOUT_S}s", "--api-workers", str(WORKERS),
                               "--api-connection-lifetime", f"{LIFETIME_S}s"],
                         **kwargs)


@pytest.fixture(scope="module")
def daemon(hub, tmp_path_factory):
    process = start_daemon(tmp_path_factory.mktemp("daemon-api"), hub,
                           env={"LSTAR_HUB_WEBHOOK_SECRET": "hook-secret"})
    with process:
        yield process


def port(daemon: DaemonProcess) -> int:
    assert daemon.url is not None
    return int(daemon.url.rsplit(":", 1)[1])


def raw_request(daemon: DaemonProcess, head: str, body: bytes = b"", *,
                half_close: bool = False) -> tuple[int, bytes]:
    """(status, body) of one request written byte for byte (then our side closed, if asked)."""
    with socket.create_connection(("127.0.0.1", port(daemon)), timeout=30) as sock:
        sock.sendall(head.encode("latin-1") + body)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        return parse_answer(read_answer(sock))


def read_answer(sock: socket.socket) -> bytes:
    """What the server sends until it closes the connection or one answer is complete."""
    data = b""
    try:
        while True:
            chunk = sock.recv(1 << 16)
            if not chunk:
                return data
            data += chunk
            head, sep, rest = data.partition(b"\r\n\r\n")
            if sep:
                length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), None)
                if length is not None and len(rest) >= length:
                    return data
    except ConnectionResetError:
        return data


def read_until_close(sock: socket.socket) -> bytes:
    data = b""
    try:
        while chunk := sock.recv(1 << 16):
            data += chunk
    except ConnectionResetError:
        pass
    return data


def parse_answer(data: bytes) -> tuple[int, bytes]:
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1."), f"no HTTP answer: {data[:200]!r}"
    return int(head.split()[1]), body


def silences(daemon: DaemonProcess) -> list[dict]:
    return daemon.get_json("/silences?all=1&now=2030-01-01T00:00:00Z")["items"]


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


# -- framing -------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", ["/silences", "/hooks/hub"])
def test_a_negative_content_length_with_a_600_mb_body_is_refused_before_reading(daemon, path):
    # -1 is the dangerous one: a stream's read(-1) reads until the client closes.
    total = 600 << 20
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {daemon.api_token()}",
               "X-Webhook-Secret": "hook-secret"}
    head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port(daemon)}\r\n"
            + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "Content-Length: -1\r\n\r\n")
    raw_request(daemon, head, half_close=True)  # warm-up: the code paths are imported
    pid = daemon.proc.pid
    before = rss_bytes(pid)

    def body() -> Iterator[bytes]:
        chunk = b"x" * (1 << 16)
        for _ in range(total // len(chunk)):
            yield chunk

    answer = b""
    with socket.create_connection(("127.0.0.1", port(daemon)), timeout=30) as sock:
        sock.sendall(head.encode())
        for i, chunk in enumerate(body()):
            if select.select([sock], [], [], 0)[0]:
                break  # the server answered or closed: stop sending
            try:
                sock.sendall(chunk)
            except OSError:
                break
            if i % 32 == 0:
                grown = rss_bytes(pid) - before
                assert grown < 64 << 20, f"the daemon's RSS grew by {grown >> 20} MiB while the body streamed"
        answer = read_answer(sock)
    status, text = parse_answer(answer)
    assert status == 400
    assert json.loads(text)["error"] == "Content-Length '-1' is not a byte count"
    assert rss_bytes(pid) - before < 64 << 20
    assert daemon.request("/health")[0] == 200  # and the daemon serves on


@pytest.mark.parametrize("value", ["-629145600", "abc", "1e3", "+12", "0x10", "12, 12", "\u00b2"])
@pytest.mark.parametrize("path", ["/silences", "/hooks/hub"])
def test_a_malformed_content_length_is_400_and_ends_the_connection(daemon, path, value):
    head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port(daemon)}\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {daemon.api_token()}\r\nX-Webhook-Secret: hook-secret\r\n"
            f"Content-Length: {value}\r\n\r\n")
    # What follows is unframed: it must never be taken for a second request.
    smuggled = f"GET /health HTTP/1.1\r\nHost: 127.0.0.1:{port(daemon)}\r\n\r\n"
    with socket.create_connection(("127.0.0.1", port(daemon)), timeout=30) as sock:
        sock.sendall((head + smuggled).encode("latin-1"))
        data = read_until_close(sock)
    assert data.count(b"HTTP/1.1 ") == 1, data
    status, body = parse_answer(data)
    assert status == 400
    assert json.loads(body)["error"] == f"Content-Length {value!r} is not a byte count"


def test_the_webhook_secret_is_checked_before_the_body_is_read(daemon):
    # A wrong secret with a body that never comes: answered at once, not after a read.
    head = (f"POST /hooks/hub HTTP/1.1\r\nHost: 127.0.0.1:{port(daemon)}\r\nX-Webhook-Secret: wrong\r\n"
            f"Content-Length: 1000000\r\n\r\n")
    with socket.create_connection(("127.0.0.1", port(daemon)), timeout=30) as sock:
        sock.sendall(head.encode())
        assert select.select([sock], [], [], 10)[0], "no answer while the body was still to come"
        status, body = parse_answer(read_answer(sock))
    assert (status, json.loads(body)["error"]) == (403, "wrong X-Webhook-Secret")


# -- Host, Origin and the token ------------------------------------------------------------------
def test_foreign_host_and_origin_are_refused_on_every_endpoint(daemon):
    p = port(daemon)
    count = len(silences(daemon))
    for headers in ({"Host": f"evil.example:{p}"}, {"Host": f"127.0.0.1:{p + 1}"}, {"Host": "127.0.0.1"},
                    {"Host": f"localhost.:{p}"}, {"Origin": f"http://evil.example:{p}"}, {"Origin": "null"},
                    {"Origin": f"https://127.0.0.1:{p}"}):
        status, body = daemon.post_json("/silences", SILENCE, headers=headers)
        assert status == 403, (headers, body)
        assert json.loads(body)["hint"] == f"address the API as http://127.0.0.1:{p} (or localhost)"
        assert daemon.request("/status", headers=headers)[0] == 403
        assert daemon.request("/hooks/hub", method="POST", body=b"{}",
                              headers={"X-Webhook-Secret": "hook-secret", **headers})[0] == 403
    assert len(silences(daemon)) == count  # nothing was written

    for headers in ({"Host": f"localhost:{p}"}, {"Host": f"[::1]:{p}"}, {"Origin": f"http://localhost:{p}"},
                    {"Origin": f"http://127.0.0.1:{p}"}):
        assert daemon.request("/status", headers=headers)[0] == 200
    assert daemon.post_json("/silences", SILENCE, headers={"Origin": f"http://127.0.0.1:{p}"})[0] == 200
    assert len(silences(daemon)) == count + 1


def test_state_changes_need_the_token_from_the_owner_only_file(daemon):
    token_file = daemon.state_dir / "api.token"
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    token = daemon.api_token()
    assert len(token) >= 40 and token == read_api_token(daemon.state_dir)

    count = len(silences(daemon))
    status, body = daemon.request("/silences", method="POST", body=json.dumps(SILENCE).encode(),
                                  headers={"Content-Type": "application/json"})
    assert status == 401
    assert json.loads(body)["error"] == "this request changes state and needs the API token"
    assert daemon.post_json("/silences", SILENCE, token=token[:-1] + ("A" if token[-1] != "A" else "B"))[0] == 403
    assert daemon.post_json("/silences", SILENCE, token="")[0] == 401
    for path in ("/silences/anything/expire", "/alerts/1/retry"):
        assert daemon.request(path, method="POST", body=b"{}",
                              headers={"Content-Type": "application/json"})[0] == 401
    assert len(silences(daemon)) == count

    status, body = daemon.post_json("/silences", SILENCE)
    assert status == 200
    silence_id = json.loads(body)["id"]
    assert daemon.post_json(f"/silences/{silence_id}/expire", {"now": "2030-01-01T00:30:00Z"})[0] == 200


def test_the_cli_sends_the_token_and_names_the_file_when_it_is_refused(daemon):
    db = str(daemon.state_dir / "lstar.duckdb")
    added = lstar("silence", "add", "--match", "policy=cli", "--until", "1h", "--comment", "via cli",
                  "--now", "2030-01-01T00:00:00Z", "--db", db, "--json")
    assert added.returncode == 0, added.stderr
    assert json.loads(added.stdout)["matchers"] == ['policy="cli"']

    token_file = daemon.state_dir / "api.token"
    good = token_file.read_text()
    try:
        token_file.write_text("not-the-token\n")
        refused = lstar("silence", "expire", json.loads(added.stdout)["id"], "--db", db)
        assert refused.returncode == 3
        assert refused.stderr == (
            f"error: the running daemon answered 403 to POST /silences/{json.loads(added.stdout)['id']}/expire: "
            f"wrong API token; send `Authorization: Bearer TOKEN` with the token in {token_file} "
            "(the daemon writes a new one at each start)\n")
        token_file.unlink()
        missing = lstar("silence", "expire", json.loads(added.stdout)["id"], "--db", db)
        assert (missing.returncode, missing.stderr) == (
            3, f"error: cannot read the daemon's API token {token_file}: No such file or directory; "
               "`lstar run` writes it at start; restart the daemon if it is missing\n")
    finally:
        token_file.write_text(good)
        token_file.chmod(0o600)


def test_the_token_file_is_created_owner_only_whatever_the_umask(tmp_path):
    old = os.umask(0)
    try:
        first = create_api_token(tmp_path)
        second = create_api_token(tmp_path)
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "api.token").stat().st_mode) == 0o600
    assert first != second and read_api_token(tmp_path) == second
    assert [p.name for p in tmp_path.iterdir()] == ["api.token"]  # no temporary file left behind
    (tmp_path / "api.token").write_text("")
    with pytest.raises(StoreError, match="api.token is empty or malformed"):
        read_api_token(tmp_path)


@pytest.mark.parametrize(("hosts", "origins", "ok"), [
    (["127.0.0.1:8787"], None, True), (["LOCALHOST:8787"], None, True), (["[::1]:8787"], None, True),
    (["127.0.0.1:8787"], ["http://localhost:8787"], True),
    (None, None, False), (["127.0.0.1:8787", "127.0.0.1:8787"], None, False), (["127.0.0.1:08787x"], None, False),
    (["127.0.0.2:8787"], None, False), (["127.0.0.1.nip.io:8787"], None, False), (["[::1]8787"], None, False),
    (["127.0.0.1:8787"], ["http://127.0.0.1:8787/x"], False),
    (["127.0.0.1:8787"], ["http://user@127.0.0.1:8787"], False),
])
def test_host_and_origin_rules(hosts, origins, ok):
    if ok:
        check_host_and_origin(hosts, origins, 8787)
    else:
        with pytest.raises(RequestRefused) as refused:
            check_host_and_origin(hosts, origins, 8787)
        assert refused.value.status == 403


def test_framing_rules():
    assert body_length(None, None, limit=10) == 0
    assert body_length(["10", " 10"], None, limit=10) == 10
    for lengths, encodings, status in ((["-1"], None, 400), (["5", "6"], None, 400), (["11"], None, 413),
                                       (["9" * 19], None, 400), (None, ["chunked"], 411)):
        with pytest.raises(RequestRefused) as refused:
            body_length(lengths, encodings, limit=10)
        assert refused.value.status == status


# -- what the endpoints accept -------------------------------------------------------------------
def test_report_names_a_loaded_policy_never_a_path(daemon, tmp_path):
    elsewhere = tmp_path / "elsewhere.yaml"
    elsewhere.write_text(POLICY.replace("name: watcher", "name: elsewhere"))
    for value in ("/dev/zero", str(elsewhere), str(daemon.policies_dir / "watcher.yaml"), "../watcher.yaml"):
        status, body = daemon.request(f"/report?policy={value}")
        answer = json.loads(body)
        assert (status, answer["error"]) == (400, f"policy={value!r} is not a policy name"), value
        assert answer["hint"].endswith("not a path")

    status, body = daemon.request("/report?policy=elsewhere")
    assert status == 400
    assert json.loads(body) == {"error": "the running daemon has no policy 'elsewhere' loaded",
                                "hint": f"loaded: watcher; put its file in {daemon.policies_dir} "
                                        "(read within the reload interval)",
                                "kind": "PolicyError"}
    for name in ("watcher", "watcher.yaml"):
        status, body = daemon.request(f"/report?policy={name}")
        assert status == 200
        assert [r["policy"] for r in json.loads(body)] == ["watcher"]


def test_the_cli_report_names_the_policy_and_says_when_the_daemon_lacks_it(daemon, tmp_path):
    db = str(daemon.state_dir / "lstar.duckdb")
    served = lstar("report", "--policy", str(daemon.policies_dir / "watcher.yaml"), "--db", db, "--json")
    assert served.returncode == 0, served.stderr
    assert json.loads(served.stdout)["policy"] == "watcher"

    elsewhere = tmp_path / "elsewhere.yaml"
    elsewhere.write_text(POLICY.replace("name: watcher", "name: elsewhere"))
    refused = lstar("report", "--policy", str(elsewhere), "--db", db, "--json")
    assert (refused.returncode, refused.stdout) == (2, "")
    assert refused.stderr == ("error: the running daemon has no policy 'elsewhere' loaded; loaded: watcher; "
                              f"put its file in {daemon.policies_dir} (read within the reload interval)\n")


@pytest.mark.parametrize(("path", "message"), [
    ("/checkpoints?limit=-1", "limit must be a whole number from 1 to 1000, got '-1'"),
    ("/checkpoints?limit=abc", "limit must be a whole number from 1 to 1000, got 'abc'"),
    ("/checkpoints?limit=99999999999999999999", "limit must be a whole number from 1 to 1000, "
                                                 "got '99999999999999999999'"),
    ("/alerts?limit=0", "limit must be a whole number from 1 to 1000, got '0'"),
    ("/alerts?limit=1&limit=2", "query parameter 'limit' given 2 times"),
    ("/status?verbose=1", "unknown query parameter 'verbose' for /status"),
    ("/report/latest?format=txt", "format must be one of html, md, json, png, got 'txt'"),
    ("/silences?all=yes", "all must be one of 0, 1, got 'yes'"),
    ("/silences?now=tomorrow", "'tomorrow' is not an ISO 8601 time"),
])
def test_bad_query_parameters_are_400_with_a_clear_message(daemon, path, message):
    status, body = daemon.request(path)
    assert status == 400
    assert json.loads(body)["error"] == message
    assert not any(marker in body.decode() for marker in INTERNALS)


def test_a_silence_beyond_the_calendar_is_400_not_500(daemon):
    status, body = daemon.post_json("/silences", {**SILENCE, "until": "99999999999y"})
    assert status == 400
    assert json.loads(body)["error"] == "--until '99999999999y': is longer than 100 years; write a shorter duration"
    status, body = daemon.post_json("/silences", {**SILENCE, "until": "60d", "start": "9999-12-01T00:00:00Z"})
    assert status == 400
    assert "reaches beyond the year 9999" in json.loads(body)["error"]


def test_a_500_is_logged_and_answered_without_internals(hub, tmp_path):
    # Every write of this daemon fails with ENOSPC (the disk-full fail point).
    with start_daemon(tmp_path, hub, env={"LSTAR_FAILPOINT": "enospc_writes"}) as failing:
        status, body = failing.post_json("/silences", SILENCE)
        assert status == 500
        assert json.loads(body) == {"error": "internal error; the daemon's log has the details"}
        log = wait_for(lambda: "API POST /silences failed" in failing.log() and failing.log(), timeout=10,
                       what="the logged failure")
        assert "No space left on device" in log and "Traceback" in log


# -- connections ---------------------------------------------------------------------------------
def closed_by_server(sock: socket.socket, *, trickle: bytes = b"", within: float = 30) -> bool:
    """Whether the server closes `sock` within `within` s while we send `trickle` a byte at a
    time, 0.2 s apart (nothing when empty)."""
    deadline = time.monotonic() + within
    sent = 0
    while time.monotonic() < deadline:
        if select.select([sock], [], [], 0.2)[0]:
            try:
                return sock.recv(1 << 16) == b""
            except ConnectionResetError:
                return True
        if trickle:
            try:
                sock.sendall(trickle[sent % len(trickle):][:1])
            except OSError:
                return True
            sent += 1
    return False


def test_an_idle_connection_is_closed_after_the_timeout(daemon):
    with socket.create_connection(("127.0.0.1", port(daemon)), timeout=30) as sock:
        assert closed_by_server(sock)


def test_a_trickling_client_cannot_hold_a_worker(daemon):
    # One header byte every 0.2 s never lets a single read wait long: only a deadline ends it.
    with socket.create_connection(("127.0.0.1", port(daemon)), timeout=30) as sock:
        sock.sendall(f"GET /health HTTP/1.1\r\nHost: 127.0.0.1:{port(daemon)}\r\n".encode())
        assert closed_by_server(sock, trickle=b"X-Slow: " + b"z" * 1000)


def hold_every_worker(daemon: DaemonProcess) -> list[socket.socket]:
    """WORKERS requests being served: Hub webhooks with the right secret whose bodies never
    come, each holding its handler slot until the request deadline (IDLE_TIMEOUT_S)."""
    head = (f"POST /hooks/hub HTTP/1.1\r\nHost: 127.0.0.1:{port(daemon)}\r\nX-Webhook-Secret: hook-secret\r\n"
            "Content-Length: 10\r\n\r\n").encode()
    holders = [socket.create_connection(("127.0.0.1", port(daemon)), timeout=30) for _ in range(WORKERS)]
    for sock in holders:
        sock.sendall(head)
    time.sleep(0.2)   # every head is dispatched
    return holders


def test_a_saturated_pool_answers_503_and_recovers(daemon):
    holders = hold_every_worker(daemon)
    try:
        status, body = get(daemon, "/status")
        assert status == 503
        assert json.loads(body)["error"] == f"the API is busy ({WORKERS} requests in progress)"
    finally:
        for sock in holders:
            sock.close()
    wait_for(lambda: daemon.request("/status")[0] == 200, timeout=30, what="a free worker again")


# -- the reserved lane and the connection's lifetime ---------------------------------------------
def get(daemon: DaemonProcess, path: str, *, method: str = "GET", host: str | None = None) -> tuple[int, bytes]:
    host = host or f"127.0.0.1:{port(daemon)}"
    return raw_request(daemon, f"{method} {path} HTTP/1.1\r\nHost: {host}\r\n\r\n")


def timed_get(daemon: DaemonProcess, path: str) -> tuple[int, float]:
    """(status, seconds from connect to the whole answer) of one GET on a fresh connection."""
    start = time.monotonic()
    status, _ = get(daemon, path)
    return status, time.monotonic() - start


class Hogs:
    """Clients that try to keep every worker: `idle` ones that send nothing, `drip` ones that
    send a request head a byte at a time, `keepalive` ones that send a whole request every
    0.5 s on one connection (each restarts the per-request deadline). Each reconnects when the
    server closes it, until stopped or `limit_s` is over."""

    def __init__(self, daemon: DaemonProcess, kinds: list[str], *, limit_s: float = 30) -> None:
        self.port = port(daemon)
        self.until = time.monotonic() + limit_s
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._hold, args=(kind,), daemon=True) for kind in kinds]

    def __enter__(self) -> "Hogs":
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=10)

    def running(self) -> bool:
        return not self.stop.is_set() and time.monotonic() < self.until

    def _hold(self, kind: str) -> None:
        for _ in range(1000):
            if not self.running():
                return
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=10) as sock:
                    getattr(self, f"_{kind}")(sock)
            except OSError:
                pass
            self.stop.wait(0.1)

    def _wait_close(self, sock: socket.socket, drip: bytes = b"") -> None:
        while self.running():
            if select.select([sock], [], [], 0.2)[0]:
                read_answer(sock)
                return
            if drip:
                sock.sendall(drip)

    def _idle(self, sock: socket.socket) -> None:
        self._wait_close(sock)

    def _drip(self, sock: socket.socket) -> None:
        sock.sendall(f"GET /status HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\nX-Slow: ".encode())
        self._wait_close(sock, drip=b"z")

    def _keepalive(self, sock: socket.socket) -> None:
        request = f"GET /status HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\n\r\n".encode()
        while self.running():
            sock.sendall(request)
            answer = read_answer(sock)
            if not answer or answer.startswith(b"HTTP/1.1 503 "):
                return
            self.stop.wait(0.5)


def test_health_and_metrics_answer_within_a_second_while_other_clients_hold_every_worker(daemon):
    # Keep-alive clients on every worker, and more idle and dripping connections (each opened
    # again when closed) than the old design's slots and reserved lane held together (3 + 64).
    kinds = ["keepalive"] * 3 + ["drip"] * 40 + ["idle"] * 40
    answers = []
    with Hogs(daemon, kinds):
        time.sleep(1.0)  # every connection is open
        end = time.monotonic() + LIFETIME_S + IDLE_TIMEOUT_S + 3  # past every deadline they restart
        for i in range(60):
            if time.monotonic() > end:
                break
            path = ("/health", "/metrics")[i % 2]
            answers.append((path, *timed_get(daemon, path)))
            time.sleep(0.2)
    late = [(path, status, round(seconds, 2)) for path, status, seconds in answers
            if status != 200 or seconds >= 1.0]
    assert len(answers) >= 10 and late == [], late


def test_health_and_metrics_hold_no_worker_and_pass_the_same_checks(daemon):
    holders = hold_every_worker(daemon)
    try:
        status, body = get(daemon, "/status")
        assert (status, json.loads(body)["error"]) == (503, f"the API is busy ({WORKERS} requests in progress)")
        assert get(daemon, "/health", method="POST")[0] == 503   # not a reserved request: it needs a worker
        status, body = get(daemon, "/health")
        assert (status, json.loads(body)) == (200, {"ok": True, "reasons": []})
        status, body = get(daemon, "/metrics")
        assert status == 200 and b"# TYPE " in body
        assert get(daemon, "/metrics", method="HEAD") == (200, b"")
        assert get(daemon, "/health", host=f"evil.example:{port(daemon)}")[0] == 403
        status, body = get(daemon, "/health?verbose=1")
        assert (status, json.loads(body)["error"]) == (400, "unknown query parameter 'verbose' for /health")
    finally:
        for sock in holders:
            sock.close()
    wait_for(lambda: daemon.request("/status")[0] == 200, timeout=30, what="a free worker again")


def test_a_connection_that_keeps_sending_requests_is_closed_after_its_lifetime(daemon):
    request = f"GET /health HTTP/1.1\r\nHost: 127.0.0.1:{port(daemon)}\r\n\r\n".encode()
    statuses = []
    with socket.create_connection(("127.0.0.1", port(daemon)), timeout=30) as sock:
        start = time.monotonic()
        closed_after = None
        for _ in range(60):  # 30 s at most, ten times the lifetime
            try:
                sock.sendall(request)
                answer = read_answer(sock)
            except OSError:
                answer = b""
            if not answer:
                closed_after = time.monotonic() - start
                break
            statuses.append(parse_answer(answer)[0])
            time.sleep(0.5)  # inside the idle timeout: each request restarts it
    assert closed_after is not None, f"still open after {len(statuses)} answers"
    assert closed_after < LIFETIME_S + IDLE_TIMEOUT_S
    assert len(statuses) >= 2 and set(statuses) == {200}


def test_a_connection_closes_after_its_last_allowed_answer(daemon):
    request = f"GET /health HTTP/1.1\r\nHost: 127.0.0.1:{port(daemon)}\r\n\r\n".encode()
    with socket.create_connection(("127.0.0.1", port(daemon)), timeout=30) as sock:
        sock.sendall(request * MAX_REQUESTS)  # pipelined: all of them are read, none left unread
        data = read_until_close(sock)
    answers = data.split(b"HTTP/1.1 ")[1:]
    assert len(answers) == MAX_REQUESTS
    assert [b"Connection: close" in a for a in answers] == [False] * (MAX_REQUESTS - 1) + [True]


# -- start-up --------------------------------------------------------------------------------------
def state_files(state: Path) -> dict[str, tuple[bytes, int]]:
    return {p.relative_to(state).as_posix(): (p.read_bytes(), p.stat().st_mode)
            for p in sorted(state.rglob("*")) if p.is_file()}


def _an_earlier_state(tmp_path: Path) -> Path:
    """A policies folder and a state folder holding an earlier start's token (which a client
    may still be using); returns the state folder."""
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "watcher.yaml").write_text(POLICY)
    state = tmp_path / "state"
    state.mkdir()
    create_api_token(state)
    return state


def _run_on_a_taken_port(tmp_path: Path, state: Path) -> tuple[subprocess.CompletedProcess, int]:
    """`lstar run --once` on a port another socket is listening on; (its result, the port)."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        result = lstar_process("run", "--policies", str(tmp_path / "policies"), "--state", str(state),
                       "--api-port", str(taken), "--once")
    return result, taken


def test_a_port_in_use_is_one_line_and_changes_nothing(tmp_path):
    state = _an_earlier_state(tmp_path)
    (state / "lstar.lock").write_text("12345\n")
    before = state_files(state)
    result, taken = _run_on_a_taken_port(tmp_path, state)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.splitlines() == [f"error: port {taken} on 127.0.0.1 is already in use (Address already "
                                          "in use); choose another with --api-port or stop the process holding it"]
    assert state_files(state) == before   # the token byte for byte, no database, no daemon.json


def test_a_second_daemon_on_the_same_state_and_port_is_told_the_first_runs(tmp_path):
    """The port is taken by this state's own daemon: "choose another --api-port" would only
    lead to the lock's refusal. Nothing is written (the lock is only looked at)."""
    import fcntl

    state = _an_earlier_state(tmp_path)
    lock = os.open(state / "lstar.lock", os.O_RDWR | os.O_CREAT, 0o644)
    os.write(lock, b"4242\n")
    fcntl.flock(lock, fcntl.LOCK_EX)   # as the first daemon holds it
    before = state_files(state)
    try:
        result, taken = _run_on_a_taken_port(tmp_path, state)
    finally:
        os.close(lock)
    assert result.returncode == 3 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.splitlines() == [f"error: another daemon (pid 4242) holds {state / 'lstar.lock'} (and port "
                                          f"{taken} is taken); it is running already; stop it first, or give this "
                                          "one another --state directory and --api-port"]
    assert state_files(state) == before
