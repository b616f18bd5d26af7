"""The `--limit` / `--cursor` options of the listing commands, and the line that says how to
see more (`monitor.store.pages` holds the pages themselves)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import typer
from rich.console import Console

from monitor.commands.options import MAX_ROWS, int_option
from monitor.store.pages import DEFAULT_LIMIT, Page, more_note

CURSOR_OPTION = typer.Option(None, "--cursor", help="Continue after the page that printed this cursor.")


def limit_option(what: str, default: int = DEFAULT_LIMIT) -> Any:
    """`--limit`: at most this many rows in one page (1 to MAX_ROWS)."""
    return int_option(default, "--limit", low=1, high=MAX_ROWS, help=f"At most this many {what} in one page.")


def page_of(answer: dict[str, Any], revive: Callable[[Any], Any] | None = None) -> Page:
    """The page the daemon's API answered (its times revived by `revive`, by default the
    service client's `revive_times`)."""
    if revive is None:
        from monitor.service.client import revive_times as revive
    return Page(revive(answer["items"]), int(answer["total"]), answer.get("next_cursor"), int(answer["limit"]))


def print_more(console: Console, page: Page, what: str) -> None:
    """Under a table: how many rows of how many are shown, and the cursor of the next page."""
    note = more_note(len(page.items), page.total, page.next_cursor, what=what)
    if note is not None:
        console.print(note, soft_wrap=True, highlight=False)


def title(page: Page, what: str, suffix: str = "") -> str:
    """`3 checkpoint(s)`, or `50 of 1,234 checkpoint(s)` when there are more pages."""
    shown = f"{len(page.items):,}" if len(page.items) == page.total else f"{len(page.items):,} of {page.total:,}"
    return f"{shown} {what}{suffix}"


__all__ = ["CURSOR_OPTION", "limit_option", "page_of", "print_more", "title"]
