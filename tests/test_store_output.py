"""The store writes nothing on standard output: DuckDB draws a progress bar there for a
statement running past two seconds (a migration, a 10^5-row report), which would land inside a
`--json` answer or the daemon's log."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from monitor.store import Store

# a statement of a few hundred milliseconds: long enough for a bar drawn from the first moment
SLOW = "SELECT count(*) FROM range(40000000) t(x) WHERE x % 7 = 3"


def test_the_store_connections_draw_no_progress_bar(tmp_path: Path, capfd, monkeypatch: pytest.MonkeyPatch) -> None:
    # Every new connection draws a bar from the first moment (DuckDB's default, a bar after two
    # seconds, depends on where it runs: off under pytest, on in a shell) ...
    real = duckdb.connect

    def connect(*args, **kwargs):
        conn = real(*args, **kwargs)
        conn.execute("SET progress_bar_time = 0")     # which turns the bar on
        return conn

    monkeypatch.setattr(duckdb, "connect", connect)
    capfd.readouterr()
    duckdb.connect().execute(SLOW).fetchall()
    assert "%" in capfd.readouterr().out           # the check below can fail
    # ... and the store's connections draw none, read-write or read-only
    for read_only in (False, True):
        with Store.open(tmp_path / "lstar.duckdb", read_only=read_only) as store:
            capfd.readouterr()                        # (the fake connect's own SET drew one)
            store.conn.execute(SLOW).fetchall()
            assert capfd.readouterr().out == "", read_only
