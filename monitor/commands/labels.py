"""`lstar labels import`: published training histories as a labels/history CSV.

The importers (`monitor.curves.importers`) are imported inside the command, so that `lstar
--help` does not pay for them.
"""

from __future__ import annotations

from pathlib import Path

import typer

from monitor.commands.options import OptionError
from monitor.commands.terminal import echo

FORMATS = ("olmo-ladder", "pythia", "obsscaling")

_IMPORT_HELP = """Turn a published evaluation table into a history file: the labels CSV that
`lstar curves fit --labels` reads, one row per (checkpoint, task, metric), each with its
lineage (training run), step, tokens and FLOPs where known.

olmo-ladder (SOURCE: olmo-ladder/ladder-runs, or one run's CSV): lineage = file stem, family =
model size, raw_ce = the --corpus validation cross-entropy, task_loss = the task's bits per
byte; value = the paper's accuracy column (rc format, length-normalised; MMLU = plain mean of
its 4 categories). Default lineages: the ladder runs and peteish7_eval_full.

pythia (SOURCE: pythia/pythia-v1-evals.csv): lineage = model, family = size, raw_ce =
ln(LAMBADA perplexity) in nats, tokens = step x 2,097,152, FLOPs = 6 N D; MMLU = mean of its
subjects. --shots 0 (default) or 5.

obsscaling (SOURCE: obsscaling/base_llm_benchmark_eval.csv): one checkpoint per model, family
from the file, params, tokens and FLOPs from its columns.

The joins in full: docs/guide.md, "History files"."""
# one line per paragraph: the help renderer wraps paragraphs itself
IMPORT_HELP = "\n\n".join(" ".join(p.split()) for p in _IMPORT_HELP.split("\n\n"))


def _split(values: list[str] | None) -> list[str] | None:
    if not values:
        return None
    return [part.strip() for value in values for part in value.split(",") if part.strip()]


def register(app: typer.Typer) -> None:
    labels_app = typer.Typer(help="Labels files: import published training histories.", no_args_is_help=True)

    @labels_app.command("import", help=IMPORT_HELP)
    def import_(
        source: Path = typer.Argument(..., help="The table (or, for olmo-ladder, the folder of runs)."),
        format: str = typer.Option(..., "--format", help="olmo-ladder, pythia or obsscaling."),
        out: Path = typer.Option(..., "--out", "-o", help="Where to write the history CSV."),
        corpus: str = typer.Option("c4_en", "--corpus",
                                   help="olmo-ladder: the validation corpus of the raw_ce axis (c4_en, pile, "
                                        "wikitext_103, dolma_books, ...)."),
        shots: int = typer.Option(0, "--shots", help="pythia: 0 (zero-shot) or 5 (five-shot)."),
        lineages: list[str] = typer.Option(None, "--lineages",
                                           help="Globs over lineage names (comma-separated or repeated), "
                                                "e.g. '1B-*,peteish7_eval_full'."),
        tasks: list[str] = typer.Option(None, "--tasks", help="Tasks to include (comma-separated or repeated)."),
    ) -> None:
        from monitor.curves.importers import (import_obsscaling, import_olmo_ladder, import_pythia,
                                              write_labels_csv)

        if format not in FORMATS:
            raise OptionError(f"--format must be one of {', '.join(FORMATS)}, not {format!r}")
        globs, chosen = _split(lineages), _split(tasks)
        if format == "olmo-ladder":
            labels = import_olmo_ladder(source, corpus=corpus, lineages=globs, tasks=chosen)
        elif format == "pythia":
            labels = import_pythia(source, shots=shots, lineages=globs, tasks=chosen)
        else:
            labels = import_obsscaling(source, lineages=globs, tasks=chosen)
        write_labels_csv(labels, out)
        echo(f"wrote {out}: {len({x.lineage for x in labels})} lineages, "
             f"{len({x.checkpoint for x in labels})} checkpoints, {len({x.task for x in labels})} tasks, "
             f"{len(labels)} rows")

    app.add_typer(labels_app, name="labels")
