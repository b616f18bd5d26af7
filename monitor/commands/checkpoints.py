"""`lstar checkpoints`: list discovered checkpoints and where they are in the pipeline."""

from __future__ import annotations

import json
from pathlib import Path

import click
import typer
from rich.table import Table

from monitor.commands.options import DB_OPTION, MAX_ROWS, STATE_OPTION, add_columns, db_file, int_option
from monitor.commands.terminal import plain_console, print_table
from monitor.commands.through_daemon import through_daemon
from monitor.service import api_get

STATUSES = ("discovered", "gated", "fetched", "scored", "skipped", "failed")


def register(app: typer.Typer) -> None:
    @app.command("checkpoints")
    def checkpoints(
        status: str = typer.Option(None, "--status", help=f"Only rows in this status ({', '.join(STATUSES)})."),
        repo: str = typer.Option(None, "--repo", help="Only rows of this repo."),
        limit: int = int_option(None, "--limit", low=1, high=MAX_ROWS, help="At most this many rows."),
        state: Path = STATE_OPTION,
        db: Path | None = DB_OPTION,
        as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    ) -> None:
        """List checkpoint rows: repo, commit, refs, status and reason (opens the file read-only)."""
        db_path = db_file(state, db)
        if status is not None and status not in STATUSES:
            raise click.BadParameter(f"{status!r} is not one of {', '.join(STATUSES)}",
                                     param_hint="--status")
        rows = read_checkpoints(db_path, status=status, repo=repo, limit=limit)
        if as_json:
            print(json.dumps(rows, indent=2, default=str))
            return
        table = Table(title=f"{len(rows)} checkpoint(s)", title_justify="left")
        add_columns(table, ("id", "repo", "sha", "refs", "status", "attempts", "reason"),
                    names=("repo", "sha"), ids=("refs",), right=("id", "attempts"))
        for r in rows:
            table.add_row(str(r["id"]), r["repo"], r["sha"][:12], ", ".join(r["refs"]), r["status"],
                          str(r["attempts"]), r["reason"] or not_evaluated_note(r) or linked_note(r.get("meta") or {}))
        print_table(plain_console(), table)


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


def read_checkpoints(db_path: Path, *, status: str | None, repo: str | None,
                     limit: int | None) -> list[dict]:
    """Rows from the daemon running on the database's folder (its API), else a read-only open."""
    return through_daemon(db_path,
                          lambda url: api_get(url, "/checkpoints", {"status": status, "repo": repo, "limit": limit}),
                          lambda store: store.with_not_evaluated(
                              [r.as_dict() for r in store.list_checkpoints(status=status, repo=repo, limit=limit)]))
