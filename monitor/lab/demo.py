"""Trained checkpoint lineages for `lstar demo`: two families, trained in about a minute.

`train_demo_lineages` trains the reduced lab (`monitor.lab.config.reduced_config`: gpt2 and
the toy unigram tokenizer, width 64) without scoring, and returns the checkpoint folders of
each family by step, ready to be published on the fake Hub as step branches. Already trained
lineages in `out` are reused (training resumes from the last saved state).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from monitor.lab.config import reduced_config
from monitor.lab.pipeline import train_lab
from monitor.lab.train import lineage_name


def train_demo_lineages(out: str | Path, *, shared: str | Path = Path("../shared"),
                        families: tuple[str, ...] = ("gpt2", "spm-unigram-toy"), seed: int = 0,
                        workers: int = 2, progress: bool = False, **changes: Any) -> dict[str, dict[int, Path]]:
    """Train one lineage per family; returns {family: {step: checkpoint folder}}."""
    shared = Path(shared)
    config = reduced_config(families=families, seeds=(seed,), tokenizers_dir=shared / "tokenizers",
                            text_corpus=shared / "corpus" / "calib-v0-alt",
                            calib_corpus=shared / "corpus" / "calib-v0",
                            cloze_task=shared / "tasks" / "cloze-v0.jsonl", **changes)
    out = Path(out)
    lineages = train_lab(config, out, workers=workers, progress=progress)
    return {family: {step: out / meta["path"] for step, meta in sorted(lineages[lineage_name(family, seed)].items())}
            for family in families}
