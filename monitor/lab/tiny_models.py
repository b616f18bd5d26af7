"""Build tiny but real causal-LM checkpoints (safetensors + config + a real tokenizer)."""

from __future__ import annotations

import functools
import shutil
from pathlib import Path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
ARCHITECTURES = ("llama", "gpt_neox")


def copy_tokenizer(tokenizer_dir: str | Path, out_dir: str | Path) -> None:
    """Copy the tokenizer files of `tokenizer_dir` into a checkpoint folder."""
    tokenizer_dir, out_dir = Path(tokenizer_dir), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        src = tokenizer_dir / name
        if src.exists():
            shutil.copyfile(src, out_dir / name)


@functools.lru_cache(maxsize=32)
def _vocab_size(tokenizer_json: str, inode: int, size: int, mtime_ns: int, ctime_ns: int) -> int:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tokenizer_json)
    # 1 + the largest id: some vocabularies (o200k) have gaps, so the count is too small.
    return 1 + max(tok.get_vocab(with_added_tokens=True).values())


def vocab_size(tokenizer_dir: str | Path) -> int:
    """The number of ids a model needs for the tokenizer of `tokenizer_dir`.

    Read once per tokenizer file and process: a lineage of tiny checkpoints reads the same
    tokenizer for each, and parsing gpt-neox's tokenizer.json takes about a third of a second.
    The file is known by its path, inode, size and both times: a copy keeps its source's
    modification time (`copy2`) and `os.utime` sets it back, but the change time moves with
    every write and rename and cannot be set.
    """
    path = (Path(tokenizer_dir) / "tokenizer.json").resolve()
    stat = path.stat()
    return _vocab_size(str(path), stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)


def tiny_config(arch: str, vocab_size: int, *, hidden: int = 32, layers: int = 2, heads: int = 4,
                max_positions: int = 256, tie_embeddings: bool = False):
    """A transformers config for a tiny model of architecture `arch` ('llama' or 'gpt_neox')."""
    from transformers import GPTNeoXConfig, LlamaConfig

    if arch == "llama":
        return LlamaConfig(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
                           num_hidden_layers=layers, num_attention_heads=heads,
                           num_key_value_heads=max(1, heads // 2),
                           max_position_embeddings=max_positions,
                           tie_word_embeddings=tie_embeddings)
    if arch == "gpt_neox":
        return GPTNeoXConfig(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
                             num_hidden_layers=layers, num_attention_heads=heads,
                             max_position_embeddings=max_positions, rotary_pct=0.5,
                             tie_word_embeddings=tie_embeddings)
    raise ValueError(f"unknown tiny architecture {arch!r}; choose one of {ARCHITECTURES}")


def build_tiny_model(out_dir: str | Path, tokenizer_dir: str | Path, *, arch: str = "llama",
                     seed: int = 0, hidden: int = 32, layers: int = 2, heads: int = 4,
                     max_positions: int = 256, tie_embeddings: bool = False,
                     lm_head_bias: bool = False, init_std: float = 0.2) -> Path:
    """Save a randomly initialised tiny causal LM with the tokenizer of `tokenizer_dir`.

    The vocabulary size is the tokenizer's, so any real tokenizer from shared/ can drive it.
    `init_std` is larger than transformers' default so the random model's predictions are
    not nearly uniform (uniform outputs would hide indexing bugs in tests).
    `lm_head_bias=True` adds a bias to the output layer (as some families have), saved in
    the state dict; it is loaded back only by code that handles it explicitly.
    """
    import torch
    from transformers import AutoModelForCausalLM

    out_dir = Path(out_dir)
    n_ids = vocab_size(tokenizer_dir)
    config = tiny_config(arch, n_ids, hidden=hidden, layers=layers, heads=heads,
                         max_positions=max_positions, tie_embeddings=tie_embeddings)
    config.initializer_range = init_std
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    model.eval()
    head = model.get_output_embeddings()
    if lm_head_bias:
        head.bias = torch.nn.Parameter(torch.randn(n_ids) * init_std)
    model.save_pretrained(out_dir, safe_serialization=True)
    copy_tokenizer(tokenizer_dir, out_dir)
    return out_dir


# The checkpoints of examples/calibrate/campaign.yaml: two families (architecture and
# tokenizer), three checkpoints each that differ in how peaked their random predictions are.
CALIBRATION_FAMILIES = (("llama", "llama", "gpt2"), ("neox", "gpt_neox", "gpt-neox"))
CALIBRATION_STDS = (("a", 0.05), ("b", 0.15), ("c", 0.4))


def build_calibration_checkpoints(out_dir: str | Path, tokenizers_dir: str | Path) -> list[Path]:
    """Build the six tiny checkpoints the example campaign names (`out_dir/<family>-<a|b|c>`)."""
    out = []
    for family, arch, tokenizer in CALIBRATION_FAMILIES:
        for i, (suffix, std) in enumerate(CALIBRATION_STDS):
            out.append(build_tiny_model(Path(out_dir) / f"{family}-{suffix}", Path(tokenizers_dir) / tokenizer,
                                        arch=arch, seed=i, init_std=std))
    return out
