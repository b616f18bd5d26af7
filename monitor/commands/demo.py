"""`lstar demo`: the whole loop offline — a lineage that learns the additions in words with a jump,
published step by step on a fake Hub, its curve, the daemon, local webhook and SMTP receivers, a
report — where every artefact is, the lineage's states in order, and the commands that read its
state next."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any

import typer
from rich.text import Text

from monitor.commands.options import OptionError, json_option
from monitor.commands.terminal import echo, plain_console


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


def _threshold_line(threshold: dict[str, Any] | None) -> str:
    if not threshold or threshold.get("estimate") is None:
        return "not reached inside the data (UNRESOLVED)"
    interval = "" if threshold["lower"] is None or threshold["upper"] is None else \
        f" [{threshold['lower']:.3f}, {threshold['upper']:.3f}] ({threshold['confidence']:.0%})"
    return (f"L* = {threshold['estimate']:.3f}{interval}, "
            f"{'resolved' if threshold['resolved'] else 'UNRESOLVED'}")


def _lineage_lines(lineage: dict[str, Any] | None) -> list[str]:
    """One line per published checkpoint: its L*, the predicted interval and state."""
    if not lineage:
        return []
    lines = [f"lineage:       {lineage['repo']} (seed {lineage['seed']}), one checkpoint per poll: "
             f"{'clear -> at_risk -> emerged' if lineage['in_order'] else 'states NOT in order'}"]
    for s in lineage["states"]:
        if s["state"] is None:
            lines.append(f"  step{s['step']:<6} no prediction")
        else:
            margin = "" if s.get("emerged_margin_se") is None else \
                (f"  (emerged by {s['emerged_margin_se']:.2f} SE)" if s["emerged_margin"] >= 0 else
                 f"  ({-s['emerged_margin_se']:.2f} SE short of emerged)")
            lines.append(f"  step{s['step']:<6} L* {s['lstar']:.3f} ± {s['lstar_se']:.3f}  predicted "
                         f"{s['p_hat']:.2f} [{s['lo']:.2f}, {s['hi']:.2f}]  {s['state']}{margin}")
    return lines


def _evaluation_lines(evaluations: list[dict[str, Any]] | None) -> list[str]:
    """One line per active evaluation: the checkpoint, prediction, observation and verdict."""
    if not evaluations:
        return ["evaluations:   none"]
    lines = ["evaluations:   the task run by the daemon on checkpoints predicted at risk or emerged"]
    for e in evaluations:
        if e["status"] != "done":
            lines.append(f"  step{e['step']:<6} {e['status']}" + (f" ({e['reason']})" if e.get("reason") else ""))
        else:
            lines.append(f"  step{e['step']:<6} predicted {e['predicted_state']} [{e['predicted_lo']:.2f}, "
                         f"{e['predicted_hi']:.2f}]; observed acc {e['observed']:.2f} ({e['k']}/{e['n']}) "
                         f"[{e['observed_lo']:.2f}, {e['observed_hi']:.2f}] -> {e['observed_state']}: "
                         f"{e['verdict']}")
    return lines


def print_summary(summary: dict[str, Any]) -> None:
    """Where every artefact is, then the next commands; plain lines, never wrapped mid-path."""
    lines = [
        f"{'loop closed' if summary['ok'] else 'loop NOT closed'} in {summary['wall_s']} s",
        f"state:         {summary.get('state') or Path(summary['db']).parent}",
        f"database:      {summary['db']}",
        f"policy:        {summary['policy']}",
        f"task curve:    {summary['curve']} ({summary.get('history', 'shipped')}, seed 0; "
        f"level {summary['fit']['level']:.4f})",
        f"threshold:     {_threshold_line(summary.get('threshold'))}",
        f"task items:    {summary.get('task_file', '-')}",
        *_lineage_lines(summary.get("lineage")),
        *_evaluation_lines(summary.get("evaluation")),
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
    # Not the console: rich would wrap long paths mid-path at the terminal's width.
    for line in lines:
        echo(line)


def run_demo(*args: Any, **kwargs: Any) -> dict[str, Any]:
    """`monitor.demo.run_demo`, imported when the demo runs (not when `lstar demo --help` is
    printed); the one place this command starts the demo."""
    from monitor.demo import run_demo as run

    return run(*args, **kwargs)


def register(app: typer.Typer) -> None:
    @app.command("demo")
    def demo(
        workdir: Path = typer.Option(Path("state") / "demo", "--workdir",
                                     help="Folder for everything the demo makes: a new or empty folder, or one "
                                          "an earlier demo made (its own entries are emptied first; anything "
                                          "else there, or a symbolic link, is refused)."),
        shared: Path = typer.Option(None, "--shared", help="The shared data folder (default: ../shared)."),
        as_json: bool = json_option("Print a machine-readable summary."),
        fit_history: bool = typer.Option(False, "--fit-history",
                                         help="Train, label and fit the history curve (seed 0) here instead of "
                                              "using the shipped one (about as long again as the demo itself)."),
        save_history_curve: Path = typer.Option(None, "--save-history-curve",
                                                 help="With --fit-history: also write the fitted curve here."),
        checkpoints: int = typer.Option(None, "--checkpoints", min=2,
                                        help="Publish only this many (2 to 12) of the live lineage's twelve checkpoints, "
                                             "evenly spaced from the first to the last (default: all twelve). "
                                             "Each is one daemon pass, nearly all of it one score, so 4 takes "
                                             "about a third of the passes' time and still shows clear, at risk "
                                             "and emerged; the lineage is trained in full either way."),
    ) -> None:
        """Run discovery → gate → score → predict → evaluate → alert → report offline; exit 0 when
        the loop closed.

        A failed demo ends with one line, `demo failed at STAGE: REASON` (with --json, also the
        summary's `failed_stage` and `failure`)."""
        from monitor.demo.failure import DemoFailed

        console = plain_console(stderr=True)
        try:
            if save_history_curve is not None and not fit_history:
                raise OptionError("it needs --fit-history (the curve written is the one fitted in the demo)",
                                  param_hint="--save-history-curve")
            # progress bars when stderr is a terminal; elsewhere a line per quarter of training and per pass
            summary = run_demo(workdir, shared_dir=shared, fit_history=fit_history,
                               save_history_curve=save_history_curve, checkpoints=checkpoints,
                               progress=console.is_terminal,
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
            echo(f"demo failed at {summary['failed_stage']}: {summary['failure']}", err=True)
            raise typer.Exit(1)
