"""`lstar score MODEL`: score a checkpoint on a pinned corpus and record the run."""

from __future__ import annotations

import json
import sys
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.table import Table

from monitor.commands.options import (DB_OPTION, MAX_BATCH, STATE_OPTION, Device, DType, add_columns, db_file,
                                      endpoint_option, int_option, is_hub_model)
from monitor.commands.terminal import echo, plain_console, print_table
from monitor.constants import DEFAULT_CORPUS_DIR, DEFAULT_MODEL
from monitor.environment import hub_reachable, quiet_hub_progress
from monitor.errors import SpecError

if TYPE_CHECKING:
    from monitor.scoring import ScoreRequest

DEFAULT_CORPUS = DEFAULT_CORPUS_DIR


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
    if model.get("note"):   # e.g. builtin:gemma3-270m's numbers are those of a dequantised model
        title += f" [{model['note']}]"
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

    from monitor.hub import HubClient
    from monitor.scoring.scoring_driver import score_in_process, score_queue
    from monitor.store import Store

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


def until_settled_summary(result: dict[str, Any]) -> dict[str, Any]:
    """What `lstar score --until-settled --json` prints: the state per task, the tokens scored
    and the selection's total, the stopping reason and the bound."""
    seq = result["sequential"]
    return {"run_id": result["run_id"], "model": result["model"]["repo"], "sha": result["model"]["sha"],
            "states": {t["task"]: t["state"] or "unresolved" for t in seq["tasks"]},
            "tokens_scored": seq["tokens_scored"], "tokens_total": seq["tokens_total"],
            "documents_scored": seq["documents_scored"], "documents_total": seq["documents_total"],
            "stopping_reason": seq["reason"], "partial": seq["partial"], "looks": seq["looks"],
            "delta": seq["delta"], "bound": seq["bound"], "lstar": result["lstar"], "se": result["se_ce"],
            "lstar_box": seq["box"]["lstar"], "tasks_skipped": seq["tasks_skipped"],
            "resumed_from": seq["resumed_from"], "wall_s": result["wall_s"]}


def _score_until_settled(request: ScoreRequest, folder: Path, *, db: Path | None, delta: float | None,
                         block_docs: int | None, seed: int, as_json: bool) -> None:
    from dataclasses import replace

    from monitor.policy import load_policies
    from monitor.policy.files import policy_files_in
    from monitor.policy.readiness import require_policy_folder
    from monitor.scoring.engine import prepare
    from monitor.alerts.sequential_plan import plan_for_repo

    require_policy_folder(folder)
    files = policy_files_in(folder)
    if not files:
        raise SpecError(f"--until-settled {folder}: no policy files (*.yaml) there",
                        hint="point it at the folder of the policies whose tasks decide the stop")
    policies = load_policies(files)
    prepared = prepare(request)
    plan = plan_for_repo(policies, prepared.checkpoint.repo, delta=delta, block_documents=block_docs, seed=seed)
    if not plan["tasks"]:
        raise SpecError(f"no policy in {folder} watches {prepared.checkpoint.repo}",
                        hint="add a watch rule that matches it, or drop --until-settled for a full score")
    prepared.request = replace(request, sequential=plan)
    result = _record(prepared, db)
    summary = until_settled_summary(result)
    if as_json:
        print(json.dumps(summary, indent=2, sort_keys=True, default=str))
        return
    table = Table(title=f"{summary['model']} @ {summary['sha'][:12]}: {summary['stopping_reason']} after "
                        f"{summary['tokens_scored']:,} of {summary['tokens_total']:,} tokens", title_justify="left")
    add_columns(table, ("task", "state"), names=("task",))
    for task, state in summary["states"].items():
        table.add_row(task, state)
    print_table(plain_console(), table)


def _record(prepared: Any, db: Path | None) -> dict[str, Any]:
    """Score a prepared request (continuing a recorded partial score) and record it."""
    from dataclasses import replace

    from monitor.scoring.engine import compute_score, score_identity
    from monitor.store import Store
    from monitor.scoring.sequential_run import resume_payload

    if db is None:
        return compute_score(prepared, None).result
    with Store.open(db) as store:
        if prepared.request.resume_partial and prepared.request.resume is None:
            resume = resume_payload(store, score_identity(prepared))
            if resume is not None:
                prepared.request = replace(prepared.request, resume=resume)
        scored = compute_score(prepared, store)
        with store.transaction() as conn:
            scored.write(store, conn)
        store.checkpoint()
    return scored.result


def register(app: typer.Typer) -> None:
    @app.command("score")
    def score(
        model: str = typer.Argument(DEFAULT_MODEL, help="Checkpoint: a local directory, "
                                    "'org/name@revision' on the Hub, builtin:smollm2-135m, or builtin:gemma3-270m "
                                    "(Gemma 3 270M dequantised from Q4_K_M)."),
        corpus: str = typer.Option(str(DEFAULT_CORPUS), "--corpus", help="Corpus folder, or several "
                                   "separated by commas (A,B,C): each is scored with one load of the model "
                                   "and recorded as its own run."),
        max_context: int | None = int_option(
            None, "--max-context", low=2, help="Window length (default: 2048 capped by the model; "
            "a value above the model's maximum positions is an error)."),
        stride: int | None = int_option(None, "--stride", low=1, help="Stride (default window/2)."),
        disjoint: bool = typer.Option(False, "--disjoint", help="Disjoint windows (stride = window)."),
        docs: int | None = int_option(None, "--docs", low=1, help="Score only the first K documents."),
        every: int | None = int_option(None, "--every", low=1, help="Score every K-th document "
                                       "(after --slices, before --docs)."),
        slices: str | None = typer.Option(None, "--slices", help="Comma-separated slices to score."),
        dtype: DType = typer.Option(DType.auto, "--dtype", help="auto: bf16 on a GPU of compute capability 8 or later, float32 elsewhere."),
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
        quiet: bool = typer.Option(False, "--quiet", help="No table and no progress bars (the Hub client's download bars "
                                   "included); the run is still recorded and its id said on stderr."),
        pending: bool = typer.Option(False, "--pending", help="Fetch and score the queue of "
                                     "gated Hub checkpoints instead of MODEL."),
        limit: int | None = int_option(None, "--limit", low=1, help="With --pending: at most N jobs."),
        endpoint: str | None = endpoint_option("Hub endpoint a Hub MODEL (or --pending's queue) is fetched from "
                                               "(default HF_ENDPOINT or the public Hub)."),
        cache_dir: Path | None = typer.Option(None, "--cache-dir", help="Download cache of a Hub MODEL "
                                              "or --pending (default HF_HUB_CACHE)."),
        until_settled: Path | None = typer.Option(
            None, "--until-settled", help="Policy folder: score in blocks of a pinned document order and "
            "stop once every task of every policy watching MODEL is settled (a partial score)."),
        delta: float | None = typer.Option(None, "--delta", min=1e-9, max=0.5, help="With --until-settled: "
                                           "chance of a wrong state (default 1 − the curves' confidence)."),
        block_docs: int | None = int_option(None, "--block-docs", low=1, help="With --until-settled: "
                                            "documents per block (default: 1/20 of the selection)."),
        order_seed: int = typer.Option(0, "--order-seed", help="With --until-settled: seed of the document order."),
        no_resume: bool = typer.Option(False, "--no-resume", help="Score every document even when a "
                                       "partial score of this checkpoint is recorded."),
    ) -> None:
        """Score a checkpoint on a pinned corpus: CE, CE_uni, L* and variants, bits/byte, TCB."""
        from monitor.store import refuse_if_held

        db = db_file(state, db)
        if not no_db:
            refuse_if_held(db)   # a daemon's state: refuse now, not after loading the model
        if quiet or as_json:  # the Hub client's download bars too, not only ours
            quiet_hub_progress()
        request, corpora = _score_request(
            model, corpus, max_context=max_context, stride=stride, disjoint=disjoint, docs=docs, every=every,
            slices=slices, dtype=dtype, device=device, batch_size=batch_size, tokenizer=tokenizer,
            reference_tokenizer=reference_tokenizer, no_tcb=no_tcb, no_resume=no_resume,
            show_progress=not (quiet or as_json), endpoint=endpoint, cache_dir=cache_dir, pending=pending)
        # The Hub the checkpoint comes from is reached even with HF_HUB_OFFLINE set when it is on
        # this machine (the guide's fake Hub); any other Hub is refused now, in one line.
        with (hub_reachable("lstar score", endpoint) if pending or is_hub_model(model) else nullcontext()):
            _score(request, corpora=corpora, model=model, db=db, no_db=no_db, pending=pending, limit=limit, endpoint=endpoint,
                   cache_dir=cache_dir, until_settled=until_settled, delta=delta, block_docs=block_docs,
                   order_seed=order_seed, as_json=as_json, quiet=quiet)


def _score_request(model: str, corpus: str, *, max_context: int | None, stride: int | None, disjoint: bool,
                   docs: int | None, every: int | None, slices: str | None, dtype: DType, device: Device,
                   batch_size: int, tokenizer: Path | None, reference_tokenizer: Path | None, no_tcb: bool,
                   no_resume: bool, show_progress: bool, endpoint: str | None, cache_dir: Path | None,
                   pending: bool) -> tuple[ScoreRequest, list[Path]]:
    """`lstar score`'s options as the request for the first corpus, and every corpus folder;
    options that contradict each other are refused, before anything is loaded."""
    from monitor.scoring import ScoreRequest

    if stride is not None and disjoint:
        raise SpecError("--stride and --disjoint contradict each other",
                        hint="--disjoint means stride = window; give one of them")
    corpora = corpus_list(corpus)
    request = ScoreRequest(
        model=model, corpus_dir=corpora[0], max_context=max_context, stride=stride,
        disjoint=disjoint, docs=docs, every=every, resume_partial=not no_resume,
        slices=[s.strip() for s in slices.split(",") if s.strip()] if slices else None,
        dtype=dtype.value, device=device.value, batch_size=batch_size,
        tokenizer_dir=tokenizer, reference_tokenizer=reference_tokenizer,
        with_tcb=not no_tcb, progress=show_progress and sys.stderr.isatty(),
        endpoint=endpoint, hub_cache_dir=cache_dir.expanduser() if cache_dir is not None else None)
    if (endpoint is not None or cache_dir is not None) and not pending and not is_hub_model(model):
        raise SpecError(f"--endpoint and --cache-dir say where a Hub checkpoint comes from; {model} is not "
                        "one (a local folder or a builtin model)",
                        hint="drop them, or name the checkpoint as org/name@revision")
    return request, corpora


def score_checkpoint(request: ScoreRequest, *, db_path: Path | None) -> dict[str, Any]:
    """`monitor.scoring.score_checkpoint`, imported when a score runs (not when `lstar score
    --help` is printed); the one place this command hands a request to the scoring stage."""
    from monitor.scoring import score_checkpoint as score

    return score(request, db_path=db_path)


def corpus_list(value: str) -> list[Path]:
    """--corpus A,B,C as folders, in the order given; a folder named twice is an error."""
    names = [v.strip() for v in value.split(",") if v.strip()]
    if not names:
        raise SpecError("--corpus names no folder", hint="pass a corpus folder, or several as A,B,C")
    paths = [Path(n).expanduser() for n in names]
    resolved = [p.resolve() for p in paths]
    if len(set(resolved)) != len(resolved):
        raise SpecError(f"--corpus {value} names a folder twice", hint="name each corpus once")
    return paths


def score_corpora(request: ScoreRequest, corpora: list[Path], *, db_path: Path | None) -> list[dict[str, Any]]:
    """`monitor.scoring.engine.score_corpora`, imported when a score runs."""
    from monitor.scoring.engine import score_corpora as score

    return score(request, corpora, db_path=db_path)


def _score_many(request: ScoreRequest, corpora: list[Path], *, db: Path, no_db: bool, as_json: bool,
                quiet: bool) -> None:
    results = score_corpora(request, corpora, db_path=None if no_db else db)
    if as_json:
        print(json.dumps(results, indent=2, sort_keys=True, default=str))
        return
    for result in results:
        if not quiet:
            render_result(result, plain_console())
        if not no_db:
            echo(f"recorded run {result['run_id']} ({result['corpus']['name']} {result['corpus']['version']}) "
                 f"in {db}", err=True)


def _score(request: ScoreRequest, *, corpora: list[Path], model: str, db: Path, no_db: bool, pending: bool, limit: int | None,
           endpoint: str | None, cache_dir: Path | None, until_settled: Path | None, delta: float | None,
           block_docs: int | None, order_seed: int, as_json: bool, quiet: bool) -> None:
    if len(corpora) > 1:
        if pending or until_settled is not None:
            raise SpecError("several corpora are scored for one MODEL in full; --pending and --until-settled "
                            "take one corpus", hint="pass one --corpus folder")
        if delta is not None or block_docs is not None:
            raise SpecError("--delta and --block-docs apply to a sequential score of one corpus")
        _score_many(request, corpora, db=db, no_db=no_db, as_json=as_json, quiet=quiet)
        return
    if pending:
        if model != DEFAULT_MODEL:
            raise SpecError("--pending scores the queue; do not also name MODEL")
        if no_db:
            raise SpecError("--pending needs the database; drop --no-db")
        if until_settled is not None:
            raise SpecError("--until-settled scores one MODEL; the queue is scored sequentially by "
                            "`lstar run --scoring sequential`", hint="drop one of --pending and --until-settled")
        _score_pending(request, db, limit=limit, endpoint=endpoint, cache_dir=cache_dir,
                       as_json=as_json)
        return
    if until_settled is not None:
        _score_until_settled(request, until_settled, db=None if no_db else db, delta=delta,
                             block_docs=block_docs, seed=order_seed, as_json=as_json)
        return
    if delta is not None or block_docs is not None:
        raise SpecError("--delta and --block-docs apply to a sequential score",
                        hint="add --until-settled POLICY_DIR")
    result = score_checkpoint(request, db_path=None if no_db else db)
    if as_json:
        print(json.dumps(result, indent=2, sort_keys=True, default=str))
    else:
        if not quiet:  # --quiet: the run is recorded, nothing is drawn
            render_result(result, plain_console())
        if not no_db:
            echo(f"recorded run {result['run_id']} in {db}", err=True)
