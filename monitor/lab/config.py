"""What a lab run is: families, seeds, byte budget, architecture, data and scoring settings.

The whole configuration is stored in `lab.json` (with the sha256 of every input) so a run can
be reproduced; `LabConfig.validate` turns every bad value into one `LabError` line naming it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from monitor.errors import LabError
from monitor.lab.model import ArchConfig

SHARED = Path("../shared")
# Families of the full lab: four real tokenizers and the toy unigram one.
DEFAULT_FAMILIES = ("gpt2", "llama-3", "bert-base-uncased", "smollm2", "spm-unigram-toy")
# Checkpoints at these shares of the byte budget: same bytes seen in every family. Denser in
# the middle, where the pilot in docs/lab.md saw the additions task rise.
DEFAULT_FRACTIONS = (0.05, 0.15, 0.25, 0.35, 0.45, 0.6, 0.8, 1.0)
MAX_BYTE_BUDGET = 1 << 30


@dataclass(frozen=True)
class LabConfig:
    """One lab run. Paths may be relative to the working folder (the checkout)."""

    families: tuple[str, ...] = DEFAULT_FAMILIES
    seeds: tuple[int, ...] = (0, 1, 2)
    # Budget, batch and the share of additions were set from a pilot (docs/lab.md, "Sizing the
    # budget") so that the additions task is learned inside the budget; 1.2 MB at batch 8 left
    # every real tokenizer at chance.
    byte_budget: int = 2_400_000
    arch: ArchConfig = field(default_factory=ArchConfig)
    batch_size: int = 4
    lr: float = 2e-3
    warmup_steps: int = 30
    fractions: tuple[float, ...] = DEFAULT_FRACTIONS
    data_seed: int = 0
    problems_per_doc: int = 16
    heldout_every: int = 3
    tokenizers_dir: Path = SHARED / "tokenizers"
    text_corpus: Path = SHARED / "corpus" / "calib-v0-alt"
    calib_corpus: Path = SHARED / "corpus" / "calib-v0"
    cloze_task: Path = SHARED / "tasks" / "cloze-v0.jsonl"
    # Score every k-th calib-v0 document (1: all). A full-vocabulary output layer makes
    # scoring cost ~V exp() per token; a fixed, slice-balanced subset keeps the lab in budget.
    score_every: int = 8
    n_boot: int = 200
    threads: int = 1                        # torch threads per training process

    def tokenizer_dir(self, family: str) -> Path:
        return self.tokenizers_dir / family

    def validate(self) -> "LabConfig":
        """Check every value; returns self so calls chain."""
        self.arch.validate()
        if not self.families:
            raise LabError("a lab needs at least one family")
        if len(set(self.families)) != len(self.families):
            raise LabError(f"families are repeated: {', '.join(self.families)}")
        for family in self.families:
            if not family or "/" in family or family.startswith("."):
                raise LabError(f"family {family!r} must be the name of a folder in {self.tokenizers_dir}")
            if not (self.tokenizer_dir(family) / "tokenizer.json").is_file():
                raise LabError(f"family {family!r}: no tokenizer.json in {self.tokenizer_dir(family)}",
                               hint=f"choose folders of {self.tokenizers_dir} that hold a fast tokenizer")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds) or min(self.seeds) < 0:
            raise LabError(f"seeds must be distinct non-negative integers, got {list(self.seeds)}")
        if not 10_000 <= self.byte_budget <= MAX_BYTE_BUDGET:
            raise LabError(f"byte budget {self.byte_budget} must be from 10000 to {MAX_BYTE_BUDGET}")
        if not 1 <= self.batch_size <= 1024:
            raise LabError(f"batch size must be from 1 to 1024, got {self.batch_size}")
        if not 0.0 < self.lr <= 1.0:
            raise LabError(f"learning rate must be in (0, 1], got {self.lr}")
        if not self.fractions or any(not 0.0 < f <= 1.0 for f in self.fractions) \
                or list(self.fractions) != sorted(set(self.fractions)):
            raise LabError(f"checkpoint fractions must be increasing shares in (0, 1], got {list(self.fractions)}")
        if not 0 <= self.problems_per_doc <= 1000:
            raise LabError(f"problems_per_doc must be from 0 to 1000, got {self.problems_per_doc}")
        if not 1 <= self.score_every <= 100:
            raise LabError(f"score_every must be from 1 to 100, got {self.score_every}")
        for name in ("text_corpus", "calib_corpus"):
            if not (getattr(self, name) / "manifest.json").is_file():
                raise LabError(f"{name} {getattr(self, name)} has no manifest.json",
                               hint="run from the checkout with the shared folder at ../shared")
        if not self.cloze_task.is_file():
            raise LabError(f"cloze task {self.cloze_task} does not exist",
                           hint="point it at shared/tasks/cloze-v0.jsonl")
        return self

    def with_(self, **changes: Any) -> "LabConfig":
        return replace(self, **changes)

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["arch"] = self.arch.as_dict()
        return {k: (str(v) if isinstance(v, Path) else list(v) if isinstance(v, tuple) else v)
                for k, v in out.items()}


def reduced_config(**changes: Any) -> LabConfig:
    """A lab small enough for CI and the demo: two layers of width 64 over short contexts."""
    base = LabConfig(families=("gpt2", "spm-unigram-toy"), seeds=(0,), byte_budget=150_000,
                     arch=ArchConfig(hidden=64, layers=2, heads=4, intermediate=256, context=64),
                     batch_size=8, lr=3e-3, warmup_steps=10, fractions=(0.1, 0.4, 1.0),
                     problems_per_doc=8, score_every=12, n_boot=50)
    return base.with_(**changes)
