"""`/report` is a streamed answer: a client that asks for it and then stops reading (or reads a
byte now and then) must not hold its connection, its handler slot or the report's memory
beyond the API's deadline for an unread answer (`idle_timeout`), as a whole answer does not
(test_api_hostile's unread-answer test); nor may it hold the store at all (the report is
computed, and the store released, before the first byte is sent)."""

from __future__ import annotations

import contextlib
import gc
import socket
import threading
import time
from types import SimpleNamespace

import pytest

import monitor.service.api as api_module
from monitor.service.api import ApiServer
from test_api_server import StandIn, port_of, request_bytes

ROWS = 20_000           # a report of ~20 MB: far beyond the socket buffers and uvicorn's write buffer
LIFETIME = 30.0         # the connection's lifetime: the stall must be dropped long before it


class ReportStandIn(StandIn):
    """A daemon with one loaded policy `p` whose store says whether it is open."""

    def __init__(self, tmp) -> None:
        super().__init__(tmp)
        self.store_open = 0

    def policies(self) -> list:
        return [SimpleNamespace(name="p", path=None)]

    @contextlib.contextmanager
    def read_store(self):
        self.store_open += 1
        try:
            yield object()
        finally:
            self.store_open -= 1


@pytest.fixture()
def big_report(monkeypatch):
    """The report the API streams, and an event set once its encoding generator is let go
    (finished or closed: the report's memory is no longer held by the answer)."""
    released = threading.Event()
    monkeypatch.setattr(api_module, "report_for_cli",
                        lambda store, policy, now: {"rows": [{"text": "x" * 1000, "i": i} for i in range(ROWS)]})
    real = api_module.iter_json

    def tracked(value):
        try:
            yield from real(value)
        finally:
            released.set()

    monkeypatch.setattr(api_module, "iter_json", tracked)
    return released


@pytest.mark.parametrize("reader", ["never reads", "reads a byte at a time"])
def test_a_client_that_stops_reading_a_streamed_report_is_dropped_at_the_deadline(tmp_path, big_report, reader):
    idle_timeout = 1.0
    daemon = ReportStandIn(tmp_path)
    with ApiServer(daemon, port=0, token="t" * 32, workers=2, idle_timeout=idle_timeout,
                   lifetime=LIFETIME) as server:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", port_of(server)))
        try:
            sock.sendall(request_bytes(server, "/report?policy=p", close=False))
            head = sock.recv(256)
            assert head.startswith(b"HTTP/1.1 200 "), head
            start = time.monotonic()
            time.sleep(0.3)
            # streaming, the client behind: the answer holds a handler slot, the store is closed
            assert server.server.slots.taken == 1 and not big_report.is_set()
            assert daemon.store_open == 0
            deadline = start + 2 * idle_timeout + 3.0
            while (server.limits.open or server.server.slots.taken or not big_report.is_set()) \
                    and time.monotonic() < deadline:
                if reader == "reads a byte at a time":
                    with contextlib.suppress(OSError):
                        sock.recv(1)
                time.sleep(0.25)
                gc.collect()   # an abandoned stream is let go with its cycles
            held = time.monotonic() - start
            assert not server.limits.open, f"the connection is still open after {held:.1f} s"
            assert server.server.slots.taken == 0, f"the handler slot is still held after {held:.1f} s"
            assert big_report.is_set(), f"the report is still held after {held:.1f} s"
            # the slot is free: another request is served
            with socket.create_connection(("127.0.0.1", port_of(server)), timeout=10) as other:
                other.sendall(request_bytes(server, "/status"))
                assert other.recv(64).startswith(b"HTTP/1.1 200 ")
        finally:
            sock.close()


def test_a_client_that_reads_a_streamed_report_gets_all_of_it(tmp_path, big_report):
    """The deadline must not cut a reader that keeps up, however long the answer."""
    daemon = ReportStandIn(tmp_path)
    with ApiServer(daemon, port=0, token="t" * 32, workers=2, idle_timeout=1.0, lifetime=LIFETIME) as server:
        with socket.create_connection(("127.0.0.1", port_of(server)), timeout=10) as sock:
            sock.sendall(request_bytes(server, "/report?policy=p"))
            data = bytearray()
            while chunk := sock.recv(1 << 16):
                data += chunk
                time.sleep(0.001)
    body = bytes(data).partition(b"\r\n\r\n")[2]
    # chunked transfer: the JSON's last row and its closing are there
    assert f'"i": {ROWS - 1}'.encode() in body or f'"i":{ROWS - 1}'.encode() in body
    assert body.endswith(b"0\r\n\r\n")
