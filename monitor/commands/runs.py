"""`lstar runs`: the score runs recorded in the state, newest first."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from monitor.commands.options import DB_OPTION, JSON_OPTION, STATE_OPTION, db_file, id_column
from monitor.commands.paging import CURSOR_OPTION, limit_option, page_of, print_more, title
from monitor.commands.terminal import name_column, plain_console, print_table
from monitor.commands.through_daemon import through_daemon
from monitor.store.pages import Page


def read_runs(db_path: Path, *, limit: int, cursor: str | None = None) -> Page:
    """A page of score runs from the daemon running on the database's folder (its API), else a read-only open."""
    from monitor.service import api_get
    from monitor.store.listings import runs_page

    return through_daemon(db_path, lambda url: page_of(api_get(url, "/runs", {"limit": limit, "cursor": cursor})),
                          lambda store: runs_page(store, limit=limit, cursor=cursor))


def corpus_label(row: dict[str, Any]) -> str:
    """`calib-v0 v1 (first:8)`, or the corpus sha's first 12 hex digits when it is not registered."""
    if row.get("corpus_name") is None:
        return str(row["corpus_sha256"])[:12]
    return f"{row['corpus_name']} {row['corpus_version']} ({row['corpus_selection']})"


def render_runs(page: Page, console: Console) -> None:
    """The runs as one table that fits 80 columns for repo ids up to about 30 characters: the
    model (repo, then revision @ sha, then the run id and the run it was linked to when its
    weights were scored before) is never broken inside a name, L* and its SE share a column,
    the corpus wraps whole. Longer repo ids widen the table rather than break."""
    rows = page.items
    table = Table(title=title(page, "score run(s)", ", newest first"), title_justify="left")
    name_column(table, "model")  # repo, then revision @ sha, then the run
    id_column(table, "corpus")
    table.add_column("L* ± SE", justify="right", no_wrap=True)
    table.add_column("tokens/s", justify="right", no_wrap=True)
    table.add_column("finished", no_wrap=True)
    for r in rows:
        finished = r["finished_at"]
        when = finished.strftime("%Y-%m-%d\n%H:%M:%S") if hasattr(finished, "strftime") else str(finished)
        at = f"{r['revision']} @ {str(r['model_sha'])[:12]}" if r.get("revision") else str(r["model_sha"])[:12]
        at += f"\nrun {str(r['run_id'])[:8]}"
        if r.get("linked_from_run_id"):  # same weights as an earlier run: its numbers, no forward pass
            at += f"\nlinked to run {str(r['linked_from_run_id'])[:8]}"
        table.add_row(f"{r['model_repo']}\n{at}", corpus_label(r), f"{r['lstar']:.4f}\n± {r['se_ce']:.4f}",
                      f"{r['tokens_per_s']:,.0f}", when)
    print_table(console, table)
    print_more(console, page, "score runs")


def register(app: typer.Typer) -> None:
    @app.command("runs")
    def runs(
        limit: int = limit_option("runs", default=20),
        cursor: str = CURSOR_OPTION,
        state: Path = STATE_OPTION,
        db: Path | None = DB_OPTION,
        as_json: bool = JSON_OPTION,
    ) -> None:
        """List score runs newest first: model, revision, corpus, L*, SE, tokens/s (opens the file read-only)."""
        page = read_runs(db_file(state, db), limit=limit, cursor=cursor)
        if as_json:
            print(json.dumps(page.as_dict(), indent=2, default=str))
            return
        render_runs(page, plain_console())
