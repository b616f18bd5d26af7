"""monitor.scoring.host_memory: freed activation-sized blocks are reused instead of page-faulted in
again. Each case runs in a fresh interpreter so the allocator setting of one cannot leak
into another (or into the test process)."""

from __future__ import annotations

import json
import platform
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(sys.platform != "linux" or platform.libc_ver()[0] != "glibc",
                                 reason="the setting is glibc's")]

# A forward pass at batch 4 of a small model holds a few 12 MiB activations (gate, up,
# their product) at once and frees them at the end of each layer. Do that 40 times and
# count the minor page faults. With glibc's defaults the freed top of the heap exceeds its
# (self-adjusting) trim threshold and goes back to the kernel, so it faults in again.
PROBE = r"""
import json, resource, sys
import numpy as np
from monitor.scoring.host_memory import keep_freed_memory
applied = keep_freed_memory() if sys.argv[1] == "keep" else None
again = keep_freed_memory() if sys.argv[1] == "keep" else None
def layer():
    blocks = [np.ones(3 << 20, dtype=np.float32) for _ in range(3)]   # 12 MiB each, every page written
    del blocks
for _ in range(3):
    layer()                                     # warm-up: let glibc settle its thresholds
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(40):
    layer()
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print(json.dumps({"applied": applied, "again": again, "faults": faults}))
"""


def probe(mode: str) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_keeping_freed_memory_stops_the_page_faults_of_reallocated_blocks():
    default, kept = probe("default"), probe("keep")
    assert kept["applied"] is True and kept["again"] is True
    pages_per_block = (12 << 20) // 4096
    # glibc's defaults trim part of the freed heap each layer (here about a third of it)
    assert default["faults"] > 4 * pages_per_block
    # kept: the blocks are reused from the heap, so less than one block's worth of faults
    assert kept["faults"] < pages_per_block
