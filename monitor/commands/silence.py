"""`lstar silence add|list|expire`: runtime silences (not part of any policy file).

While `lstar run` holds the database, each subcommand asks the daemon's API instead (the
daemon validates and writes with the same code), so the output is the same either way.
"""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import quote

import typer
from rich.table import Table

from monitor.commands.options import (DB_OPTION, JSON_OPTION, NOW_OPTION, STATE_OPTION, add_columns, db_file,
                                      json_option)
from monitor.commands.paging import CURSOR_OPTION, limit_option, page_of, print_more, title
from monitor.commands.terminal import echo, plain_console, print_table
from monitor.commands.through_daemon import change_through_daemon, through_daemon


def register(app: typer.Typer) -> None:
    silence = typer.Typer(help="Silences: stop matching alerts from being sent, until a time.",
                          no_args_is_help=True)

    for add_command in (_add_command, _list_command, _expire_command):
        add_command(silence)

    app.add_typer(silence, name="silence")


def _add_command(silence: typer.Typer) -> None:
    @silence.command("add")
    def add(
        match: list[str] = typer.Option(..., "--match", help="KEY=VALUE, KEY!=VALUE, KEY=~REGEX or KEY!~REGEX "
                                                             "(repeat: all must match)."),
        until: str = typer.Option(..., "--until", help="End: a time (2025-06-01T12:00Z) or a duration (2h)."),
        comment: str = typer.Option(..., "--comment", help="Why (kept with the silence)."),
        start: str = typer.Option(None, "--start", help="Start later than now (ISO 8601)."),
        state: Path = STATE_OPTION,
        db: Path | None = DB_OPTION,
        now_text: str = NOW_OPTION,
        as_json: bool = json_option("Print the silence as JSON."),
    ) -> None:
        """Add a silence; prints its id, and how many alerts in force it matches."""
        from monitor.alerts.state_ops import add_silence_from_args, parse_now
        from monitor.service import revive_times

        from monitor.alerts import current_user

        now = parse_now(now_text)
        row = change_through_daemon(
            db_file(state, db), "/silences", {"match": list(match), "until": until, "comment": comment,
                                              "start": start, "now": now.isoformat(), "created_by": current_user()},
            revive_times,
            lambda store: add_silence_from_args(store, match=match, until=until, comment=comment, start=start,
                                                now=now))
        if as_json:
            print(json.dumps(row, indent=2, default=str))
            return
        print(row["id"])  # alone on stdout, for scripts that keep the id
        count = row.get("matches_current")
        if count is not None:
            echo(f"matches {count} current alert{'' if count == 1 else 's'}", err=True)


def _list_command(silence: typer.Typer) -> None:
    @silence.command("list")
    def list_(
        include_expired: bool = typer.Option(False, "--all", help="Include expired silences."),
        limit: int = limit_option("silences"),
        cursor: str = CURSOR_OPTION,
        state: Path = STATE_OPTION,
        db: Path | None = DB_OPTION,
        now_text: str = NOW_OPTION,
        as_json: bool = JSON_OPTION,
    ) -> None:
        """List active and pending silences, newest first (opens the file read-only)."""
        from monitor.alerts.state_ops import parse_now
        from monitor.service import api_get
        from monitor.store.listings import silences_page

        now = parse_now(now_text)
        page = through_daemon(
            db_file(state, db),
            lambda url: page_of(api_get(url, "/silences", {"now": now.isoformat(), "limit": limit, "cursor": cursor,
                                                           "all": "1" if include_expired else None})),
            lambda store: silences_page(store, now=now, include_expired=include_expired, limit=limit,
                                        cursor=cursor))
        if as_json:
            print(json.dumps(page.as_dict(), indent=2, default=str))
            return
        rows = page.items
        table = Table(title=title(page, "silence(s)"), title_justify="left")
        # the id and the end whole on one line (an id is copied into `silence expire`), the rest wraps
        add_columns(table, ("id", "state", "matchers", "until", "by", "comment"), ids=("matchers",),
                    whole=("id", "until"))
        for r in rows:
            table.add_row(r["id"], r["state"], " ".join(r["matchers"]), r["ends_at"].isoformat(timespec="seconds"),
                          r["created_by"], r["comment"])
        console = plain_console()
        print_table(console, table)
        print_more(console, page, "silences")


def _expire_command(silence: typer.Typer) -> None:
    @silence.command("expire")
    def expire(silence_id: str = typer.Argument(..., help="Id from `lstar silence list`, or a unique "
                                                "prefix of it, 4 characters at least (an ambiguous one "
                                                "lists the candidates)."),
               state: Path = STATE_OPTION,
               db: Path | None = DB_OPTION,
               now_text: str = NOW_OPTION) -> None:
        """End a silence now."""
        from monitor.alerts.state_ops import parse_now

        from monitor.alerts import expire_silence

        now = parse_now(now_text)
        expired = change_through_daemon(db_file(state, db), f"/silences/{quote(silence_id, safe='')}/expire",
                                        {"now": now.isoformat()}, lambda reply: reply["expired"],
                                        lambda store: expire_silence(store, silence_id, now=now))
        echo(f"expired {expired}")
