"""What the post-training example's labels support about the budget, beyond the fitted curves.

For each labels file (GSM8K at 1 and 5 samples, BBH without and with chain of thought), on
log10 FLOPs and at the level the README's `lstar curves fit` uses:

1. **Budget order of separate fits.** One weighted isotonic curve per budget level, fitted
   alone (the `per_level` model of the leave-one-family-out table): at how many of the
   distinct FLOPs values the lower budget's fit lies above the higher budget's, and by how
   much at most. Zero would mean the bivariate fit's budget order costs nothing here.
2. **Raw scores.** For how many models the higher budget scores lower, and the two-sided sign
   test over the models whose two scores differ.
3. **The threshold shift** η̂(lowest level) − η̂(highest level), in log10 FLOPs, with a paired
   bootstrap on the fit's own resamples (`--seed`, `--resamples`: the draws of
   `monitor.curves.budget`, so with the defaults these are the resamples behind the
   artifacts' intervals; each level's crossing percentiles equal the artifact's stored
   `threshold.bootstrap`). Two fits on every resample:
   - `bivariate`: the curve monotone in FLOPs and the budget, as fitted. Its shift is ≥ 0 by
     construction, so its interval cannot show that the shift is not zero;
   - `unconstrained`: the separate per-level fits, no budget order, so a resample can give a
     negative shift; the share of resamples at or below 0 is the evidence of a shift.
   Resampled are the distinct FLOPs values (models of equal FLOPs pooled), as the fit does.
   The percentile bootstrap of an isotonic threshold tends to be too narrow
   (`monitor.curves.stats`), so these intervals are if anything optimistic.

    python examples/post-training/budget_checks.py [--json results/budget-checks.json]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import binomtest
from sklearn.isotonic import isotonic_regression

from monitor.bands import first_reach
from monitor.curves.axes import AXES
from monitor.curves.budget import BudgetGrid, bivariate_isotonic, budget_grid, fit_grid
from monitor.curves.labels import read_labels_csv

HERE = Path(__file__).resolve().parent
# (task, labels file, budget column, baseline + margin): as in the README's `lstar curves fit`.
TASKS = (("gsm8k_cot", "gsm8k-samples.csv", "samples", 0.0 + 0.1),
         ("bbh", "bbh-cot.csv", "cot", 0.25 + 0.1))
CONFIDENCE = 0.9


def _crossing(t: np.ndarray, fitted: np.ndarray, level: float, start: float) -> float:
    """Where a non-decreasing fit first reaches `level` (the fit's rule: `start` if it is
    there from the first point, NaN if never)."""
    return start if fitted[0] >= level else first_reach(t, fitted, level)


def _per_level(y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """A separate isotonic fit per budget level (a column), no order across levels."""
    return np.stack([isotonic_regression(y[:, j], sample_weight=w[:, j], increasing=True)
                     for j in range(y.shape[1])], axis=1)


def _interval(values: np.ndarray) -> dict[str, Any]:
    finite = values[np.isfinite(values)]
    alpha = 1.0 - CONFIDENCE
    low, median, high = np.quantile(finite, [alpha / 2.0, 0.5, 1.0 - alpha / 2.0], method="inverted_cdf")
    return {"lower": float(low), "median": float(median), "upper": float(high),
            "share_at_or_below_zero": float(np.mean(finite <= 0.0)),
            "share_below_quarter_decade": float(np.mean(finite < 0.25)),
            "undefined": int(values.size - finite.size)}


def order_violations(grid: BudgetGrid) -> dict[str, Any]:
    """Distinct axis values where a lower budget's separate fit lies above a higher one's."""
    tu, yu, wu, _ = fit_grid(grid.x, grid.y, grid.w)
    free = _per_level(yu, wu)
    gap = np.max(np.maximum(free[:, :-1] - free[:, 1:], 0.0), axis=1)
    # Out of order by more than rounding (two fits that pool alike can differ in the last bits).
    return {"values": int(len(tu)), "violated": int(np.sum(gap > 1e-12)), "largest": float(gap.max())}


def raw_order(grid: BudgetGrid) -> dict[str, Any]:
    """Models scoring lower at the highest budget than at the lowest, and the sign test."""
    diff = grid.y[:, -1] - grid.y[:, 0]
    higher, lower = int(np.sum(diff > 0)), int(np.sum(diff < 0))
    return {"models": int(len(diff)), "higher": higher, "lower": lower, "ties": int(len(diff) - higher - lower),
            "sign_test_p": float(binomtest(higher, higher + lower, 0.5).pvalue)}


def shift(grid: BudgetGrid, level: float, *, resamples: int, seed: int) -> dict[str, Any]:
    """η̂(lowest) − η̂(highest budget) and its paired bootstrap, bivariate and unconstrained."""
    tu, yu, wu, fitted = fit_grid(grid.x, grid.y, grid.w)
    start = float(tu[0])
    last = yu.shape[1] - 1
    free = _per_level(yu, wu)
    estimate = {name: _crossing(tu, f[:, 0], level, start) - _crossing(tu, f[:, last], level, start)
                for name, f in (("bivariate", fitted), ("unconstrained", free))}
    m = len(tu)
    # The draws of monitor.curves.budget._bootstrap: the same seed gives the same resamples.
    draws = np.random.default_rng(seed).multinomial(m, np.full(m, 1.0 / m), size=resamples)
    cross = {"bivariate": np.empty((resamples, 2)), "unconstrained": np.empty((resamples, 2))}
    for b in range(resamples):
        keep = np.flatnonzero(draws[b])
        tb, yb, wb = tu[keep], yu[keep], wu[keep] * draws[b][keep][:, None]
        for name, f in (("bivariate", bivariate_isotonic(yb, wb)), ("unconstrained", _per_level(yb, wb))):
            cross[name][b] = [_crossing(tb, f[:, 0], level, start), _crossing(tb, f[:, last], level, start)]
    out: dict[str, Any] = {"level": level, "resamples": resamples, "seed": seed, "confidence": CONFIDENCE}
    for name, c in cross.items():
        out[name] = {"estimate": estimate[name], **_interval(c[:, 0] - c[:, 1]),
                     "crossing_percentiles": [_interval(c[:, j]) for j in (0, 1)]}
    return out


def check(labels: Path, column: str, level: float, *, resamples: int, seed: int) -> dict[str, Any]:
    grid = budget_grid(read_labels_csv(labels, budget_column=column), AXES["log_flops"])
    return {"labels": labels.name, "budget_column": column, "levels": [float(v) for v in grid.levels],
            "per_level_order": order_violations(grid), "raw_scores": raw_order(grid),
            "shift": shift(grid, level, resamples=resamples, seed=seed)}


def describe(task: str, got: dict[str, Any]) -> str:
    low, high = (f"{v:g}" for v in (got["levels"][0], got["levels"][-1]))
    order, raw, s = got["per_level_order"], got["raw_scores"], got["shift"]
    lines = [f"{task} ({got['labels']}, {got['budget_column']} {low} vs {high}, level {s['level']:g})",
             f"  separate per-level fits out of budget order at {order['violated']} of {order['values']} "
             f"FLOPs values, by up to {order['largest']:.4f}",
             f"  raw scores: {raw['lower']} of {raw['models']} models lower at {high} than at {low}, "
             f"{raw['higher']} higher, {raw['ties']} tied; sign test p = {raw['sign_test_p']:.2g}"]
    for name in ("bivariate", "unconstrained"):
        d = s[name]
        lines.append(f"  shift η̂({low}) − η̂({high}), {name}: {d['estimate']:.3g} log10 FLOPs, "
                     f"{s['confidence']:.0%} paired bootstrap [{d['lower']:.3g}, {d['upper']:.3g}] "
                     f"(median {d['median']:.3g}; ≤ 0 in {d['share_at_or_below_zero']:.1%}, "
                     f"< 0.25 in {d['share_below_quarter_decade']:.1%} of {s['resamples']} resamples, "
                     f"seed {s['seed']})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--resamples", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None, help="also write the numbers here")
    args = parser.parse_args(argv)
    if args.resamples < 50:
        sys.exit("error: use at least 50 resamples")
    results = {task: check(HERE / "labels" / name, column, level, resamples=args.resamples, seed=args.seed)
               for task, name, column, level in TASKS}
    for task, got in results.items():
        print(describe(task, got))
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {args.json}")
    return 0 if all(math.isfinite(r["shift"]["bivariate"]["estimate"]) for r in results.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
