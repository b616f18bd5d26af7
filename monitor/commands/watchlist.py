"""`lstar watchlist`: which watched lineages are at risk right now (`monitor.reports.watchlist`).

While `lstar run` holds the database it asks the daemon's `/watchlist`, with the same output.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.table import Table
from rich.text import Text

from monitor.commands.options import (DB_OPTION, JSON_OPTION, POLICY_NAME_OPTION, STATE_OPTION, OptionError, db_file,
                                      id_column)
from monitor.commands.paging import CURSOR_OPTION, limit_option, page_of, print_more, title
from monitor.commands.terminal import echo, name_column, plain_console, print_table
from monitor.commands.through_daemon import through_daemon

STATE_COLOURS = {"clear": "green", "at_risk": "yellow", "emerged": "bold red", "flagged": "magenta"}


def _status(value: str | None) -> str | None:
    from monitor.reports.watchlist import check_status

    try:
        return check_status(value)
    except ValueError as exc:
        raise OptionError(str(exc)) from None


def _glob(value: str | None) -> str | None:
    from monitor.reports.watchlist import MAX_GLOB_CHARS

    if value is not None and len(value) > MAX_GLOB_CHARS:
        raise OptionError(f"the glob is {len(value):,} characters long; give at most {MAX_GLOB_CHARS}")
    return value


def register(app: typer.Typer) -> None:
    from monitor.reports.watchlist import STATUSES

    @app.command("watchlist")
    def watchlist(
        status: str = typer.Option(None, "--status", callback=_status,
                                   help=f"Only lineages in this state now ({', '.join(STATUSES)})."),
        task: str = typer.Option(None, "--task", help="Only this task (by name)."),
        policy: str = POLICY_NAME_OPTION,
        repo: str = typer.Option(None, "--repo", callback=_glob, help="Only lineages whose current checkpoint's repo matches "
                                 "this glob (org/*, *-instruct)."),
        limit: int = limit_option("lineages"),
        cursor: str = CURSOR_OPTION,
        state: Path = STATE_OPTION,
        db: Path | None = DB_OPTION,
        as_json: bool = JSON_OPTION,
    ) -> None:
        """The current state of every watched lineage × task, closest to its level first.

        Each lineage is shown at its current checkpoint (the last in training order: by the
        step its branch or tag names, else the Hub commit date, else when it was first seen or
        scored) with that checkpoint's newest prediction: P̂ and its interval, the level
        b + ε, the distance P̂ − level, the state in force (an evaluation's observed state
        supersedes the prediction) and the lineage's newest alert. Opens the file read-only.
        """
        from monitor.reports.present import fmt
        from monitor.reports.watchlist import describe_distance, watchlist_page
        from monitor.service import api_get

        params = {"status": status, "task": task, "policy": policy, "repo": repo, "limit": limit,
                  "cursor": cursor}
        page = through_daemon(db_file(state, db), lambda url: page_of(api_get(url, "/watchlist", params)),
                              lambda store: watchlist_page(store, status=status, task=task, policy=policy,
                                                           repo=repo, limit=limit, cursor=cursor))
        if as_json:
            print(json.dumps(page.as_dict(), indent=2, default=str))
            return
        if not page.items:
            filters = ", ".join(f"{k} {v}" for k, v in (("status", status), ("task", task), ("policy", policy),
                                                          ("repo", repo)) if v is not None)
            echo("no watched lineage has a prediction" + (f" with {filters}" if filters else "")
                 + (" after this cursor" if cursor else ""))
            return
        # Two lines a row, names whole (they wrap, never cut). When every row is of one policy
        # and task, the title names them and the table fits 80 columns without their column.
        pairs = {(r["policy"], r["task"]) for r in page.items}
        single = next(iter(pairs)) if len(pairs) == 1 else None
        what = "lineage(s)" + (f" of {single[0]} / {single[1]}" if single else " × task")
        table = Table(title=title(page, what, ", closest to the level first"), title_justify="left",
                      show_edge=False, pad_edge=False)
        if single is None:
            id_column(table, "policy / task")
        name_column(table, "lineage / checkpoint")
        table.add_column("state", min_width=7)
        table.add_column("P̂\ninterval", no_wrap=True)
        table.add_column("level\ndistance", no_wrap=True)
        id_column(table, "last\nalert", min_width=8)
        for r in page.items:
            a = r["last_alert"]
            alert = f"#{a['id']} {a['state']}\n{a['status']}" if a else "—"
            observed = f"\n(predicted {r['predicted_state']})" if r["observed_state"] else ""
            # the checkpoint's name starts with its repo: when that is the lineage, the ref alone
            where = r["checkpoint"].removeprefix(r["lineage"]) if r["repo"] == r["lineage"] else r["checkpoint"]
            cells = [] if single else [f"{r['policy']}\n{r['task']}"]
            table.add_row(*cells, f"{r['lineage']}\n{where}",
                          Text(r["state"] + observed, style=STATE_COLOURS.get(r["state"], "")),
                          f"{fmt(r['p_hat'])}\n[{fmt(r['lo'])}, {fmt(r['hi'])}]",
                          f"{fmt(r['level'])}\n{describe_distance(r['distance'])}", alert)
        console = plain_console()
        print_table(console, table)
        print_more(console, page, "lineages")
