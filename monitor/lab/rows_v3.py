"""Lab v3's race rows, checked and put in the shape v2's race code reads.

A v3 row (`monitor.lab.records_v3.race_rows_v3`) is one (checkpoint, text) with `family,
seed, step, bytes_seen, tokens_seen, text, axes, metrics, baselines, data` (`data.sample`: the
family's pinned data assignment). There is one model size, so `size` may be absent or
constant; v2's checks (`monitor.lab.analysis.check_rows`) run on the rows with that size
filled in, and the data assignment is kept beside them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from monitor.errors import LabError
from monitor.lab import analysis as race

ONE_SIZE = "one"
V3_KEYS = ("family", "seed", "step", "bytes_seen", "tokens_seen", "text", "axes", "metrics", "baselines", "data")


def check_rows_v3(rows: Sequence[Mapping[str, Any]], *, what: str = "race rows") -> list[dict[str, Any]]:
    """Validated rows, each with `size` (the constant one) and `sample` (its data assignment).
    Raises one LabError line naming the row and key at fault."""
    if not isinstance(rows, Sequence) or isinstance(rows, (str, bytes)):
        raise LabError(f"the v3 {what} must be a list of objects")
    if len(rows) > race.MAX_ROWS:
        raise LabError(f"{len(rows)} v3 {what}; the analysis takes at most {race.MAX_ROWS}")
    sizes, samples, filled = set(), [], []
    for i, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise LabError(f"v3 {what} {i} is not an object")
        for key in V3_KEYS:
            if key not in row:
                raise LabError(f"v3 {what} {i} has no {key!r}", hint="rows come from records_v3.race_rows_v3")
        data = row["data"]
        sample = data.get("sample") if isinstance(data, Mapping) else None
        if not isinstance(sample, str) or not 0 < len(sample) <= 200:
            raise LabError(f"v3 {what} {i}: data.sample must be the id of the family's data assignment "
                           "(a name of 1 to 200 characters)")
        size = row.get("size", ONE_SIZE)
        sizes.add(size if isinstance(size, str) else repr(size))
        samples.append(sample)
        filled.append({**row, "size": size})
    if len(sizes) > 1:
        raise LabError(f"the v3 {what} hold {len(sizes)} model sizes ({', '.join(sorted(sizes))[:120]})",
                       hint="lab v3 trains one size")
    clean = race.check_rows(filled)
    for row, sample in zip(clean, samples):
        row["sample"] = sample
    return clean


def data_assignment_check(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The per-family data rule: every lineage (family, seed) reads one data assignment, and no
    two families share one. A lab v3 record names one assignment per lineage (its seeds read
    the family's mixture in their own orders, so the id carries the seed:
    `monitor.lab.assignment.DataAssignment.sample`); rows that give a family one id for all
    its seeds keep the rule too. Returns what was found and whether the rule holds."""
    by_lineage: dict[tuple[str, Any], set[str]] = {}
    by_family: dict[str, set[str]] = {}
    for r in rows:
        by_lineage.setdefault((r["family"], r["seed"]), set()).add(r["sample"])
        by_family.setdefault(r["family"], set()).add(r["sample"])
    several = sorted(f"{f} seed {s}" for (f, s), samples in by_lineage.items() if len(samples) > 1)
    owners: dict[str, list[str]] = {}
    for f, s in by_family.items():
        for sample in s:
            owners.setdefault(sample, []).append(f)
    shared = sorted(sample for sample, fams in owners.items() if len(fams) > 1)
    return {"holds": not several and not shared, "lineages_with_several_samples": several,
            "samples_shared_by_families": shared,
            "samples": {f: sorted(s)[0] if len(s) == 1 else sorted(s) for f, s in sorted(by_family.items())}}
