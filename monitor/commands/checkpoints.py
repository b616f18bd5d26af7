"""`lstar checkpoints`: list discovered checkpoints and where they are in the pipeline."""

from __future__ import annotations

import json
from pathlib import Path

import click
import typer
from rich.table import Table

from monitor.commands.options import DB_OPTION, STATE_OPTION, add_columns, db_file
from monitor.commands.paging import CURSOR_OPTION, limit_option, page_of, print_more, title
from monitor.commands.terminal import plain_console, print_table
from monitor.commands.through_daemon import through_daemon
from monitor.service import api_get
from monitor.store.listings import checkpoints_page
from monitor.store.pages import Page

STATUSES = ("discovered", "gated", "fetched", "scored", "skipped", "failed")


def register(app: typer.Typer) -> None:
    @app.command("checkpoints")
    def checkpoints(
        status: str = typer.Option(None, "--status", help=f"Only rows in this status ({', '.join(STATUSES)})."),
        repo: str = typer.Option(None, "--repo", help="Only rows of this repo."),
        limit: int = limit_option("rows"),
        cursor: str = CURSOR_OPTION,
        state: Path = STATE_OPTION,
        db: Path | None = DB_OPTION,
        as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    ) -> None:
        """List checkpoint rows, oldest first: repo, commit, refs, status and reason (opens the file read-only)."""
        db_path = db_file(state, db)
        if status is not None and status not in STATUSES:
            raise click.BadParameter(f"{status!r} is not one of {', '.join(STATUSES)}",
                                     param_hint="--status")
        page = read_checkpoints(db_path, status=status, repo=repo, limit=limit, cursor=cursor)
        if as_json:
            print(json.dumps(page.as_dict(), indent=2, default=str))
            return
        rows = page.items
        table = Table(title=title(page, "checkpoint(s)"), title_justify="left")
        add_columns(table, ("id", "repo", "sha", "refs", "status", "attempts", "reason"),
                    names=("repo", "sha"), ids=("refs",), right=("id", "attempts"))
        for r in rows:
            table.add_row(str(r["id"]), r["repo"], r["sha"][:12], ", ".join(r["refs"]), r["status"],
                          str(r["attempts"]), r["reason"] or not_evaluated_note(r) or linked_note(r.get("meta") or {}))
        console = plain_console()
        print_table(console, table)
        print_more(console, page, "checkpoints")


def not_evaluated_note(row: dict) -> str:
    """`not evaluated: policy/task: reason` for a score some policy task could not evaluate."""
    notes = row.get("not_evaluated") or []
    return f"not evaluated: {'; '.join(notes)}" if notes else ""


def linked_note(meta: dict) -> str:
    """`same weights as checkpoint 3 (run 1a2b3c4d)` for a score linked to an earlier one."""
    if not meta.get("linked_from_run_id"):
        return ""
    return (f"same weights as checkpoint {meta.get('linked_from_checkpoint_id')} "
            f"(run {str(meta['linked_from_run_id'])[:8]})")


def read_checkpoints(db_path: Path, *, status: str | None, repo: str | None, limit: int | None,
                     cursor: str | None = None) -> Page:
    """A page of rows from the daemon running on the database's folder (its API), else a read-only open."""
    return through_daemon(db_path,
                          lambda url: page_of(api_get(url, "/checkpoints", {"status": status, "repo": repo,
                                                                            "limit": limit, "cursor": cursor}),
                                              revive=lambda items: items),
                          lambda store: checkpoints_page(store, status=status, repo=repo, limit=limit, cursor=cursor))
