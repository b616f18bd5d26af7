"""`lstar corpus info|verify|build`."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.table import Table

from monitor.commands.terminal import plain_console
from monitor.scoring import Corpus, build_corpus, load_corpus


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

    @corpus_app.command("info")
    def info(path: Path = typer.Argument(..., help="Corpus folder (documents.jsonl + manifest.json)."),
             as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
        """Name, version, pin, size and slices of a corpus (verified on load)."""
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

    @corpus_app.command("verify")
    def verify(path: Path = typer.Argument(..., help="Corpus folder.")) -> None:
        """Check every document hash, the order and the manifest pin; exit non-zero on any difference."""
        corpus = load_corpus(path)
        print(f"OK {_one_line(corpus)}")

    @corpus_app.command("build")
    def build(src_dir: Path = typer.Argument(..., help="Folder of .txt/.md/.py/.jsonl files."),
              out_dir: Path = typer.Argument(..., help="New corpus folder (must not exist or be empty)."),
              slice_rules: Path = typer.Option(
                  ..., "--slice-rules", help="YAML/JSON file: name, version, rules of glob -> slice."),
              ) -> None:
        """Build a new corpus version (deterministic: the same inputs give the same manifest)."""
        corpus = build_corpus(src_dir, out_dir, slice_rules)
        print(f"built {out_dir}: {_one_line(corpus)}")

    app.add_typer(corpus_app, name="corpus")
