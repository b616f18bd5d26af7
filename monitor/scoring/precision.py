"""The device and dtype a score runs in: `auto` resolved once, by one rule.

The rule (docs/measurement.md §1): `--device auto` is `cuda` where torch sees a GPU, else
`cpu`; `--dtype auto` is bfloat16 on a CUDA device that computes in bf16 natively (compute
capability 8, Ampere, and later), float32 on an older GPU (which only emulates bf16,
slowly) and on the CPU. Every place that needs the answer asks here: the loader (what the
model is loaded in), the memory estimate a backend places a job by (`backends.placement`),
and the daemon, which resolves its scoring template once so that the options it digests
to link identical weights (`request_digest`) name the precision the scores are computed
in, never the word `auto`.

The hardware is a parameter (`capability`), so the rule is testable without a GPU; without
one, torch is asked. `host_precision` answers for this machine without importing torch in
the calling process (the daemon starts without torch): on a machine with no NVIDIA driver
there is no CUDA device to ask about; elsewhere a child interpreter asks the same torch the
scoring workers use, once per process.
"""

from __future__ import annotations

import functools
import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

# The dtype and device choices and the bf16 threshold live in `monitor.constants` (the command
# line's help prints them without importing this module); re-exported here for the stages.
from monitor.constants import (BF16_NATIVE_MAJOR, DEVICE_PATTERN, DTYPE_ALIASES, DTYPE_CHOICES,  # noqa: F401
                               DTYPES, UNKNOWN, Capability, DTypeChoice)
from monitor.errors import SpecError


@dataclass(frozen=True)
class Precision:
    """A resolved device (cpu, cuda or cuda:N) and dtype (one of DTYPES)."""

    device: str
    dtype: str


def resolve_device(device: str) -> str:
    """'auto' → 'cuda' when a GPU is usable, else 'cpu'; explicit choices are checked (torch)."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        return "cpu"
    if device == "cuda" or device.startswith("cuda:"):
        if not torch.cuda.is_available():
            raise SpecError(f"device {device!r} requested but no CUDA GPU is available",
                            hint="use --device cpu or --device auto")
        index = device.partition(":")[2]
        if device != "cuda" and not (index.isdigit() and int(index) < torch.cuda.device_count()):
            raise SpecError(f"device {device!r} does not exist: this host has "
                            f"{torch.cuda.device_count()} CUDA device(s)",
                            hint=f"use cuda:0 .. cuda:{torch.cuda.device_count() - 1} or cuda")
        return device
    raise SpecError(f"unknown device {device!r}", hint="use auto, cpu, cuda or cuda:N")


def canonical_dtype(dtype: str) -> str:
    """'auto' or the canonical name of an explicit dtype (aliases such as bf16 accepted)."""
    if dtype == "auto":
        return dtype
    name = DTYPE_ALIASES.get(dtype)
    if name is None:
        raise SpecError(f"unknown dtype {dtype!r}", hint=f"use {', '.join(DTYPE_CHOICES[:-1])} or {DTYPE_CHOICES[-1]}")
    return name


def resolve_dtype(dtype: str, device: str,
                  capability: Capability | Literal["unknown"] | None = None) -> str:
    """The dtype a score on the resolved `device` runs in: 'auto' → bfloat16 on a CUDA device
    of compute capability ≥ 8, float32 on an older GPU and on the CPU; 'bfloat16' on CPU is
    the opt-in bf16 CPU path. `capability` is the device's (major, minor); None asks torch,
    "unknown" (the device is elsewhere) gives float32."""
    name = canonical_dtype(dtype)
    if name == "auto":
        if not device.startswith("cuda"):
            return "float32"
        if capability is None:
            import torch

            capability = tuple(torch.cuda.get_device_capability(device))  # type: ignore[assignment]
        if capability == UNKNOWN:
            return "float32"
        return "bfloat16" if capability[0] >= BF16_NATIVE_MAJOR else "float32"  # type: ignore[index]
    if name == "float16" and device == "cpu":
        raise SpecError("dtype float16 is not supported on CPU", hint="use float32 or bfloat16 on CPU")
    return name


def resolve_precision(dtype: str, device: str,
                      capability: Capability | Literal["unknown"] | None = None) -> Precision:
    """Device and dtype resolved together (device first: the dtype rule depends on it)."""
    resolved = resolve_device(device) if capability is None else _device_given(device, capability)
    return Precision(device=resolved, dtype=resolve_dtype(dtype, resolved, capability))


def _device_given(device: str, capability: Capability | Literal["unknown"]) -> str:
    # A GPU of the given capability: 'auto' is 'cuda'. Hardware unknown: 'auto' stays open.
    return "cuda" if device == "auto" and capability != UNKNOWN else device


@functools.lru_cache(maxsize=8)
def _host_capabilities() -> tuple[Capability, ...]:
    """Compute capabilities of the CUDA devices torch sees on this machine, without importing
    torch here: no NVIDIA driver, no devices; else a child interpreter asks torch."""
    if "torch" in sys.modules:
        torch = sys.modules["torch"]
        if not torch.cuda.is_available():
            return ()
        return tuple(tuple(torch.cuda.get_device_capability(i)) for i in range(torch.cuda.device_count()))
    if not Path("/proc/driver/nvidia/version").exists() and not Path("/dev/nvidiactl").exists():
        return ()
    code = ("import json, torch; ok = torch.cuda.is_available(); "
            "print(json.dumps([list(torch.cuda.get_device_capability(i)) "
            "for i in range(torch.cuda.device_count())] if ok else []))")
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
        return tuple((int(c[0]), int(c[1])) for c in json.loads(out.stdout.strip().splitlines()[-1]))
    except (OSError, subprocess.SubprocessError, ValueError, IndexError, TypeError):
        return ()


def host_precision(dtype: str, device: str) -> Precision:
    """`dtype`/`device` resolved for this machine by the rule above, torch not imported here.
    An explicit CUDA device this machine lacks is kept as given (the loader refuses it)."""
    dtype = canonical_dtype(dtype)
    if device == "cpu":
        return Precision("cpu", resolve_dtype(dtype, "cpu", UNKNOWN))
    caps = _host_capabilities()
    if device == "auto":
        device = "cuda" if caps else "cpu"
    if not device.startswith("cuda"):
        return Precision(device, resolve_dtype(dtype, device, UNKNOWN))
    suffix = device.partition(":")[2]
    index = 0 if device == "cuda" else int(suffix) if suffix.isdigit() else -1
    capability: Capability | Literal["unknown"] = caps[index] if 0 <= index < len(caps) else UNKNOWN
    if dtype != "auto":
        return Precision(device, dtype)
    return Precision(device, resolve_dtype(dtype, device, capability))


__all__ = ["BF16_NATIVE_MAJOR", "DEVICE_PATTERN", "DTypeChoice", "DTYPES", "DTYPE_ALIASES", "DTYPE_CHOICES", "Precision", "UNKNOWN",
           "canonical_dtype", "host_precision", "resolve_device", "resolve_dtype", "resolve_precision"]
