"""`lstar db migrate|info`."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.table import Table

from monitor.commands.options import DB_OPTION, JSON_OPTION, STATE_OPTION, db_file
from monitor.commands.terminal import plain_console
from monitor.commands.through_daemon import through_daemon


def register(app: typer.Typer) -> None:
    db = typer.Typer(help="The DuckDB state file: migrations and contents.", no_args_is_help=True)

    @db.command("migrate")
    def migrate(state: Path = STATE_OPTION, db: Path | None = DB_OPTION) -> None:
        """Apply pending schema migrations (each in one transaction). A second run is a no-op."""
        from monitor.store import Store

        db_path = db_file(state, db)
        with Store.open(db_path, migrate=False) as store:
            done = store.migrate()
        plain_console().print(f"applied {len(done)} migration(s)" + (f": {', '.join(done)}" if done else ""))

    @db.command("info")
    def info(state: Path = STATE_OPTION, db: Path | None = DB_OPTION,
             as_json: bool = JSON_OPTION) -> None:
        """Schema version and row counts (opens the file read-only)."""
        from monitor.service import api_get

        db_path = db_file(state, db)
        # a running daemon answers: no lock error
        data = through_daemon(db_path, lambda url: api_get(url, "/db/info"), lambda store: store.info())
        if as_json:
            print(json.dumps(data, indent=2))
            return
        table = Table(title=f"{data['path']}  ({len(data['migrations'])} migrations applied)")
        table.add_column("table")
        table.add_column("rows", justify="right")
        for name, count in data["tables"].items():
            table.add_row(name, f"{count:,}")
        plain_console().print(table)

    app.add_typer(db, name="db")
