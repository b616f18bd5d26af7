"""Checkpoint lineages for the offline demo, without training: interpolations between a random
tiny transformer and a bigram language model of calib-v0-alt written into the same weights.

Training even a tiny model takes minutes on a laptop CPU; building a bigram model takes a
second. The bigram model is a tiny transformer whose blocks add nothing (their output
projections are zero), so the last hidden state is the current token's embedding and the
logits are `W · norm(E[x])`. `E` and `W` hold a rank-k factorisation (truncated SVD) of
log(1 + bigram counts) of calib-v0-alt, plus one coordinate carrying the log unigram
probabilities. Checkpoint t of a lineage is `(1 − t)·random + t·bigram` for every weight,
so L* falls and the cloze task (whose items come from calib-v0-alt) improves as t grows,
the way a training run's checkpoints do.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from monitor.sandbox.tiny_models import build_tiny_model

# (parameter of the embedding, final norm weight, final norm bias or None, output matrix,
#  parameters zeroed so that each block passes its input through)
ARCH_PARAMS = {
    "gpt_neox": ("gpt_neox.embed_in.weight", "gpt_neox.final_layer_norm.weight",
                 "gpt_neox.final_layer_norm.bias", "embed_out.weight",
                 ("attention.dense.weight", "attention.dense.bias", "mlp.dense_4h_to_h.weight",
                  "mlp.dense_4h_to_h.bias")),
    "llama": ("model.embed_tokens.weight", "model.norm.weight", None, "lm_head.weight",
              ("self_attn.o_proj.weight", "mlp.down_proj.weight")),
}


def bigram_factors(token_seqs: Sequence[Sequence[int]], vocab_size: int, rank: int
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Row factors A [V, rank], column factors B [V, rank] with A·Bᵀ ≈ log(1 + counts), and
    the log unigram probabilities u [V] (add-one smoothed)."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.linalg import svds

    prev = np.concatenate([np.asarray(s[:-1], dtype=np.int64) for s in token_seqs if len(s) > 1])
    nxt = np.concatenate([np.asarray(s[1:], dtype=np.int64) for s in token_seqs if len(s) > 1])
    counts = coo_matrix((np.ones(len(prev)), (prev, nxt)), shape=(vocab_size, vocab_size)).tocsr()
    counts.sum_duplicates()
    counts.data = np.log1p(counts.data)
    u_mat, s, vt = svds(counts, k=rank, random_state=0)
    root = np.sqrt(s)
    unigram = np.bincount(np.concatenate([np.asarray(x, dtype=np.int64) for x in token_seqs]),
                          minlength=vocab_size).astype(np.float64) + 1.0
    return u_mat * root, vt.T * root, np.log(unigram / unigram.sum())


def bigram_state(model: Any, arch: str, factors: tuple[np.ndarray, np.ndarray, np.ndarray],
                 *, scale: float = 1.0) -> dict[str, Any]:
    """The state dict of `model` turned into the bigram model (a new dict; `model` unchanged)."""
    import torch

    embed_name, norm_w, norm_b, head_name, zeroed = ARCH_PARAMS[arch]
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    a, b, u = factors
    vocab, hidden = state[embed_name].shape
    rank = a.shape[1]
    if hidden < rank + 2:
        raise ValueError(f"hidden size {hidden} is too small for rank {rank} (needs rank + 2)")
    emb = np.zeros((vocab, hidden))
    emb[:, :rank] = a[:vocab]
    emb[:, rank] = 1.0                                     # carries the unigram term
    if norm_b is not None:                                 # LayerNorm subtracts the mean: cancel it
        emb[:, rank + 1] = -emb[:, :rank + 1].sum(axis=1)
    head = np.zeros((vocab, hidden))
    head[:, :rank] = b[:vocab]
    head[:, rank] = u[:vocab]
    # Normalisation divides each embedding by its spread; undo it for the typical row.
    spread = np.median(np.sqrt((emb ** 2).mean(axis=1)))
    state[embed_name] = torch.tensor(emb, dtype=torch.float32)
    state[head_name] = torch.tensor(head * spread * scale, dtype=torch.float32)
    state[norm_w] = torch.ones_like(state[norm_w])
    if norm_b is not None:
        state[norm_b] = torch.zeros_like(state[norm_b])
    for name in state:
        if name.endswith(zeroed):
            state[name] = torch.zeros_like(state[name])
    return state


def build_lineage(out_dir: Path, tokenizer_dir: Path, token_seqs: Sequence[Sequence[int]], *, arch: str,
                  seed: int, steps: Sequence[float], hidden: int = 32, rank: int = 24,
                  max_positions: int = 128, factors: Any = None) -> list[Path]:
    """Save one checkpoint folder per interpolation weight t in `steps` (t=0: random, 1: bigram)."""
    import torch
    from transformers import AutoModelForCausalLM

    base = build_tiny_model(out_dir / "_init", tokenizer_dir, arch=arch, seed=seed, hidden=hidden, layers=1,
                            heads=2, max_positions=max_positions, init_std=0.3)
    model = AutoModelForCausalLM.from_pretrained(base)
    vocab = model.get_input_embeddings().weight.shape[0]
    factors = factors if factors is not None else bigram_factors(token_seqs, vocab, rank)
    start = {k: v.detach().clone() for k, v in model.state_dict().items()}
    target = bigram_state(model, arch, factors)
    folders = []
    for i, t in enumerate(steps):
        mixed = {k: (1.0 - t) * start[k] + t * target[k] if start[k].is_floating_point() else start[k]
                 for k in start}
        with torch.no_grad():
            model.load_state_dict(mixed)
        folder = out_dir / f"t{i}"
        model.save_pretrained(folder, safe_serialization=True)
        for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
            if (base / name).exists():
                (folder / name).write_bytes((base / name).read_bytes())
        (folder / "lineage.json").write_text(json.dumps({"t": t, "seed": seed, "arch": arch}))
        folders.append(folder)
    return folders
