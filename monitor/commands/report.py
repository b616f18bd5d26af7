"""`lstar report`: the governance summary of a policy, in the terminal (rich), or as JSON,
Markdown or a self-contained HTML file. Opens the database read-only, or, while `lstar run`
holds it, asks the daemon's API for the same data. Without `--policy` it reports on the policy
in the policies folder beside the state directory (`STATE/../policies`, as `lstar demo` lays
them out) or in `./policies`: the only one, or the first in name order."""

from __future__ import annotations

import sys
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from monitor.commands.options import DB_OPTION, STATE_OPTION, OptionError, db_file, id_column, json_option
from monitor.commands.policy import expand_policy_paths
from monitor.commands.terminal import echo, name_column, plain_console, print_table
from monitor.commands.through_daemon import through_daemon
from monitor.errors import LstarError, PolicyError

if TYPE_CHECKING:
    from monitor.store import Store

STATE_COLOURS = {"clear": "green", "at_risk": "yellow", "emerged": "bold red"}


def policy_folders(db_path: Path) -> list[Path]:
    """Where `lstar report` looks for a policy when none is named: `policies` beside the state
    directory, then `policies` in the working directory (once if they are the same folder)."""
    folders: list[Path] = []
    for folder in (db_path.parent.parent / "policies", Path("policies")):
        if folder.resolve() not in [f.resolve() for f in folders]:
            folders.append(folder)
    return folders


def default_policy(db_path: Path) -> tuple[Path, str]:
    """The policy file to report on when `--policy` is not given, and why it was chosen: the
    only one in the first policies folder that has any, else the first of them in name order."""
    from monitor.policy import policy_files_in

    folders = policy_folders(db_path)
    for folder in folders:
        files = [f for f in policy_files_in(folder) if f.is_file()] if folder.is_dir() else []
        if len(files) == 1:
            return files[0], f"the only policy in {folder}"
        if files:
            return files[0], f"the first of {len(files)} policies in {folder} in name order; give --policy for another"
    raise PolicyError(f"no --policy given and no policy file (*.yaml) in {' or '.join(str(f) for f in folders)}",
                      hint="give --policy FILE (or a folder of policies)")


def read_reports(db_path: Path, files: list[Path],
                 window: tuple[datetime, datetime] | None = None) -> list[dict[str, Any]]:
    """The report data of each policy file: from the daemon running next to the database (its
    API computes it on its own connection, for the policy of that name it has in force), else
    from a read-only open.

    The daemon's policy of that name may be another version than the file (edited since the
    daemon read it, or another file of the same name): its report is refused then, naming
    both versions (`reports.version`), never shown as the file's. It cannot be computed here
    instead: the daemon holds the only connection DuckDB allows to the file.

    `window` (since, until] replaces the default period (since the policy's last report); the
    daemon is sent its two ends as times, so it reports on the same window."""
    from monitor.policy import load_policies

    policies = load_policies(files)  # validated here either way: the same errors

    def ask(url: str) -> list[dict[str, Any]]:
        from monitor.reports import load_policy_curves
        from monitor.reports.version import policy_version, require_same_version
        from monitor.service import api_get, revive_times

        asked = {"policy": [p.name for p in policies]}
        if window is not None:
            asked |= {"since": window[0].isoformat(), "until": window[1].isoformat()}
        reports = revive_times(api_get(url, "/report", asked),
                               keys=("start", "end", "at"))
        for data, policy in zip(reports, policies, strict=True):
            curves = load_policy_curves(policy)[0]   # the plots need the curve objects, not their JSON
            require_same_version(policy_version(policy, curves), data.get("policy_version"))
            data["_curves"] = curves
        return reports

    def read(store: Store) -> list[dict[str, Any]]:
        from monitor.reports import report_for_cli
        from monitor.reports.window import window_report
        from monitor.store import utcnow

        now = utcnow()
        if window is not None:
            return [window_report(store, p, start=window[0], end=window[1], now=now) for p in policies]
        return [report_for_cli(store, p, now=now) for p in policies]

    return through_daemon(db_path, ask, read)


def parse_window(since: str | None, until: str | None, *, last_week: bool,
                 this_week: bool) -> tuple[datetime, datetime] | None:
    """The window the options name (`reports.window.report_window`), or None for the default
    period; a bad value is refused in one line naming its flag and the accepted forms."""
    from monitor.reports.window import WindowError, parse_moment, report_window
    from monitor.store import utcnow

    now = utcnow()
    for flag, value in (("--since", since), ("--until", until)):
        if value is not None:
            try:
                parse_moment(value, now=now)
            except WindowError as exc:
                raise OptionError(str(exc), param_hint=f"'{flag}'") from None
    try:
        return report_window(since=since, until=until, now=now, last_week=last_week, this_week=this_week)
    except WindowError as exc:
        raise OptionError(str(exc)) from None


def print_rich(data: dict[str, Any], console: Console) -> None:
    """Render a report's data as rich tables (on a `plain_console`: values are not markup)."""
    from monitor.reports import fmt, ref_name
    from monitor.reports.report import version_line
    from monitor.reports.summary import summarised

    s = data["summary"]
    data = summarised(data)  # the long tables' top rows; --json has every row
    omitted = data["omitted"]
    console.print(Text.assemble((f"Governance report: {data['policy']}", "bold"),
                                f"  {fmt(data['period']['start'])} → {fmt(data['period']['end'])}"))
    if data.get("policy_version"):
        console.print(f"policy {version_line(data)}", highlight=False)
    console.print(f"new checkpoints {s['new_checkpoints']} · new scores {s['new_scores']} · lineages "
                  f"{s['lineages']} · at risk {s['at_risk']} · emerged {s['emerged']} · crossings {s['crossings']}")
    for problem in data["problems"]:
        console.print(Text.assemble(("problem:", "red"), f" {problem}"))
    # Seven columns of numbers leave little room at 80 columns: the lineage, its checkpoint and
    # whether it is new this period share one column (each name whole on its line); no outer border.
    table = Table(title="L* by family", show_edge=False, pad_edge=False)
    name_column(table, "lineage / checkpoint")
    for col in ("L*", "SE", "CE", "CE_uni", "TCB median", "V_eff", "margin"):
        table.add_column(col, justify="right", no_wrap=col != "TCB median")
    for r in data["lstar_table"]:
        st = r["stability"] or {}
        table.add_row(f"{r['lineage']}\n{ref_name(r)}{' (new)' if r['new'] else ''}", fmt(r["lstar"]),
                      fmt(r["se"]), fmt(r["ce"]), fmt(r["ce_unigram"]), fmt(st.get("median")),
                      fmt(st.get("v_eff_mean"), 1), fmt(st.get("margin_mean")))
    print_table(console, table)
    _note(console, omitted, "lstar_table")
    # the same current checkpoint as the Markdown, HTML, JSON and the daemon's reports (training_order)
    for f in data["families"]:
        console.print(f"current {f['lineage']}: {f['current']}, L* {fmt(f['latest_lstar'])} "
                      f"(latest by {f['order']})", highlight=False)
    for t in data["tasks"]:
        tt = Table(title=f"task {t['task']} ({t['metric']}): level {fmt(t['level'])}, η̂ {fmt(t['eta'])} "
                         f"[{fmt(t['eta_lower'])}, {fmt(t['eta_upper'])}]")
        name_column(tt, "lineage")
        for col in ("state", t.get("axis_label", "L*"), "P̂", "interval", "threshold"):
            tt.add_column(col)
        for x in t["lineages"]:
            colour = STATE_COLOURS.get(x["state"], "")
            tt.add_row(x["lineage"], Text(x["state"], style=colour or ""),
                       fmt(x.get("value", x["lstar"])), fmt(x["p_hat"]), f"[{fmt(x['lo'])}, {fmt(x['hi'])}]", fmt(x["threshold"]))
        print_table(console, tt)
        _note(console, omitted, f"task:{t['task']}")
    for change in data.get("policy_changes") or []:
        console.print(f"policy change {fmt(change['changed_at'])}: {change['summary']}", highlight=False)
    if data["crossings"]:
        ct = Table(title="crossings")
        for col in ("task", "lineage", "checkpoint"):
            id_column(ct, col)
        for col in ("from", "to", "L*"):
            ct.add_column(col)
        for c in data["crossings"]:
            ct.add_row(c["task"], c["lineage"], ref_name(c), c["from"] or "new", c["to"],
                       fmt(c["lstar"]))
        console.print(ct)
        _note(console, omitted, "crossings")


def _note(console: Console, omitted: dict[str, str], section: str) -> None:
    """Under a cut table: how many rows of how many it shows."""
    if section in omitted:
        console.print(f"{omitted[section]}.", highlight=False)


def write_report_folder(data: dict[str, Any], folder: Path) -> Path:
    """Write the report into `folder` (`write_report`), which must be new or empty: a folder
    holding anything else is refused, never replaced. Returns the path of report.md."""
    from monitor.reports.report import write_report

    if folder.is_symlink() or folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise LstarError(f"--out {folder}: exists and is not an empty folder",
                          hint="give a new folder (the report is written as report.md, report.html, "
                               "report.json and its plots)")
    return write_report(data, folder)["markdown"]


def register(app: typer.Typer) -> None:
    @app.command("report")
    def report(
        policy: list[Path] = typer.Option(
            None, "--policy", help="Policy file or folder (repeatable). Default: the only (or first) "
            "policy in STATE/../policies, else in ./policies."),
        state: Path = STATE_OPTION,
        db: Path | None = DB_OPTION,
        as_json: bool = json_option("Print the report as JSON."),
        markdown: bool = typer.Option(False, "--markdown", help="Print the report as Markdown."),
        html: Path = typer.Option(None, "--html", help="Write the self-contained HTML report to this file."),
        out: Path = typer.Option(None, "--out", help="Write the report folder here (report.md beside its "
                                 "plots, report.html, report.json): a new or empty folder."),
        since: str = typer.Option(None, "--since", help="Report on the window from this time: a duration back "
                                  "from now (7d, 12h, 1d12h), a date (2026-11-01, UTC) or a date and time."),
        until: str = typer.Option(None, "--until", help="End the window at this time (same forms; default now)."),
        last_week: bool = typer.Option(False, "--last-week", help="The previous ISO week: Monday 00:00 UTC to "
                                       "Monday 00:00 UTC."),
        this_week: bool = typer.Option(False, "--this-week", help="This ISO week so far: Monday 00:00 UTC to now."),
    ) -> None:
        """The governance summary of each policy since its last report (or its report window), or of
        any window (--since/--until, --last-week, --this-week) with the state carried into it."""
        from monitor.reports import iter_json, render_plots, to_html, to_markdown

        window = parse_window(since, until, last_week=last_week, this_week=this_week)
        db_path = db_file(state, db)
        if not policy:
            chosen, why = default_policy(db_path)
            echo(f"report: policy {chosen} ({why})", err=True)
            policy = [chosen]
        reports = read_reports(db_path, expand_policy_paths(policy), window)
        console = plain_console()  # values (problems, intervals, names) printed as they are
        for data in reports:
            if html is not None:
                figures = render_plots(data)
                target = html if len(reports) == 1 else html.with_name(f"{html.stem}-{data['policy']}{html.suffix}")
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(to_html(data, figures), encoding="utf-8")
                console.print(f"wrote {target}", soft_wrap=True, markup=False)
            folder = None
            if out is not None:
                folder = out if len(reports) == 1 else out / data["policy"]
                written = write_report_folder(data, folder)
                console.print(f"wrote {written}", soft_wrap=True, markup=False)
            if as_json:   # encoded once, written as it is encoded
                for chunk in iter_json(data):
                    sys.stdout.write(chunk)
                sys.stdout.flush()
            elif markdown:  # with --out, the plots are linked where they were written
                print(to_markdown(data, image_prefix=f"{folder}/" if folder is not None else ""), end="")
            elif html is None and out is None:
                print_rich(data, console)
