"""`lstar eval MODEL --task FILE`: the built-in multiple-choice evaluator; results become labels."""

from __future__ import annotations

import json
import uuid
from contextlib import nullcontext
from datetime import datetime, timezone
from pathlib import Path

import typer
from rich.table import Table

from monitor.commands.options import (DB_OPTION, JSON_OPTION, MAX_BATCH, STATE_OPTION, DType, db_file, device_option,
                                      endpoint_option, int_option, is_hub_model)
from monitor.commands.terminal import plain_console
from monitor.environment import hub_reachable
from monitor.errors import SpecError


def register(app: typer.Typer) -> None:
    @app.command("eval")
    def eval_cmd(
        model: str = typer.Argument(..., help="Checkpoint: a local directory or org/name[@revision]."),
        task: Path = typer.Option(..., "--task", help="Multiple-choice task file (JSON lines, cloze-v0 format)."),
        limit: int = int_option(None, "--limit", low=1, help="Evaluate only the first N items."),
        family: str = typer.Option(None, "--family", help="Family recorded with the labels (default: the repo)."),
        batch_size: int = int_option(8, "--batch-size", low=1, high=MAX_BATCH, help="Sequences per forward pass."),
        dtype: DType = typer.Option(DType.auto, "--dtype", help="auto: bf16 on a GPU of compute capability 8 or later, float32 elsewhere."),
        device: str = device_option(),
        state: Path = STATE_OPTION,
        db: Path | None = DB_OPTION,
        no_store: bool = typer.Option(False, "--no-store", help="Do not write the labels to the database."),
        as_json: bool = JSON_OPTION,
        endpoint: str | None = endpoint_option("Hub endpoint a Hub MODEL is fetched from (default HF_ENDPOINT or "
                                               "the public Hub)."),
        cache_dir: Path | None = typer.Option(None, "--cache-dir", help="Download cache of a Hub MODEL "
                                              "(default HF_HUB_CACHE)."),
    ) -> None:
        """Evaluate a checkpoint on a multiple-choice task and store the metrics as labels."""
        from monitor.store import Store

        db_path = db_file(state, db)
        if (endpoint is not None or cache_dir is not None) and not is_hub_model(model):
            raise SpecError(f"--endpoint and --cache-dir say where a Hub checkpoint comes from; {model} is not "
                            "one (a local folder)", hint="drop them, or name the checkpoint as org/name@revision")
        # Imported here: the evaluator loads models (torch, transformers) and is not needed
        # for `lstar --help` or other commands.
        from monitor.curves import MC_METRICS, evaluate_checkpoint, evaluation_labels, label_rows

        # As `lstar score`: a Hub on this machine is reached whatever HF_HUB_OFFLINE says, another is refused.
        with (hub_reachable("lstar eval", endpoint) if is_hub_model(model) else nullcontext()):
            evaluation = evaluate_checkpoint(model, task, limit=limit, dtype=dtype.value, device=device,
                                             batch_size=batch_size, endpoint=endpoint,
                                             cache_dir=cache_dir.expanduser() if cache_dir is not None else None)
        result = evaluation.result
        run_id = f"eval-{uuid.uuid4().hex[:16]}"
        family = family or evaluation.repo
        labels = evaluation_labels(evaluation, family=family, run_id=run_id)
        stored = 0
        if not no_store:
            run = {"run_id": run_id, "model_repo": evaluation.repo, "model_sha": evaluation.sha,
                   "model_source": evaluation.source, "task": result.task,
                   "task_sha256": result.task_sha256, "n_items": result.n_items, "item_limit": limit,
                   "tokenizer_fingerprint": evaluation.tokenizer_fingerprint, "dtype": evaluation.dtype,
                   "device": evaluation.device, "metrics": result.as_dict()["metrics"],
                   "model": evaluation.model_info, "wall_s": evaluation.wall_s,
                   "finished_at": datetime.now(timezone.utc)}
            with Store.open(db_path) as store:
                stored = store.record_labels(label_rows(labels, source_ref=run_id, eval_run_id=run_id),
                                             eval_run=run)
        if as_json:
            print(json.dumps({"run_id": None if no_store else run_id, "repo": evaluation.repo,
                              "sha": evaluation.sha, "family": family, "labels_stored": stored,
                              "wall_s": evaluation.wall_s, **result.as_dict()}, indent=2))
            return
        table = Table(title=f"{result.task} · {evaluation.repo} @ {evaluation.sha[:12]} · "
                            f"{result.n_items} items", title_justify="left")
        for name in ("metric", "value", "stderr", "random baseline"):
            table.add_column(name, justify="left" if name == "metric" else "right")
        for name in MC_METRICS:
            value, stderr = result.metrics[name]
            table.add_row(name, f"{value:.4f}", f"{stderr:.4f}", f"{result.baselines[name]:.4f}")
        console = plain_console()
        console.print(table)
        console.print(f"{evaluation.wall_s:.1f} s on {evaluation.device} ({evaluation.dtype})"
                      + ("" if no_store else f" · stored {stored} labels as run {run_id} in {db_path}"))
