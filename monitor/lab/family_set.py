"""Lab v3's family set, checked when a run starts from a folder of families (`lstar lab run3
--families-dir`): which candidates are lossless and distinct enough to race, by the
pre-registered rule (data/lab-v3-preregistration.json, `families`).

1. The candidates are the family folders present, in the pre-registered order
   (`monitor.lab.config.family_folders`, `monitor.lab.families.V3_FAMILY_NAMES`).
2. Each one's decode round trip on the run's own texts (the first train chunks, the pool's
   held-out text, calib-v0; a document with a special-token literal that fails is excluded for
   every family alike): a lossy family is not walked.
3. The lossless ones are walked in order by `distinctness.distinct_families` on their
   token-boundary Jaccard on calib-v0, at the pre-registered cut-off.
4. Without `--families` the run races the kept families (the CI size: the first two); a
   full-size race with fewer than the pre-registered minimum kept is refused in one line. With
   `--families` (the pilot, say) each one named must be kept.

This is run set-up: it chooses which lineages run, never what one computes, and it enters no
lineage's resume key. What it found goes into lab.json (`family_set`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from monitor.errors import LabError


@dataclass(frozen=True)
class FamilySetRule:
    """The pre-registered rule as a run applies it."""

    cutoff: float
    min_kept: int | None                 # None: no minimum (a pilot, the CI size, --families)
    chosen: tuple[str, ...] | None       # --families, else None: race every kept family
    at_most: int | None = None           # race only the first kept ones (the CI size: 2)

    @classmethod
    def preregistered(cls, *, chosen: Sequence[str] | None, full_race: bool, at_most: int | None = None,
                      prereg: Mapping[str, Any] | None = None) -> "FamilySetRule":
        """The cut-off and minimum of the pre-registration (the committed one by default)."""
        from monitor.lab.preregistration import load_preregistration

        spec = (prereg or load_preregistration()).get("families")
        try:
            cutoff, min_kept = float(spec["cutoff"]), int(spec["min_kept"])
        except (TypeError, KeyError, ValueError):
            raise LabError("the pre-registration gives no families.cutoff and families.min_kept",
                           hint="they are fixed in data/lab-v3-preregistration.json") from None
        return cls(cutoff=cutoff, min_kept=min_kept if full_race and chosen is None else None,
                   chosen=None if chosen is None else tuple(chosen), at_most=at_most)


def check_run_families(candidates: Sequence[str], folder_of: Any, texts: Mapping[str, Sequence[Any]],
                       rule: FamilySetRule) -> dict[str, Any]:
    """The family set of a run: `candidates` in pre-registered order, `folder_of(name)` their
    tokenizer folders, `texts` {"train", "heldout", "calib"} as (id, text) pairs or strings.
    Returns the record's `family_set` (with `raced`, the families the run trains); refuses in
    one line a chosen family that is not kept, or a full race below the minimum."""
    from monitor.lab.distinctness import distinct_families, jaccard_matrix
    from monitor.lab.families import check_family_folder, round_trip_checks
    from monitor.scoring import load_tokenizer

    if not candidates:
        raise LabError("the families folder holds no family folder (tokenizer.json each)",
                       hint="build them with `lstar lab tokenizers build OUT --pool POOL`")
    for name in candidates:      # a hostile folder is refused from its files' metadata, before they are read
        check_family_folder(Path(folder_of(name)), name)
    handles = {name: load_tokenizer(Path(folder_of(name))) for name in candidates}
    pairs = {k: [d if isinstance(d, tuple) else (f"{k}-{i}", d) for i, d in enumerate(v)] for k, v in texts.items()}
    trip = round_trip_checks(handles, pairs)
    lossless = [n for n in candidates if n not in trip["lossy"]]
    calib = [t for doc_id, t in pairs["calib"] if doc_id not in set(trip["excluded"])]
    names, matrix = jaccard_matrix({n: handles[n] for n in lossless}, calib) if lossless else ([], None)
    distinct = (distinct_families(names, cutoff=rule.cutoff, matrix=matrix) if names
                else {"kept": [], "dropped": {}, "matrix": []})
    dropped = {**trip["lossy"], **distinct["dropped"]}
    kept = distinct["kept"]
    if rule.chosen is not None:
        for name in rule.chosen:
            if name not in kept:
                raise LabError(f"family {name!r} is not in the distinct set: "
                               + (dropped.get(name) or "no such family folder among the candidates"),
                               hint=f"choose from the kept families: {', '.join(kept) or 'none'}")
        raced = list(rule.chosen)
    else:
        raced = list(kept[:rule.at_most] if rule.at_most else kept)
    if rule.min_kept is not None and len(kept) < rule.min_kept:
        raise LabError(f"{len(kept)} of {len(candidates)} families kept at the pre-registered cut-off "
                       f"{rule.cutoff:g}; the full race needs at least {rule.min_kept}",
                       hint="build every candidate (`lstar lab tokenizers build`), or run the pilot with --families")
    return {"cutoff": rule.cutoff, "min_kept": rule.min_kept, "candidates": list(candidates),
            "round_trip": {"excluded": trip["excluded"],
                           "documents": {k: len(v) for k, v in pairs.items()},
                           "failing": {n: sum(t["failing"] for t in c["texts"].values())
                                       for n, c in trip["checks"].items()}},
            "names": list(names), "matrix": distinct["matrix"], "kept": kept, "dropped": dropped,
            "raced": raced}


__all__ = ["FamilySetRule", "check_run_families"]
