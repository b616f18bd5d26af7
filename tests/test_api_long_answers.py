"""An answer the server is still producing is never cut by the connection's lifetime (issue 39:
a week's report at 10^4 checkpoints was cut mid-body at the 60-second lifetime), while a client
that stops reading is still dropped."""

from __future__ import annotations

import contextlib
import json
import socket
import time
from types import SimpleNamespace

import httpx
import pytest

import monitor.service.api as api_module
from monitor.service.api import ApiServer
from test_api_server import StandIn, port_of, request_bytes

LIFETIME = 1.0
IDLE = 1.0


class ReportingStandIn(StandIn):
    """A daemon with one loaded policy, `p`, and a store the report seam never touches."""

    def policies(self) -> list:
        return [SimpleNamespace(name="p", path=None)]

    @contextlib.contextmanager
    def read_store(self):
        yield None


@pytest.fixture()
def server(tmp_path):
    with ApiServer(ReportingStandIn(tmp_path), port=0, token="t" * 32, workers=2, idle_timeout=IDLE,
                   lifetime=LIFETIME) as running:
        yield running


def slow_chunks(n: int, pause: float, size: int = 1000):
    """A JSON list of `n` strings of `size` characters, a chunk every `pause` seconds."""
    def iter_json(reports):
        yield "["
        for i in range(n):
            time.sleep(pause)
            yield ("," if i else "") + json.dumps(f"{i:06d}" + "x" * (size - 6))
        yield "]"
    return iter_json


def test_a_report_streamed_for_longer_than_the_lifetime_arrives_whole(server, monkeypatch):
    # 12 chunks 0.3 s apart: 3.6 s of writing, past the lifetime and two reader checks after it
    monkeypatch.setattr(api_module, "report_for_cli", lambda store, policy, now: {"policy": policy.name})
    monkeypatch.setattr(api_module, "iter_json", slow_chunks(12, 0.3))
    start = time.monotonic()
    response = httpx.get(f"{server.url}/report?policy=p", timeout=30)
    took = time.monotonic() - start
    assert response.status_code == 200
    body = response.json()
    assert [item[:6] for item in body] == [f"{i:06d}" for i in range(12)] and all(len(s) == 1000 for s in body)
    assert took > LIFETIME + 2 * IDLE   # it did outlive the lifetime and the reader checks


def test_a_report_computed_for_longer_than_the_lifetime_is_answered_whole(server, monkeypatch):
    def slow_report(store, policy, now):
        time.sleep(LIFETIME + 2.5 * IDLE)   # nothing written meanwhile: the client has nothing to read
        return {"policy": policy.name, "rows": list(range(2000))}

    monkeypatch.setattr(api_module, "report_for_cli", slow_report)
    response = httpx.get(f"{server.url}/report?policy=p", timeout=30)
    assert response.status_code == 200
    assert response.json() == [{"policy": "p", "rows": list(range(2000))}]


def test_a_client_that_stops_reading_a_long_answer_is_dropped_after_the_lifetime(server, monkeypatch):
    # 4 MB as fast as the socket takes it, to a client that reads nothing
    monkeypatch.setattr(api_module, "report_for_cli", lambda store, policy, now: {})
    monkeypatch.setattr(api_module, "iter_json", slow_chunks(64, 0.0, size=64 << 10))
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    try:
        sock.connect(("127.0.0.1", port_of(server)))
        sock.sendall(request_bytes(server, "/report?policy=p", close=False))
        time.sleep(0.5)
        assert len(server.limits.open) == 1   # being answered, the answer unread
        deadline = time.monotonic() + LIFETIME + 2 * IDLE + 3
        while server.limits.open and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(server.limits.open) == 0
    finally:
        sock.close()


def test_an_idle_connection_is_still_closed_at_the_request_deadline(server):
    with socket.create_connection(("127.0.0.1", port_of(server)), timeout=10) as sock:
        start = time.monotonic()
        assert sock.recv(1024) == b""   # closed by the server, nothing sent
        assert time.monotonic() - start < IDLE + 2
