"""Power of lab v3's pre-registered test, by simulation (docs/lab-v3-preregistration.md).

The test (v2's, `monitor.curves.axis_choice.sign_flip_pvalue`): a two-sided sign-flip
permutation test, over families, of the family-averaged difference in leave-one-family-out
crossing error between two axes; exact (all 2^F sign patterns) up to 16 families, 10,000
seeded patterns beyond.

**One unit.** Every effect is δ, the family-averaged difference in crossing-error units, and
its standardised value e = δ / UNIT_SD, where UNIT_SD = 0.0560 is the SD of a family's
difference at three seeds under the variance model below. v2's effects in that unit
(`V2_EFFECTS`, measured by `variance_structure` on the v2 record): bits/byte − L* on calib
(v2's primary) δ 0.0278, e 0.50; bits/byte − L* on heldout δ 0.0278, e 0.50; L*(oos) − L* on
calib δ 0.0509, e 0.91. (0.65 and 0.79, quoted before, were δ over the *measured* spread of
each comparison's per-family differences, 0.043 and 0.035: another unit.)

**Two noise models.**

- *Conservative* (the variance model, `NoiseModel()`): d_f = δ + b_f + mean_s e_fs with
  e_fs ~ N(0, 0.090²) (seed to seed inside a family) and b_f ~ N(0, 0.021²) (the spread of the
  family means), so SD(d_f) = sqrt(0.021² + 0.090²/k) at k seeds. It does not fit its inputs:
  seed noise alone would give family means an SD of 0.090/√3 = 0.052, yet they spread by
  0.021; adding the two overstates the noise, so this model understates the power.
- *Measured* (`NoiseModel.measured(sd)`): d_f ~ N(δ, sd²) with sd the measured SD of the
  per-family differences of v2's three-seed race (seed noise and family spread together),
  valid at three seeds only.

`power_table` gives the conservative power by families and seeds, `measured_power` the
measured model's at three seeds; `exact_power_six` is the closed form for six families (the
test rejects at α 0.05 only with every sign alike, p = 2/64), against which the simulator is
checked. Every cell is seeded by its own coordinates, so one cell recomputed alone equals the
same cell of the whole table.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.stats import norm

from monitor.curves.axis_choice import EXACT_MAX_FAMILIES
from monitor.errors import LabError

# Measured on benchmarks/results/lab-v2/lab.json (see `variance_structure`).
V2_WITHIN_SD = 0.090
V2_BETWEEN_SD = 0.021
V2_SEEDS = 3
# The one unit of every standardised effect: SD of a family's difference at v2's three seeds
# under the conservative (variance) model.
UNIT_SD = math.sqrt(V2_BETWEEN_SD ** 2 + V2_WITHIN_SD ** 2 / V2_SEEDS)


@dataclass(frozen=True)
class V2Effect:
    """One effect seen in v2: δ (crossing-error units) and the measured SD of its per-family
    differences (v2's race, three seeds pooled), both from `variance_structure`."""

    name: str
    delta: float
    measured_sd: float

    @property
    def standardised(self) -> float:
        """δ in the one unit (over UNIT_SD)."""
        return self.delta / UNIT_SD

    @property
    def key(self) -> float:
        """The standardised effect as the tables key it (two decimals)."""
        return round(self.standardised, 2)


# Read from benchmarks/results/lab-v2/lab.json by `variance_structure` (add-words exact match).
V2_EFFECTS = (
    V2Effect("bits/byte - L*, calib (v2's primary)", 1 / 36, 0.0430),
    V2Effect("bits/byte - L*, heldout", 1 / 36, 0.0351),
    V2Effect("L*(oos) - L*, calib (the largest loss-axis effect)", 11 / 216, 0.0567),
)
# The standardised effects of the tables, one per distinct v2 effect: 0.50 and 0.91.
EFFECTS = tuple(sorted({e.key for e in V2_EFFECTS}))
FAMILIES = tuple(range(6, 31))
SEEDS = tuple(range(1, 6))
PERMUTATIONS = 10_000
REPLICATES = 2_000
MAX_FAMILIES = 64
_CHUNK = 1 << 22   # sign patterns × replicates held in memory at once (32 MiB of float64)


@dataclass(frozen=True)
class NoiseModel:
    """The variance structure of per-family differences (within-family seed SD, between-family SD)."""

    within: float = V2_WITHIN_SD
    between: float = V2_BETWEEN_SD
    name: str = "conservative"

    @classmethod
    def measured(cls, sd: float) -> "NoiseModel":
        """d_f ~ N(δ, sd²): the measured spread of per-family differences at three seeds, seed
        noise included (so it is valid at three seeds only)."""
        return cls(within=0.0, between=sd, name="measured")

    def family_sd(self, seeds: int) -> float:
        """SD of a family's difference averaged over `seeds` seeds."""
        return math.sqrt(self.between ** 2 + self.within ** 2 / seeds)

    def raw_effect(self, standardised: float) -> float:
        """δ in crossing-error units for a standardised effect (always in the one unit, UNIT_SD,
        whatever the model, so that models are compared at the same δ)."""
        return standardised * UNIT_SD

    def standardised_at(self, standardised: float, seeds: int) -> float:
        """The same δ standardised by the family SD with `seeds` seeds."""
        return self.raw_effect(standardised) / self.family_sd(seeds)


def sign_flip_pvalues(diffs: np.ndarray, *, permutations: int = PERMUTATIONS, seed: int = 0,
                      exact_max: int = EXACT_MAX_FAMILIES) -> np.ndarray:
    """`sign_flip_pvalue` on every row of `diffs` (replicates × families) at once: the same
    sign patterns (all 2^F, or the same seeded Monte Carlo sample), the same tolerance."""
    d = np.atleast_2d(np.asarray(diffs, dtype=np.float64))
    reps, f = d.shape
    if not 1 <= f <= MAX_FAMILIES:
        raise LabError(f"the sign-flip test takes 1 to {MAX_FAMILIES} families, got {f}")
    if f <= exact_max:
        signs = np.array(list(itertools.product((1.0, -1.0), repeat=f)))
        exact = True
    else:
        signs = np.random.default_rng(seed).choice((1.0, -1.0), size=(permutations, f))
        exact = False
    observed = np.abs(d.mean(axis=1))
    tol = 1e-12 * np.maximum(1.0, np.abs(d).max(axis=1))
    hits = np.zeros(reps)
    step = max(1, _CHUNK // len(signs))
    for lo in range(0, reps, step):
        block = np.abs(signs @ d[lo:lo + step].T) / f            # patterns × replicates
        hits[lo:lo + step] = np.sum(block >= observed[lo:lo + step] - tol[lo:lo + step], axis=0)
    return hits / len(signs) if exact else (1.0 + hits) / (1.0 + permutations)


def simulate_family_differences(n_families: int, n_seeds: int, effect: float, *, noise: NoiseModel,
                                replicates: int, rng: np.random.Generator) -> np.ndarray:
    """Replicates × families of per-family differences under `noise` at standardised `effect`."""
    delta = noise.raw_effect(effect)
    between = rng.normal(0.0, noise.between, size=(replicates, n_families))
    seeds = rng.normal(0.0, noise.within, size=(replicates, n_families, n_seeds)).mean(axis=2)
    return delta + between + seeds


def simulate_power(n_families: int, n_seeds: int, effect: float, *, noise: NoiseModel = NoiseModel(),
                   alpha: float = 0.05, replicates: int = REPLICATES, permutations: int = PERMUTATIONS,
                   seed: int = 0) -> float:
    """Share of simulated designs in which the sign-flip test gives p < α."""
    if not 2 <= n_families <= MAX_FAMILIES or not 1 <= n_seeds <= 100:
        raise LabError(f"power is simulated for 2–{MAX_FAMILIES} families and 1–100 seeds "
                       f"(got {n_families} families, {n_seeds} seeds)")
    if replicates < 100:
        raise LabError(f"{replicates} replicates are too few for a power estimate", hint="use at least 100")
    rng = np.random.default_rng([seed, n_families, n_seeds, int(round(effect * 10_000))])
    d = simulate_family_differences(n_families, n_seeds, effect, noise=noise, replicates=replicates, rng=rng)
    p = sign_flip_pvalues(d, permutations=permutations, seed=seed)
    return float(np.mean(p < alpha))


def exact_power_six(effect_at_design: float) -> float:
    """Power of the exact test with six normal family differences of standardised mean
    `effect_at_design`: p < 0.05 only when all six share a sign (p = 2/64), so the power is
    Φ(e)^6 + Φ(−e)^6."""
    return float(norm.cdf(effect_at_design) ** 6 + norm.cdf(-effect_at_design) ** 6)


def power_table(families: Iterable[int] = FAMILIES, seeds: Iterable[int] = SEEDS,
                effects: Iterable[float] = EFFECTS, *, noise: NoiseModel = NoiseModel(), alpha: float = 0.05,
                replicates: int = REPLICATES, seed: int = 0) -> dict[str, Any]:
    """Power by (effect, seeds, families), with the settings that made it (JSON-ready)."""
    families, seeds, effects = list(families), list(seeds), list(effects)
    cells = {f"{e:g}": {str(k): {str(n): simulate_power(n, k, e, noise=noise, alpha=alpha, replicates=replicates,
                                                         seed=seed) for n in families} for k in seeds}
             for e in effects}
    return {"test": "two-sided sign-flip permutation test over families (exact up to "
                    f"{EXACT_MAX_FAMILIES}, {PERMUTATIONS} seeded patterns beyond)",
            "alpha": alpha, "replicates": replicates, "seed": seed,
            "noise": {"model": noise.name, "within_family_seed_sd": noise.within, "between_family_sd": noise.between},
            "unit": {"sd": UNIT_SD, "definition": "standardised effect = delta / SD of a family's difference at "
                     "three seeds under the conservative model; delta = effect x sd, in crossing-error units"},
            "families": families, "seeds": seeds, "effects": effects, "power": cells}


def measured_power(families: Iterable[int] = FAMILIES, effects: Sequence[V2Effect] = V2_EFFECTS, *,
                   alpha: float = 0.05, replicates: int = REPLICATES, seed: int = 0) -> list[dict[str, Any]]:
    """Power at three seeds under each v2 effect's measured spread (`NoiseModel.measured`), by
    families, at the effect's tabled standardised value (JSON-ready)."""
    families = list(families)
    return [{"name": e.name, "effect": e.key, "delta": e.key * UNIT_SD, "v2_delta": e.delta, "measured_sd": e.measured_sd,
             "effect_over_measured_sd": e.key * UNIT_SD / e.measured_sd, "seeds": V2_SEEDS,
             "power": {str(n): simulate_power(n, V2_SEEDS, e.key, noise=NoiseModel.measured(e.measured_sd),
                                              alpha=alpha, replicates=replicates, seed=seed) for n in families}}
            for e in effects]


def families_needed(table: Mapping[str, Any], effect: float, seeds: int, target: float = 0.8) -> int | None:
    """The fewest families in `table` whose power reaches `target` from there on (None if never)."""
    row = table["power"][f"{effect:g}"][str(seeds)]
    ns = sorted(int(n) for n in row)
    for i, n in enumerate(ns):
        if all(row[str(m)] >= target for m in ns[i:]):
            return n
    return None


def table_lookup(table: Mapping[str, Any], n_families: int, n_seeds: int) -> dict[str, float] | None:
    """Power per effect for one design from a committed table, or None when it is not in it."""
    out = {}
    for e in table["effects"]:
        cell = table["power"].get(f"{e:g}", {}).get(str(n_seeds), {}).get(str(n_families))
        if cell is None:
            return None
        out[f"{e:g}"] = float(cell)
    return out


def markdown_table(table: Mapping[str, Any], effect: float) -> list[str]:
    """One effect's power as a Markdown table: a row per seed count, a column per family count."""
    fams = table["families"]
    out = [f"| seeds \\ families | " + " | ".join(map(str, fams)) + " |", "|---|" + "---:|" * len(fams)]
    for k in table["seeds"]:
        row = table["power"][f"{effect:g}"][str(k)]
        out.append(f"| {k} | " + " | ".join(f"{row[str(n)]:.2f}" for n in fams) + " |")
    return out


# -- the variance structure, measured on a race --------------------------------------------------
def variance_structure(rows: Sequence[Mapping[str, Any]], *, task: str, metric: str, text: str, axis: str,
                       margin: float = 0.1, fold_seed: int = 0) -> dict[str, Any]:
    """How the v2 numbers behind the power analysis are derived from race rows
    (`monitor.lab.records.race_rows`; lab v2's race, `monitor.lab.analysis`):

    - each seed's rows are raced on their own (leave-one-family-out, every size pooled), giving
      each (family, seed) a difference in crossing error, `axis` − L*;
    - `within_sd`: the root of the mean over families of the variance across seeds;
    - `between_sd`: the SD over families of their mean over seeds;
    - `seed_part_sd`: within_sd / sqrt(seeds), the SD seed noise alone gives a family mean (the
      variance model needs between_sd at least this large; v2's primary has 0.021 against 0.052);
    - `difference_sd`: from the race of all seeds together (v2's primary analysis), the SD of the
      per-family differences (the measured model's spread);
    - `standardised_effect`: |difference| over UNIT_SD (the one unit); `effect_over_measured_sd`:
      |difference| over difference_sd (the unit of the measured model only).
    """
    from monitor.lab import analysis as race

    clean = race.check_rows(rows)
    baseline = race._baseline(clean, task, metric)
    d = race._data(clean, task, metric, text, (race.REFERENCE, axis))
    if axis not in d.xs or race.REFERENCE not in d.xs:
        raise LabError(f"axis {axis!r} or L* is missing on the {text} rows of {task}/{metric}")
    fams = sorted(set(d.family.tolist()))
    seeds = sorted(set(d.seed.tolist()))

    def per_family(idx: np.ndarray) -> dict[str, float]:
        lofo = race._lofo(d, idx, None, baseline=baseline, margin=margin, seed=fold_seed)
        err = {a: race._cell_errors(p, d.family[idx], np.ones(len(idx))) for a, p in lofo.points.items()}
        return {f: err[axis][f]["crossing_error"] - err[race.REFERENCE][f]["crossing_error"] for f in err[axis]}

    by_seed = np.array([[per_family(np.flatnonzero(d.seed == s))[f] for s in seeds] for f in fams])
    pooled = per_family(np.arange(len(d.y)))
    diffs = np.array([pooled[f] for f in fams])
    sd = float(np.std(diffs, ddof=1))
    within = float(np.sqrt(np.mean(np.var(by_seed, axis=1, ddof=1))))
    return {"task": task, "metric": metric, "text": text, "axis": axis, "reference": race.REFERENCE,
            "families": fams, "seeds": seeds, "per_family_per_seed": by_seed.tolist(),
            "within_sd": within, "seed_part_sd": within / math.sqrt(len(seeds)),
            "between_sd": float(np.std(by_seed.mean(axis=1), ddof=1)),
            "difference": float(diffs.mean()), "difference_sd": sd,
            "standardised_effect": float(abs(diffs.mean()) / UNIT_SD),
            "effect_over_measured_sd": float(abs(diffs.mean()) / sd) if sd > 0 else None}
