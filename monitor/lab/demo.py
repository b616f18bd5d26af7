"""Trained checkpoint lineages for `lstar demo`: two tokenizer families, two seeds each.

`demo_config` is the lab sized for the demo's time budget (about a minute and a half of
training on 2 cores): the lab's architecture over 64-token contexts, 300 kB of the lab's byte
stream per lineage. Both families end below their unigram baseline on calib-v0 (negative L*),
as real models do. `train_demo_lineages` trains it without scoring and returns the checkpoint
folders of each (family, seed) by step, ready to be labelled or published on the fake Hub;
already trained lineages in `out` are reused (training resumes from the last saved state).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from monitor.lab.config import LabConfig
from monitor.lab.model import ArchConfig
from monitor.lab.pipeline import TASKS_DIR, train_lab
from monitor.lab.tasks import CLOZE_TASK
from monitor.lab.train import lineage_name

DEMO_FAMILIES = ("gpt2", "spm-unigram-toy")
DEMO_SEEDS = (0, 1)


def demo_config(shared: str | Path = Path("../shared"), **changes: Any) -> LabConfig:
    """The demo's lab: the full lab's width over shorter contexts and a 300 kB budget."""
    shared = Path(shared)
    config = LabConfig(families=DEMO_FAMILIES, seeds=DEMO_SEEDS, byte_budget=300_000,
                       arch=ArchConfig(hidden=128, layers=2, heads=4, intermediate=512, context=64),
                       batch_size=8, lr=3e-3, warmup_steps=10, fractions=(0.15, 0.45, 1.0), problems_per_doc=8,
                       tokenizers_dir=shared / "tokenizers", text_corpus=shared / "corpus" / "calib-v0-alt",
                       calib_corpus=shared / "corpus" / "calib-v0", cloze_task=shared / "tasks" / "cloze-v0.jsonl")
    return config.with_(**changes)


def train_demo_lineages(out: str | Path, *, shared: str | Path = Path("../shared"), workers: int = 2,
                        progress: bool = False, **changes: Any) -> dict[tuple[str, int], dict[int, Path]]:
    """Train every (family, seed) lineage of `demo_config`; returns {(family, seed): {step: folder}}."""
    config = demo_config(shared, **changes)
    out = Path(out)
    lineages = train_lab(config, out, workers=workers, progress=progress)
    return {(family, seed): {step: out / meta["path"]
                             for step, meta in sorted(lineages[lineage_name(family, seed)].items())}
            for seed in config.seeds for family in config.families}


def heldout_cloze_file(out: str | Path) -> Path:
    """The cloze items of the documents the demo's lab held out of training (written by
    `train_demo_lineages`)."""
    return Path(out) / TASKS_DIR / f"{CLOZE_TASK}.jsonl"
