"""`lstar lab train|run|report`: the emergence lab (trained checkpoint families, their scores and labels).

The lab's modules (torch, transformers) are imported inside the commands so `lstar --help`
does not pay for them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from monitor.commands.options import MAX_SEED, id_column, int_option
from monitor.commands.terminal import plain_console
from monitor.errors import LabError
from monitor.lab.records import LAB_FILE

SIZES = ("full", "reduced")


def _int_list(value: str, flag: str, *, low: int, high: int) -> tuple[int, ...]:
    try:
        items = tuple(int(part) for part in value.split(",") if part.strip())
    except ValueError as exc:
        raise LabError(f"{flag} {value!r} must be a comma-separated list of integers") from exc
    if not items or any(not low <= i <= high for i in items):
        raise LabError(f"{flag} {value!r}: every value must be from {low} to {high}")
    return items


def _config(size: str, shared: Path, families: str | None, seeds: str | None, byte_budget: int | None,
            score_every: int | None) -> Any:
    from monitor.lab.config import LabConfig, reduced_config

    if size not in SIZES:
        raise LabError(f"--size {size!r} is not one of {', '.join(SIZES)}")
    paths = {"tokenizers_dir": shared / "tokenizers", "text_corpus": shared / "corpus" / "calib-v0-alt",
             "calib_corpus": shared / "corpus" / "calib-v0", "cloze_task": shared / "tasks" / "cloze-v0.jsonl"}
    config = reduced_config(**paths) if size == "reduced" else LabConfig(**paths)
    changes: dict[str, Any] = {}
    if families is not None:
        changes["families"] = tuple(f.strip() for f in families.split(",") if f.strip())
    if seeds is not None:
        changes["seeds"] = _int_list(seeds, "--seeds", low=0, high=MAX_SEED)
    if byte_budget is not None:
        changes["byte_budget"] = byte_budget
    if score_every is not None:
        changes["score_every"] = score_every
    return config.with_(**changes).validate()


def _print_summary(record: Any) -> None:
    from monitor.lab.pipeline import lab_summary

    table = Table(title="lab checkpoints")
    id_column(table, "lineage")
    for col in ("step", "bytes", "L*", "CE", "bits/byte", "add acc", "add EM", "cloze acc"):
        table.add_column(col, justify="right")
    fmt = lambda v: "—" if v is None else f"{v:.3f}"  # noqa: E731
    for r in lab_summary(record):
        table.add_row(r["lineage"], str(r["step"]), f"{r['bytes']:,}", fmt(r["lstar"]), fmt(r["ce"]),
                      fmt(r["bpb"]), fmt(r["add_acc"]), fmt(r["add_em"]), fmt(r["cloze_acc"]))
    plain_console().print(table)


def register(app: typer.Typer) -> None:
    lab = typer.Typer(help="The emergence lab: train checkpoint families with different tokenizers, "
                           "score and label them, report how L* transfers thresholds.",
                      no_args_is_help=True)
    app.add_typer(lab, name="lab")

    out_option = typer.Option(Path("state") / "lab", "--out", help="The lab folder (resumed when it exists).")
    shared_option = typer.Option(Path("../shared"), "--shared", help="The shared data folder.")
    size_option = typer.Option("full", "--size", help="full (the measured lab) or reduced (the CI size).")
    families_option = typer.Option(None, "--families", help="Comma-separated tokenizer folders of shared/tokenizers.")
    seeds_option = typer.Option(None, "--seeds", help="Comma-separated seeds, e.g. 0,1,2.")
    budget_option = int_option(None, "--byte-budget", low=10_000, high=1 << 30,
                               help="Training bytes per lineage.")
    score_every_option = int_option(None, "--score-every", low=1, high=100,
                                    help="Score every k-th calib-v0 document.")
    workers_option = int_option(2, "--workers", low=1, high=64, help="Lineages trained at once (one core each).")

    @lab.command("train")
    def train(out: Path = out_option, shared: Path = shared_option, size: str = size_option,
              families: str = families_option, seeds: str = seeds_option, byte_budget: int = budget_option,
              workers: int = workers_option,
              as_json: bool = typer.Option(False, "--json", help="Print the checkpoints as JSON.")) -> None:
        """Train (or resume) every lineage and save its checkpoints; no scoring."""
        from monitor.lab.pipeline import train_lab

        config = _config(size, shared, families, seeds, byte_budget, None)
        lineages = train_lab(config, out, workers=workers, progress=not as_json)
        if as_json:
            print(json.dumps(lineages, indent=1))
        else:
            for name, steps in lineages.items():
                print(f"{name}: {', '.join(f'step{s}' for s in steps)} under {out / name}")

    @lab.command("run")
    def run(out: Path = out_option, shared: Path = shared_option, size: str = size_option,
            families: str = families_option, seeds: str = seeds_option, byte_budget: int = budget_option,
            score_every: int = score_every_option, workers: int = workers_option,
            as_json: bool = typer.Option(False, "--json", help="Print lab.json's checkpoints as JSON.")) -> None:
        """Train, score and label every lineage, then write OUT/lab.json."""
        from monitor.lab.pipeline import run_lab

        config = _config(size, shared, families, seeds, byte_budget, score_every)
        record = run_lab(config, out, workers=workers, progress=not as_json)
        if as_json:
            print(json.dumps([c.model_dump(mode="json") for c in record.checkpoints], indent=1))
        else:
            _print_summary(record)
            print(f"lab record: {out / 'lab.json'}")

    @lab.command("report")
    def report(lab_dir: Path = typer.Option(Path("state") / "lab", "--lab", help="The lab folder (or its lab.json)."),
               rows: Path = typer.Option(None, "--rows", help="Race from a JSON file of race rows instead of a lab "
                                                              "record (docs/lab.md lists the keys)."),
               out: Path = typer.Option(None, "--out", help="Report folder (default: LAB/report, or next to --rows)."),
               resamples: int = int_option(200, "--resamples", low=20, high=100_000,
                                           help="Two-stage refit-bootstrap resamples."),
               seed: int = int_option(0, "--seed", low=0, high=MAX_SEED, help="Seed of the bootstrap and permutations."),
               axes: str = typer.Option(None, "--axes", help="Comma-separated axes to race (default: all; L* always)."),
               as_json: bool = typer.Option(False, "--json", help="Print the report's numbers as JSON.")) -> None:
        """Race the progress axes and write the lab report (Markdown, HTML with plots, lab-report.json)."""
        from monitor.lab.analysis import RaceConfig
        from monitor.lab.report import write_lab_report

        from monitor.lab.analysis import AXES

        chosen = tuple(AXES) if axes is None else tuple(a.strip() for a in axes.split(",") if a.strip())
        config = RaceConfig(resamples=resamples, seed=seed, axes=chosen)
        config.check()
        lab_json = lab_dir if lab_dir.suffix == ".json" else lab_dir / LAB_FILE
        out_dir = out or ((rows.parent / "report") if rows is not None else lab_json.parent / "report")
        result = write_lab_report(lab_json, out_dir, config=config, rows_file=rows)
        if as_json:
            print(json.dumps(result, indent=1, allow_nan=False))
        else:
            print(f"{result['primary']['statement']} (primary comparison; rule in docs/lab.md)")
            print(f"lab report: {out_dir}")
