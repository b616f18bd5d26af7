"""`lstar db migrate|info`."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from monitor.service import api_get, live_daemon_url
from monitor.store import DEFAULT_DB_PATH, Store

DB_OPTION = typer.Option(DEFAULT_DB_PATH, "--db", help="DuckDB state file.")


def register(app: typer.Typer) -> None:
    db = typer.Typer(help="The DuckDB state file: migrations and contents.", no_args_is_help=True)

    @db.command("migrate")
    def migrate(db_path: Path = DB_OPTION) -> None:
        """Apply pending schema migrations (each in one transaction). A second run is a no-op."""
        with Store.open(db_path, migrate=False) as store:
            done = store.migrate()
        Console().print(f"applied {len(done)} migration(s)" + (f": {', '.join(done)}" if done else ""))

    @db.command("info")
    def info(db_path: Path = DB_OPTION,
             as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
        """Schema version and row counts (opens the file read-only)."""
        url = live_daemon_url(Path(db_path).parent)  # a running daemon answers: no lock error
        if url is not None:
            data = api_get(url, "/db/info")
        else:
            with Store.open(db_path, read_only=True) as store:
                data = store.info()
        if as_json:
            print(json.dumps(data, indent=2))
            return
        table = Table(title=f"{data['path']}  ({len(data['migrations'])} migrations applied)")
        table.add_column("table")
        table.add_column("rows", justify="right")
        for name, count in data["tables"].items():
            table.add_row(name, f"{count:,}")
        Console().print(table)

    app.add_typer(db, name="db")
