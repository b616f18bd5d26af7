"""Lab v3 race rows with a known answer, in the shape of `records_v3.race_rows_v3`.

Each family reads its own data (`data.sample`), which sets how fast it learns: its latent
progress z = share of the budget × a speed drawn per family, so bytes seen (the same steps for
every family) is not a clock. L* is −2z plus noise; bits/byte −1.2z plus noise plus, with
`winner="lstar"`, a fixed offset per family (so a threshold on it does not transfer). The
primary metric (`logp_correct` of the additions) rises by a logistic in z from log(1/21) when
`skill` is true; when it is false it is drawn independently of every axis. Used by the tests.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

N_OPTIONS = 21
CHANCE_LOGP = math.log(1.0 / N_OPTIONS)


def synthetic_v3_rows(*, families: int = 20, seeds: int = 3, steps: int = 8, skill: bool = True,
                      winner: str | None = "lstar", offset: float = 0.4, noise: float = 0.03,
                      shared_data: bool = False, seed: int = 0) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    # Own data per family: its own speed; shared data: one speed, so bytes seen is a clock.
    speed = np.ones(families) if shared_data else rng.uniform(0.4, 1.6, size=families)
    bpb_offset = rng.normal(0.0, offset, size=families) if winner == "lstar" else np.zeros(families)
    rows = []
    for f in range(families):
        for s in range(seeds):
            for k in range(1, steps + 1):
                z = min(1.0, k / steps * speed[f])
                bytes_seen = 100_000 * k
                for text in ("heldout", "calib"):
                    shift = 0.0 if text == "heldout" else 1.0
                    lstar = -2.0 * z + shift + rng.normal(0, noise)
                    bpb = -1.2 * z + 2.0 + shift + bpb_offset[f] + rng.normal(0, noise)
                    rise = 1.0 / (1.0 + math.exp(-(z - 0.5) / 0.08))
                    logp = (CHANCE_LOGP + 1.2 * rise + rng.normal(0, 0.05) if skill
                            else CHANCE_LOGP + rng.uniform(0.0, 0.8))
                    p = math.exp(logp)
                    acc = min(1.0, max(0.0, 0.05 + 0.8 * rise + rng.normal(0, 0.03)))
                    rows.append({
                        "family": f"fam{f:02d}", "seed": s, "step": 100 * k, "bytes_seen": bytes_seen,
                        "tokens_seen": int(bytes_seen / (3.0 + 0.05 * f)), "text": text,
                        "axes": {"lstar": lstar, "lstar_oos": lstar + 0.3, "bits_per_byte": bpb,
                                 "raw_ce": lstar + 6.0 + 0.1 * f, "bytes_seen": float(bytes_seen),
                                 "tokens_seen": float(int(bytes_seen / (3.0 + 0.05 * f)))},
                        "metrics": {"add-words": {"logp_correct": logp, "p_correct": p, "acc": acc,
                                                  "exact_match": acc}},
                        "baselines": {"add-words": {"logp_correct": CHANCE_LOGP, "p_correct": 1.0 / N_OPTIONS,
                                                    "acc": 1.0 / N_OPTIONS, "exact_match": 0.0}},
                        "data": {"sample": "pool-all" if shared_data else f"sample-{f:02d}"}})
    return rows
