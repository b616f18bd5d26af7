"""Lineages of a committed v3 record reused by a new sitting on another machine.

A lineage's `scores.json` lives in the lab folder, which a new machine does not have; its
`lab.json` (committed) holds the same results but not the key that lets the race reuse them.
`reuse_lineages` writes `OUT/<lineage>/scores.json` for each lineage of a record whose inputs
are, by content, those of this run: the settings, the pool and texts' provenance (locations
left out), the tokenizer's files and the lineage's data assignment. Any difference leaves
the lineage to be trained and scored again; nothing is taken on trust from the record.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from monitor.errors import LabError, PolicyError
from monitor.files import NotJsonError, atomic_write_text, read_bounded_json
from monitor.lab.config import RaceConfigV3
from monitor.lab.race import LOCATION_SETTINGS, SCORES_FILE, _without_locations, lineage_id, tokenizer_sha256
from monitor.lab.records import LAB_MAX_BYTES, LAB_RECORD
from monitor.lab.records_v3 import parse_lab_v3

_NOT_SETTINGS = LOCATION_SETTINGS | {"families", "stress_families", "seeds"}


def read_reusable_record(path: Path) -> dict[str, Any]:
    """A v3 `lab.json` as written (validated as a v3 record, read bounded): the lineages'
    results are copied from these bytes, not from a re-serialised model."""
    try:
        data, _ = read_bounded_json(path, str(path), what=LAB_RECORD, limit=LAB_MAX_BYTES)
    except PolicyError as exc:
        raise LabError(exc.message, hint="pass --reuse a lab.json that lstar lab run3 wrote") from None
    except NotJsonError as exc:
        raise LabError(f"{path} is not valid JSON: {str(exc)[:200]}",
                       hint="pass --reuse a lab.json that lstar lab run3 wrote") from None
    parse_lab_v3(data, where=str(path))
    return data


def _settings(config: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in config.items() if k not in _NOT_SETTINGS}


def reuse_mismatch(config: RaceConfigV3, inputs: Any, record: dict[str, Any], family: str,
                   seed: int) -> str | None:
    """Why the record's lineage (family, seed) cannot be reused by this run (`inputs`: its
    `RaceInputsV3`), or None."""
    ours = {**config.as_dict(), **inputs.provenance}
    theirs = record.get("config") or {}
    for key, value in _settings(config.as_dict()).items():
        if json.dumps(theirs.get(key), sort_keys=True, default=str) != json.dumps(value, sort_keys=True, default=str):
            return f"setting {key} differs"
    for key in inputs.provenance:
        if _without_locations(theirs.get(key)) != _without_locations(json.loads(json.dumps(ours[key], default=str))):
            return f"input {key} differs"
    families = {f["family"]: f for f in record.get("families", [])}
    if family not in families or families[family].get("tokenizer_sha256") != tokenizer_sha256(config.tokenizer_dir(family)):
        return "tokenizer files differ"
    if (family, seed) not in inputs.assignments:
        return "not a lineage of this run"
    data = [d for d in record.get("data", []) if d.get("family") == family and d.get("seed") == seed]
    if len(data) != 1 or data[0].get("order_sha256") != inputs.assignments[(family, seed)].order_sha256:
        return "data assignment differs"
    return None


def reuse_lineages(config: RaceConfigV3, inputs: Any, record: dict[str, Any], out: Path,
                   key_of: Callable[[str, int], str]) -> dict[str, str]:
    """Write `out/<lineage>/scores.json`, under the key `key_of(family, seed)` gives, for every
    reusable lineage of `record` that the folder does not hold yet; returns each of the record's
    lineages with what happened to it."""
    size = config.size_spec.name
    outcome: dict[str, str] = {}
    for data in record.get("data", []):
        family, seed = data["family"], data["seed"]
        name = lineage_id(family, size, seed)
        saved = out / name / SCORES_FILE
        if saved.is_file():
            outcome[name] = "already in the folder"
            continue
        why = reuse_mismatch(config, inputs, record, family, seed)
        if why:
            outcome[name] = f"not reused: {why}"
            continue
        checkpoints = [c for c in record["checkpoints"] if c["family"] == family and c["seed"] == seed]
        text = json.dumps({"key": key_of(family, seed), "lineage": name, "data": data,
                           "checkpoints": checkpoints}, indent=1, sort_keys=True) + "\n"
        saved.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(saved, text)
        outcome[name] = "reused"
    return outcome


__all__ = ["read_reusable_record", "reuse_lineages", "reuse_mismatch"]
