"""`lstar demo`: the whole loop offline — fake Hub, two checkpoint families, cloze curve, daemon,
local webhook and SMTP receivers, a report — and where every artefact is."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console

from monitor.demo import run_demo


def register(app: typer.Typer) -> None:
    @app.command("demo")
    def demo(
        workdir: Path = typer.Option(Path("state") / "demo", "--workdir",
                                     help="Folder for everything the demo makes (emptied first)."),
        shared: Path = typer.Option(None, "--shared", help="The shared data folder (default: ../shared)."),
        as_json: bool = typer.Option(False, "--json", help="Print a machine-readable summary."),
    ) -> None:
        """Run discovery → gate → score → predict → alert → report offline; exit 0 when the loop closed."""
        console = Console(stderr=True)
        summary = run_demo(workdir, shared_dir=shared, log=lambda line: console.print(f"[dim]demo:[/dim] {line}"))
        if as_json:
            print(json.dumps(summary, indent=2, default=str))
        else:
            out = Console()
            out.print(f"[bold]{'loop closed' if summary['ok'] else 'loop NOT closed'}[/bold] in {summary['wall_s']} s")
            out.print(f"database:      {summary['db']}")
            out.print(f"task curve:    {summary['curve']} (level {summary['fit']['level']:.4f})")
            out.print(f"predictions:   {summary['predictions']}")
            out.print(f"webhook:       {summary['webhook']['alert_messages']} alert message(s) -> {summary['webhook']['file']}")
            out.print(f"email:         {summary['email']['alert_messages']} alert mail(s), "
                      f"{summary['email']['report_messages']} report mail(s) -> {', '.join(summary['email']['files'])}")
            for r in summary["reports"]:
                out.print(f"report:        {r['folder']}/report.html")
            out.print(f"audit log:     {summary['audit_log']}")
        if not summary["ok"]:
            raise typer.Exit(1)
