"""How much memory scoring a checkpoint needs, read from its safetensors headers.

A backend places a job by this estimate (Ray's `memory` resource, the number of GPUs), so
a model goes to a worker that can hold it. Only headers are read: the estimate costs a few
kilobytes of I/O however large the model.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Literal

from monitor.hub import Budgets, ConfigBudgetError, LayoutError, config_shape
from monitor.hub.safetensors_layout import DTYPE_BYTES, check_local_file
from monitor.scoring.precision import DTYPES, UNKNOWN, Capability, resolve_dtype

# Bytes per parameter once loaded, by the dtype scoring runs in.
LOADED_BYTES = dict(zip(DTYPES, (4, 2, 2)))
_FLOAT_DTYPES = frozenset({"F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2"})
# What a scoring worker holds besides the weights: the torch runtime, tokenizer, corpus.
RUNTIME_OVERHEAD = 1 << 30


def loaded_dtype(dtype: str, device: str, capability: Capability | Literal["unknown"] = UNKNOWN) -> str:
    """The dtype scoring loads the weights in, by the rule the loader uses
    (`monitor.scoring.precision.resolve_dtype`): `capability` is the CUDA device's; unknown
    here (the daemon does not import torch; a Ray worker is elsewhere) an auto dtype on CUDA
    counts as float32, the wider, so the estimate is never too small."""
    if device == "auto":
        device = "cuda" if capability != UNKNOWN else "cpu"
    return resolve_dtype(dtype, device, capability)


def weight_bytes(model_dir: Path, dtype: str = "auto", device: str = "auto",
                 capability: Capability | Literal["unknown"] = UNKNOWN) -> int:
    """Bytes the checkpoint's weights take once loaded in `dtype` (floating tensors are
    converted; integer tensors, e.g. packed quantized weights, keep their size)."""
    per_param = LOADED_BYTES[loaded_dtype(dtype, device, capability)]
    total = 0
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise LayoutError(f"{model_dir} holds no .safetensors file to estimate its memory from")
    for path in files:
        _, layout = check_local_file(path)
        for name, count in layout.dtypes.items():
            total += count * (per_param if name in _FLOAT_DTYPES else DTYPE_BYTES[name])
    return total


def activation_bytes(model_dir: Path) -> int:
    """The per-layer activation estimate of the checkpoint's config.json (0 when unknown)."""
    try:
        config = json.loads((model_dir / "config.json").read_text())
        shape = config_shape(config, Budgets())
    except (OSError, ValueError, ConfigBudgetError, AttributeError):
        return 0
    return shape.activation_bytes() or 0


def estimate_memory(model_dir: str | Path, *, dtype: str = "auto", device: str = "auto",
                    capability: Capability | Literal["unknown"] = UNKNOWN) -> int:
    """Bytes a worker needs to score the checkpoint in `model_dir`: loaded weights, two
    layers' activations (one in flight, one being freed) and the runtime's overhead.
    `dtype`/`device` are resolved by the loader's rule, on a CUDA device of `capability`."""
    model_dir = Path(model_dir)
    return (weight_bytes(model_dir, dtype, device, capability) + 2 * activation_bytes(model_dir)
            + RUNTIME_OVERHEAD)


def gpus_needed(memory_bytes: int, gpu_bytes: int) -> int:
    """GPUs of one node a model of `memory_bytes` needs when each has `gpu_bytes` (at least 1).

    More than one means the loader spreads the layers with `device_map="auto"`.
    """
    if gpu_bytes <= 0:
        raise ValueError("gpu_bytes must be positive")
    return max(1, math.ceil(memory_bytes / gpu_bytes))
