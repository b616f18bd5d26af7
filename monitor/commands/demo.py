"""`lstar demo`: the whole loop offline — fake Hub, two checkpoint families, cloze curve, daemon,
local webhook and SMTP receivers, a report — where every artefact is, and the commands that
read its state next."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any

import typer
from rich.text import Text

from monitor.commands.terminal import plain_console
from monitor.demo import run_demo
from monitor.demo.failure import DemoFailed


def next_commands(summary: dict[str, Any]) -> list[str]:
    """The read commands that work on the demo's state, as lines to copy (paths quoted for the shell)."""
    state = shlex.quote(summary.get("state") or str(Path(summary["db"]).parent))
    policy = shlex.quote(summary["policy"])
    return [
        f"lstar status --state {state}",
        f"lstar runs --state {state}",
        f"lstar checkpoints --state {state}",
        f"lstar alerts list --state {state}",
        f"lstar report --state {state} --policy {policy}",
    ]


def print_summary(summary: dict[str, Any]) -> None:
    """Where every artefact is, then the next commands; plain lines, never wrapped mid-path."""
    lines = [
        f"{'loop closed' if summary['ok'] else 'loop NOT closed'} in {summary['wall_s']} s",
        f"state:         {summary.get('state') or Path(summary['db']).parent}",
        f"database:      {summary['db']}",
        f"policy:        {summary['policy']}",
        f"task curve:    {summary['curve']} (level {summary['fit']['level']:.4f})",
        "predictions:   " + (", ".join(f"{n} {state}" for state, n in sorted(summary["predictions"].items()))
                             or "none"),
        f"webhook:       {summary['webhook']['alert_messages']} alert message(s) -> {summary['webhook']['file']}",
        f"email:         {summary['email']['alert_messages']} alert mail(s), "
        f"{summary['email']['report_messages']} report mail(s) -> {', '.join(summary['email']['files'])}",
        *(f"report:        {r['folder']}/report.html" for r in summary["reports"]),
        f"audit log:     {summary['audit_log']}",
        "",
        "next: read the demo's state with",
        *(f"  {line}" for line in next_commands(summary)),
    ]
    # Plain print: rich would wrap long paths mid-path at the terminal's width.
    print("\n".join(lines))


def register(app: typer.Typer) -> None:
    @app.command("demo")
    def demo(
        workdir: Path = typer.Option(Path("state") / "demo", "--workdir",
                                     help="Folder for everything the demo makes (emptied first)."),
        shared: Path = typer.Option(None, "--shared", help="The shared data folder (default: ../shared)."),
        as_json: bool = typer.Option(False, "--json", help="Print a machine-readable summary."),
    ) -> None:
        """Run discovery → gate → score → predict → alert → report offline; exit 0 when the loop closed.

        A failed demo ends with one line, `demo failed at STAGE: REASON` (with --json, also the
        summary's `failed_stage` and `failure`)."""
        console = plain_console(stderr=True)
        try:
            summary = run_demo(workdir, shared_dir=shared,
                               log=lambda line: console.print(Text.assemble(("demo:", "dim"), f" {line}"),
                                                              soft_wrap=True))
        except DemoFailed as exc:  # a stage raised before the loop could run: nothing else to show
            summary = {"ok": False, "workdir": str(workdir.resolve()), "failed_stage": exc.stage,
                       "failure": exc.reason}
        else:
            if not as_json:
                print_summary(summary)
        if as_json:
            print(json.dumps(summary, indent=2, default=str))
        if not summary["ok"]:
            sys.stdout.flush()  # the summary first, the reason last
            print(f"demo failed at {summary['failed_stage']}: {summary['failure']}", file=sys.stderr)
            raise typer.Exit(1)
