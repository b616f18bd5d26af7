"""`lstar corpus info|verify|build`."""

from __future__ import annotations

from typing import TYPE_CHECKING

import json
import tempfile
from pathlib import Path

import typer
from rich.table import Table

from monitor.commands.options import JSON_OPTION, json_option
from monitor.commands.terminal import echo, plain_console

if TYPE_CHECKING:
    from monitor.scoring import Corpus


def _summary(corpus: Corpus) -> dict:
    slices: dict[str, dict] = {}
    for doc in corpus.documents:
        entry = slices.setdefault(doc.slice, {"documents": 0, "bytes": 0, "sources": []})
        entry["documents"] += 1
        entry["bytes"] += doc.n_bytes
        if doc.source not in entry["sources"]:
            entry["sources"].append(doc.source)
    return {"name": corpus.name, "version": corpus.version, "path": str(corpus.path),
            "sha256": corpus.sha256, "documents": len(corpus.documents),
            "bytes": corpus.n_bytes, "slices": slices}


def _one_line(corpus: Corpus) -> str:
    return (f"{corpus.name} {corpus.version}: {len(corpus.documents):,} documents, "
            f"{corpus.n_bytes:,} bytes, sha256 {corpus.sha256}")


def register(app: typer.Typer) -> None:
    corpus_app = typer.Typer(help="Pinned corpora: inspect, verify, build new versions.",
                             no_args_is_help=True)

    for add_command in (_info_command, _verify_command, _build_command, _build_pool_command,
                        _build_registers_command):
        add_command(corpus_app)

    app.add_typer(corpus_app, name="corpus")


def _info_command(corpus_app: typer.Typer) -> None:
    @corpus_app.command("info")
    def info(path: Path = typer.Argument(..., help="Corpus folder (documents.jsonl + manifest.json)."),
             as_json: bool = JSON_OPTION) -> None:
        """Name, version, pin, size and slices of a corpus (verified on load)."""
        from monitor.scoring import load_corpus

        data = _summary(load_corpus(path))
        if as_json:
            print(json.dumps(data, indent=2))
            return
        table = Table(title=f"{data['name']} {data['version']}  ({data['path']})",
                      caption=f"sha256 {data['sha256']}")
        table.add_column("slice")
        table.add_column("documents", justify="right")
        table.add_column("bytes", justify="right")
        table.add_column("sources")
        for name, entry in data["slices"].items():
            table.add_row(name, f"{entry['documents']:,}", f"{entry['bytes']:,}",
                          ", ".join(entry["sources"]))
        table.add_section()
        table.add_row("total", f"{data['documents']:,}", f"{data['bytes']:,}", "")
        plain_console().print(table)


def _verify_command(corpus_app: typer.Typer) -> None:
    @corpus_app.command("verify")
    def verify(path: Path = typer.Argument(..., help="Corpus folder.")) -> None:
        """Check every document hash, the order and the manifest pin; exit non-zero on any difference."""
        from monitor.scoring import load_corpus

        corpus = load_corpus(path)
        echo(f"OK {_one_line(corpus)}")


def _build_command(corpus_app: typer.Typer) -> None:
    @corpus_app.command("build")
    def build(src_dir: Path = typer.Argument(..., help="Folder of .txt/.md/.py/.jsonl files."),
              out_dir: Path = typer.Argument(..., help="New corpus folder (must not exist or be empty)."),
              slice_rules: Path = typer.Option(
                  ..., "--slice-rules", help="YAML/JSON file: name, version, rules of glob -> slice."),
              ) -> None:
        """Build a new corpus version (deterministic: the same inputs give the same manifest)."""
        from monitor.scoring import build_corpus

        corpus = build_corpus(src_dir, out_dir, slice_rules)
        echo(f"built {out_dir}: {_one_line(corpus)}")


def _build_pool_command(corpus_app: typer.Typer) -> None:
    @corpus_app.command("build-pool")
    def build_pool_cmd(
            out_dir: Path = typer.Argument(..., help="New pool folder (must not exist or be empty)."),
            packages: str = typer.Option(None, "--packages", help="Comma-separated Debian packages "
                                         "(default: those of --pins)."),
            cache: Path = typer.Option(None, "--cache", help="Folder of .debs; missing ones are "
                                       "fetched there with `apt-get download` (default: a temporary folder)."),
            pins: Path = typer.Option(None, "--pins", help="A pool manifest: refuse any other package "
                                      "version or file, and check the result against it."),
            exclude: list[Path] = typer.Option(
                [Path("../shared/corpus/calib-v0"), Path("../shared/corpus/calib-v0-alt")], "--exclude",
                help="Corpus folder whose documents the pool must not contain (repeatable)."),
            sample: bool = typer.Option(False, "--sample", help="Keep a small deterministic sample "
                                        "(about 340 kB of text) in the same layout."),
            name: str = typer.Option(None, "--name", help="Pool name (corpora are NAME-train, ...; "
                                     "default: that of --pins, else lab-pool)."),
            version: str = typer.Option(None, "--version", help="Pool version (default: that of --pins, else v1)."),
            as_json: bool = json_option("Print the pool manifest's summary as JSON."),
    ) -> None:
        """Build the lab's text pool from Debian packages: train / heldout / tasks corpora."""
        from monitor.scoring.pool_build import build_pool

        names = [p.strip() for p in packages.split(",") if p.strip()] if packages else None
        with tempfile.TemporaryDirectory(prefix="lstar-debs.") as tmp:
            built = build_pool(out_dir, names, cache=cache or Path(tmp), exclude=exclude, pins=pins,
                               sample=sample, name=name, version=version)
        splits = built.manifest["splits"]
        if as_json:
            print(json.dumps({"path": str(out_dir), "splits": splits,
                              "excluded": built.manifest["excluded"]}, indent=2))
            return
        for split, info in splits.items():
            echo(f"{split}: {info['documents']:,} documents, {info['bytes']:,} bytes, sha256 {info['sha256']}")
        echo(f"built {out_dir} from "
             + ", ".join(f"{p['package']} {p['version']}" for p in built.manifest["packages"]))


def _build_registers_command(corpus_app: typer.Typer) -> None:
    @corpus_app.command("build-registers")
    def build_registers_cmd(
            out_dir: Path = typer.Argument(..., help="Folder to build the register corpora in "
                                           "(one new sub-folder per register, named as its pins)."),
            pins: list[Path] = typer.Option(None, "--pins", help="A register manifest (repeatable; "
                                            "default: every data/registers/*.json of this checkout)."),
            cache: Path = typer.Option(None, "--cache", help="Folder of .debs; missing ones are "
                                       "fetched there with `apt-get download` (default: a temporary folder)."),
            exclude: list[Path] = typer.Option(
                [Path("../shared/corpus/calib-v0"), Path("../shared/corpus/calib-v0-alt")], "--exclude",
                help="Corpus folder whose documents the registers must not contain (repeatable)."),
            as_json: bool = typer.Option(False, "--json", help="Print each register's corpus summary as JSON."),
    ) -> None:
        """Rebuild the calibration-corpus registers byte for byte from their pinned Debian packages.

        The registers are code, technical prose and dictionary prose (docs/stress.md); a package
        whose version differs from its pin is refused in one line."""
        from monitor.scoring.register_build import REGISTER_PINS_DIR, build_registers

        files = list(pins) if pins else sorted(REGISTER_PINS_DIR.glob("*.json"))
        with tempfile.TemporaryDirectory(prefix="lstar-debs.") as tmp:
            built = build_registers(out_dir, files, cache=cache or Path(tmp), exclude=exclude)
        if as_json:
            print(json.dumps([{"path": str(b.path), "register": b.manifest["register"], **b.manifest["corpus"]}
                              for b in built], indent=2))
            return
        for b in built:
            c = b.manifest["corpus"]
            echo(f"{b.manifest['register']}: {b.path} — {c['documents']:,} documents, {c['bytes']:,} bytes, "
                 f"sha256 {c['sha256']}")

