"""The lab report: `lab-report.json` (every number of the race), `lab-report.md`, a
self-contained `lab-report.html` and the PNG figures.

    data = write_lab_report(Path("OUT/lab.json"), Path("OUT/report"))   # rows via records.race_rows
    data = write_race_report(rows, Path("OUT/report"), source={...})      # rows already at hand

The text states the verdict of the pre-registered rule (`monitor.lab.analysis.RULE`), the
numbers it read, and the limits of the design; it never says two axes are equivalent.

Family, size, task and metric names come from the rows (a rows file is anyone's), and so do
the reasons that quote them: the text functions take `name`, which the Markdown gives as
`monitor.escape.markdown_text` (each name is literal text there, whatever it holds) and the
HTML leaves as it is (its template's `finalize` and autoescape do the escaping). The JSON
keeps the exact values.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from monitor.errors import LabError, PolicyError
from monitor.escape import html_environment, markdown_code, markdown_text
from monitor.files import FileKind, NotJsonError, read_bounded_json
from monitor.lab.analysis import AXES, PRIMARY, REFERENCE, RaceConfig, race

TEMPLATE_DIR = Path(__file__).resolve().parents[1] / "templates"
HTML_TEMPLATE = "lab_report.html.j2"
ROWS_MAX_BYTES = 64 << 20
ROWS_FILE = FileKind("race rows", "race rows", "JSON")
PROGRESS_TITLE = "Training progress: L* and bits/byte on calib against bytes seen, per lineage"
Name = Callable[[Any], str]   # how a name from the rows is written: `str`, or `markdown_text`


# -- where rows come from -------------------------------------------------------------------------
def rows_from_lab(lab_json: Path) -> tuple[list[dict[str, Any]], str]:
    """The race rows of a lab record (`monitor.lab.records.race_rows`) and the record's sha256."""
    from monitor.lab import records
    from monitor.lab.record_file import load_lab_with_sha256

    lab, sha = load_lab_with_sha256(lab_json)
    return list(records.race_rows(lab)), sha


def load_rows_file(path: Path) -> tuple[list[dict[str, Any]], str]:
    """Race rows from a JSON file: a list of rows, or an object with a `rows` list."""
    path = Path(path)
    if not path.exists():
        raise LabError(f"no rows file at {path}", hint="pass the JSON file of race rows")
    try:
        data, raw = read_bounded_json(path, str(path), what=ROWS_FILE, limit=ROWS_MAX_BYTES)
    except PolicyError as exc:
        raise LabError(exc.message, hint="pass a JSON file of race rows") from None
    except NotJsonError as exc:
        raise LabError(f"{path} is not valid JSON: {str(exc)[:200]}", hint="pass a JSON file of race rows") from None
    rows = data.get("rows") if isinstance(data, dict) else data
    if not isinstance(rows, list):
        raise LabError(f"{path} holds no list of race rows", hint="a JSON list, or an object with a 'rows' list")
    return rows, hashlib.sha256(raw).hexdigest()


# -- text -----------------------------------------------------------------------------------------
def _g(value: Any, digits: int = 3) -> str:
    return "—" if value is None else f"{value:.{digits}g}" if isinstance(value, float) else str(value)


def _signed(value: float | None) -> str:
    return "—" if value is None else f"{value:+.4f}"


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)[:80]


def figure_name(task: str, metric: str, taken: set[str] | frozenset[str] = frozenset()) -> str:
    """`task_<task>_<metric>.png`, unique among `taken` (slugs that collide get the first hex
    digits of the sha256 of (task, metric), as many as make the name unique)."""
    base = f"task_{_slug(task)}_{_slug(metric)}"
    digest = hashlib.sha256(json.dumps([task, metric]).encode("utf-8")).hexdigest()
    for width in range(0, len(digest) + 1, 8):
        name = f"{base}_{digest[:width]}.png" if width else f"{base}.png"
        if name not in taken:
            return name
    raise LabError(f"the lab report already has a figure for task {task!r} metric {metric!r}")


def figure_title(task: str, metric: str, name: Name = str) -> str:
    return f"{name(task)} · {name(metric)} against L*, bits/byte and bytes seen (calib)"


def task_figures(data: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """(file, task, metric) of each task's figure: the metrics raced on calib, in order."""
    taken, out = {"progress.png"}, []
    for entry in data["metrics"]:
        if "axes" in entry["texts"].get("calib", {}):
            file = figure_name(entry["task"], entry["metric"], taken)
            taken.add(file)
            out.append((file, entry["task"], entry["metric"]))
    return out


def limits(data: Mapping[str, Any]) -> list[str]:
    """What the design cannot show, from its own numbers."""
    d = data["design"]
    f, m = d["n_families"], data["n_secondary"]
    smallest = d["smallest_permutation_p"]
    alpha = data["config"]["alpha"]
    out = [f"{f} families (tokenizers) are the unit: the permutation test and the bootstrap draw from "
           f"{f} values, and say nothing about tokenizers unlike all of them."]
    if smallest is not None:
        out.append(f"With {f} families the smallest exact sign-flip p-value is 2/2^{f} = {smallest:.3g}"
                   + (f"; no comparison can pass the rule at α = {alpha:g}." if smallest >= alpha else ".")
                   + (f" Holm over {m} secondary comparisons needs {m}·p < {alpha:g} for the smallest, "
                      f"which {'cannot' if m * smallest >= alpha else 'can'} happen here." if m else ""))
    out += [f"Seeds {', '.join(map(str, d['seeds']))} per family and size ({d['n_lineages']} lineages, "
            f"{d['checkpoints_per_lineage']['min']}–{d['checkpoints_per_lineage']['max']} checkpoints each): "
            "checkpoints within a lineage are not independent; the per-family error pools them, and the "
            "bootstrap resamples whole lineages, never single checkpoints.",
            "Only lossless tokenizers race: a tokenizer whose decoding does not reproduce the text "
            "measures less information per byte and is not counted.",
            "'Not distinguishable' means the rule's conditions were not all met; it does not mean the "
            "axes are equivalent."]
    return out


def _checks_text(v: Mapping[str, Any]) -> str:
    names = {"permutation_p_below_alpha": "permutation p below α",
             "interval_excludes_zero": "refit interval excludes zero",
             "same_sign_on_both_texts": "same sign on calib and heldout",
             "same_sign_within_each_size": "same sign within each size"}
    # in the rule's order, not the dict's (a report read back from its sorted JSON reads the same)
    return "; ".join(f"{label}: {'yes' if v['checks'][k] else 'no'}" for k, label in names.items() if k in v["checks"])


def verdict_lines(data: Mapping[str, Any], *, name: Name = str, strong: str = "**") -> list[str]:
    """The primary verdict with its numbers, then every secondary that the rule decided; the
    primary's statement between `strong` (Markdown's bold; none in the HTML)."""
    p = data["primary"]
    out = [f"{strong}{p['statement']}{strong} (primary: {AXES[PRIMARY['axis']].label} against L* on the "
           f"family-averaged LOFO crossing error of {PRIMARY['task']} {PRIMARY['metric']}, {PRIMARY['text']} text)."]
    if p.get("checks"):
        out.append(f"Difference ({AXES[PRIMARY['axis']].label} − L*) {_signed(p['difference'])}, "
                   f"permutation p {_g(p['p_value'])}, {data['config']['interval']:.0%} refit interval "
                   f"[{_signed(p['lower'])}, {_signed(p['upper'])}]; {_checks_text(p)}.")
    decided = [(m, a, v) for m in data["metrics"] for a, v in m.get("verdicts", {}).items()
               if v["role"] == "secondary" and v["decided"]]
    out.append("Secondary comparisons (Holm-adjusted): " + ("; ".join(
        f"{name(m['task'])} {name(m['metric'])}: {v['statement']} (Holm p {_g(v['p_holm'])})" for m, a, v in decided)
        if decided else "none passes the rule") + ".")
    flat = data.get("level_not_crossed") or []
    if flat:
        out.append(f"Uninformative on the crossing error (every checkpoint on one side of the level, so every "
                   f"axis errs 0): {', '.join(map(name, flat))}; only their RMSE compares the axes.")
    c = data["negative_control"]
    if c.get("ran"):
        e = c["errors"]
        out.append(f"Negative control (leave-one-size-out, {name(c['task'])} {name(c['metric'])}, {name(c['text'])}): "
                   "crossing "
                   f"error on bytes seen {_g(e.get('bytes_seen', {}).get('crossing_error'))}, on L* "
                   f"{_g(e.get(REFERENCE, {}).get('crossing_error'))}: bytes seen "
                   + ("failed to transfer across sizes, as it should." if c["failed_to_transfer"]
                      else "did NOT fail to transfer across sizes: it is still a clock in this lab."))
    else:
        out.append(f"Negative control not run: {name(c.get('reason'))}.")
    return out


def axis_table(entry: Mapping[str, Any], text: str, name: Name = str) -> tuple[list[str], list[list[str]]]:
    """Per axis on one text: pooled and family-mean errors, and against L*: the difference in
    crossing error, permutation p, Holm p, interval, by size, and the verdict."""
    header = ["axis", "RMSE", "crossing error", "family-mean crossing", "Δ crossing vs L*", "p", "Holm p",
              "interval", "Δ by size", "Δ RMSE vs L*", "verdict"]
    rows = []
    for a, r in entry["texts"].get(text, {}).get("axes", {}).items():
        if not r.get("available"):
            rows.append([AXES[a].label, *["—"] * 9, f"not raced: {name(r['reason'])}"])
            continue
        vs = r.get("vs_reference")
        v = entry.get("verdicts", {}).get(a) if text == PRIMARY["text"] else None
        if vs is None:
            rows.append([AXES[a].label, _g(r["rmse"], 4), _g(r["crossing_error"], 4),
                         _g(r["family_mean"]["crossing_error"], 4)] + ["(reference)"] + ["—"] * 6)
            continue
        c = vs["crossing_error"]
        interval = "—" if c["lower"] is None else f"[{_signed(c['lower'])}, {_signed(c['upper'])}]"
        sizes = ", ".join(f"{name(s)} {_signed(d)}" for s, d in c["by_size"].items())
        rows.append([AXES[a].label, _g(r["rmse"], 4), _g(r["crossing_error"], 4),
                     _g(r["family_mean"]["crossing_error"], 4), _signed(c["difference"]), _g(c["p_value"]),
                     _g(c.get("p_holm")), interval, sizes, _signed(vs["rmse"]["difference"]),
                     "—" if v is None else f"{v['statement']} ({v['role']})"])
    return header, rows


def family_table(entry: Mapping[str, Any], text: str, name: Name = str) -> tuple[list[str], list[list[str]]]:
    """Per family: its LOFO crossing error (and RMSE) on each axis."""
    axes = {a: r for a, r in entry["texts"].get(text, {}).get("axes", {}).items() if r.get("available")}
    fams = sorted({f["family"] for r in axes.values() for f in r["per_family"]})
    header = ["family"] + [AXES[a].label for a in axes]
    rows = []
    for fam in fams:
        cells = []
        for r in axes.values():
            hit = [f for f in r["per_family"] if f["family"] == fam]
            cells.append(f"{hit[0]['crossing_error']:.3f} / {hit[0]['rmse']:.3f}" if hit else "—")
        rows.append([name(fam), *cells])
    return header, rows


def threshold_table(entry: Mapping[str, Any], text: str) -> tuple[list[str], list[list[str]]]:
    """Per axis: how many families' own thresholds entered, Cochran's Q, its p, τ², I²."""
    header = ["axis", "families used", "pooled threshold", "Q", "df", "p", "τ²", "I²"]
    rows = []
    for a, t in entry["thresholds"].get(text, {}).items():
        used = sum(1 for f in t["per_family"] if f.get("used"))
        rows.append([AXES[a].label, f"{used} of {len(t['per_family'])}", _g(t["pooled"], 4), _g(t["q"], 4),
                     _g(t["df"]), _g(t["p_value"]), _g(t["tau2"], 3), _g(t["i2"], 3)])
    return header, rows


def sections(data: Mapping[str, Any], name: Name = str) -> list[dict[str, Any]]:
    """Per task metric: its tables on each text (for the Markdown and the HTML)."""
    out = []
    for entry in data["metrics"]:
        texts = []
        for text in ("calib", "heldout"):
            t = entry["texts"].get(text, {})
            if "axes" not in t:
                texts.append({"text": text, "skipped": name(t.get("skipped", "no rows"))})
                continue
            flat = t.get("level_crossed") is False
            note = (f"The level is never crossed on this text ({t['above_level']} of {t['n_rows']} checkpoints "
                    "at or above it): every axis's crossing error is 0 and says nothing here; only the RMSE "
                    "compares the axes.") if flat else None
            texts.append({"text": text, "n_rows": t["n_rows"], "level_note": note,
                          "axes": axis_table(entry, text, name), "families": family_table(entry, text, name),
                          "thresholds": threshold_table(entry, text)})
        out.append({"task": name(entry["task"]), "metric": name(entry["metric"]), "baseline": entry["baseline"],
                    "level": entry["level"], "texts": texts})
    return out


def _md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    """A table whose cells are Markdown already (names escaped by `markdown_text`, `|` included)."""
    return (["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
            + ["| " + " | ".join(row) + " |" for row in rows])


def to_markdown(data: Mapping[str, Any]) -> str:
    """The report as Markdown (figures as links to the PNG files next to it)."""
    d = data["design"]
    out = ["# Emergence lab report (the race between progress axes)", "",
           f"Source {markdown_code(data['source']['path'])} (sha256 {markdown_code(data['source']['sha256'][:16])}): "
           f"{d['n_checkpoints']} checkpoints of {d['n_lineages']} lineages; families "
           f"{', '.join(map(markdown_text, d['families']))}; sizes {', '.join(map(markdown_text, d['sizes']))}; "
           f"seeds {', '.join(map(str, d['seeds']))}; texts {', '.join(map(markdown_text, d['texts']))}.", "",
           "## Verdict", ""]
    out += [f"- {s}" for s in verdict_lines(data, name=markdown_text)]
    out += ["", f"Rule (written before the full run): {data['rule']}", "", "## Limits", ""]
    out += [f"- {s}" for s in data["limits"]] + [""]
    for s in sections(data, markdown_text):
        out += [f"## {s['task']} · {s['metric']}", "",
                f"Baseline {_g(s['baseline'])}, level b + ε {_g(s['level'])}. Crossing error: the share of a "
                "held-out family's checkpoints put on the wrong side of the level; Δ: axis − L*, averaged over "
                "families (negative: the axis erred less).", ""]
        for t in s["texts"]:
            if "skipped" in t:
                out += [f"### {t['text']} text: not analysed ({t['skipped']})", ""]
                continue
            out += [f"### {t['text']} text ({t['n_rows']} checkpoints)", ""]
            out += [f"*{t['level_note']}*", ""] if t["level_note"] else []
            out += _md_table(*t["axes"]) + [""]
            out += ["Per family, LOFO crossing error / RMSE:", ""] + _md_table(*t["families"]) + [""]
            out += ["Spread of the per-family thresholds (each family's own curve) against their own intervals:",
                    ""] + _md_table(*t["thresholds"]) + [""]
    # the figures' files are slugs (`figure_name`); their titles are written again with the names escaped
    titles = {"progress.png": PROGRESS_TITLE} | {file: figure_title(task, metric, markdown_text)
                                                 for file, task, metric in task_figures(data)}
    out += ["## Figures", ""] + [f"![{titles.get(p['file']) or markdown_text(p['title'])}]({p['file']})"
                                 for p in data["plots"]]
    return "\n".join(out) + "\n"


def to_html(data: Mapping[str, Any], figures: Mapping[str, bytes]) -> str:
    """One self-contained HTML page (figures embedded as data URIs)."""
    env = html_environment(TEMPLATE_DIR)
    images = [{"title": p["title"], "uri": "data:image/png;base64," + base64.b64encode(figures[p["file"]]).decode()}
              for p in data["plots"]]
    return env.get_template(HTML_TEMPLATE).render(data=data, images=images, sections=sections(data),
                                                  conclusions=verdict_lines(data, strong=""))


def _write_atomic(path: Path, payload: bytes) -> None:
    """A temporary file renamed into place: a failed write leaves the previous file intact."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_bytes(payload)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_race_report(rows: Sequence[Mapping[str, Any]], out_dir: Path, *, source: Mapping[str, str],
                      config: RaceConfig | None = None) -> dict[str, Any]:
    """Race `rows` and write lab-report.{json,md,html} and the figures into `out_dir`.

    Returns the report data (what lab-report.json holds), with `files` naming what was written.
    Nothing is written when the rows are refused.
    """
    from monitor.lab import plots
    from monitor.lab.analysis import check_rows

    out_dir = Path(out_dir)
    data = race(rows, config)
    clean = check_rows(rows)
    data["source"] = dict(source)
    data["conclusions"] = verdict_lines(data)
    data["limits"] = limits(data)
    colours = plots.family_colours(data["design"]["families"])
    markers = plots.size_markers(data["design"]["sizes"])
    data["family_colours"], data["size_markers"] = colours, markers
    figures: dict[str, bytes] = {"progress.png": plots.progress(clean, colours, markers)}
    titles = {"progress.png": PROGRESS_TITLE}
    levels = {(m["task"], m["metric"]): m["level"] for m in data["metrics"]}
    for name, task, metric in task_figures(data):
        figures[name] = plots.task_against_axes(clean, task=task, metric=metric, level=levels[task, metric],
                                                axes=data["axes"], colours=colours, markers=markers)
        titles[name] = figure_title(task, metric)
    data["plots"] = [{"file": f, "title": titles[f]} for f in figures]
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, png in figures.items():
        _write_atomic(out_dir / name, png)
    data["files"] = [*figures, "lab-report.json", "lab-report.md", "lab-report.html"]
    _write_atomic(out_dir / "lab-report.json",
                  (json.dumps(data, indent=2, sort_keys=True, allow_nan=False) + "\n").encode())
    _write_atomic(out_dir / "lab-report.md", to_markdown(data).encode())
    _write_atomic(out_dir / "lab-report.html", to_html(data, figures).encode())
    return data


def write_lab_report(lab_json: Path, out_dir: Path, *, config: RaceConfig | None = None,
                     rows_file: Path | None = None) -> dict[str, Any]:
    """The report of a lab record (its race rows), or of a rows file when `rows_file` is given."""
    if rows_file is not None:
        rows, sha = load_rows_file(Path(rows_file))
        return write_race_report(rows, out_dir, source={"path": str(rows_file), "sha256": sha}, config=config)
    rows, sha = rows_from_lab(Path(lab_json))
    return write_race_report(rows, out_dir, source={"path": str(lab_json), "sha256": sha}, config=config)
