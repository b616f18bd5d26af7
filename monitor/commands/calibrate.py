"""`lstar calibrate CAMPAIGN.yaml`: score and evaluate reference checkpoints, fit the task curves.

The library (`monitor.calibrate`) does the work; this prints its progress and where the
curves and the report are. Rerunning a campaign resumes it: finished jobs are not run again.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from monitor.commands.options import json_option
from monitor.commands.terminal import plain_console
from monitor.environment import quiet_hub_progress
from monitor.errors import CampaignError
from monitor.escape import plain_text

STAGES = {"score": "scoring", "eval": "evaluating", "import": "importing results", "fit": "fitting curves"}


def _summary(result: Any) -> dict[str, Any]:
    outputs = result.outputs
    return {"db": str(result.db), "scored": result.ran_scores, "evaluated": result.ran_evals,
            "imported_labels": result.imported, "skipped_results": result.skipped_results,
            "failures": [vars(f) for f in result.failures],
            "curves": [] if outputs is None else
            [{"task": c.task, "metric": c.metric, "path": str(c.path) if c.path else None,
              "curve_id": c.curve.curve_id if c.curve else None, "error": c.error} for c in outputs.curves],
            "report": None if outputs is None else {"markdown": str(outputs.report_md),
                                                    "json": str(outputs.report_json)},
            "removed": [] if outputs is None else [str(p) for p in outputs.cleanup.removed],
            "kept": [] if outputs is None else [{"path": str(p), "reason": why} for p, why in outputs.cleanup.kept]}


class StageBars:
    """`run_campaign`'s `on_progress`: a bar per stage on stderr, started at the first event (so
    an error found before any work prints only its line). What a bar is at names a checkpoint
    or a task of the campaign's files: it is shown on one line, as it is (`plain_text`, on the
    literal console)."""

    def __init__(self, show: bool) -> None:
        self.progress = Progress(TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[what]}", markup=False), TimeElapsedColumn(),
                                 console=plain_console(stderr=True), disable=not show)
        self.bars: dict[str, Any] = {}

    def __call__(self, stage: str, done: int, total: int, what: str) -> None:
        if not self.bars:
            self.progress.start()
        if stage not in self.bars:
            self.bars[stage] = self.progress.add_task(STAGES.get(stage, stage), total=total, what="")
        self.progress.update(self.bars[stage], completed=done, total=total, what=plain_text(what))

    def stop(self) -> None:
        if self.bars:
            self.progress.stop()


def register(app: typer.Typer) -> None:
    @app.command("calibrate")
    def calibrate(
        campaign_file: Path = typer.Argument(..., help="Campaign file (YAML): checkpoints, tasks, corpus, fit."),
        as_json: bool = json_option("Print a JSON summary instead of tables."),
        quiet: bool = typer.Option(False, "--quiet", help="No progress bars (the Hub client's download bars included)."),
        output: Path | None = typer.Option(None, "--output", help="Write to this folder instead of the "
                                           "file's `output` (which must stay inside the file's folder)."),
    ) -> None:
        """Score and evaluate a campaign's checkpoints, then fit, validate and write its task curves.

        Resumable: a campaign killed mid-way picks up where it stopped when run again."""
        from monitor.calibrate import load_campaign, run_campaign
        from monitor.curves import curve_warnings

        show = not (quiet or as_json)
        if not show:  # the Hub client's download bars too, not only ours
            quiet_hub_progress()
        campaign = load_campaign(campaign_file, output=output)
        bars = StageBars(show)
        try:
            result = run_campaign(campaign, on_progress=bars)
        finally:
            bars.stop()
        if as_json:
            print(json.dumps(_summary(result), indent=2))
        out = plain_console()
        if result.failures:
            if not as_json:
                for f in result.failures:
                    out.print(f"failed {f.kind} {f.checkpoint}{' · ' + f.task if f.task else ''}: {f.error}",
                              markup=False, highlight=False, soft_wrap=True)
            raise CampaignError(f"{len(result.failures)} job(s) of campaign {campaign.name} failed; no curves "
                                "were fitted", hint=f"fix them and run `lstar calibrate {campaign_file}` again "
                                "(finished jobs are kept)")
        outputs = result.outputs
        assert outputs is not None
        if not as_json:
            for line in result.skipped_results:
                out.print(f"skipped result {line}: not a checkpoint of the campaign", markup=False,
                          highlight=False, soft_wrap=True)
            table = Table(title=f"campaign {campaign.name}: {len(result.plan.checkpoints)} checkpoints, "
                                f"{len(result.ran_scores)} scored and {len(result.ran_evals)} evaluated now",
                          title_justify="left")
            for name in ("task", "metric", "η̂ [interval]", "threshold", "curve"):
                table.add_column(name, overflow="fold")
            for c in outputs.curves:
                if c.curve is None:
                    table.add_row(c.task, c.metric, "—", "not fitted", c.error or "")
                    continue
                thr = c.curve.threshold
                fmt = (lambda v: "—" if v is None else f"{v:.4g}")
                unresolved = any(w.unresolved for w in curve_warnings(c.curve))
                table.add_row(c.task, c.metric, f"{fmt(thr.estimate)} [{fmt(thr.lower)}, {fmt(thr.upper)}]",
                              f"{thr.status}{' (unresolved)' if unresolved else ''}", str(c.path))
            out.print(table)
            for c in outputs.curves:
                for w in curve_warnings(c.curve) if c.curve is not None else []:
                    out.print(f"warning: {c.task} · {c.metric}: {w.message}", markup=False, highlight=False,
                              soft_wrap=True)
            for path in outputs.cleanup.removed:
                out.print(f"removed {path}: an earlier run of this campaign wrote it and this run did not",
                          markup=False, highlight=False, soft_wrap=True)
            for path, why in outputs.cleanup.kept:
                out.print(f"kept {path}: {why}", markup=False, highlight=False, soft_wrap=True)
            out.print(f"report: {outputs.report_md} and {outputs.report_json}", markup=False, soft_wrap=True)
            out.print(f"state: {result.db}", markup=False, soft_wrap=True)
        if outputs.failed:
            raise CampaignError(f"{len(outputs.failed)} curve(s) of campaign {campaign.name} could not be fitted: "
                                + "; ".join(f"{c.task} · {c.metric}: {c.error}" for c in outputs.failed[:3]),
                                hint=f"see {outputs.report_md}")
