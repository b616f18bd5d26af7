"""`lstar checkpoints`: list discovered checkpoints and where they are in the pipeline."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.table import Table

from monitor.commands.options import DB_OPTION, JSON_OPTION, STATE_OPTION, OptionError, add_columns, db_file
from monitor.commands.paging import CURSOR_OPTION, limit_option, page_of, print_more, title
from monitor.commands.terminal import plain_console, print_table
from monitor.commands.through_daemon import through_daemon
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
        as_json: bool = JSON_OPTION,
        with_meta: bool = typer.Option(False, "--meta", help="With --json: each row's whole meta (the gate's, "
                                       "fetch's and score's facts, ~2 KB a row); without it a row's meta holds "
                                       "only its score (run_id, lstar, se) and what links it to another."),
    ) -> None:
        """List checkpoint rows, oldest first: repo, commit, refs, status and reason (opens the file read-only)."""
        db_path = db_file(state, db)
        if status is not None and status not in STATUSES:
            raise OptionError(f"{status!r} is not one of {', '.join(STATUSES)}",
                                     param_hint="--status")
        page = read_checkpoints(db_path, status=status, repo=repo, limit=limit, cursor=cursor,
                                with_meta=with_meta and as_json)
        if as_json:
            print(json.dumps(page.as_dict(), indent=2, default=str))
            return
        rows = page.items
        table = Table(title=title(page, "checkpoint(s)"), title_justify="left")
        derived = any(r.get("base") for r in rows)
        columns = ("id", "repo", "sha", "refs", "status", "attempts", *(("base", "L*(base) → L*") if derived else ()),
                   "reason")
        add_columns(table, columns, names=("repo", "sha"), ids=("refs",), right=("id", "attempts"))
        for r in rows:
            lineage = (base_note(r), coordinates_note(r)) if derived else ()
            table.add_row(str(r["id"]), r["repo"], r["sha"][:12], ", ".join(r["refs"]), r["status"],
                          str(r["attempts"]), *lineage, "; ".join(filter(None, (
                              r["reason"] or not_evaluated_note(r) or linked_note(r.get("meta") or {})
                              or reference_note(r.get("meta") or {}),
                              observed_note(r)))))
        console = plain_console()
        print_table(console, table)
        print_more(console, page, "checkpoints")


def not_evaluated_note(row: dict) -> str:
    """`not evaluated: policy/task: reason` for a score some policy task could not evaluate."""
    notes = row.get("not_evaluated") or []
    return f"not evaluated: {'; '.join(notes)}" if notes else ""


def observed_note(row: dict) -> str:
    """`observed arith: at_risk -> observed_emerged (contradicted)` for each active evaluation of
    the checkpoint (the observed state supersedes the predicted one; both are shown)."""
    parts = []
    for o in row.get("observations") or []:
        if o["status"] == "done":
            parts.append(f"observed {o['task']}: {o['predicted_state']} -> {o['observed_state']} ({o['verdict']})")
        else:
            parts.append(f"evaluation {o['task']}: {o['status']}" + (f" ({o['reason']})" if o.get("reason") else ""))
    return "; ".join(parts)


def base_note(row: dict) -> str:
    """`finetune of org/base@0123456789ab` for a derivative (its declared base and relation)."""
    base = row.get("base")
    if not base:
        return ""
    if not base.get("repo"):
        return f"{base['relation']} of {', '.join(base.get('bases') or []) or '?'}"
    return f"{base['relation']} of {base['repo']}@{(base.get('sha') or 'unpinned')[:12]}"


def coordinates_note(row: dict) -> str:
    """`2.1043 → 1.9870`: L*(base) and the checkpoint's own L* on one corpus and spec."""
    pair = row.get("coordinates")
    return f"{pair['lstar_base']:.4f} → {pair['lstar']:.4f}" if pair else ""


def reference_note(meta: dict) -> str:
    """Why a reference base was queued (`monitor.alerts.reference_bases`)."""
    why = meta.get("reference_base")
    return f"reference: {why.get('reason', '')}" if why else ""


def linked_note(meta: dict) -> str:
    """`same weights as checkpoint 3 (run 1a2b3c4d)` for a score linked to an earlier one."""
    if not meta.get("linked_from_run_id"):
        return ""
    return (f"same weights as checkpoint {meta.get('linked_from_checkpoint_id')} "
            f"(run {str(meta['linked_from_run_id'])[:8]})")


def read_checkpoints(db_path: Path, *, status: str | None, repo: str | None, limit: int | None,
                     cursor: str | None = None, with_meta: bool = False) -> Page:
    """A page of rows from the daemon running on the database's folder (its API), else a
    read-only open; each row's meta whole only `with_meta` (`listings.checkpoints_page`)."""
    from monitor.service.client import api_get   # the read's own modules: httpx, or duckdb
    from monitor.store.listings import checkpoints_page

    return through_daemon(db_path,
                          lambda url: page_of(api_get(url, "/checkpoints", {"status": status, "repo": repo,
                                                                            "limit": limit, "cursor": cursor,
                                                                            "fields": "meta" if with_meta else None}),
                                              revive=lambda items: items),
                          lambda store: checkpoints_page(store, status=status, repo=repo, limit=limit, cursor=cursor,
                                                         with_meta=with_meta))
