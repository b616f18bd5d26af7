"""`lstar score MODEL`: score a checkpoint on a pinned corpus and record the run."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from monitor.commands.options import (DB_OPTION, MAX_BATCH, STATE_OPTION, Device, DType, add_columns, db_file,
                                      int_option)
from monitor.commands.terminal import plain_console, print_table
from monitor.environment import quiet_hub_progress
from monitor.errors import SpecError
from monitor.hub import HubClient
from monitor.scoring import DEFAULT_MODEL, ScoreRequest, score_checkpoint
from monitor.service.scoring_driver import score_in_process, score_queue
from monitor.store import Store

DEFAULT_CORPUS = Path("../shared/corpus/calib-v0")


def _fmt(value: Any, digits: int = 4) -> str:
    if value is None:
        return "—"
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:.{digits}f}"


ROWS = (("CE (nats/token)", "ce"), ("CE_uni", "ce_unigram"), ("L*", "lstar"), ("SE(L*)", "se_ce"),
        ("L_rel", "l_rel"), ("L_gain", "l_gain"), ("bits/byte", "bits_per_byte"),
        ("tokens/byte", "tokens_per_byte"), ("tokens", "n_tokens"), ("bytes", "n_bytes"))


def render_result(result: dict[str, Any], console: Console) -> None:
    """Print a score result as a rich table (metrics × slices) plus stability and provenance."""
    model, corpus, spec = result["model"], result["corpus"], result["spec"]
    title = (f"{model['repo']} @ {model['sha'][:12]} on {corpus['name']} {corpus['version']} "
             f"({corpus['selection']}, sha256 {corpus['sha256'][:12]})")
    columns = [("all", result)] + sorted(result["slices"].items())
    table = Table(title=title, title_justify="left")
    table.add_column("metric")
    for name, _ in columns:
        table.add_column(name, justify="right", style="bold" if name == "all" else None)
    for label, key in ROWS:
        cells = [_fmt(int(m[key])) if key in ("n_tokens", "n_bytes") else _fmt(m[key])
                 for _, m in columns]
        table.add_row(label, *cells, style="bold" if key == "lstar" else None)
    console.print(table)
    if result.get("weighted_ppl") is not None:
        ref = result.get("reference_tokenizer") or {}
        console.print(f"weighted PPL {result['weighted_ppl']:.4f} "
                      f"(reference {ref.get('source')}, {ref.get('n_tokens', 0):,} tokens)")
    tcb = result.get("tcb")
    if tcb and tcb.get("n_positions"):
        console.print(f"TCB δ mean {tcb['mean']:.4g}, median {tcb['median']:.4g}, "
                      f"p10 {tcb['p10']:.4g} · V_eff mean {tcb['v_eff_mean']:.1f} · "
                      f"logit margin mean {tcb['margin_mean']:.3f} ({tcb['n_positions']} positions)")
    console.print(f"spec {spec['version']}: window {spec['window']}, stride {spec['stride']}, "
                  f"prefix {spec['prefix']}, {spec['dtype']} on {spec['device']} · "
                  f"{result['tokens_per_s']:,.0f} tokens/s · {result['wall_s']:.1f} s")


def _score_pending(request: ScoreRequest, db: Path, *, limit: int | None, endpoint: str | None,
                   cache_dir: Path | None, as_json: bool) -> None:
    import os
    import socket

    owner = f"{socket.gethostname()}:{os.getpid()}"
    with Store.open(db) as store:
        client = HubClient(endpoint, store=store)
        results = score_queue(store, client, score_in_process(store, request), owner=owner,
                              cache_dir=cache_dir, limit=limit)
    if as_json:
        print(json.dumps([r.as_dict() for r in results], indent=2, default=str))
        return
    table = Table(title=f"scored the queue ({len(results)} job(s))", title_justify="left")
    add_columns(table, ("id", "repo", "sha", "attempt", "status", "reason"), names=("repo", "sha"))
    for r in results:
        table.add_row(str(r.id), r.repo, r.sha[:12], str(r.attempt), r.status, r.reason or "")
    print_table(plain_console(), table)


def register(app: typer.Typer) -> None:
    @app.command("score")
    def score(
        model: str = typer.Argument(DEFAULT_MODEL, help="Checkpoint: a local directory, "
                                    "'org/name@revision' on the Hub, or builtin:smollm2-135m."),
        corpus: Path = typer.Option(DEFAULT_CORPUS, "--corpus", help="Corpus folder."),
        max_context: int | None = int_option(
            None, "--max-context", low=2, help="Window length (default: 2048 capped by the model; "
            "a value above the model's maximum positions is an error)."),
        stride: int | None = int_option(None, "--stride", low=1, help="Stride (default window/2)."),
        disjoint: bool = typer.Option(False, "--disjoint", help="Disjoint windows (stride = window)."),
        docs: int | None = int_option(None, "--docs", low=1, help="Score only the first K documents."),
        slices: str | None = typer.Option(None, "--slices", help="Comma-separated slices to score."),
        dtype: DType = typer.Option(DType.auto, "--dtype", help="auto: bf16 on CUDA, float32 on CPU."),
        device: Device = typer.Option(Device.auto, "--device"),
        batch_size: int = int_option(8, "--batch-size", low=1, high=MAX_BATCH, help="Windows per forward pass."),
        tokenizer: Path | None = typer.Option(None, "--tokenizer", help="Tokenizer folder "
                                              "(default: the checkpoint's own)."),
        reference_tokenizer: Path | None = typer.Option(
            None, "--reference-tokenizer", help="Tokenizer folder for weighted perplexity."),
        no_tcb: bool = typer.Option(False, "--no-tcb", help="Skip the Token Constraint Bound."),
        state: Path = STATE_OPTION,
        db: Path | None = DB_OPTION,
        no_db: bool = typer.Option(False, "--no-db", help="Do not record the run."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
        quiet: bool = typer.Option(False, "--quiet", help="No progress bars (the Hub client's download bars included)."),
        pending: bool = typer.Option(False, "--pending", help="Fetch and score the queue of "
                                     "gated Hub checkpoints instead of MODEL."),
        limit: int | None = int_option(None, "--limit", low=1, help="With --pending: at most N jobs."),
        endpoint: str | None = typer.Option(None, "--endpoint", help="Hub endpoint (default "
                                            "HF_ENDPOINT or the public Hub)."),
        cache_dir: Path | None = typer.Option(None, "--cache-dir", help="Download cache "
                                              "(default HF_HUB_CACHE)."),
    ) -> None:
        """Score a checkpoint on a pinned corpus: CE, CE_uni, L* and variants, bits/byte, TCB."""
        db = db_file(state, db)
        if quiet or as_json:  # the Hub client's download bars too, not only ours
            quiet_hub_progress()
        if stride is not None and disjoint:
            raise SpecError("--stride and --disjoint contradict each other",
                            hint="--disjoint means stride = window; give one of them")
        request = ScoreRequest(
            model=model, corpus_dir=corpus, max_context=max_context, stride=stride,
            disjoint=disjoint, docs=docs,
            slices=[s.strip() for s in slices.split(",") if s.strip()] if slices else None,
            dtype=dtype.value, device=device.value, batch_size=batch_size,
            tokenizer_dir=tokenizer, reference_tokenizer=reference_tokenizer,
            with_tcb=not no_tcb, progress=not (quiet or as_json) and sys.stderr.isatty())
        if pending:
            if model != DEFAULT_MODEL:
                raise SpecError("--pending scores the queue; do not also name MODEL")
            if no_db:
                raise SpecError("--pending needs the database; drop --no-db")
            _score_pending(request, db, limit=limit, endpoint=endpoint, cache_dir=cache_dir,
                           as_json=as_json)
            return
        result = score_checkpoint(request, db_path=None if no_db else db)
        if as_json:
            print(json.dumps(result, indent=2, sort_keys=True, default=str))
        else:
            render_result(result, plain_console())
            if not no_db:
                Console(stderr=True).print(f"recorded run {result['run_id']} in {db}", soft_wrap=True, markup=False)
