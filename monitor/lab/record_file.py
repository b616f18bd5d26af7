"""Reading `lab.json`, whatever its version: the one place that knows every record schema.

`monitor.lab.records` defines versions 1 and 2, `monitor.lab.records_v3` builds version 3 on
their types; the dispatch on the `schema` key lives here, above both, so neither imports the
other back (the package's no-cycle contract, `tests/test_architecture.py`).

    record = load_lab(path)                  # LabRecord | LabRecordV2 | LabRecordV3
    record, sha = load_lab_with_sha256(path)  # and the sha256 of the bytes read

A file is read bounded (`LAB_MAX_BYTES`), and every problem is one `LabError` line naming it.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from monitor.errors import LabError, PolicyError
from monitor.files import NotJsonError, read_bounded_json
from monitor.lab.records import (LAB_FILE, LAB_MAX_BYTES, LAB_RECORD, LAB_SCHEMA_V2, LabRecord, LabRecordV2,
                                 parse_lab, parse_lab_v2)
from monitor.lab.records_v3 import LAB_SCHEMA_V3, LabRecordV3, parse_lab_v3

AnyLabRecord = LabRecord | LabRecordV2 | LabRecordV3


def parse_any_lab(data: Any, *, where: str = LAB_FILE) -> AnyLabRecord:
    """A version-3 or version-2 record, or a version-1 record (still readable, e.g. by the v1 analysis)."""
    if isinstance(data, dict) and data.get("schema") == LAB_SCHEMA_V3:
        return parse_lab_v3(data, where=where)
    if isinstance(data, dict) and data.get("schema") == LAB_SCHEMA_V2:
        return parse_lab_v2(data, where=where)
    return parse_lab(data, where=where)


def load_lab(path: str | Path) -> AnyLabRecord:
    """Read and validate `lab.json` (a file, or the lab folder holding it)."""
    return load_lab_with_sha256(path)[0]


def load_lab_with_sha256(path: str | Path) -> tuple[AnyLabRecord, str]:
    """`load_lab`, and the sha256 of the bytes it read (one read, for provenance)."""
    path = Path(path)
    if path.is_dir():
        path = path / LAB_FILE
    if not path.exists():
        raise LabError(f"no lab record at {path}", hint="run `lstar lab run --out DIR` (or `lstar lab run3`) first")
    try:  # a regular file of bounded size, read without blocking (a FIFO cannot hang us)
        data, raw = read_bounded_json(path, str(path), what=LAB_RECORD, limit=LAB_MAX_BYTES)
    except PolicyError as exc:
        raise LabError(exc.message, hint="pass the lab.json a lab run wrote") from None
    except NotJsonError as exc:
        raise LabError(f"{path} is not valid JSON: {str(exc)[:200]}",
                       hint="regenerate it with `lstar lab run`") from None
    return parse_any_lab(data, where=str(path)), hashlib.sha256(raw).hexdigest()


__all__ = ["AnyLabRecord", "load_lab", "load_lab_with_sha256", "parse_any_lab"]
