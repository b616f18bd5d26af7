"""Write two labels files of inference budgets from ObsScaling's published tables in
`../shared/data/public-evals/obsscaling/` (`base_llm_post_training_eval.csv`, joined by model
name to `base_llm_benchmark_eval.csv` for FLOPs and family):

`labels/gsm8k-samples.csv`: GSM8K exact match at two sampling budgets, first sample and
majority of five (chain of thought, 8-shot self-consistency prompt):

- budget column `samples`: 1 (`gsm8k_cot_self_consistency_8_exact_match,score-first`) and
  5 (`…,maj@5`), strict extraction;
- axis: `flops` (`FLOPs (1E21)` × 10²¹ of the benchmark table, joined by model name) read as
  log10 FLOPs; family: the benchmark table's `Model Family`;
- n = 500: every value is a multiple of 1/500 (checked below), the size of the subset scored.

`labels/bbh-cot.csv`: BIG-Bench Hard (27 tasks, 3-shot, overall exact match, flexible
extraction) without (`cot` = 0, `bbh_fewshot_overall…`) and with chain of thought (`cot` = 1,
`bbh_cot_fewshot_overall…`). BBH has 6,511 items; the chain-of-thought scores are not whole
counts of them (the answer-only ones are), so `n` = 6,511 makes the weights approximate.

Models without a value at every budget, or without FLOPs in the benchmark table, are left out
(the script prints which).
"""

from __future__ import annotations

import csv
import math
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = HERE.parents[1] / ".." / "shared" / "data" / "public-evals" / "obsscaling"
# (file, task, budget column, {budget: source column}, n, whole counts checked)
TABLES = [
    ("gsm8k-samples.csv", "gsm8k_cot", "samples",
     {1: "gsm8k_cot_self_consistency_8_exact_match,score-first",
      5: "gsm8k_cot_self_consistency_8_exact_match,maj@5"}, 500, True),
    ("bbh-cot.csv", "bbh", "cot",
     {0: "bbh_fewshot_overall_3_exact_match,flexible-extract",
      1: "bbh_cot_fewshot_overall_3_exact_match,flexible-extract"}, 6511, False),
]


def main() -> int:
    source = SOURCE.resolve()
    with open(source / "base_llm_benchmark_eval.csv", encoding="utf-8") as fh:
        bench = {row["Model"]: row for row in csv.DictReader(fh)}
    with open(source / "base_llm_post_training_eval.csv", encoding="utf-8") as fh:
        post = list(csv.DictReader(fh))
    for name, task, column, columns, n_items, whole in TABLES:
        rows, dropped = [], []
        for row in post:
            model = row["Model"]
            if model not in bench:
                sys.exit(f"{model!r} is not in base_llm_benchmark_eval.csv")
            cells = {k: row.get(c, "") for k, c in columns.items()}
            if any(v in ("", "nan") for v in cells.values()) or bench[model]["FLOPs (1E21)"] in ("", "nan"):
                dropped.append(model)
                continue
            flops = float(bench[model]["FLOPs (1E21)"]) * 1e21
            if not math.isfinite(flops) or flops <= 0:
                sys.exit(f"{model}: no FLOPs")
            for budget, cell in cells.items():
                value = float(cell)
                if whole and abs(value * n_items - round(value * n_items)) > 1e-6:
                    sys.exit(f"{model}: {cell} is not a multiple of 1/{n_items}")
                rows.append({"checkpoint": model, "family": bench[model]["Model Family"], "task": task,
                             "metric": "exact_match", "value": cell, "n": n_items, "flops": f"{flops:.6g}",
                             column: budget})
        out = HERE / "labels" / name
        out.parent.mkdir(exist_ok=True)
        with open(out, "w", encoding="utf-8", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(rows[0]), lineterminator="\n")
            writer.writeheader()
            writer.writerows(rows)
        print(f"wrote {out.relative_to(HERE)}: {len(rows) // len(columns)} models × {len(columns)} budgets; "
              f"left out (no value): {', '.join(dropped) or 'none'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
