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

from monitor.commands.options import MAX_SEED, id_column, int_option, json_option
from monitor.commands.terminal import echo, plain_console
from monitor.errors import LabError

SIZES = ("full", "reduced")


def _int_list(value: str, flag: str, *, low: int, high: int) -> tuple[int, ...]:
    try:
        items = tuple(int(part) for part in value.split(",") if part.strip())
    except ValueError as exc:
        raise LabError(f"{flag} {value!r} must be a comma-separated list of integers") from exc
    if not items or any(not low <= i <= high for i in items):
        raise LabError(f"{flag} {value!r}: every value must be from {low} to {high}")
    return items


def _check_size_and_pool(size: str, pool: Path | None) -> Path:
    if size not in SIZES:
        raise LabError(f"--size {size!r} is not one of {', '.join(SIZES)}")
    if pool is None:
        raise LabError("--pool is required: the folder of a lab pool (train/, heldout/, tasks/)",
                       hint="e.g. --pool data/lab-pool-sample for the reduced lab")
    return pool


def _with_options(config: Any, *, families: str | None, seeds: str | None, stress: str | None = None) -> Any:
    """`config` with the command line's --families, --stress-families and --seeds, validated."""
    changes: dict[str, Any] = {}
    if families is not None:
        changes["families"] = tuple(f.strip() for f in families.split(",") if f.strip())
    if stress is not None:
        changes["stress_families"] = tuple(f.strip() for f in stress.split(",") if f.strip())
    if seeds is not None:
        changes["seeds"] = _int_list(seeds, "--seeds", low=0, high=MAX_SEED)
    return config.with_(**changes).validate()


def _config(size: str, shared: Path, pool: Path | None, families: str | None, stress: str | None,
            seeds: str | None) -> Any:
    from monitor.lab.config import race_full_config, race_reduced_config

    pool = _check_size_and_pool(size, pool)
    config = (race_reduced_config if size == "reduced" else race_full_config)(pool, shared)
    return _with_options(config, families=families, seeds=seeds, stress=stress)


def _print_summary(record: Any) -> None:
    from monitor.lab.records import race_rows

    table = Table(title="lab checkpoints (calib-v0)")
    id_column(table, "lineage")
    for col in ("step", "bytes", "L*", "L* oos", "bits/byte", "add acc", "add EM", "cloze acc"):
        table.add_column(col, justify="right")
    for role in ("primary", "stress"):
        for r in race_rows(record, role=role):
            if r["text"] != "calib":
                continue
            a, m = r["axes"], r["metrics"]
            table.add_row(f"{r['family']}-{r['size']}-s{r['seed']}" + (" (stress)" if role == "stress" else ""),
                          str(r["step"]), f"{r['bytes_seen']:,}", f"{a['lstar']:.3f}", f"{a['lstar_oos']:.3f}",
                          f"{a['bits_per_byte']:.3f}", f"{m['add-words']['acc']:.3f}",
                          f"{m['add-words']['exact_match']:.3f}", f"{m['cloze']['acc']:.3f}")
    plain_console().print(table)


def _is_v3(path: Path) -> bool:
    """Whether a lab.json or rows file is lab v3's (schema `lstar-lab/3` or `lstar-lab-rows/3`)."""
    from monitor.lab.report_v3 import is_v3, read_json

    if not path.exists():
        return False
    try:
        return is_v3(read_json(path)[0])
    except LabError:   # not readable as JSON: v2's reader says why, in its own words
        return False


def _report_v3(path: Path, out_dir: Path, *, resamples: int, as_json: bool) -> None:
    """Lab v3's verdict: the pre-registration's pin checked, then the pilot gate, the power, the
    primary comparison and the negative control (docs/lab-v3-preregistration.md)."""
    from monitor.lab.report_v3 import write_v3_report_from

    result = write_v3_report_from(path, out_dir, resamples=resamples)
    if as_json:
        print(json.dumps({k: result[k] for k in ("pilot_gate", "power", "primary", "negative_control",
                                                 "secondary", "design", "preregistration_sha256", "source")},
                         indent=1, allow_nan=False))
    else:
        echo(f"{result['primary']['statement']} (primary comparison; rule in docs/lab-v3-preregistration.md)")
        echo(f"lab report: {out_dir}")


def _pilot_gate(path: Path, *, as_json: bool) -> None:
    """`lstar lab report --pilot`: the pre-registered pilot gate of a v3 record, alone."""
    from monitor.lab.report_v3 import pilot_gate_from

    result = pilot_gate_from(path)
    gate = result["pilot_gate"]
    if as_json:
        print(json.dumps(result, indent=1, allow_nan=False))
    else:
        cover = gate["pilot"]
        echo(f"pilot gate: {'passed' if gate['passed'] else 'stopped'} ({gate.get('reason')})")
        echo(f"pilot families present: {', '.join(cover['present']) or 'none'}; missing: "
             f"{', '.join(cover['missing']) or 'none'} (seed {cover['seed']})")
        for axis, v in (gate.get("axes") or {}).items():
            if "crossing_error" in v:
                echo(f"  {axis}: crossing error {v['crossing_error']:.3f}, always above {v['always_above_error']:.3f}, "
                     f"shuffled {v['shuffled_mean_error']:.3f}: {'passes' if v['passed'] else 'fails'}")
    if not gate["passed"]:
        raise typer.Exit(1)


def _config_v3(size: str, shared: Path, pool: Path | None, families_dir: Path | None, families: str | None,
               seeds: str | None) -> Any:
    from monitor.lab.config import race_v3_config, race_v3_reduced_config

    pool = _check_size_and_pool(size, pool)
    config = (race_v3_reduced_config if size == "reduced" else race_v3_config)(pool, shared, families_dir=families_dir)
    return _with_options(config, families=families, seeds=seeds)


def _print_summary_v3(record: Any) -> None:
    from monitor.lab.records_v3 import PRIMARY_TEXT, race_rows_v3

    table = Table(title="lab v3 checkpoints (primary text: the pool's held-out split)")
    id_column(table, "lineage")
    for col in ("step", "bytes", "L*", "bits/byte", "add logp", "add acc", "cloze logp", "cloze acc"):
        table.add_column(col, justify="right")
    for r in race_rows_v3(record):
        if r["text"] != PRIMARY_TEXT:
            continue
        a, m = r["axes"], r["metrics"]
        table.add_row(f"{r['family']}-s{r['seed']}", str(r["step"]), f"{r['bytes_seen']:,}", f"{a['lstar']:.3f}",
                      f"{a['bits_per_byte']:.3f}", f"{m['add-words']['logp_correct']:.3f}",
                      f"{m['add-words']['acc']:.3f}", f"{m['cloze']['logp_correct']:.3f}", f"{m['cloze']['acc']:.3f}")
    plain_console().print(table)


# The flags lab train and lab run share (run3 and report take some of them).
OUT_OPTION = typer.Option(Path("state") / "lab", "--out", help="The lab folder (resumed when it exists).")
SHARED_OPTION = typer.Option(Path("../shared"), "--shared", help="The shared data folder.")
SIZE_OPTION = typer.Option("full", "--size", help="full (the measured lab) or reduced (the CI size).")
POOL_OPTION = typer.Option(None, "--pool", help="The lab pool folder (train/, heldout/, tasks/).")
FAMILIES_OPTION = typer.Option(None, "--families",
                               help="Comma-separated lossless tokenizer folders of shared/tokenizers (the race).")
STRESS_OPTION = typer.Option(None, "--stress-families",
                             help="Comma-separated tokenizers run as a labelled stress test (lossy ones allowed).")
SEEDS_OPTION = typer.Option(None, "--seeds", help="Comma-separated seeds, e.g. 0,1,2.")
WORKERS_OPTION = int_option(2, "--workers", low=1, high=64, help="Lineages trained at once (one core each).")


def register(app: typer.Typer) -> None:
    lab = typer.Typer(help="The emergence lab: train checkpoint families with different tokenizers, "
                           "score and label them, report how L* transfers thresholds.",
                      no_args_is_help=True)
    app.add_typer(lab, name="lab")

    for add_command in (_train_command, _run_command, _run3_command, _report_command):
        add_command(lab)

    tokenizers_app = typer.Typer(help="The tokenizer families of lab v3: build their folders, measure how "
                                      "distinct they are (docs/lab.md, \"Families v3\").", no_args_is_help=True)
    lab.add_typer(tokenizers_app, name="tokenizers")

    for add_command in (_tokenizers_build_command, _tokenizers_check_command):
        add_command(tokenizers_app)


def _train_command(lab: typer.Typer) -> None:
    @lab.command("train")
    def train(out: Path = OUT_OPTION, shared: Path = SHARED_OPTION, size: str = SIZE_OPTION,
              pool: Path = POOL_OPTION, families: str = FAMILIES_OPTION, stress: str = STRESS_OPTION,
              seeds: str = SEEDS_OPTION, workers: int = WORKERS_OPTION,
              as_json: bool = json_option("Print the checkpoints as JSON.")) -> None:
        """Train (or resume) every lineage and save its checkpoints; no scoring."""
        from monitor.lab.race import train_race

        config = _config(size, shared, pool, families, stress, seeds)
        lineages = train_race(config, out, workers=workers)
        if as_json:
            print(json.dumps(lineages, indent=1))
        else:
            for name, metas in lineages.items():
                steps = ", ".join(f"step{m['step']}" for m in metas)
                echo(f"{name}: {steps} under {out / name}")


def _run_command(lab: typer.Typer) -> None:
    @lab.command("run")
    def run(out: Path = OUT_OPTION, shared: Path = SHARED_OPTION, size: str = SIZE_OPTION,
            pool: Path = POOL_OPTION, families: str = FAMILIES_OPTION, stress: str = STRESS_OPTION,
            seeds: str = SEEDS_OPTION, workers: int = WORKERS_OPTION,
            as_json: bool = json_option("Print lab.json's checkpoints as JSON.")) -> None:
        """Train, score and label every lineage (lab v2), then write OUT/lab.json."""
        from monitor.lab.race import run_race

        config = _config(size, shared, pool, families, stress, seeds)
        record = run_race(config, out, workers=workers, progress=not as_json)
        if as_json:
            print(json.dumps([c.model_dump(mode="json") for c in record.checkpoints], indent=1))
        else:
            _print_summary(record)
            echo(f"lab record: {out / 'lab.json'}")


def _run3_command(lab: typer.Typer) -> None:
    @lab.command("run3")
    def run3(out: Path = typer.Option(Path("state") / "lab-v3", "--out", help="The lab folder (resumed when it exists)."),
             shared: Path = SHARED_OPTION, size: str = SIZE_OPTION, pool: Path = POOL_OPTION,
             families_dir: Path = typer.Option(None, "--families-dir",
                                               help="A folder of family folders (tokenizer.json + tokenizer_config.json "
                                                    "each); default: v2's six, starcoder2 and gpt-4o of SHARED/tokenizers."),
             families: str = typer.Option(None, "--families", help="Comma-separated families (default: all of them; "
                                                                   "with --families-dir, every kept one)."),
             seeds: str = SEEDS_OPTION, workers: int = WORKERS_OPTION,
             reuse: list[Path] = typer.Option(None, "--reuse", help="A v3 lab.json of an earlier sitting (another "
                                              "machine's): its lineages whose settings, inputs, tokenizer and data "
                                              "are this run's by content are reused. Repeatable."),
             as_json: bool = json_option("Print the race rows (race_rows_v3) as JSON.")) -> None:
        """Lab v3: train and score every (family, seed) lineage of one size, each on its own pinned data.

        Primary text: the pool's held-out split (in distribution); secondary: calib-v0. Tasks add logp_correct.

        With --families-dir the family set is checked first by the pre-registered rule: each family's
        round trip, then the boundary-Jaccard cut-off of data/lab-v3-preregistration.json in
        pre-registered order; kept and dropped families go into lab.json. Without --families the run
        races every kept family, and a full-size race with fewer than 20 kept is refused; with
        --families (the pilot) each one named must be kept.

        Writes OUT/lab.json (lstar-lab/3); a rerun resumes per lineage, and --reuse takes the
        lineages of a lab.json written elsewhere. --size reduced: the CI size.
        docs/lab.md, "Lab v3", has the details and the commands of the pilot and the race."""
        from monitor.lab.family_set import FamilySetRule
        from monitor.lab.race_v3 import run_race_v3
        from monitor.lab.records_v3 import race_rows_v3
        from monitor.lab.reuse_v3 import read_reusable_record

        config = _config_v3(size, shared, pool, families_dir, families, seeds)
        earlier = [read_reusable_record(path) for path in reuse or ()]
        rule = None if families_dir is None else FamilySetRule.preregistered(
            chosen=None if families is None else config.families, full_race=size == "full",
            at_most=len(config.families) if size == "reduced" else None)
        record = run_race_v3(config, out, workers=workers, progress=not as_json, family_set=rule, reuse=earlier)
        if as_json:
            print(json.dumps(race_rows_v3(record), indent=1, allow_nan=False))
        else:
            _print_summary_v3(record)
            echo(f"lab record: {out / 'lab.json'}")


def _report_command(lab: typer.Typer) -> None:
    @lab.command("report")
    def report(lab_dir: Path = typer.Option(Path("state") / "lab", "--lab", help="The lab folder (or its lab.json)."),
               rows: Path = typer.Option(None, "--rows", help="Race from a JSON file of race rows instead of a lab "
                                                              "record (docs/lab.md lists the keys)."),
               out: Path = typer.Option(None, "--out", help="Report folder (default: LAB/report, or next to --rows)."),
               resamples: int = int_option(200, "--resamples", low=20, high=100_000,
                                           help="Two-stage refit-bootstrap resamples."),
               seed: int = int_option(0, "--seed", low=0, high=MAX_SEED, help="Seed of the bootstrap and permutations."),
               axes: str = typer.Option(None, "--axes", help="Comma-separated axes to race (default: all; L* always)."),
               pilot: Path = typer.Option(None, "--pilot",
                                          help="Lab v3: judge only the pilot gate of this lab.json (or lab folder): "
                                               "a pilot-only run, before the race. Exit 0 passed, 1 stopped."),
               as_json: bool = json_option("Print the report's numbers as JSON.")) -> None:
        """Race the progress axes and write the lab report (Markdown, HTML with plots, lab-report.json).

        A lab v3 record (schema lstar-lab/3) or v3 rows file (lstar-lab-rows/3) gets v3's report
        instead: its pre-registration pin is checked, then the pilot gate (on the pre-registered
        pilot's families at seed 0), the power of the design as run, the primary verdict by the
        pre-registered rule and the negative control (docs/lab-v3-preregistration.md); --json
        prints them. --pilot OUT/lab.json gives the pilot gate alone and writes nothing."""
        from monitor.lab.analysis import AXES, RaceConfig
        from monitor.lab.records import LAB_FILE
        from monitor.lab.report import write_lab_report

        if pilot is not None:
            _pilot_gate(pilot if pilot.suffix == ".json" else pilot / LAB_FILE, as_json=as_json)
            return
        lab_json = lab_dir if lab_dir.suffix == ".json" else lab_dir / LAB_FILE
        out_dir = out or ((rows.parent / "report") if rows is not None else lab_json.parent / "report")
        if _is_v3(rows if rows is not None else lab_json):
            _report_v3(rows if rows is not None else lab_json, out_dir, resamples=resamples, as_json=as_json)
            return
        chosen = tuple(AXES) if axes is None else tuple(a.strip() for a in axes.split(",") if a.strip())
        config = RaceConfig(resamples=resamples, seed=seed, axes=chosen)
        config.check()
        result = write_lab_report(lab_json, out_dir, config=config, rows_file=rows)
        if as_json:
            print(json.dumps(result, indent=1, allow_nan=False))
        else:
            echo(f"{result['primary']['statement']} (primary comparison; rule in docs/lab.md)")
            echo(f"lab report: {out_dir}")


def _tokenizers_build_command(tokenizers_app: typer.Typer) -> None:
    @tokenizers_app.command("build")
    def tokenizers_build(
            out: Path = typer.Argument(..., help="Folder to write one tokenizer folder per family into."),
            pool: Path = typer.Option(..., "--pool", help="The lab pool; the trained families learn from its train split."),
            shared: Path = SHARED_OPTION,
            families: str = typer.Option(None, "--families", help="Comma-separated subset of the v3 candidates "
                                                                  "(default: all, in the pre-registered order)."),
            mistral_data: Path = typer.Option(None, "--mistral-data",
                                              help="mistral-common's data folder (default: the installed package's)."),
            mistral_wheel: Path = typer.Option(None, "--mistral-wheel",
                                               help="Read the mistral vocabularies from the pinned wheel file "
                                                    "(mistral_common-1.13.1-py3-none-any.whl, sha256 checked) "
                                                    "instead of an installed mistral-common."),
            as_json: bool = json_option("Print each family's provenance as JSON.")) -> None:
        """Write OUT/<family>/ (tokenizer.json, tokenizer_config.json, provenance.json) for every v3
        candidate: real tokenizers copied from the shared folder, mistral-common's vocabularies converted,
        byte-level BPE tokenizers trained on the pool, and pruned-merge variants. A rebuild
        from the same inputs writes the same bytes. Without mistral-common installed (it is only in the
        `lab` extra), --mistral-wheel reads its two vocabulary files from the pinned wheel itself."""
        from monitor.lab.families import build_lab_families

        names = None if families is None else [f.strip() for f in families.split(",") if f.strip()]
        built = build_lab_families(out, pool=pool, shared=shared, names=names, mistral_data=mistral_data,
                                   mistral_wheel=mistral_wheel)
        if as_json:
            print(json.dumps([s.provenance for s in built], indent=1))
        else:
            for s in built:
                echo(f"{s.name} ({s.kind}): {s.folder}")


def _tokenizers_check_command(tokenizers_app: typer.Typer) -> None:
    @tokenizers_app.command("check")
    def tokenizers_check(
            folder: Path = typer.Argument(..., help="The folder `lstar lab tokenizers build` wrote."),
            pool: Path = typer.Option(..., "--pool", help="The lab pool (its train chunks and held-out text are "
                                                          "round-tripped)."),
            shared: Path = SHARED_OPTION,
            cutoff: float = typer.Option(0.96, "--cutoff", help="Boundary Jaccard at or above which a family "
                                                               "counts as a near-duplicate of one kept before it."),
            out: Path = typer.Option(None, "--out", help="Also write the result as JSON to this file."),
            as_json: bool = json_option("Print the result as JSON.")) -> None:
        """Refuse any family that fails the decode round trip (on the pool's text and calib-v0; a document
        with a special-token literal that fails is excluded for all), then measure the token-boundary
        Jaccard between every pair on calib-v0 and keep families greedily in the pre-registered order,
        dropping any whose Jaccard with a kept one reaches the cut-off."""
        from monitor.files import atomic_write_text
        from monitor.lab.families import check_family_set

        result = check_family_set(folder, pool=pool, shared=shared, cutoff=cutoff)
        if out is not None:
            atomic_write_text(out, json.dumps(result, indent=1) + "\n")
        if as_json:
            print(json.dumps(result, indent=1))
        else:
            echo(f"round trip: every family lossless; excluded documents: {result['round_trip']['excluded'] or 'none'}")
            for name, reason in result["dropped"].items():
                echo(f"dropped {name}: {reason}")
            echo(f"{len(result['kept'])} distinct families at cut-off {cutoff}: {', '.join(result['kept'])}")
