"""`lstar stress`: the stress tests that say where L* stops being a portable progress coordinate."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from monitor.commands.options import DB_OPTION, STATE_OPTION, db_file
from monitor.constants import DEFAULT_CORPUS_DIR

# Paragraphs without line breaks: typer keeps a single line break of a later paragraph as a new line.
_HELP = (
    'Run stress tests on checkpoints: tokenization perturbations, calibration registers, task '
    'formats.'
    '\n\n'
    'Give the checkpoints as --model REF (repeat it; a local folder or builtin:smollm2-135m) or '
    'as --lab-lineage DIR (every step* folder under DIR, in step order). The tokenization test '
    'rescores the corpus under a whitespace-collapsed normalisation, seeded BPE-dropout at '
    '--dropout-rates and a vocabulary without its last --prune-fraction of merges, and reports '
    'CE, CE_uni and L* under each; with two or more checkpoints it fits L*_perturbed = alpha * L* '
    '+ beta. The registers test scores every checkpoint on --corpus and on each --register corpus '
    "(Kendall tau of the checkpoints' L* between registers; with --curve-file, the curve's "
    'threshold refitted per register). The task_format test rescores --task-file under equivalent '
    'surface forms (format instability and the accuracy bound it implies). Without --tests, every '
    'test whose inputs are given runs. --json prints the lstar-stress/1 document; --save (or --db) also '
    'stores it. See docs/stress.md.'
)


def default_tests(registers: list[Path] | None, task_file: Path | None) -> list[str]:
    """The tests that can run on what was given: tokenization always, registers with a
    --register corpus, task_format with a --task-file."""
    return ["tokenization", *(["registers"] if registers else []), *(["task_format"] if task_file else [])]


def _step_number(path: Path) -> int:
    digits = path.name.removeprefix("step")
    return int(digits) if digits.isdigit() else -1


def lineage_checkpoints(lineage: Path, tokenizer: Path | None, steps: str | None = None):
    """The step* folders of a lab lineage, in step order, as stress checkpoints (only the
    steps named in `steps`, comma-separated, when given)."""
    from monitor.errors import SpecError
    from monitor.stress.subject import StressCheckpoint

    if not lineage.is_dir():
        raise SpecError(f"lab lineage {lineage} is not a folder", hint="pass a folder holding step* checkpoints")
    found = sorted((p for p in lineage.iterdir() if p.is_dir() and _step_number(p) >= 0), key=_step_number)
    if not found:
        raise SpecError(f"lab lineage {lineage} has no step<N> folders", hint="pass a lab lineage folder")
    if steps:
        # by number: "10", "010" and "step10" all name the folder step010
        names = [s.strip().removeprefix("step") for s in steps.split(",") if s.strip()]
        wanted = {int(n) if n.isdigit() else n for n in names}
        missing = sorted(str(w) for w in wanted - {_step_number(p) for p in found})
        if missing:
            raise SpecError(f"lab lineage {lineage} has no step(s) {', '.join(missing)}",
                            hint="available: " + ", ".join(p.name for p in found))
        found = [p for p in found if _step_number(p) in wanted]
    return tuple(StressCheckpoint(ref=str(p), label=p.name, tokenizer_dir=tokenizer) for p in found)


def model_checkpoints(models: list[str], tokenizer: Path | None):
    """--model refs as stress checkpoints, labelled by folder name (or the ref itself); refs
    whose folder names coincide (a/final, b/final) keep their full ref as the label."""
    from monitor.stress.subject import StressCheckpoint

    short = [Path(m).name if Path(m).is_dir() else m for m in models]
    labels = [s if short.count(s) == 1 else m for s, m in zip(short, models)]
    return tuple(StressCheckpoint(ref=m, label=label, tokenizer_dir=tokenizer) for m, label in zip(models, labels))


def _summary_lines(document: dict) -> list[str]:
    lines = []
    section = document["sections"].get("tokenization")
    if section:
        lines.append("tokenization (nats/token): variant  CE  CE_uni  L*")
        for checkpoint in section["checkpoints"]:
            lines.append(f"  {checkpoint['label']}")
            for v in checkpoint["variants"]:
                lines.append(f"    {v['name']:<24} {v['ce']:.4f} {v['ce_uni']:.4f} {v['lstar']:+.4f}")
        for fit in section["fits"]:
            rv = "n/a" if fit["residual_variance"] is None else f"{fit['residual_variance']:.3g}"
            lines.append(f"  fit {fit['variant']}: alpha {fit['alpha']:.3f}, beta {fit['beta']:+.3f}, "
                         f"residual variance {rv} (n={fit['n']})")
        lines.extend(f"  note: {n}" for n in section["notes"])
    for name in document["sections"]:
        if name != "tokenization":
            lines.append(f"{name}: see --json")
    return lines


def print_summary(document: dict) -> None:
    """The short table, one `echo` per line: labels and notes (folder names, stored text) have
    their control characters and line breaks shown as escapes."""
    from monitor.commands.terminal import echo

    for line in _summary_lines(document):
        echo(line)


def register(app: typer.Typer) -> None:
    @app.command("stress", help=_HELP)
    def stress(
        model: list[str] = typer.Option(None, "--model", help="A checkpoint to stress (repeat for several)."),
        lab_lineage: Path | None = typer.Option(None, "--lab-lineage",
                                                help="A lab lineage folder: its step* checkpoints, in order."),
        steps: str | None = typer.Option(None, "--steps",
                                         help="With --lab-lineage: only these steps, e.g. 144,431,861."),
        tokenizer: Path | None = typer.Option(None, "--tokenizer",
                                              help="Tokenizer folder for every checkpoint (default: each one's own)."),
        corpus: Path = typer.Option(DEFAULT_CORPUS_DIR, "--corpus", help="The primary calibration corpus folder."),
        tests: str | None = typer.Option(None, "--tests",
                                         help="Comma-separated tests (default: every registered one)."),
        max_documents: int | None = typer.Option(None, "--max-documents", min=1,
                                                 help="Score only the first N documents."),
        seed: int = typer.Option(0, "--seed", help="Seed of the BPE-dropout sampling."),
        dropout_rates: str = typer.Option("0.05,0.1", "--dropout-rates", help="BPE-dropout rates, comma-separated."),
        prune_fraction: float = typer.Option(0.1, "--prune-fraction",
                                             help="Fraction of merges (the last ones) pruned from the vocabulary."),
        device: str = typer.Option("auto", "--device", help="auto, cpu or cuda[:N]."),
        register_dirs: list[Path] = typer.Option(None, "--register",
                                                 help="A register corpus folder for the registers test (repeat "
                                                      "for several; built by `lstar corpus build-registers`)."),
        task_file: Path | None = typer.Option(None, "--task-file",
                                              help="A multiple-choice task file for the task_format test."),
        curve_file: Path | None = typer.Option(None, "--curve-file",
                                               help="A curve file whose threshold the registers test refits "
                                                    "on each register (its id becomes --curve)."),
        curve: str | None = typer.Option(None, "--curve", help="The curve id these results qualify."),
        save: bool = typer.Option(False, "--save", help="Store the document in the state's database "
                                  "(STATE/lstar.duckdb, or --db), where policy check, curves show, alerts "
                                  "and reports read its flags. Given --db, it is stored there."),
        state: Path = STATE_OPTION,
        db: Path | None = DB_OPTION,
        as_json: bool = typer.Option(False, "--json", help="Print the lstar-stress/1 document."),
    ) -> None:
        from monitor.errors import SpecError
        from monitor.stress.runner import parse_tests, run_stress
        from monitor.stress.subject import StressOptions, StressSubject

        if bool(model) == (lab_lineage is not None):
            raise SpecError("give either --model (one or more) or --lab-lineage",
                            hint="e.g. --model builtin:smollm2-135m, or --lab-lineage DIR")
        try:
            rates = tuple(float(r) for r in dropout_rates.split(",") if r.strip())
        except ValueError:
            raise SpecError(f"--dropout-rates {dropout_rates!r} is not a list of numbers",
                            hint="e.g. --dropout-rates 0.05,0.1") from None
        if curve_file is not None:
            from monitor.curves.artifact import load_curve

            file_curve = load_curve(curve_file).curve_id
            if curve is not None and curve != file_curve:
                raise SpecError(f"--curve {curve} is not the curve in --curve-file {curve_file} ({file_curve})",
                                hint="drop --curve: the curve file names its curve")
            curve = file_curve
        if lab_lineage is not None:
            subject = StressSubject(kind="lab", name=lab_lineage.name,
                                    checkpoints=lineage_checkpoints(lab_lineage, tokenizer, steps),
                                    corpus=corpus, curve_id=curve)
        else:
            checkpoints = model_checkpoints(model, tokenizer)
            subject = StressSubject(kind="model", name=", ".join(c.label for c in checkpoints),
                                    checkpoints=checkpoints, corpus=corpus, curve_id=curve)
        options = StressOptions(seed=seed, max_documents=max_documents, dropout_rates=rates,
                                register_corpora=tuple(register_dirs or ()), task_file=task_file,
                                curve_path=curve_file,
                                extra={"prune_fraction": prune_fraction, "device": device})
        chosen = parse_tests(tests) if tests and tests.strip() else default_tests(register_dirs, task_file)
        document = run_stress(subject, options, chosen)
        if save or db is not None:
            from monitor.store import Store
            from monitor.stress.storage import save_stress_report

            with Store.open(db_file(state, db)) as store:
                document["stored_id"] = save_stress_report(store, document)
        if as_json:
            print(json.dumps(document, indent=2))
            return
        print_summary(document)
