"""What a Hub checkpoint derives from: its declared base model and relation.

Most new checkpoints on the Hub are fine-tunes, adapters, quantizations or merges of a base
model. The model card declares them (`base_model`: a repo id or a list of them;
`base_model_relation`: finetune, adapter, quantized or merge); where it declares a base but
no relation, the files imply one (an `adapter_config.json`: adapter; a `quantization_config`
in config.json: quantized; several bases: merge; else finetune), recorded as inferred. The
base is pinned to the commit its `main` pointed at when the derivative was gated (or to the
commit a `repo@sha` reference names), so a later push to the base never changes what the
derivative is compared with.

Card data is the repo owner's text: a value that is not a repo id, a list longer than
MAX_BASES or a relation outside the four is recorded as a problem, never trusted.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

RELATIONS = ("finetune", "adapter", "quantized", "merge")
# A merge names its bases; more than this many is not a model card a person wrote.
MAX_BASES = 16
_REPO = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}"
_BASE_REF = re.compile(rf"^(?P<repo>{_REPO})(?:@(?P<sha>[0-9a-f]{{40}}))?$")
ADAPTER_CONFIG = "adapter_config.json"


@dataclass(frozen=True)
class DeclaredBase:
    """The base of a checkpoint as its card and files say (before pinning)."""

    bases: tuple[str, ...]                 # repo ids, in the card's order
    relation: str
    relation_source: str                   # declared | inferred
    pinned_sha: str | None = None          # a `repo@sha` reference's commit (one base only)
    problems: tuple[str, ...] = ()

    @property
    def base_repo(self) -> str | None:
        """The one base a derivative is compared with (None for a merge of several)."""
        return self.bases[0] if len(self.bases) == 1 else None


@dataclass
class Lineage:
    """A checkpoint's base, pinned: what the gate records (`checkpoint_bases`)."""

    base_repo: str | None
    base_sha: str | None
    relation: str
    relation_source: str
    bases: list[str] = field(default_factory=list)
    problem: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _card_field(card: Any, key: str) -> Any:
    if card is None:
        return None
    if isinstance(card, Mapping):
        return card.get(key)
    getter = getattr(card, "get", None)
    return getter(key) if callable(getter) else getattr(card, key, None)


def declared_base(card: Any, files: Collection[str], config: Mapping[str, Any] | None) -> DeclaredBase | None:
    """The base a checkpoint declares (None: it declares none and its files imply none)."""
    raw = _card_field(card, "base_model")
    problems: list[str] = []
    refs: list[str] = []
    if isinstance(raw, str):
        refs = [raw]
    elif isinstance(raw, list):
        if len(raw) > MAX_BASES:
            problems.append(f"base_model lists {len(raw)} models (more than {MAX_BASES}); ignored")
        else:
            refs = [r for r in raw if isinstance(r, str)]
            if len(refs) != len(raw):
                problems.append("base_model has entries that are not repo ids; they are ignored")
    elif raw is not None:
        problems.append(f"base_model is a {type(raw).__name__}, not a repo id or a list of them; ignored")
    bases: list[str] = []
    pinned = None
    for ref in refs:
        match = _BASE_REF.match(ref.strip())
        if match is None:
            problems.append(f"base_model {ref[:100]!r} is not a repo id; ignored")
            continue
        if match["repo"] not in bases:
            bases.append(match["repo"])
        if match["sha"] and len(refs) == 1:
            pinned = match["sha"]
    declared = _card_field(card, "base_model_relation")
    adapter = ADAPTER_CONFIG in files
    quantized = isinstance(config, Mapping) and config.get("quantization_config") is not None
    if not bases and not adapter:
        return None if not problems else DeclaredBase((), "finetune", "inferred", None, tuple(problems))
    if isinstance(declared, str) and declared in RELATIONS:
        relation, source = declared, "declared"
    else:
        if declared is not None:
            problems.append(f"base_model_relation {str(declared)[:40]!r} is not one of {', '.join(RELATIONS)}; "
                            "inferred from the files instead")
        relation = ("adapter" if adapter else "quantized" if quantized else
                    "merge" if len(bases) > 1 else "finetune")
        source = "inferred"
    return DeclaredBase(tuple(bases), relation, source, pinned, tuple(problems))
