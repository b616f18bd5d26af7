"""The scoring child's memory limit (`--score-memory`): what running out of it looks like, and
a check at start-up that the limit can hold the scoring libraries at all.

The limit is an address-space limit (`RLIMIT_AS`), set in the child between fork and exec
(`limit_child`). Under it, a shared library that does not fit fails to
load with an ImportError ("libtorch_cpu.so: failed to map segment from shared object"), a
Python allocation with MemoryError, a C++ one with std::bad_alloc, and OpenBLAS prints an
error or retries its thread buffers for ever. None of these means a package is missing: the
limit is too small, and the same checkpoint scores under a larger one. `is_memory_failure`
tells them apart from a genuinely absent module.

`check_score_memory` measures once, in a probe child, what every scoring child imports
before it loads a checkpoint: the peak address space (`VmPeak`, the quantity `RLIMIT_AS`
bounds). A limit below that is refused at once (under it the probe could hang in OpenBLAS's
retries). A limit within `CONFIRM_MARGIN` of the need is confirmed by a second probe under
the limit itself, by the same mechanism. Probe protocol: `python -m
monitor.scoring.memory_limit` prints one JSON line, `{"ok": true, "peak_bytes": N}` or
`{"ok": false, "error_class", "message"}`.
"""

from __future__ import annotations

import ctypes
import faulthandler
import importlib
import json
import resource
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

from monitor.errors import SpecError

# What in an error message or a dead child's output says an allocation or a mapping failed.
# Compared in lower case.
MEMORY_MARKERS = ("memoryerror", "std::bad_alloc", "cannot allocate memory", "can't allocate memory",
                  "out of memory", "failed to map segment", "memory allocation still failed",
                  "memory allocation failed", "[errno 12]")
# The modules a scoring child imports before it loads a checkpoint (transformers imports
# its model classes lazily: the auto classes and modeling_utils are what every load takes).
PROBE_MODULES = ("monitor.scoring.engine", "monitor.scoring.forward", "torch", "tokenizers", "safetensors",
                 "transformers", "transformers.modeling_utils", "transformers.models.auto.modeling_auto")
# Importing torch and transformers takes seconds; on a loaded machine, a minute or more.
PROBE_TIMEOUT_S = 300.0
# A limit less than this many times the measured need is also tried: what the imports reserve
# without a limit (allocator arenas, thread stacks) and need under one differ a little.
CONFIRM_MARGIN = 1.5


def is_memory_failure(text: str) -> bool:
    """Whether an error message or a child's output says memory ran out (an allocation or a
    shared library's mapping failed), as opposed to anything else."""
    lowered = text.lower()
    return any(marker in lowered for marker in MEMORY_MARKERS)


def size_text(n_bytes: int) -> str:
    """`n_bytes` for messages: in GiB, or in MiB below 1 GiB (as `--score-memory 300M` was given)."""
    if n_bytes < 1 << 30:
        return f"{n_bytes / 2**20:.0f} MiB"
    return f"{n_bytes / 2**30:.2f} GiB"


_PR_SET_PDEATHSIG = 1  # prctl(2): the signal a child gets when its parent dies


def limit_child(memory_bytes: int | None) -> None:
    """Runs in the child between fork and exec: die with the parent, cap the address space
    (the scoring child's, `child.run_score_child`, and the start-up probe's, `probe`)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:  # not Linux: the time limit still bounds an orphan
        pass
    if memory_bytes is not None:
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))


@dataclass(frozen=True)
class ProbeResult:
    """What a probe child said: whether the imports succeeded, its peak address space, and
    why it failed (one line) when it did."""

    ok: bool
    peak_bytes: int | None = None
    reason: str = ""
    memory_failure: bool = False
    timed_out: bool = False
    seconds: float = 0.0


def probe(memory_bytes: int | None, *, timeout_s: float = PROBE_TIMEOUT_S) -> ProbeResult:
    """Import the scoring libraries in a child under `memory_bytes` of address space (None:
    no limit), exactly as a scoring child is limited; what happened."""
    started = time.monotonic()
    try:
        child = subprocess.Popen([sys.executable, "-m", "monitor.scoring.memory_limit"],
                                 stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 close_fds=True, preexec_fn=lambda: limit_child(memory_bytes))
    except OSError as exc:  # too little to start the interpreter at all
        return ProbeResult(False, reason=f"{type(exc).__name__}: {exc}", memory_failure=is_memory_failure(str(exc)))
    try:
        output, _ = child.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        child.kill()
        output, _ = child.communicate()
        text = output.decode("utf-8", errors="replace")
        return ProbeResult(False, reason=f"the imports did not finish within {timeout_s:g} s",
                           memory_failure=is_memory_failure(text), timed_out=True, seconds=timeout_s)
    text = output.decode("utf-8", errors="replace")
    answer = _last_json_line(text)
    if answer is not None and answer.get("ok"):
        peak = answer.get("peak_bytes")
        return ProbeResult(True, peak_bytes=int(peak) if isinstance(peak, int) else None,
                           seconds=time.monotonic() - started)
    if answer is not None:
        reason = " ".join(f"{answer.get('error_class')}: {answer.get('message')}".split())[:300]
    else:
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        reason = f"exit code {child.returncode}" + (f": {lines[-1][:300]}" if lines else "")
    return ProbeResult(False, reason=reason, memory_failure=is_memory_failure(text),
                       seconds=time.monotonic() - started)


def _last_json_line(text: str) -> dict | None:
    for line in reversed(text.splitlines()):
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except ValueError:
                return None
            return value if isinstance(value, dict) else None
    return None


def check_score_memory(memory_bytes: int | None, *, timeout_s: float = PROBE_TIMEOUT_S) -> ProbeResult | None:
    """Refuse a scoring memory limit too small to import the scoring libraries (SpecError
    naming `--score-memory`, the limit and the measured need); None without a limit, else
    what the probe measured.

    One probe child without a limit measures the need; a limit close to it is tried by a
    second probe under the limit. A failure that is not the limit's (the probe fails without
    a limit too, or fails under it for another reason) is left to scoring, which reports
    its real reason.
    """
    if memory_bytes is None:
        return None
    measured = probe(None, timeout_s=timeout_s)
    need = measured.peak_bytes
    if not measured.ok or need is None:
        return measured
    refusal = (f"--score-memory {size_text(memory_bytes)} is too small: a scoring child needs about "
               f"{size_text(need)} of address space to load torch and transformers on this machine (measured)")
    hint = "give --score-memory more than that (scoring a model needs more still), or auto"
    if need > memory_bytes:
        raise SpecError(refusal, hint=hint)
    if memory_bytes < need * CONFIRM_MARGIN:
        # Bounded by how long the imports took without the limit, not the full timeout.
        limited = probe(memory_bytes, timeout_s=min(timeout_s, max(30.0, 4 * measured.seconds)))
        # A hang only under the limit is OpenBLAS retrying buffers it cannot get.
        if not limited.ok and (limited.memory_failure or limited.timed_out):
            raise SpecError(f"{refusal}, and under the limit it failed: {limited.reason}", hint=hint)
    return measured


def proc_status_bytes(field: str, pid: int | str = "self") -> int | None:
    """A memory field of `/proc/PID/status` (`VmPeak`, `VmRSS`, …) in bytes; None when it
    cannot be read."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith(f"{field}:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def vm_peak() -> int | None:
    """This process's peak address space (`VmPeak`, what RLIMIT_AS bounds) in bytes."""
    return proc_status_bytes("VmPeak")


def main() -> int:
    """Probe child: import what a scoring child imports, run one small matrix product (which
    starts the math libraries' thread pools, as a forward pass does), print the outcome."""
    from monitor.environment import harden_environment

    faulthandler.enable()
    harden_environment()
    try:
        for name in PROBE_MODULES:
            importlib.import_module(name)
        torch = sys.modules["torch"]
        torch.ones(64, 64) @ torch.ones(64, 64)
    except Exception as exc:  # MemoryError included
        print(json.dumps({"ok": False, "error_class": type(exc).__name__, "message": str(exc)}), flush=True)
        return 1
    print(json.dumps({"ok": True, "peak_bytes": vm_peak()}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
