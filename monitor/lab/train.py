"""Train one (family, seed) lineage: deterministic, checkpointed, resumable.

The family's tokens are the training documents of `monitor.lab.text`, each after the
tokenizer's prefix token, concatenated; step `s` reads the windows `s·B … (s+1)·B − 1` of
`context + 1` tokens, so the data order is fixed and every family reads the same bytes in the
same order. A checkpoint is saved at each share of the byte budget in `config.fractions`
(so families are compared at equal bytes seen, not equal steps) as a full-vocabulary folder
`<family>-s<seed>/step<N>`, and beside the lineage the compact model, optimizer and RNG
states (`.state/`), written atomically after the checkpoint folder. A run killed at any
point restarts from the last state and produces the same weights as an uninterrupted run.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from monitor.errors import LabError
from monitor.lab.config import LabConfig
from monitor.lab.model import VocabMap, build_compact_model, save_full_model
from monitor.lab.tiny_models import copy_tokenizer
from monitor.scoring import TokenizerHandle, load_tokenizer

STATE_DIR = ".state"
STATE_FILE = "train_state.pt"
META_FILE = "lab-checkpoint.json"
KILL_ENV = "LSTAR_LAB_KILL_AT_STEP"      # crash tests: SIGKILL after this optimizer step


@dataclass
class FamilyData:
    """A family's tokenizer, compact vocabulary and training tokens."""

    handle: TokenizerHandle
    vocab: VocabMap
    tokens: np.ndarray          # compact ids of the whole stream
    cum_bytes: np.ndarray       # cum_bytes[i] = bytes of the stream up to and including token i


def lineage_name(family: str, seed: int) -> str:
    return f"{family}-s{seed}"


def encode_family(config: LabConfig, family: str, stream: list[str], eval_texts: list[str]) -> FamilyData:
    """Tokenize the stream for `family` and build its vocabulary over stream + evaluation text."""
    handle = load_tokenizer(config.tokenizer_dir(family))
    seqs = handle.encode_documents(stream)
    eval_ids = handle.encode_documents(eval_texts)
    prefix = [handle.prefix_token_id] if handle.prefix_token_id is not None else []
    vocab = VocabMap.from_ids([*seqs, *eval_ids, prefix], handle.vocab_size)
    parts, byte_parts = [], []
    for doc, ids in zip(stream, seqs):
        parts.append(prefix + ids)
        # a document's bytes are spread evenly over its tokens; the prefix token has none
        share = len(doc.encode("utf-8")) / max(1, len(ids))
        byte_parts.append([0.0] * len(prefix) + [share] * len(ids))
    flat = [t for p in parts for t in p]
    tokens = vocab.to_compact(flat)
    cum_bytes = np.cumsum(np.array([b for p in byte_parts for b in p], dtype=np.float64))
    return FamilyData(handle, vocab, tokens, cum_bytes)


def schedule(config: LabConfig, n_tokens: int) -> tuple[int, list[int]]:
    """Total optimizer steps and the steps after which a checkpoint is saved."""
    window = config.arch.context + 1
    n_windows = (n_tokens - 1) // config.arch.context if n_tokens >= window else 0
    total = n_windows // config.batch_size
    if total < len(config.fractions):
        raise LabError(f"the byte budget {config.byte_budget} gives only {total} optimizer steps",
                       hint="raise --byte-budget or lower the batch size or context")
    steps = sorted({max(1, math.ceil(f * total)) for f in config.fractions})
    return total, steps


def lr_at(config: LabConfig, step: int, total: int) -> float:
    """Linear warm-up, then the peak rate (`lr_schedule` "constant", lab v2) or a cosine decay
    to a tenth of the peak (version 1)."""
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    if getattr(config, "lr_schedule", "cosine") == "constant":
        return config.lr
    progress = (step - config.warmup_steps) / max(1, total - config.warmup_steps)
    return config.lr * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress))))


def _batch(data: FamilyData, config: LabConfig, step: int):
    import torch

    T, B = config.arch.context, config.batch_size
    starts = (np.arange(B) + step * B) * T
    rows = np.stack([data.tokens[s:s + T + 1] for s in starts])
    return torch.from_numpy(rows[:, :-1].copy()), torch.from_numpy(rows[:, 1:].copy())


def seen_at(data: FamilyData, config: LabConfig, step: int) -> tuple[int, int]:
    """(bytes, tokens) of training text whose tokens were predicted by the end of `step`."""
    n = step * config.batch_size * config.arch.context
    return (int(round(data.cum_bytes[n])) if n > 0 else 0), n


def training_fingerprint(config: LabConfig, data: FamilyData, seed: int) -> str:
    """What a lineage's weights depend on: its tokens, the architecture and the optimisation
    settings. A saved state with another fingerprint belongs to another lab and is not resumed."""
    settings = {"arch": config.arch.as_dict(), "batch_size": config.batch_size, "lr": config.lr,
                "warmup_steps": config.warmup_steps, "fractions": list(config.fractions), "seed": seed,
                "vocab": hashlib.sha256(data.vocab.used.tobytes()).hexdigest()}
    if getattr(config, "lr_schedule", "cosine") != "cosine":   # version 1's fingerprints unchanged
        settings["lr_schedule"] = config.lr_schedule
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode("utf-8"))
    digest.update(np.ascontiguousarray(data.tokens, dtype=np.int64).tobytes())
    return digest.hexdigest()


def _save_state(path: Path, model, optimizer, step: int, fingerprint: str) -> None:
    import torch

    tmp = path.with_name(path.name + ".tmp")
    torch.save({"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "rng": torch.get_rng_state(), "fingerprint": fingerprint}, tmp)
    with open(tmp, "rb") as handle:
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def _load_state(path: Path) -> dict[str, Any] | None:
    import torch

    if not path.is_file():
        return None
    try:
        return torch.load(path, weights_only=True)
    except Exception as exc:  # a torn or foreign file: refuse rather than guess
        raise LabError(f"cannot read the training state {path}: {str(exc).splitlines()[0]}",
                       hint="delete that lineage folder to retrain it from the start") from exc


def _write_checkpoint(out: Path, model, data: FamilyData, config: LabConfig, family: str, seed: int,
                      step: int) -> dict[str, Any]:
    """Save the full-vocabulary checkpoint folder for `step` atomically (temporary folder, rename)."""
    final = out / f"step{step}"
    tmp = out / f".step{step}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_full_model(model, data.vocab, config.arch, tmp, prefix_token_id=data.handle.prefix_token_id)
    copy_tokenizer(config.tokenizer_dir(family), tmp)
    bytes_seen, tokens_seen = seen_at(data, config, step)
    meta = {"family": family, "seed": seed, "step": step, "bytes_seen": bytes_seen,
            "tokens_seen": tokens_seen, "vocab_used": data.vocab.n_used}
    (tmp / META_FILE).write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    return meta


def train_lineage(config: LabConfig, family: str, seed: int, data: FamilyData, out_root: Path, *,
                  progress: Any = None, name: str | None = None) -> list[dict[str, Any]]:
    """Train (or resume) one lineage; returns the metadata of every checkpoint, in step order.

    `progress`, when given, is called as progress(step, total) after every optimizer step.
    """
    import torch

    torch.set_num_threads(config.threads)
    torch.use_deterministic_algorithms(True)
    out = out_root / (name or lineage_name(family, seed))
    state_path = out / STATE_DIR / STATE_FILE
    total, ckpt_steps = schedule(config, len(data.tokens))
    model = build_compact_model(config.arch, data.vocab.n_used, seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, betas=(0.9, 0.95), weight_decay=0.01)
    start = 0
    fingerprint = training_fingerprint(config, data, seed)
    state = _load_state(state_path)
    if state is not None:
        if state.get("fingerprint") != fingerprint:
            raise LabError(f"the training state {state_path} was saved by a lab with other settings, "
                           "text or tokenizer than this one",
                           hint=f"delete {out} to retrain that lineage, or run with the settings it was trained with")
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["rng"])
        start = int(state["step"])
        if not 0 < start <= total or not (out / f"step{start}").is_dir():
            raise LabError(f"training state {state_path} is at step {start}, which this lineage "
                           f"(0..{total} steps) has no checkpoint for",
                           hint="delete that lineage folder to retrain it with the current settings")
    (out / STATE_DIR).mkdir(parents=True, exist_ok=True)
    kill_at = int(os.environ.get(KILL_ENV, "0") or 0)
    model.train()
    for step in range(start, total):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(config, step, total)
        x, y = _batch(data, config, step)
        logits = model(input_ids=x).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        done = step + 1
        if done in ckpt_steps:
            model.eval()
            _write_checkpoint(out, model, data, config, family, seed, done)
            _save_state(state_path, model, optimizer, done, fingerprint)
            model.train()
        if progress is not None:
            progress(done, total)
        if kill_at and done == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
    return [json.loads((out / f"step{s}" / META_FILE).read_text(encoding="utf-8")) for s in ckpt_steps]
