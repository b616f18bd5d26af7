"""The store writes nothing on standard output: DuckDB draws a progress bar there for a
statement running past two seconds (a migration, a 10^5-row report), which would land inside a
`--json` answer or the daemon's log."""

from __future__ import annotations

from pathlib import Path

import duckdb

from monitor.store import Store

SETTING = "SELECT current_setting('enable_progress_bar')"


def test_the_store_connections_draw_no_progress_bar(tmp_path: Path, capfd) -> None:
    # DuckDB's own default draws one (the check below can fail) ...
    raw = duckdb.connect(str(tmp_path / "raw.duckdb"))
    assert raw.execute(SETTING).fetchone()[0] is True
    raw.close()
    # ... the store's connections do not, read-write or read-only
    for read_only in (False, True):
        with Store.open(tmp_path / "lstar.duckdb", read_only=read_only) as store:
            assert store.conn.execute(SETTING).fetchone()[0] is False
    assert capfd.readouterr().out == ""
