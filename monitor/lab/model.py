"""The lab's architecture and its vocabulary remapping.

Every family gets the same transformer body (transformers' Phi architecture: pre-LayerNorm,
partial rotary embeddings, and an output layer with a bias, tied to the input embeddings).
Only the vocabulary differs, and it is remapped: a family trains on the ids its tokenizer
actually produces on the lab's training and evaluation text (plus its prefix token), because
the output layer dominates the cost on a CPU (a full 128k-id vocabulary is ~20× slower).

A saved checkpoint is an ordinary full-vocabulary model: row `i` of the compact embedding
goes to the tokenizer's id `used[i]`; every other row is zero and its output bias is
`UNUSED_BIAS`, so an id the lab never saw gets a logit of −10⁴ and carries no probability
mass (its exp underflows to 0). Its config is a plain `PhiConfig`, so
`AutoModelForCausalLM` and `monitor.scoring.loader` load it with no custom code.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from monitor.errors import LabError

# exp() of this logit underflows to exactly 0 in float32: a bias of only -100 leaves
# denormal values, which make the CPU's exp ~2x slower over a full vocabulary.
UNUSED_BIAS = -1.0e4


@dataclass(frozen=True)
class ArchConfig:
    """The architecture budget shared by every family."""

    hidden: int = 128
    layers: int = 2
    heads: int = 4
    intermediate: int = 512
    context: int = 128           # training sequence length = the model's max positions

    def validate(self) -> None:
        for name, value, low in (("hidden", self.hidden, 8), ("layers", self.layers, 1),
                                 ("heads", self.heads, 1), ("intermediate", self.intermediate, 8),
                                 ("context", self.context, 8)):
            if not isinstance(value, int) or value < low or value > 8192:
                raise LabError(f"architecture {name} must be an integer from {low} to 8192, got {value!r}")
        if self.hidden % self.heads:
            raise LabError(f"architecture hidden ({self.hidden}) must be a multiple of heads ({self.heads})")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def phi_config(arch: ArchConfig, vocab_size: int, *, prefix_token_id: int | None = None):
    """A transformers `PhiConfig` of `vocab_size` ids for the shared body."""
    from transformers import PhiConfig

    return PhiConfig(vocab_size=vocab_size, hidden_size=arch.hidden, intermediate_size=arch.intermediate,
                     num_hidden_layers=arch.layers, num_attention_heads=arch.heads,
                     num_key_value_heads=arch.heads, max_position_embeddings=arch.context,
                     resid_pdrop=0.0, embd_pdrop=0.0, attention_dropout=0.0,
                     tie_word_embeddings=True, bos_token_id=prefix_token_id,
                     eos_token_id=prefix_token_id, pad_token_id=None)


def build_compact_model(arch: ArchConfig, n_used: int, seed: int):
    """A freshly initialised model over the compact vocabulary, seeded."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(phi_config(arch, n_used))
    return model


@dataclass(frozen=True)
class VocabMap:
    """Compact id `i` stands for tokenizer id `used[i]`."""

    used: np.ndarray           # sorted int64 tokenizer ids
    full_size: int             # the tokenizer's id space (1 + largest id)

    @classmethod
    def from_ids(cls, id_lists: Iterable[Iterable[int]], full_size: int) -> "VocabMap":
        seen: set[int] = set()
        for ids in id_lists:
            seen.update(ids)
        if not seen:
            raise LabError("the lab's text encodes to no tokens")
        used = np.array(sorted(seen), dtype=np.int64)
        if used[0] < 0 or used[-1] >= full_size:
            raise LabError(f"token id {int(used[-1])} is outside the tokenizer's {full_size} ids")
        return cls(used, full_size)

    @property
    def n_used(self) -> int:
        return int(len(self.used))

    def lookup(self) -> np.ndarray:
        """full id → compact id (−1 where unused)."""
        table = np.full(self.full_size, -1, dtype=np.int64)
        table[self.used] = np.arange(len(self.used))
        return table

    def to_compact(self, ids: Iterable[int]) -> np.ndarray:
        out = self.lookup()[np.asarray(list(ids), dtype=np.int64)]
        if (out < 0).any():
            raise LabError("a token id outside the lab's vocabulary; rebuild the vocabulary map")
        return out


def fill_full_model(full: Any, compact: Any, vocab: VocabMap) -> None:
    """Write `compact`'s weights into the full-vocabulary model `full`: the used ids' rows of
    the embeddings and output layer, zero rows and bias UNUSED_BIAS for the ids never seen,
    every other tensor copied."""
    import torch

    src = compact.state_dict()
    used = torch.from_numpy(vocab.used)
    with torch.no_grad():
        for name, tensor in full.state_dict().items():
            if name.endswith("embed_tokens.weight") or name == "lm_head.weight":
                tensor.zero_()
                tensor[used] = src[name]
            elif name == "lm_head.bias":
                tensor.fill_(UNUSED_BIAS)
                tensor[used] = src[name]
            else:
                tensor.copy_(src[name])


def save_full_model(compact: Any, vocab: VocabMap, arch: ArchConfig, out_dir: Path, *,
                    prefix_token_id: int | None) -> None:
    """Save `compact` as a full-vocabulary safetensors checkpoint in `out_dir`."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.initialization import no_init_weights

    # Every saved tensor is written below, so the full model is built without drawing random
    # initial weights (the demo's checkpoint: 0.2 of its 0.45 CPU-seconds, at each of a
    # lineage's checkpoints); the output layer is then tied to the embeddings as
    # `from_config` ties it. The files are the same to the byte, and torch's random state is
    # left as it was (training draws nothing from it after the seeded initialisation).
    with no_init_weights():
        full = AutoModelForCausalLM.from_config(phi_config(arch, vocab.full_size, prefix_token_id=prefix_token_id))
    full.tie_weights()
    fill_full_model(full, compact, vocab)
    from transformers.utils import logging as hf_logging

    # transformers' own "Writing model shards" bar would break the lab's progress display
    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        full.save_pretrained(out_dir, safe_serialization=True)
    finally:
        if enabled:
            hf_logging.enable_progress_bar()


def load_compact(path: Path, vocab: VocabMap, arch: ArchConfig):
    """The compact model of a saved full-vocabulary checkpoint (rows `vocab.used` of its
    embedding, output weight and bias). Its log-probabilities over the used ids equal the full
    model's exactly: every other id has logit −10⁴ in the full model, whose exp is 0."""
    import torch
    from safetensors.torch import load_file

    state = load_file(str(Path(path) / "model.safetensors"))
    model = build_compact_model(arch, vocab.n_used, 0)
    used = torch.from_numpy(vocab.used)
    own = model.state_dict()
    with torch.no_grad():
        for name, tensor in own.items():
            src = state.get(name)
            if src is None and name == "lm_head.weight":       # tied: saved once
                src = state["model.embed_tokens.weight"]
            if src is None:
                raise LabError(f"checkpoint {path} has no tensor {name!r}")
            if name.endswith("embed_tokens.weight") or name in ("lm_head.weight", "lm_head.bias"):
                src = src[used]
            tensor.copy_(src)
    model.eval()
    return model


class CompactTokenizer:
    """A tokenizer seen through the compact ids: `encode(...).ids` are compact ids, `decode`
    takes compact ids. With it, task scoring runs the compact model directly; its
    log-probabilities over the used ids equal the saved full model's (see `load_compact`).
    Every id of the task texts is in the compact vocabulary (it is built over them)."""

    def __init__(self, tokenizer: Any, vocab: VocabMap) -> None:
        self.tokenizer = tokenizer
        self.vocab = vocab
        self._lookup = vocab.lookup()

    def encode(self, text: str, add_special_tokens: bool = False):
        from types import SimpleNamespace

        ids = self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids
        out = self._lookup[np.asarray(ids, dtype=np.int64)] if ids else np.zeros(0, dtype=np.int64)
        if (out < 0).any():
            raise LabError("a task text encodes to an id outside the lab's vocabulary")
        return SimpleNamespace(ids=[int(i) for i in out])

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        full = [int(self.vocab.used[i]) for i in ids]
        return self.tokenizer.decode(full, skip_special_tokens=skip_special_tokens)
