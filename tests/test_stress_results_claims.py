"""docs/stress.md's table of the committed lab-lineage tokenization result, checked against the
committed lstar-stress/1 document (benchmarks/results/stress/) and refitted with numpy."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RESULT = ROOT / "benchmarks" / "results" / "stress" / "lab-v3-pilot-gpt2-s0-tokenization.json"
NAMES = {"whitespace collapsed": "whitespace-collapsed", "BPE-dropout 0.05": "bpe-dropout-0.05",
         "BPE-dropout 0.1": "bpe-dropout-0.1", "pruned merges 10 %": "pruned-merges-10%"}


def test_the_docs_table_is_the_committed_result():
    section = json.loads(RESULT.read_text())["sections"]["tokenization"]
    lstar = {v["name"]: [next(x["lstar"] for x in c["variants"] if x["name"] == v["name"])
                         for c in section["checkpoints"]] for v in section["checkpoints"][0]["variants"]}
    text = (ROOT / "docs" / "stress.md").read_text()
    for label, name in NAMES.items():
        row = re.search(rf"^\| {re.escape(label)} \| ([0-9.]+) → ([0-9.]+) \| ([0-9.]+) \| ([0-9.]+) \| ([0-9.]+) \|",
                        text, re.M)
        assert row, label
        assert (float(row[1]), float(row[2])) == (round(lstar[name][0], 3), round(lstar[name][-1], 3))
        alpha, beta = np.polyfit(lstar["base"], lstar[name], 1)
        assert float(row[4]) == round(alpha, 3), label
        fit = next(f for f in section["fits"] if f["variant"] == name)
        assert abs(fit["alpha"] - alpha) < 1e-9 and abs(fit["beta"] - beta) < 1e-9
