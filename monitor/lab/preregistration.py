"""Lab v3's pre-registration, as the code reads it, and the pin that ties a record to it.

`docs/lab-v3-preregistration.md` is the text a reader reads; `data/lab-v3-preregistration.json`
holds the same decisions as numbers (primary, levels, test, pilot gate, negative control,
power table) and the sha256 of the Markdown text, so one hash, `preregistration_sha256()`,
covers both. A v3 `lab.json` carries that hash (`preregistration_sha256`); `check_pin`
refuses to analyse a record whose pin differs, in one line.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from monitor.errors import LabError, PolicyError
from monitor.files import FileKind, NotJsonError, read_bounded_bytes, read_bounded_json

ROOT = Path(__file__).resolve().parents[2]
PREREG_JSON = ROOT / "data" / "lab-v3-preregistration.json"
PREREG_DOC = ROOT / "docs" / "lab-v3-preregistration.md"
SCHEMA = "lstar-lab-prereg/1"
MAX_BYTES = 1 << 20
PREREG_FILE = FileKind("pre-registration", "pre-registrations", "JSON")
DOC_FILE = FileKind("pre-registration text", "pre-registration texts", "Markdown")
REQUIRED = ("schema", "document", "primary", "levels", "secondary", "test", "families", "seeds", "sizes",
            "data_rule", "pilot_gate", "negative_control", "power")


def _read(path: Path) -> tuple[dict[str, Any], bytes]:
    try:
        data, raw = read_bounded_json(path, str(path), what=PREREG_FILE, limit=MAX_BYTES)
    except PolicyError as exc:
        raise LabError(exc.message, hint="the pre-registration is data/lab-v3-preregistration.json") from None
    except NotJsonError as exc:
        raise LabError(f"{path} is not valid JSON: {str(exc)[:200]}",
                       hint="restore it from git: git checkout data/lab-v3-preregistration.json") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise LabError(f"{path} is not a lab pre-registration (schema {SCHEMA!r})")
    missing = [k for k in REQUIRED if k not in data]
    if missing:
        raise LabError(f"{path}: the pre-registration has no {missing[0]!r}",
                       hint="restore it from git: git checkout data/lab-v3-preregistration.json")
    return data, raw


def load_preregistration(path: Path | None = None) -> dict[str, Any]:
    """The pre-registration's decisions (checked: schema, every section present)."""
    return _read(Path(path or PREREG_JSON))[0]


def preregistration_sha256(path: Path | None = None) -> str:
    """The sha256 of the pre-registration file's bytes: the pin a v3 lab.json carries."""
    return hashlib.sha256(_read(Path(path or PREREG_JSON))[1]).hexdigest()


def document_sha256(path: Path | None = None) -> str:
    """The sha256 of the Markdown text (recorded inside the JSON, so the pin covers it)."""
    path = Path(path or PREREG_DOC)
    try:
        return hashlib.sha256(read_bounded_bytes(path, str(path), what=DOC_FILE, limit=MAX_BYTES)).hexdigest()
    except PolicyError as exc:
        raise LabError(exc.message, hint="the text is docs/lab-v3-preregistration.md") from None


def check_pin(pin: Any, *, where: str = "lab.json", path: Path | None = None) -> str:
    """Refuse a record whose `preregistration_sha256` is not the committed pre-registration's."""
    expected = preregistration_sha256(path)
    if not isinstance(pin, str) or pin != expected:
        shown = repr(pin)[:20] if not isinstance(pin, str) else pin[:16] + "…"
        raise LabError(f"{where} pins pre-registration sha256 {shown}, the committed one is {expected[:16]}…",
                       hint="a v3 record is analysed only under the pre-registration it was run under; "
                            "a change after the first result is a deviation, reported as one")
    return expected
