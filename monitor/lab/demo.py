"""Trained checkpoint lineages for `lstar demo`: one tokenizer family (gpt2), two seeds.

`demo_config` is the lab sized for the demo's time budget so that its models learn the lab's
additions in words (`seven plus two is nine`) with a jump inside it: the lab's width over
64-token contexts, batch 4, 48 additions around each chunk of natural text, 1 MB of the lab's
byte stream per lineage and a checkpoint every twelfth of it, one lineage at a time on two torch
threads. Accuracy on the 55 additions stays near the frequency of the commonest answer (0.18)
for the first quarter of the budget, then rises to 0.8–0.95 (docs/lab.md, "The demo's size").
Seed 0 is the history the demo's shipped curve was fitted on (`monitor.demo.history`); seed 1
is the live lineage it publishes. `train_demo_lineages` trains without scoring and returns the
checkpoint folders of each (family, seed) by step, ready to be labelled or published on the
fake Hub; already trained lineages in `out` are reused (training resumes from the last saved
state). `demo_task_file` is the additions task as a multiple-choice JSONL file (what
`lstar eval` and the daemon's evaluation run).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from monitor.lab.config import LabConfig
from monitor.lab.model import ArchConfig
from monitor.lab.pipeline import TASKS_DIR, train_lab
from monitor.lab.tasks import ADD_TASK
from monitor.lab.train import lineage_name

DEMO_FAMILIES = ("gpt2",)
DEMO_SEEDS = (0, 1)
# Twelve checkpoints: enough on each side of the jump for the curve's threshold to be resolved
# from one seed, and for the other seed to be seen before, during and after it.
DEMO_FRACTIONS = tuple(round(i / 12, 4) for i in range(1, 13))


def demo_config(shared: str | Path = Path("../shared"), **changes: Any) -> LabConfig:
    """The demo's lab: the full lab's width over shorter contexts, mostly additions, 1 MB."""
    shared = Path(shared)
    config = LabConfig(families=DEMO_FAMILIES, seeds=DEMO_SEEDS, byte_budget=1_000_000,
                       arch=ArchConfig(hidden=128, layers=2, heads=4, intermediate=512, context=64),
                       batch_size=4, lr=3e-3, warmup_steps=10, fractions=DEMO_FRACTIONS, problems_per_doc=48,
                       # one lineage at a time on both cores; the thread count changes the float
                       # rounding of training, so a lineage is reproduced only with the same count
                       threads=2,
                       tokenizers_dir=shared / "tokenizers", text_corpus=shared / "corpus" / "calib-v0-alt",
                       calib_corpus=shared / "corpus" / "calib-v0", cloze_task=shared / "tasks" / "cloze-v0.jsonl")
    return config.with_(**changes)


def train_demo_lineages(out: str | Path, *, shared: str | Path = Path("../shared"), workers: int = 2,
                        progress: bool = False, on_step: Callable[[str, int, int], None] | None = None,
                        **changes: Any) -> dict[tuple[str, int], dict[int, Path]]:
    """Train every (family, seed) lineage of `demo_config`; returns {(family, seed): {step: folder}}.
    `progress` draws bars on stderr; `on_step` is told of the steps as they are done (`train_lab`)."""
    config = demo_config(shared, **changes)
    out = Path(out)
    lineages = train_lab(config, out, workers=workers, progress=progress, on_step=on_step)
    return {(family, seed): {step: out / meta["path"]
                             for step, meta in sorted(lineages[lineage_name(family, seed)].items())}
            for seed in config.seeds for family in config.families}


def demo_task_file(out: str | Path) -> Path:
    """The additions in words as a multiple-choice JSONL file (id, context, ten number-word
    choices, answer), written by `train_demo_lineages`; `lstar eval` runs it as it is."""
    return Path(out) / TASKS_DIR / f"{ADD_TASK}.jsonl"
