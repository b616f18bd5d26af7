"""What a lab run is: families, seeds, byte budget, architecture, data and scoring settings.

The whole configuration is stored in `lab.json` (with the sha256 of every input) so a run can
be reproduced; `LabConfig.validate` turns every bad value into one `LabError` line naming it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Self

from monitor.errors import LabError
from monitor.lab.model import ArchConfig

SHARED = Path("../shared")
# Families of the full lab: four real tokenizers and the toy unigram one.
DEFAULT_FAMILIES = ("gpt2", "llama-3", "bert-base-uncased", "smollm2", "spm-unigram-toy")
# Checkpoints at these shares of the byte budget: same bytes seen in every family. Denser in
# the middle, where the pilot in docs/lab.md saw the additions task rise.
DEFAULT_FRACTIONS = (0.05, 0.15, 0.25, 0.35, 0.45, 0.6, 0.8, 1.0)
MAX_BYTE_BUDGET = 1 << 30


# -------------------------------------------------------------------- checks every version shares
# Version 1's LabConfig and version 2's RaceConfig (and v3's, built on it) check their common
# settings alike; each calls these in its own order, so a bad value names itself as before.
def check_families(families: tuple[str, ...], tokenizers_dir: Path) -> None:
    """Distinct names, each a folder of `tokenizers_dir` holding tokenizer.json."""
    if len(set(families)) != len(families):
        raise LabError(f"families are repeated: {', '.join(families)}")
    for family in families:
        if not family or "/" in family or family.startswith("."):
            raise LabError(f"family {family!r} must be the name of a folder in {tokenizers_dir}")
        if not (tokenizers_dir / family / "tokenizer.json").is_file():
            raise LabError(f"family {family!r}: no tokenizer.json in {tokenizers_dir / family}",
                           hint=f"choose folders of {tokenizers_dir} that hold a fast tokenizer")


def check_seeds(seeds: tuple[int, ...]) -> None:
    if not seeds or len(set(seeds)) != len(seeds) or min(seeds) < 0:
        raise LabError(f"seeds must be distinct non-negative integers, got {list(seeds)}")


def check_byte_budget(byte_budget: int, *, size: str | None = None) -> None:
    if not 10_000 <= byte_budget <= MAX_BYTE_BUDGET:
        where = f"size {size}: " if size is not None else ""
        raise LabError(f"{where}byte budget {byte_budget} must be from 10000 to {MAX_BYTE_BUDGET}")


def check_optimisation(batch_size: int, lr: float) -> None:
    if not 1 <= batch_size <= 1024:
        raise LabError(f"batch size must be from 1 to 1024, got {batch_size}")
    if not 0.0 < lr <= 1.0:
        raise LabError(f"learning rate must be in (0, 1], got {lr}")


def check_problems_per_doc(problems_per_doc: int) -> None:
    if not 0 <= problems_per_doc <= 1000:
        raise LabError(f"problems_per_doc must be from 0 to 1000, got {problems_per_doc}")


def check_corpus(name: str, folder: Path) -> None:
    if not (folder / "manifest.json").is_file():
        raise LabError(f"{name} {folder} has no manifest.json",
                       hint="run from the checkout with the shared folder at ../shared")


class _FamilyFolders:
    """What every configuration that names tokenizer folders answers alike (a mixin of the
    frozen dataclasses below: `tokenizers_dir` is theirs)."""

    def tokenizer_dir(self, family: str) -> Path:
        return self.tokenizers_dir / family  # type: ignore[attr-defined]

    def with_(self, **changes: Any) -> Self:
        """A copy with `changes` (the dataclass's `replace`)."""
        return replace(self, **changes)  # type: ignore[type-var]


@dataclass(frozen=True)
class LabConfig(_FamilyFolders):
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

    def validate(self) -> "LabConfig":
        """Check every value; returns self so calls chain."""
        self.arch.validate()
        if not self.families:
            raise LabError("a lab needs at least one family")
        check_families(self.families, self.tokenizers_dir)
        check_seeds(self.seeds)
        check_byte_budget(self.byte_budget)
        check_optimisation(self.batch_size, self.lr)
        if not self.fractions or any(not 0.0 < f <= 1.0 for f in self.fractions) \
                or list(self.fractions) != sorted(set(self.fractions)):
            raise LabError(f"checkpoint fractions must be increasing shares in (0, 1], got {list(self.fractions)}")
        check_problems_per_doc(self.problems_per_doc)
        if not 1 <= self.score_every <= 100:
            raise LabError(f"score_every must be from 1 to 100, got {self.score_every}")
        check_corpus("text_corpus", self.text_corpus)
        check_corpus("calib_corpus", self.calib_corpus)
        if not self.cloze_task.is_file():
            raise LabError(f"cloze task {self.cloze_task} does not exist",
                           hint="point it at shared/tasks/cloze-v0.jsonl")
        return self

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


# ------------------------------------------------------------------------------ version 2
# The primary race of lab v2: six lossless tokenizers (docs/lab.md, "Design v2").
RACE_FAMILIES = ("gpt2", "llama-2", "llama-3", "smollm2", "qwen2", "gpt-neox")


@dataclass(frozen=True)
class LineageSettings(_FamilyFolders):
    """What `monitor.lab.train.train_lineage` needs of one lineage's size: architecture, budget,
    optimisation and checkpoint shares. Version 1's `LabConfig` has the same attributes."""

    arch: ArchConfig
    byte_budget: int
    batch_size: int
    lr: float
    warmup_steps: int
    fractions: tuple[float, ...]
    tokenizers_dir: Path
    threads: int = 1
    # "constant": linear warm-up, then the peak rate to the end, so the rate at a step does not
    # depend on the share of the budget (version 1's "cosine" made bytes seen a clock).
    lr_schedule: str = "constant"


@dataclass(frozen=True)
class SizeSpec:
    """One model size of the race: its architecture, byte budget and number of checkpoints
    (evenly spaced in steps). Sizes have different budgets, so equal bytes seen is not equal
    progress across sizes."""

    name: str
    arch: ArchConfig
    byte_budget: int
    checkpoints: int = 6

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "arch": self.arch.as_dict(), "byte_budget": self.byte_budget,
                "checkpoints": self.checkpoints}


SIZE_NAMES = ("small", "large")


@dataclass(frozen=True)
class RaceConfig(_FamilyFolders):
    """One run of lab v2 (`monitor.lab.race`). Paths may be relative to the checkout."""

    pool: Path
    families: tuple[str, ...] = RACE_FAMILIES
    stress_families: tuple[str, ...] = ()
    sizes: tuple[SizeSpec, ...] = (
        SizeSpec("small", ArchConfig(hidden=64, layers=2, heads=4, intermediate=256, context=128), 1_200_000),
        SizeSpec("large", ArchConfig(hidden=128, layers=2, heads=4, intermediate=512, context=128), 1_600_000))
    seeds: tuple[int, ...] = (0, 1, 2)
    batch_size: int = 4
    lr: float = 2e-3
    warmup_steps: int = 30
    problems_per_doc: int = 16
    chunk_chars: int = 600
    oos_unigram_bytes: int = 2_000_000     # the train split's unigram slice (never read)
    heldout_bytes: int = 200_000           # held-out evaluation text per checkpoint
    n_cloze: int = 400
    cloze_seed: int = 0
    # Windows of the evaluation: 128 = the context, disjoint windows (the spec's --disjoint), half
    # the cost of the default stride (docs/lab.md, "Sizing v2"); None: the spec's default, L/2.
    eval_stride: int | None = 128
    tokenizers_dir: Path = SHARED / "tokenizers"
    calib_corpus: Path = SHARED / "corpus" / "calib-v0"
    n_boot: int = 200
    threads: int = 1

    def size(self, name: str) -> SizeSpec:
        for spec in self.sizes:
            if spec.name == name:
                return spec
        raise LabError(f"no size {name!r} in this lab (sizes: {', '.join(s.name for s in self.sizes)})")

    def lineage_settings(self, size: str) -> LineageSettings:
        spec = self.size(size)
        fractions = tuple(round((k + 1) / spec.checkpoints, 6) for k in range(spec.checkpoints))
        return LineageSettings(arch=spec.arch, byte_budget=spec.byte_budget, batch_size=self.batch_size,
                               lr=self.lr, warmup_steps=self.warmup_steps, fractions=fractions,
                               tokenizers_dir=self.tokenizers_dir, threads=self.threads)

    def all_families(self) -> tuple[str, ...]:
        return (*self.families, *self.stress_families)

    def validate(self) -> "RaceConfig":
        """Check every value; returns self so calls chain."""
        names = self.all_families()
        if not self.families:
            raise LabError("the race needs at least one family")
        check_families(names, self.tokenizers_dir)
        check_seeds(self.seeds)
        if not self.sizes or len({s.name for s in self.sizes}) != len(self.sizes):
            raise LabError("sizes must be named distinctly and there must be at least one")
        for spec in self.sizes:
            if spec.name not in SIZE_NAMES:
                raise LabError(f"size {spec.name!r} must be one of {', '.join(SIZE_NAMES)}")
            spec.arch.validate()
            check_byte_budget(spec.byte_budget, size=spec.name)
            if not 2 <= spec.checkpoints <= 100:
                raise LabError(f"size {spec.name}: checkpoints must be from 2 to 100, got {spec.checkpoints}")
        check_optimisation(self.batch_size, self.lr)
        check_problems_per_doc(self.problems_per_doc)
        if not 1 <= self.n_cloze <= 100_000:
            raise LabError(f"n_cloze must be from 1 to 100000, got {self.n_cloze}")
        if self.eval_stride is not None and not 1 <= self.eval_stride <= min(s.arch.context for s in self.sizes):
            raise LabError(f"eval_stride {self.eval_stride} must be from 1 to the smallest context")
        if self.oos_unigram_bytes < 10_000 or self.heldout_bytes < 1_000:
            raise LabError("oos_unigram_bytes must be at least 10000 and heldout_bytes at least 1000")
        check_corpus("calib_corpus", self.calib_corpus)
        if not (Path(self.pool) / "train" / "manifest.json").is_file():
            raise LabError(f"pool {self.pool} has no train/manifest.json",
                           hint="pass --pool DIR: a lab pool with train/, heldout/ and tasks/")
        return self

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in asdict(self).items():
            if key == "sizes":
                value = [s.as_dict() for s in self.sizes]
            elif isinstance(value, Path):
                value = str(value)
            elif isinstance(value, tuple):
                value = list(value)
            out[key] = value
        out["pool"] = str(self.pool)
        out["lr_schedule"] = "constant after a linear warm-up"
        return out


def race_full_config(pool: Path, shared: Path = SHARED, **changes: Any) -> RaceConfig:
    """The full race (docs/lab.md, "Sizing v2")."""
    return RaceConfig(pool=Path(pool), tokenizers_dir=shared / "tokenizers",
                      calib_corpus=shared / "corpus" / "calib-v0").with_(**changes)


def race_reduced_config(pool: Path, shared: Path = SHARED, **changes: Any) -> RaceConfig:
    """The CI-sized race: two lossless families, both sizes, one seed, tiny models and budgets.
    It checks the pipeline and claims nothing."""
    base = RaceConfig(
        pool=Path(pool), families=("gpt2", "smollm2"), seeds=(0,),
        sizes=(SizeSpec("small", ArchConfig(hidden=32, layers=1, heads=2, intermediate=64, context=64), 60_000, 2),
               SizeSpec("large", ArchConfig(hidden=48, layers=1, heads=2, intermediate=96, context=64), 80_000, 2)),
        batch_size=8, lr=3e-3, warmup_steps=5, problems_per_doc=8, oos_unigram_bytes=100_000,
        heldout_bytes=20_000, n_cloze=300, n_boot=20, eval_stride=None,
        tokenizers_dir=shared / "tokenizers", calib_corpus=shared / "corpus" / "calib-v0")
    return base.with_(**changes)


# ------------------------------------------------------------------------------ version 3
# Until the built families land (monitor.lab.families), v3 runs on these folders of
# shared/tokenizers: v2's six and the two further lossless vocabularies issue 37 names
# (phi-3 is left out: its token boundaries equal llama-2's on calib-v0).
V3_SHARED_FAMILIES = (*RACE_FAMILIES, "starcoder2", "gpt-4o")
# One size (issue 37: one size and three seeds once the families reach 20). v2's *large*: its
# additions were above the level by the middle checkpoint in 16 of 18 lineages against 9 of 18
# for *small* (docs/lab.md, "Measured in the full run"), at about twice the cost per lineage.
V3_SIZE = SizeSpec("large", ArchConfig(hidden=128, layers=2, heads=4, intermediate=512, context=128),
                   1_600_000, 6)
MAX_MIXTURE_SPREAD = 10.0


@dataclass(frozen=True)
class RaceConfigV3(RaceConfig):
    """One run of lab v3 (`monitor.lab.race_v3`): v2's settings and validators, one size, and
    per-family data (`monitor.lab.assignment`). `tokenizers_dir` is the folder of family
    folders (`--families-dir`, or shared/tokenizers)."""

    families: tuple[str, ...] = V3_SHARED_FAMILIES
    sizes: tuple[SizeSpec, ...] = (V3_SIZE,)
    # Each family reads the pool's sources (its slices) in proportions of their natural byte
    # shares times a factor drawn log-uniformly in [1/spread, spread] per family and source
    # (then normalised): with the pool's 81 % dictionary / 19 % documentation and spread 2, a
    # family's documentation share lies between about 6 % and 48 %. 1: every family reads the
    # natural mixture (only the order differs).
    mixture_spread: float = 2.0
    version: int = 3

    def validate(self) -> "RaceConfigV3":
        super().validate()
        if len(self.sizes) != 1:
            raise LabError(f"lab v3 has one model size, got {len(self.sizes)} "
                           f"({', '.join(s.name for s in self.sizes)})")
        if not 1.0 <= self.mixture_spread <= MAX_MIXTURE_SPREAD:
            raise LabError(f"mixture_spread must be from 1 to {MAX_MIXTURE_SPREAD:g}, got {self.mixture_spread!r}")
        if self.version != 3:
            raise LabError(f"RaceConfigV3 is version 3, got version {self.version!r}")
        return self

    @property
    def size_spec(self) -> SizeSpec:
        return self.sizes[0]


def family_folders(folder: Path) -> tuple[str, ...]:
    """The family folders of `folder` (each holding tokenizer.json), in pre-registered order when
    `monitor.lab.families.V3_FAMILY_NAMES` is available (the names it lists that are present),
    else by name."""
    folder = Path(folder)
    if not folder.is_dir():
        raise LabError(f"families folder {folder} is not a folder",
                       hint="pass --families-dir DIR: a folder of tokenizer folders (tokenizer.json each)")
    present = sorted(p.name for p in folder.iterdir()
                     if p.is_dir() and not p.name.startswith((".", "_")) and (p / "tokenizer.json").is_file())
    try:
        from monitor.lab.families import V3_FAMILY_NAMES  # the pre-registered order, once it exists
    except ImportError:
        return tuple(present)
    ordered = tuple(n for n in V3_FAMILY_NAMES if n in present)
    return ordered or tuple(present)


def race_v3_config(pool: Path, shared: Path = SHARED, *, families_dir: Path | None = None,
                   **changes: Any) -> RaceConfigV3:
    """The full lab v3 (docs/lab.md, "Sizing v3"): every family of `families_dir` (or
    V3_SHARED_FAMILIES of shared/tokenizers), the one size, seeds 0, 1, 2, disjoint windows."""
    base = RaceConfigV3(pool=Path(pool), tokenizers_dir=shared / "tokenizers",
                        calib_corpus=shared / "corpus" / "calib-v0")
    if families_dir is not None:
        base = base.with_(tokenizers_dir=Path(families_dir), families=family_folders(families_dir))
    return base.with_(**changes)


def race_v3_reduced_config(pool: Path, shared: Path = SHARED, *, families_dir: Path | None = None,
                           **changes: Any) -> RaceConfigV3:
    """The CI-sized lab v3: two families of shared/tokenizers (or the first two of
    `families_dir`), one tiny size, one seed, two checkpoints: one lineage per core, about 80
    CPU seconds each (nearly all of it scoring calib-v0 and the 231 additions × 21 options). It
    checks the pipeline and claims nothing."""
    base = race_v3_config(pool, shared, families_dir=families_dir)
    return base.with_(
        families=base.families[:2] if families_dir is not None else ("gpt2", "smollm2"),
        seeds=(0,),
        sizes=(SizeSpec("large", ArchConfig(hidden=32, layers=1, heads=2, intermediate=64, context=64), 60_000, 2),),
        batch_size=8, lr=3e-3, warmup_steps=5, problems_per_doc=8, oos_unigram_bytes=100_000,
        heldout_bytes=20_000, n_cloze=300, n_boot=20, eval_stride=None).with_(**changes)
