"""Stress documents in the store, and the flags they raise on a curve.

`save_stress_report` keeps an `lstar-stress/1` document (`lstar stress --db`) with the curves
it qualifies; `stress_flags_for_curve` reads, per test, the newest stored document that holds
that test for the curve (a section that measured nothing for it does not count) and applies the documented limits (`monitor.stress.limits`) to it, so
a newer run of a test replaces the older one's flags and a changed limit applies to every stored
result. `policy check`, alert caveats and the report's problems section all read flags here.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from monitor.errors import StoreError
from monitor.store.connection import StoreConnection, utcnow
from monitor.stress.limits import StressFlag, curves_of, flags_for, measured_tests
from monitor.stress.subject import SCHEMA, TEST_NAMES

MAX_DOCUMENT_BYTES = 16 << 20


def _canonical(document: Mapping[str, Any]) -> str:
    try:
        return json.dumps(document, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise StoreError(f"stress document is not plain JSON ({exc})",
                         hint="store what `lstar stress --json` prints (NaN and infinities as null)") from None


def save_stress_report(store: StoreConnection, document: Mapping[str, Any]) -> str:
    """Store `document` (schema lstar-stress/1) and return its id, the sha256 of its canonical
    JSON; storing the same document again changes nothing."""
    if not isinstance(document, Mapping) or document.get("schema") != SCHEMA:
        got = document.get("schema") if isinstance(document, Mapping) else type(document).__name__
        raise StoreError(f"stress document has schema {got!r}, expected {SCHEMA!r}",
                         hint="store what `lstar stress --json` prints")
    sections = document.get("sections")
    subject = document.get("subject")
    if not isinstance(sections, Mapping) or not isinstance(subject, Mapping):
        raise StoreError("stress document lacks its 'subject' or 'sections' object",
                         hint="store what `lstar stress --json` prints")
    unknown = sorted((repr(k) for k in set(sections) - set(TEST_NAMES)))   # keys may be of any type
    if unknown:
        raise StoreError(f"stress document has unknown sections {', '.join(u[:60] for u in unknown[:5])}",
                         hint="the tests are " + ", ".join(TEST_NAMES))
    text = _canonical(document)
    if len(text.encode("utf-8")) > MAX_DOCUMENT_BYTES:
        raise StoreError(f"stress document is {len(text)} characters, over {MAX_DOCUMENT_BYTES} bytes",
                         hint="store fewer checkpoints per document")
    report_id = hashlib.sha256(text.encode("utf-8")).hexdigest()
    with store.transaction() as conn:
        if conn.execute("SELECT 1 FROM stress_reports WHERE report_id = ?", [report_id]).fetchone():
            return report_id
        conn.execute("INSERT INTO stress_reports VALUES (?, ?, ?, ?, ?, ?)",
                     [report_id, str(subject.get("kind", "?")), str(subject.get("name", "?")),
                      json.dumps(sorted(sections)), text, utcnow()])
        for curve_id in sorted(curves_of(document)):
            conn.execute("INSERT INTO stress_report_curves VALUES (?, ?)", [report_id, curve_id])
    return report_id


def stress_flags_for_curve(store: StoreConnection, curve_id: str | None) -> list[StressFlag]:
    """The flags the newest stored result of each stress test raises on `curve_id` ([] for
    none, or for a store that predates the stress tables)."""
    if not curve_id:
        return []
    try:   # newest first; the documents themselves are read one at a time, as needed
        rows = store.query_json(
            "SELECT r.report_id, r.tests FROM stress_reports r JOIN stress_report_curves c "
            "USING (report_id) WHERE c.curve_id = ? ORDER BY r.stored_at DESC, r.report_id", [curve_id],
            ("tests",))
    except Exception as exc:  # noqa: BLE001 - only a missing table is tolerated
        if "stress_report" in str(exc) and "does not exist" in str(exc):
            return []
        raise
    flags: list[StressFlag] = []
    seen: set[str] = set()
    for row in rows:
        if seen >= set(TEST_NAMES):
            break    # every test has its newest measurement: older documents are not read
        if not {t for t in row["tests"] if t not in seen}:
            continue
        [stored] = store.query_json("SELECT document FROM stress_reports WHERE report_id = ?",
                                    [row["report_id"]], ("document",))
        # only the tests this document measured for the curve replace older results of them
        fresh = {t for t in row["tests"] if t not in seen} & measured_tests(stored["document"], curve_id)
        if not fresh:
            continue
        seen |= fresh
        flags += flags_for(stored["document"], curve_id, tests=fresh, report_id=row["report_id"])
    return flags


def stress_flags_in(db: Path, curve_id: str | None) -> list[StressFlag]:
    """`stress_flags_for_curve` on the database file `db`, opened read-only ([] when there is
    no such file: nothing has been stored)."""
    from monitor.store import Store

    if not curve_id or not Path(db).is_file():
        return []
    with Store.open(Path(db), read_only=True) as store:
        return stress_flags_for_curve(store, curve_id)


def stress_caveats(store: StoreConnection, curve_id: str | None) -> list[str]:
    """The flags of `curve_id` as caveat lines (alerts, predictions), each naming its limit."""
    return [f"{flag.message} [limit {flag.limit}, docs/stress.md#limits]"
            for flag in stress_flags_for_curve(store, curve_id)]
