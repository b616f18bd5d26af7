"""`lstar report`: the governance summary of a policy, in the terminal (rich), or as JSON,
Markdown or a self-contained HTML file. Opens the database read-only, or, while `lstar run`
holds it, asks the daemon's API for the same data."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from monitor.commands.options import DB_OPTION, STATE_OPTION, db_file
from monitor.commands.policy import expand_policy_paths
from monitor.commands.through_daemon import through_daemon
from monitor.policy import load_policies
from monitor.reports import (fmt, load_policy_curves, ref_name, render_plots, report_for_cli, short, to_html,
                             to_json, to_markdown)
from monitor.service import api_get, revive_times
from monitor.store import Store, utcnow

STATE_COLOURS = {"clear": "green", "at_risk": "yellow", "emerged": "bold red"}


def read_reports(db_path: Path, files: list[Path]) -> list[dict[str, Any]]:
    """The report data of each policy file: from the daemon running next to the database (its
    API computes it on its own connection, for the policy of that name it has in force), else
    from a read-only open."""
    policies = load_policies(files)  # validated here either way: the same errors

    def ask(url: str) -> list[dict[str, Any]]:
        reports = revive_times(api_get(url, "/report", {"policy": [p.name for p in policies]}),
                               keys=("start", "end", "at"))
        for data, policy in zip(reports, policies, strict=True):
            data["_curves"] = load_policy_curves(policy)[0]  # the plots need the curve objects, not their JSON
        return reports

    def read(store: Store) -> list[dict[str, Any]]:
        now = utcnow()
        return [report_for_cli(store, p, now=now) for p in policies]

    return through_daemon(db_path, ask, read)


def print_rich(data: dict[str, Any], console: Console) -> None:
    """Render a report's data as rich tables."""
    s = data["summary"]
    console.print(f"[bold]Governance report: {data['policy']}[/bold]  "
                  f"{fmt(data['period']['start'])} → {fmt(data['period']['end'])}")
    console.print(f"new checkpoints {s['new_checkpoints']} · new scores {s['new_scores']} · lineages "
                  f"{s['lineages']} · at risk {s['at_risk']} · emerged {s['emerged']} · crossings {s['crossings']}")
    for problem in data["problems"]:
        console.print(f"[red]problem:[/red] {problem}")
    table = Table(title="L* by family")
    for col in ("lineage", "checkpoint", "L*", "SE", "CE", "CE_uni", "TCB median", "V_eff", "margin", "new"):
        table.add_column(col, justify="right" if col not in ("lineage", "checkpoint", "new") else "left")
    for r in data["lstar_table"]:
        st = r["stability"] or {}
        table.add_row(r["lineage"], ref_name(r), fmt(r["lstar"]), fmt(r["se"]), fmt(r["ce"]),
                      fmt(r["ce_unigram"]), fmt(st.get("median")), fmt(st.get("v_eff_mean"), 1),
                      fmt(st.get("margin_mean")), "yes" if r["new"] else "")
    console.print(table)
    for t in data["tasks"]:
        tt = Table(title=f"task {t['task']} ({t['metric']}): level {fmt(t['level'])}, η̂ {fmt(t['eta'])} "
                         f"[{fmt(t['eta_lower'])}, {fmt(t['eta_upper'])}]")
        for col in ("lineage", "state", "L*", "P̂", "interval", "threshold"):
            tt.add_column(col)
        for x in t["lineages"]:
            colour = STATE_COLOURS.get(x["state"], "")
            tt.add_row(x["lineage"], f"[{colour}]{x['state']}[/{colour}]" if colour else x["state"],
                       fmt(x["lstar"]), fmt(x["p_hat"]), f"[{fmt(x['lo'])}, {fmt(x['hi'])}]", fmt(x["threshold"]))
        console.print(tt)
    if data["crossings"]:
        ct = Table(title="crossings")
        for col in ("task", "lineage", "checkpoint", "from", "to", "L*"):
            ct.add_column(col)
        for c in data["crossings"]:
            ct.add_row(c["task"], c["lineage"], f"{c['repo']}@{short(c['commit'])}", c["from"] or "new", c["to"],
                       fmt(c["lstar"]))
        console.print(ct)


def register(app: typer.Typer) -> None:
    @app.command("report")
    def report(
        policy: list[Path] = typer.Option(..., "--policy", help="Policy file or folder (repeatable)."),
        state: Path = STATE_OPTION,
        db: Path | None = DB_OPTION,
        as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
        markdown: bool = typer.Option(False, "--markdown", help="Print the report as Markdown."),
        html: Path = typer.Option(None, "--html", help="Write the self-contained HTML report to this file."),
    ) -> None:
        """The governance summary of each policy since its last report (or its report window)."""
        db_path = db_file(state, db)
        reports = read_reports(db_path, expand_policy_paths(policy))
        console = Console()
        for data in reports:
            if html is not None:
                figures = render_plots(data)
                target = html if len(reports) == 1 else html.with_name(f"{html.stem}-{data['policy']}{html.suffix}")
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(to_html(data, figures), encoding="utf-8")
                console.print(f"wrote {target}")
            if as_json:
                print(to_json(data), end="")
            elif markdown:
                print(to_markdown(data), end="")
            elif html is None:
                print_rich(data, console)
