"""Lab v3's report: `lab-report.json` (every number of `analysis_v3.analyse_v3`) and
`lab-report.md` (the verdict, the pilot gate, the power, the negative control, the secondaries).

    data = write_v3_report(rows, out_dir, pilot_rows=..., pin=..., source={...})

Rows come from a v3 record (`records_v3.race_rows_v3`, with its `preregistration_sha256`)
or from a rows file `{"schema": "lstar-lab-rows/3", "preregistration_sha256": ..., "rows":
[...], "pilot_rows": [...]}`. Either way the pin is checked first: a record made under another
pre-registration is refused in one line. The pilot gate reads the pre-registered pilot's rows
(its families at seed 0, `monitor.lab.pilot.pilot_rows`) of the same rows, so a pilot-only
record and the full record give the gate the same numbers; `pilot_gate_from` gives the gate
alone (`lstar lab report --pilot`).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from monitor.errors import LabError, PolicyError
from monitor.escape import markdown_code, markdown_text
from monitor.files import FileKind, NotJsonError, read_bounded_json
from monitor.lab import analysis as race
from monitor.lab.analysis_v3 import analyse_v3
from monitor.lab.pilot import pilot_coverage, pilot_gate, pilot_rows
from monitor.lab.preregistration import check_pin, load_preregistration
from monitor.lab.records_v3 import LAB_SCHEMA_V3, parse_lab_v3, race_rows_v3

RECORD_SCHEMA = LAB_SCHEMA_V3
ROWS_SCHEMA = "lstar-lab-rows/3"
MAX_BYTES = 256 << 20
LAB_FILE = FileKind("lab record", "lab records", "JSON")


def read_json(path: Path) -> tuple[Any, str]:
    """A lab.json or rows file, bounded, with its sha256."""
    path = Path(path)
    if not path.exists():
        raise LabError(f"no file at {path}", hint="pass the lab folder, its lab.json, or a rows file")
    try:
        data, raw = read_bounded_json(path, str(path), what=LAB_FILE, limit=MAX_BYTES)
    except PolicyError as exc:
        raise LabError(exc.message) from None
    except NotJsonError as exc:
        raise LabError(f"{path} is not valid JSON: {str(exc)[:200]}") from None
    return data, hashlib.sha256(raw).hexdigest()


def is_v3(data: Any) -> bool:
    return isinstance(data, Mapping) and data.get("schema") in (RECORD_SCHEMA, ROWS_SCHEMA)


def rows_of(data: Mapping[str, Any], path: Path) -> tuple[list, list | None, Any]:
    """(rows, pilot rows or None, pin) of a v3 record or rows file. A record's rows are
    `records_v3.race_rows_v3` of the record `records_v3.parse_lab_v3` validates; its pilot rows
    are taken from them (None here: `pilot.pilot_rows` picks them once the pre-registration is
    read). A rows file may carry its own `pilot_rows`."""
    if data.get("schema") == ROWS_SCHEMA:
        rows, pilot = data.get("rows"), data.get("pilot_rows")
        if not isinstance(rows, list) or not (pilot is None or isinstance(pilot, list)):
            raise LabError(f"{path}: 'rows' (and 'pilot_rows', when present) must be lists of v3 rows")
        return rows, pilot, data.get("preregistration_sha256")
    lab = parse_lab_v3(data, where=str(path))
    return race_rows_v3(lab), None, lab.preregistration_sha256


def _pilot(rows: Sequence[Mapping[str, Any]], pilot: Sequence[Mapping[str, Any]] | None,
           prereg: Mapping[str, Any]) -> tuple[list, dict[str, Any]]:
    """The pilot rows (given, or the pre-registered pilot's rows of `rows`) and what they cover."""
    chosen = list(pilot) if pilot is not None else pilot_rows(rows, prereg)
    return chosen, {**pilot_coverage(chosen, prereg), "from": "pilot_rows" if pilot is not None else "rows"}


def _g(v: Any, digits: int = 3) -> str:
    return "—" if v is None else f"{v:.{digits}g}" if isinstance(v, float) else str(v)


def _axis_label(name: Any) -> str:
    axis = race.AXES.get(name) if isinstance(name, str) else None
    return axis.label if axis is not None else markdown_text(name)


def _control_errors(control: Mapping[str, Any]) -> str:
    """The family-mean crossing errors the negative control compares, as ' (bytes seen 0.06, …)'."""
    errors = control.get("family_mean_crossing_error") or {}
    shown = [f"{_axis_label(a)} {_g(v)}" for a, v in errors.items()
             if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return f" (family-mean crossing error: {', '.join(shown)})" if shown else ""


def to_markdown(data: Mapping[str, Any]) -> str:
    g, p, c, des = data["pilot_gate"], data["primary"], data["negative_control"], data["design"]
    pw = data["power"]
    out = ["# Emergence lab v3 report", "",
           f"Source {markdown_code(data['source']['path'])} (sha256 {markdown_code(data['source']['sha256'][:16])}), "
           f"pre-registration sha256 {markdown_code(data['preregistration_sha256'][:16])}: {des['n_families']} "
           f"families, seeds {', '.join(map(str, des['seeds']))}, {des['n_checkpoints']} checkpoints.", "",
           "## Verdict", "",
           f"- **{p['statement']}** (primary: {_axis_label(p['axis'])} against L* on the family-averaged LOFO "
           f"crossing error of {p['task']} {p['metric']}, {p['text']} text).",
           f"- Difference {_g(p['difference'], 4)}, sign-flip p {_g(p['p_value'])}, interval "
           f"[{_g(p['lower'], 4)}, {_g(p['upper'], 4)}]; conditions failed: "
           f"{', '.join(p['failed']) if p['failed'] else 'none'}.",
           f"- Pilot gate: {'passed' if g['passed'] else 'stopped'} ({markdown_text(g.get('reason'))}).",
           "- Negative control: " + (markdown_text(c.get("reading")) + _control_errors(c) if c.get("ran")
                                     else f"not run ({markdown_text(c.get('reason'))})") + ".",
           f"- Power of the design as run ({pw['families']} families × {pw['seeds']} seeds, α {pw['alpha']:g}): "
           + (", ".join(f"{v:.2f} at standardised effect {e}" for e, v in (pw["by_effect"] or {}).items()) or "—")
           + f" under the conservative model ({pw['source']}); under each v2 effect's measured spread: "
           + (", ".join(f"{v:.2f} ({markdown_text(name)})" for name, v in (pw.get("measured") or {}).items()
                        if v is not None) or "—") + ".",
           "- Deviations from the pre-registration: "
           + ("; ".join(markdown_text(d) for d in des["deviations"]) or "none seen") + ".", "",
           f"Rule (pre-registered): {data['rule']}", "", "## Pilot gate", ""]
    if g.get("ran"):
        out += [f"Level {_g(g['level'], 4)}; {g['share_above_level']:.1%} of {g['n_rows']} pilot checkpoints at or "
                "above it.", "", "| axis | crossing error | always above | shuffled (mean) | passes |",
                "|---|---:|---:|---:|---|"]
        for a, v in g["axes"].items():
            out.append(f"| {_axis_label(a)} | {_g(v.get('crossing_error'))} | {_g(v.get('always_above_error'))} | "
                       f"{_g(v.get('shuffled_mean_error'))} | {'yes' if v['passed'] else 'no'} |")
    else:
        out.append(f"Not run: {markdown_text(g.get('reason'))}.")
    out += ["", "## Secondary comparisons", ""]
    if data["secondary"]:
        # the axis is named: two secondaries can share a task, metric and text (bits/byte and raw
        # CE on calib-v0), and a row without it reads as the same comparison twice
        out += ["| task · metric | text | axis | axis − L* | p | Holm p | passes |",
                "|---|---|---|---:|---:|---:|---|"]
        for s in data["secondary"]:
            out.append(f"| {markdown_text(s['task'])} · {markdown_text(s['metric'])} | {markdown_text(s['text'])} | "
                       f"{_axis_label(s['axis'])} | {_g(s['difference'], 4)} | {_g(s['p_value'])} | "
                       f"{_g(s['p_holm'])} | {'yes' if s['passes'] else 'no'} |")
    else:
        out.append("Not run (the pilot gate did not pass).")
    return "\n".join(out) + "\n"


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write_v3_report(rows: Sequence[Mapping[str, Any]], out_dir: Path, *, pilot_rows: Sequence[Mapping[str, Any]] | None,
                    pin: Any, source: Mapping[str, str], resamples: int | None = None,
                    prereg_path: Path | None = None, deviations: Sequence[str] = ()) -> dict[str, Any]:
    """Check the pin, analyse, write lab-report.json and lab-report.md; return the numbers.
    `pilot_rows` None: the pre-registered pilot's rows of `rows` (its families, seed 0).
    `deviations`: those the rows cannot show (`family_set_deviations` of a record)."""
    sha = check_pin(pin, where=source["path"], path=prereg_path)
    prereg = load_preregistration(prereg_path)
    pilot, coverage = _pilot(rows, pilot_rows, prereg)
    data = analyse_v3(rows, prereg, pilot_rows=pilot, resamples=resamples)
    data["pilot_gate"]["pilot"] = coverage
    data["design"]["deviations"].extend(coverage["deviations"])    # a pilot other than the pre-registered one
    data["design"]["deviations"].extend(deviations)
    data.update(source=dict(source), preregistration_sha256=sha)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    _write(out_dir / "lab-report.json", json.dumps(data, indent=2, sort_keys=True, allow_nan=False) + "\n")
    _write(out_dir / "lab-report.md", to_markdown(data))
    return data


def write_v3_report_from(path: Path, out_dir: Path, *, resamples: int | None = None,
                         prereg_path: Path | None = None) -> dict[str, Any]:
    """The report of a v3 lab.json or rows file."""
    data, sha = read_json(path)
    rows, pilot, pin = rows_of(data, Path(path))
    return write_v3_report(rows, out_dir, pilot_rows=pilot, pin=pin, source={"path": str(path), "sha256": sha},
                           resamples=resamples, prereg_path=prereg_path, deviations=family_set_deviations(data))


def family_set_deviations(data: Mapping[str, Any]) -> list[str]:
    """What a record's family set shows and its rows cannot: families kept by the cut-off that
    have no checkpoint in the record (the pre-registration races every kept family). The
    families raced are read from the checkpoints, not from the record's own list of them. A rows
    file, or a record run without a family folder, has no family set and shows none."""
    chosen = data.get("family_set") if data.get("schema") == RECORD_SCHEMA else None
    if not isinstance(chosen, Mapping):
        return []
    kept = list(dict.fromkeys(f for f in chosen.get("kept") or [] if isinstance(f, str)))
    checkpoints = data.get("checkpoints")
    raced = {c.get("family") for c in checkpoints if isinstance(c, Mapping)} if isinstance(checkpoints, list) else set()
    left = [f for f in kept if f not in raced]
    if not left:
        return []
    return [(f"{len(left)} of the {len(kept)} families kept by the cut-off not raced ({', '.join(left)}); "
             "the pre-registration races every kept family")]


def pilot_gate_from(path: Path, *, prereg_path: Path | None = None) -> dict[str, Any]:
    """The pilot gate alone, on a pilot-only lab.json (or a full one, or a rows file): the pin
    checked, then the gate on the pre-registered pilot's rows. Nothing is written."""
    data, sha = read_json(path)
    if not is_v3(data):
        raise LabError(f"{path} is not a lab v3 record (schema {RECORD_SCHEMA!r}) or rows file ({ROWS_SCHEMA!r})",
                       hint="the pilot gate is lab v3's; pass the lab.json of `lstar lab run3`")
    rows, pilot, pin = rows_of(data, Path(path))
    pinned = check_pin(pin, where=str(path), path=prereg_path)
    prereg = load_preregistration(prereg_path)
    chosen, coverage = _pilot(rows, pilot, prereg)
    gate = (pilot_gate(chosen, prereg) if chosen else
            {"ran": False, "passed": False, "reason": f"{path} holds no row of the pilot's families at seed 0"})
    gate["pilot"] = coverage
    return {"pilot_gate": gate, "preregistration_sha256": pinned, "source": {"path": str(path), "sha256": sha}}
