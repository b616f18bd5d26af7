"""`lstar backtest`: replay training histories through the monitor and score its warnings.

A thin shell over `monitor.backtest` (imported inside the command: scipy and matplotlib behind
it are not paid for by `lstar --help`)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from monitor.commands.options import MAX_RESAMPLES, MAX_SEED, OptionError, float_option, int_option, json_option

HELP = """Backtest the monitor on training histories: when would it have warned, and how often would it have been wrong?

HISTORY.csv has one row per checkpoint × task × metric: lineage (the training run), step, optionally tokens and flops, task, metric, value, n (items) or stderr, family (any label), a checkpoint name, and one axis column per progress axis it gives (raw_ce, lstar, bits_per_byte, task_loss, ...; `<axis>_se` for its standard error). Lineages matching --reference are the references the task curves are fitted on (with `lstar curves fit`'s code); each lineage matching --target is replayed checkpoint by checkpoint through the daemon's own evaluation and alerting (one checkpoint an hour on a synthetic clock, alerts appended to --alerts-out, nothing sent), and every prediction is compared with that checkpoint's own published result.

The tasks come from --policy FILE (each task's curve artifact gives the history's task and metric, the baseline and the axis; the task's margin and confidence as the daemon resolves them; the policy's routes and timers are kept, every receiver a file sink) or from --task (repeatable: TASK with --baseline, or TASK=BASELINE) and --margin (one margin for all, the default route).

With --policy and --no-refit nothing is fitted: the policy's own curve artifacts are replayed as they are (what a daemon running that policy would have said on the history), and the history's values are taken to be measured on the corpus and scoring spec those curves are pinned to; no --reference is needed.

Reported per task × target lineage: lead time (steps, tokens, FLOPs) from the first at_risk to the first checkpoint observed emerged, misses, late warnings, false alarms, false emerged claims, interval coverage with its Clopper–Pearson interval, and the relative error at the final checkpoint (beside --paper-errors where given).

Example, on your own training log:


lstar backtest runs.csv --reference 'small-*' --target 'big-run' --task hellaswag
  --baseline 0.25 --margin 0.1 --axis raw_ce --markdown backtest.md --html backtest/
"""


def print_terminal(data: dict) -> None:  # type: ignore[type-arg]
    """The summary and the table, through the project's literal console."""
    from rich.table import Table

    from monitor.backtest.render import COLUMNS, summary_lines, table_rows
    from monitor.commands.terminal import name_column, plain_console, print_table

    console = plain_console()
    for line in summary_lines(data):
        console.print(line)
    table = Table(title="backtest: task × target lineage")
    for i, column in enumerate(COLUMNS):
        if i == 1:
            name_column(table, column)
        else:
            table.add_column(column)
    for row in table_rows(data):
        table.add_row(*row)
    print_table(console, table)
    for line in data.get("not_evaluated") or []:
        console.print(f"not evaluated: {line}")


def register(app: typer.Typer) -> None:
    @app.command("backtest", help=HELP)
    def backtest(
        history: Path = typer.Argument(..., help="The history CSV (see above)."),
        reference: str = typer.Option(None, "--reference", help="Glob of the reference lineages, or several separated by commas (fitted on; "
                                      "not with --no-refit)."),
        target: str = typer.Option(..., "--target", help="Glob of the target lineages, or several separated by commas (replayed)."),
        policy: Path = typer.Option(None, "--policy", help="Policy YAML whose tasks are backtested."),
        task: list[str] = typer.Option(None, "--task", help="Task name in the history (without --policy); "
                                       "repeatable; TASK=BASELINE gives that task its own baseline."),
        metric: str = typer.Option(None, "--metric", help="Metric of the --task(s) (default: each one's only "
                                   "metric)."),
        baseline: float = float_option(None, "--baseline", low=0.0, high=1.0, high_open=True,
                                       help="The random baseline b_t of each --task given without one."),
        margin: float = float_option(None, "--margin", low=0.0, high=1.0, low_open=True,
                                     help="Margin ε above the baseline (with --task; every task)."),
        confidence: float = float_option(0.9, "--confidence", low=0.0, high=1.0, low_open=True, high_open=True,
                                         help="Confidence of the bands (with --task)."),
        axis: str = typer.Option(None, "--axis", help="Progress axis: lstar, raw_ce, bits_per_byte, task_loss, "
                                 "... (default: the policy curves' axis, else lstar)."),
        family: str = typer.Option("isotonic", "--family", help="Curve family: isotonic, sigmoid or auto."),
        bootstrap: int = int_option(1000, "--bootstrap", low=50, high=MAX_RESAMPLES, help="Bootstrap resamples."),
        seed: int = int_option(0, "--seed", low=0, high=MAX_SEED, help="Bootstrap seed."),
        paper_errors: Path = typer.Option(None, "--paper-errors", help="CSV of reference relative errors: "
                                          "task,rel_error, or the OLMo paper's Task,Actual,Pred,Rel Error."),
        paper_task: list[str] = typer.Option(None, "--paper-task", help="PAPER_NAME=TASK: joins a paper's task "
                                             "name to the history's (repeatable)."),
        as_json: bool = json_option("Print the result as JSON."),
        markdown: Path = typer.Option(None, "--markdown", help="Write the result as Markdown to this file."),
        html: Path = typer.Option(None, "--html", help="Write an HTML page with plots into this folder."),
        alerts_out: Path = typer.Option(None, "--alerts-out", help="Keep the replay's alerts (JSON lines) here."),
        no_refit: bool = typer.Option(False, "--no-refit", help="With --policy: replay with the policy's own curve "
                                      "artifacts as they are, fitting nothing (no --reference)."),
    ) -> None:
        from monitor.backtest import load_history, run_backtest, spec_from_options, spec_from_policy
        from monitor.backtest.html import write_html
        from monitor.backtest.spec import policy_curves
        from monitor.backtest.paper import parse_task_map, read_paper_errors
        from monitor.backtest.render import markdown as to_markdown

        if family not in ("isotonic", "sigmoid", "auto"):
            raise OptionError(f"--family {family!r}: choose isotonic, sigmoid or auto")
        if policy is not None:
            if task or baseline is not None or margin is not None:
                raise OptionError("give --policy or --task/--baseline/--margin, not both")
            spec = spec_from_policy(policy, axis=axis, family=family)
        else:
            if not task or margin is None:
                raise OptionError("give --policy FILE, or --task (TASK=BASELINE, or with --baseline) and --margin")
            spec = spec_from_options(task=task, metric=metric, baseline=baseline, margin=margin,
                                     confidence=confidence, axis=axis or "lstar", family=family)
        if no_refit and (policy is None or reference is not None):
            raise OptionError("--no-refit replays a --policy's own curves: give --policy, and no --reference")
        if not no_refit and reference is None:
            raise OptionError("give --reference GLOB (the lineages the curves are fitted on), or --policy FILE "
                              "--no-refit to replay with the policy's own curves")
        curves = policy_curves(spec) if no_refit else None
        errors = read_paper_errors(paper_errors, parse_task_map(paper_task)) if paper_errors is not None else None
        hist = load_history(history, reference=reference, target=target, axis=spec.axis)
        result = run_backtest(hist, spec, alerts_out=alerts_out, paper_errors=errors, resamples=bootstrap, seed=seed,
                              curves=curves)
        data = result.as_dict()
        if markdown is not None:
            markdown.parent.mkdir(parents=True, exist_ok=True)
            markdown.write_text(to_markdown(data), encoding="utf-8")
        if html is not None:
            write_html(data, html)
        if as_json:
            # ensure_ascii: every control or non-ASCII character of a name is a \uXXXX escape
            print(json.dumps(data, indent=2, sort_keys=True, ensure_ascii=True))
        else:
            print_terminal(data)
