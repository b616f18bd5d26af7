"""Race rows with a known answer, in the format of `monitor.lab.records.race_rows`.

Every checkpoint has a latent progress z in [0, 1) that rises with training, faster for the
larger size and at a speed that differs a little between families (so bytes seen is a clock
neither across sizes nor across families). Every task metric is a known function of z: the
additions' exact match and accuracy a logistic rise at z = 0.5, the probability of the answer a
straight line, cloze a smaller logistic rise. L* is −2z plus noise that does not depend on the
family; bits/byte is −1.2z plus the same kind of noise plus, with `winner="lstar"`, a fixed
offset per family. So with `winner="lstar"` a threshold on L* transfers to a new family and
one on bits/byte does not; with `winner=None` the two axes are the same kind of function of z
and nothing should be concluded. Used by the tests and `benchmarks/lab_race_timing.py`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

FAMILY_NAMES = ("gpt2", "llama-2", "llama-3", "smollm2", "qwen2", "gpt-4o", "gpt-neox", "phi-3", "starcoder2")
SIZE_SPEED = {"small": 1.0, "large": 1.8}


def _logistic(z: float, mid: float, width: float) -> float:
    return 1.0 / (1.0 + math.exp(-(z - mid) / width))


def synthetic_race_rows(*, families: int = 6, sizes: tuple[str, ...] = ("small", "large"), seeds: int = 3,
                        steps: int = 20, winner: str | None = "lstar", offset: float = 0.4,
                        noise: float = 0.02, n_items: int = 200, seed: int = 0) -> list[dict[str, Any]]:
    """Rows for `families` × `sizes` × `seeds` lineages of `steps` checkpoints, on both texts.

    `offset` is the largest per-family shift of bits/byte, in units of z (the threshold lies at
    z = 0.5 and the rise is about 0.1 wide); every family's shift is at least half of it.
    """
    if not 2 <= families <= len(FAMILY_NAMES):
        raise ValueError(f"families must be from 2 to {len(FAMILY_NAMES)}")
    rng = np.random.default_rng(seed)
    names = FAMILY_NAMES[:families]
    # Shifts of ±(0.5 … 1)·offset, alternating in sign: none is near zero.
    mags = np.linspace(0.5, 1.0, families) * offset
    shifts = {f: float(mags[i] * (1 if i % 2 == 0 else -1)) for i, f in enumerate(names)}
    speeds = {f: float(s) for f, s in zip(names, np.linspace(0.85, 1.15, families))}
    ce_uni = {f: float(u) for f, u in zip(names, np.linspace(5.0, 8.0, families))}
    rows: list[dict[str, Any]] = []
    for f in names:
        for size in sizes:
            for s in range(seeds):
                for k in range(1, steps + 1):
                    bytes_seen = 60_000 * k
                    z = 1.0 - math.exp(-2.2 * SIZE_SPEED.get(size, 1.0) * speeds[f] * k / steps)
                    z = min(max(z + rng.normal(0, 0.01), 0.0), 1.0)
                    em = rng.binomial(n_items, _logistic(z, 0.5, 0.05)) / n_items
                    acc = rng.binomial(n_items, 0.1 + 0.9 * _logistic(z, 0.5, 0.05)) / n_items
                    p_correct = min(max(0.1 + 0.6 * z + rng.normal(0, 0.01), 0.0), 1.0)
                    cloze = rng.binomial(n_items, 0.25 + 0.3 * _logistic(z, 0.45, 0.08)) / n_items
                    metrics = {"add-words": {"acc": acc, "exact_match": em, "p_correct": p_correct},
                               "cloze": {"acc": cloze, "exact_match": cloze * 0.8,
                                         "p_correct": 0.25 + 0.2 * z}}
                    baselines = {"add-words": {"acc": 0.1, "exact_match": 0.0, "p_correct": 0.1},
                                 "cloze": {"acc": 0.25, "exact_match": 0.0, "p_correct": 0.25}}
                    for text, shift in (("calib", 0.0), ("heldout", 0.15)):
                        lstar = 1.0 + shift - 2.0 * z + rng.normal(0, 2.0 * noise)
                        off = shifts[f] if winner == "lstar" else 0.0
                        bpb = 3.0 + shift - 1.2 * (z - off) + rng.normal(0, 1.2 * noise)
                        raw_ce = lstar + ce_uni[f]
                        rows.append({
                            "family": f, "size": size, "seed": s, "step": 100 * k, "bytes_seen": bytes_seen,
                            "tokens_seen": int(bytes_seen * 0.3), "text": text,
                            "axes": {"lstar": lstar, "lstar_oos": lstar + 0.05 + rng.normal(0, noise),
                                     "bits_per_byte": bpb, "raw_ce": raw_ce, "l_rel": raw_ce / ce_uni[f],
                                     "l_gain": (ce_uni[f] - raw_ce) / ce_uni[f],
                                     "bpb_minus_unigram": bpb - 0.4 * ce_uni[f], "bytes_seen": float(bytes_seen)},
                            "metrics": metrics, "baselines": baselines})
    return rows
