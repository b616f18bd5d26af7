"""Measured matrix-multiply peak of this machine, per dtype, with torch on the CPU or a GPU.

The peak is the best rate `2·n³ / t` of `torch.matmul` on square n×n matrices, over a few
sizes and two layouts: `A @ B` and `A @ Bᵀ` (the layout `nn.Linear` uses, which some
back-ends run on a faster kernel). Sizes grow while the next one fits in the
time budget at the rate measured so far, so a dtype without a fast kernel (bf16 on a CPU
lacking AVX512-BF16/AMX can run 20-200x slower than float32) still finishes in seconds.
On CUDA the sizes go on to 16384 (a GPU reaches its peak only on large products), the
clock is read after `torch.cuda.synchronize`, and float32 runs in full float32 (no TF32).

    python benchmarks/matmul_peak.py                    # prints one JSON object
    python benchmarks/matmul_peak.py --device cuda
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

SIZES = (512, 1024, 2048, 3072, 4096)
CUDA_SIZES = (1024, 2048, 4096, 8192, 12288, 16384)


def measure_matmul_peak(dtype_name: str, *, budget_s: float = 10.0, repeats: int = 3,
                        threads: int | None = None, device: str = "cpu") -> dict[str, Any]:
    """Best GFLOP/s of square `torch.matmul` in `dtype_name` ("float32" or "bfloat16") on
    `device` ("cpu", "cuda" or "cuda:N").

    A size n is tried in a layout only if, at the rate that layout reached at the previous
    size, its warm-up and `repeats` timed products fit in what is left of `budget_s`.
    Returns {dtype, device, gflops, n, layout, threads, trials: [{n, layout, seconds, gflops}]}.
    """
    import torch

    if threads is not None:
        torch.set_num_threads(threads)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype_name]
    cuda = device.startswith("cuda")
    sizes = CUDA_SIZES if cuda else SIZES
    repeats = max(repeats, 10) if cuda else repeats    # a GPU product takes milliseconds

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    from monitor.scoring.forward import full_precision_float32

    with full_precision_float32(dtype):                # float32 means float32, not TF32
        trials = _trials(torch, dtype, device, sizes, repeats, budget_s, sync)
    top = max(trials, key=lambda t: t["gflops"])
    return {"dtype": dtype_name, "device": device, "gflops": top["gflops"], "n": top["n"],
            "layout": top["layout"], "threads": torch.get_num_threads(), "trials": trials}


def _trials(torch: Any, dtype: Any, device: str, sizes: Any, repeats: int, budget_s: float,
            sync: Any) -> list[dict[str, Any]]:
    generator = torch.Generator(device=device).manual_seed(0)
    trials: list[dict[str, Any]] = []
    rate: dict[str, float | None] = {"nn": None, "nt": None}   # FLOP/s at the last size tried
    started = time.perf_counter()
    for n in sizes:
        flop = 2.0 * n ** 3
        left = budget_s - (time.perf_counter() - started)
        # untried layouts always run at the first size; later, only if the next size fits
        layouts = [name for name, r in rate.items() if r is None or (repeats + 1) * flop / r < left]
        if n != sizes[0]:
            layouts = [name for name in layouts if rate[name] is not None]
        rate = {name: rate[name] for name in layouts}
        if not layouts:
            break
        # made on the device: on a GPU, making them on the CPU took most of the time budget
        a = torch.randn(n, n, generator=generator, device=device, dtype=dtype)
        b = torch.randn(n, n, generator=generator, device=device, dtype=dtype)
        for layout in layouts:
            rhs = b if layout == "nn" else b.t()
            torch.matmul(a, rhs)                      # warm-up: kernel selection, page faults
            sync()
            best = float("inf")
            for _ in range(repeats):
                t0 = time.perf_counter()
                torch.matmul(a, rhs)
                sync()
                best = min(best, time.perf_counter() - t0)
            rate[layout] = flop / best
            trials.append({"n": n, "layout": layout, "seconds": best, "gflops": flop / best / 1e9})
        del a, b
    return trials


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", default="float32,bfloat16", help="comma-separated dtype names")
    parser.add_argument("--budget-s", type=float, default=10.0, help="time budget per dtype")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    args = parser.parse_args(argv)
    result = {name: measure_matmul_peak(name, budget_s=args.budget_s, threads=args.threads, device=args.device)
              for name in args.dtypes.split(",")}
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
