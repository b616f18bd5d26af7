"""The lab report: `lab-report.json` (every number), `lab-report.md`, a self-contained
`lab-report.html` and the PNG figures, written from a `lab.json` alone.

    data = write_lab_report(Path("OUT/lab.json"), Path("OUT/report"))

The text says which axis had the smallest held-out error and, for each axis, whether the
interval on its difference from L* excludes zero; it claims no more than those intervals
support, and says what they do not cover (family-to-family variation).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from monitor.errors import LabError
from monitor.lab.analysis import ERRORS, REFERENCE, AnalysisConfig, analyse
from monitor.lab.records import load_lab_with_sha256

TEMPLATE_DIR = Path(__file__).resolve().parents[1] / "templates"
HTML_TEMPLATE = "lab_report.html.j2"
ERROR_LABELS = {"rmse": "RMSE", "crossing_error": "crossing error", "brier": "Brier"}
CAVEAT = ("Intervals resample the held-out checkpoints within each family (paired across axes); they do "
          "not refit the curves or resample families, so with {k} families they do not cover how a new "
          "family might differ. A positive difference means the axis erred more than L*.")


def _fmt(value: Any, digits: int = 4) -> str:
    return "—" if value is None else f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def _signed(value: float | None) -> str:
    return "—" if value is None else f"{value:+.4f}"


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)[:80]


def figure_name(task: str, metric: str, taken: set[str] | frozenset[str] = frozenset()) -> str:
    """`task_<task>_<metric>.png`, unique among `taken`.

    Slugging folds characters and cuts long names, so two task metrics can slug alike ("a b"
    and "a/b"; task "a_b" metric "c" and task "a" metric "b_c"): the later one gets the first
    hex digits of the sha256 of (task, metric), as many as make it unique (a pair met twice
    is an error).
    """
    base = f"task_{_slug(task)}_{_slug(metric)}"
    digest = hashlib.sha256(json.dumps([task, metric]).encode("utf-8")).hexdigest()
    for width in range(0, len(digest) + 1, 8):
        name = f"{base}_{digest[:width]}.png" if width else f"{base}.png"
        if name not in taken:
            return name
    raise LabError(f"the lab report already has a figure for task {task!r} metric {metric!r}")


def conclusion(analysis: Mapping[str, Any], axes: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Plain sentences on one task metric: the best axis by each error, and per axis whether
    the interval on its difference from L* excludes zero."""
    if analysis.get("lofo") is None:
        return [f"No leave-one-family-out comparison: {analysis.get('skipped', 'not enough data')}."]
    label = (lambda a: axes[a]["label"] if a in axes else a)
    out = []
    best = analysis["lofo"]["best"]
    out.append("Smallest held-out error: " + "; ".join(
        f"{ERROR_LABELS[e]} — {label(best[e]) if best[e] else 'none'}" for e in ERRORS) + ".")
    diffs = analysis.get("differences") or {}
    for e in ERRORS:
        better = [label(a) for a, d in diffs.items() if d[e]["verdict"] == "axis_better"]
        worse = [label(a) for a, d in diffs.items() if d[e]["verdict"] == "reference_better"]
        same = [label(a) for a, d in diffs.items() if d[e]["verdict"] == "no_clear_difference"]
        parts = []
        if worse:
            parts.append(f"L* erred less than {', '.join(worse)} (interval excludes zero)")
        if better:
            parts.append(f"{', '.join(better)} erred less than L* (interval excludes zero)")
        if same:
            parts.append(f"no clear difference from {', '.join(same)} (interval includes zero)")
        if parts:
            out.append(f"{ERROR_LABELS[e]}: " + "; ".join(parts) + ".")
    return out


def lofo_table(analysis: Mapping[str, Any], axes: Mapping[str, Mapping[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the LOFO table: each axis's errors and its difference from L*."""
    header = ["axis"]
    for e in ERRORS:
        header += [ERROR_LABELS[e], f"Δ{ERROR_LABELS[e]} vs L* [{_pct(analysis)}]"]
    header += ["held out", "folds", "extrapolated"]
    rows = []
    diffs = analysis.get("differences") or {}
    for r in (analysis.get("lofo") or {}).get("rows", []):
        row = [axes.get(r["predictor"], {}).get("label", r["predictor"])]
        for e in ERRORS:
            d = diffs.get(r["predictor"], {}).get(e)
            row += [_fmt(r[e]), "(reference)" if r["predictor"] == REFERENCE else
                    "—" if d is None else f"{_signed(d['difference'])} [{_signed(d['lower'])}, {_signed(d['upper'])}]"]
        row += [str(r["n_heldout"]), str(r["n_folds"]), f"{r['extrapolated']:.0%}"]
        rows.append(row)
    return header, rows


def _pct(analysis: Mapping[str, Any]) -> str:
    for d in (analysis.get("differences") or {}).values():
        return f"{d['rmse']['level']:.0%}"
    return "95%"


def threshold_table(analysis: Mapping[str, Any], axes: Mapping[str, Mapping[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """The threshold η̂ of the curve fitted on all checkpoints, per axis."""
    header = ["axis", "η̂", "interval", "status", "resamples never crossing"]
    rows = []
    for axis, curve in (analysis.get("curves") or {}).items():
        name = axes.get(axis, {}).get("label", axis)
        if not curve.get("fitted"):
            rows.append([name, "—", "—", f"not fitted: {curve.get('reason')}", "—"])
            continue
        t = curve["threshold"]
        rows.append([name, _fmt(t["estimate"]), f"[{_fmt(t['lower'])}, {_fmt(t['upper'])}]", t["status"],
                     f"{t['never_share']:.0%}"])
    return header, rows


FAMILY_HEADER = ["family", "tokenizer", "vocab used", "checkpoints", "seeds", "final bytes seen", "L*", "raw CE",
                 "unigram CE", "bits/byte", "unigram bits/byte"]


def family_rows(data: Mapping[str, Any]) -> list[list[str]]:
    return [[f["family"], f["tokenizer"], str(f["vocab_used"]), str(f["checkpoints"]), str(len(f["seeds"])),
             str(f["final_bytes_seen"]), _fmt(f["final_lstar"]), _fmt(f["final_ce"]), _fmt(f["final_ce_uni"]),
             _fmt(f["final_bits_per_byte"]), _fmt(f["final_unigram_bits_per_byte"])] for f in data["families"]]


def _md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    esc = (lambda s: s.replace("|", "\\|"))
    return (["| " + " | ".join(esc(h) for h in header) + " |", "|" + "---|" * len(header)]
            + ["| " + " | ".join(esc(c) for c in row) + " |" for row in rows])


def to_markdown(data: Mapping[str, Any]) -> str:
    """The report as Markdown (figures as links to the PNG files next to it)."""
    axes = data["axes"]
    out = ["# Emergence lab report", "",
           f"Lab record `{data['source']['path']}` (sha256 `{data['source']['sha256'][:16]}`): "
           f"{data['n_checkpoints']} checkpoints of {len(data['families'])} families.", "",
           data["caveat"], "", "## Families", "",
           "At the most trained checkpoints every seed reached (means over seeds). L* is per token, "
           "bits/byte per byte: the unigram baseline per byte differs between tokenizers.", ""]
    out += _md_table(FAMILY_HEADER, family_rows(data)) + [""]
    for a in data["analyses"]:
        out += [f"## {a['task']} · {a['metric']}", "",
                f"Baseline {_fmt(a['baseline'])}, margin ε {_fmt(a['margin'])}, level b + ε {_fmt(a['level'])}; "
                f"{a['n_checkpoints']} checkpoints.", ""]
        out += [f"- {s}" for s in a["conclusions"]] + [""]
        if a.get("lofo"):
            out += ["### Leave-one-family-out", ""] + _md_table(*lofo_table(a, axes)) + [""]
        if a.get("curves"):
            out += ["### Threshold on each axis (all checkpoints)", ""] + _md_table(*threshold_table(a, axes)) + [""]
    out += ["## Figures", ""] + [f"![{p['title']}]({p['file']})" for p in data["plots"]]
    return "\n".join(out) + "\n"


def to_html(data: Mapping[str, Any], figures: Mapping[str, bytes]) -> str:
    """One self-contained HTML page (figures embedded as data URIs)."""
    import jinja2

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)),
                             autoescape=jinja2.select_autoescape(["html", "html.j2"]),
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    images = [{"title": p["title"], "uri": "data:image/png;base64," + base64.b64encode(figures[p["file"]]).decode()}
              for p in data["plots"]]
    sections = [{"a": a, "lofo": lofo_table(a, data["axes"]) if a.get("lofo") else None,
                 "thresholds": threshold_table(a, data["axes"]) if a.get("curves") else None}
                for a in data["analyses"]]
    return env.get_template(HTML_TEMPLATE).render(data=data, images=images, sections=sections,
                                                  family_header=FAMILY_HEADER, family_rows=family_rows(data))


def _write_atomic(path: Path, payload: bytes) -> None:
    """A temporary file renamed into place: a failed write leaves the previous file intact."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_bytes(payload)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_lab_report(lab_json: Path, out_dir: Path, *, config: AnalysisConfig | None = None) -> dict[str, Any]:
    """Analyse `lab_json` and write lab-report.{json,md,html} and the figures into `out_dir`.

    Returns the report data (what lab-report.json holds), with `files` naming what was written.
    """
    from monitor.lab import plots

    lab_json, out_dir = Path(lab_json), Path(out_dir)
    lab, sha = load_lab_with_sha256(lab_json)
    data = analyse(lab, config)
    data["source"] = {"path": str(lab_json), "sha256": sha}
    data["caveat"] = CAVEAT.format(k=len(lab.families))
    for a in data["analyses"]:
        a["conclusions"] = conclusion(a, data["axes"])
    colours = plots.family_colours([f.family for f in lab.families])
    data["family_colours"] = colours
    figures: dict[str, bytes] = {"progress.png": plots.progress(data["checkpoints"], colours)}
    titles = {"progress.png": "Training progress: L* and bits/byte against bytes seen, per family"}
    for a in data["analyses"]:
        if a.get("curves"):
            name = figure_name(a["task"], a["metric"], set(figures))
            figures[name] = plots.task_against_axes(a, data["checkpoints"], data["axes"], colours)
            titles[name] = f"{a['task']} · {a['metric']} against L*, raw CE and bits/byte, by family"
    data["plots"] = [{"file": f, "title": titles[f]} for f in figures]
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, png in figures.items():
        _write_atomic(out_dir / name, png)
    files = [*figures, "lab-report.json", "lab-report.md", "lab-report.html"]
    data["files"] = files
    _write_atomic(out_dir / "lab-report.json",
                  (json.dumps(data, indent=2, sort_keys=True, allow_nan=False) + "\n").encode())
    _write_atomic(out_dir / "lab-report.md", to_markdown(data).encode())
    _write_atomic(out_dir / "lab-report.html", to_html(data, figures).encode())
    return data
