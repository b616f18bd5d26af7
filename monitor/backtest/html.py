"""A backtest's HTML page: per task × target lineage, the predicted band over training steps
against the observed values with their intervals, the level line, and where the first warning
and the observed crossing fall; then the table of `monitor.backtest.render`.

Figures follow the package's conventions (`monitor.plotting`: Agg, no mathtext, positions held
drawable) and are written as PNG files beside `index.html`; every string from the input is
escaped (`html.escape` of its `plain_text`), in the page and in file names (which are numbered).
"""

from __future__ import annotations

import html
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from monitor.backtest.render import COLUMNS, CURVE_COLUMNS, curve_rows, summary_lines, table_rows
from monitor.escape import plain_text
from monitor.plotting import png, pyplot, shown

STATE_MARKERS = {"clear": "o", "at_risk": "D", "emerged": "*"}


def _e(value: Any) -> str:
    return html.escape(plain_text(value), quote=True)


def lineage_figure(item: Mapping[str, Any]) -> bytes:
    """The band over steps, the observations with their intervals, the level, the markers."""
    plt = pyplot()
    points = item["points"]
    fig, ax = plt.subplots(figsize=(8.0, 4.0), dpi=100)
    steps = shown(p["step"] for p in points)
    lo = shown((p["interval"] or [None, None])[0] for p in points)
    hi = shown((p["interval"] or [None, None])[1] for p in points)
    ax.fill_between(steps, lo, hi, color="tab:blue", alpha=0.2, label="predicted interval")
    ax.plot(steps, shown(p["p_hat"] for p in points), color="tab:blue", lw=1.5, label="predicted p̂")
    obs = shown(p["observed"] for p in points)
    yerr = [[max(0.0, o - shown([p["observed_interval"][0]])[0]) for o, p in zip(obs, points)],
            [max(0.0, shown([p["observed_interval"][1]])[0] - o) for o, p in zip(obs, points)]]
    ax.errorbar(steps, obs, yerr=yerr, fmt="o", ms=4, color="black", capsize=2, label="observed", zorder=4)
    for state, marker in STATE_MARKERS.items():
        xs = [s for s, p in zip(steps, points) if p["predicted_state"] == state]
        ys = [y for y, p in zip(shown(p["p_hat"] for p in points), points) if p["predicted_state"] == state]
        if xs:
            ax.scatter(xs, ys, marker=marker, s=40, color="tab:blue", zorder=5, label=f"predicted {state}")
    if item["level"] is not None:
        ax.axhline(shown([item["level"]])[0], color="black", lw=1, ls="-.", label="level b + ε")
    if item["first_warning"] is not None:
        ax.axvline(shown([item["first_warning"]["step"]])[0], color="tab:orange", lw=1.5, label="first warning")
    if item["crossing"] is not None:
        ax.axvline(shown([item["crossing"]["step"]])[0], color="tab:red", lw=1.5, ls="--", label="observed crossing")
    ax.set_xlabel("training step")
    ax.set_ylabel("task value")
    ax.set_title(f"{plain_text(item['task'])} · {plain_text(item['lineage'])}")
    ax.legend(fontsize=7, loc="best")
    return png(fig)


def write_html(data: Mapping[str, Any], folder: str | Path) -> Path:
    """Write `index.html`, one PNG per task × lineage and `result.json` into `folder`."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "result.json").write_text(json.dumps(data, indent=2, sort_keys=True, ensure_ascii=True) + "\n",
                                        encoding="utf-8")
    parts = ["<!doctype html>", '<html lang="en"><head><meta charset="utf-8"><title>Backtest</title>',
             "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
             "td,th{border:1px solid #ccc;padding:3px 6px;font-size:13px}</style></head><body>",
             "<h1>Backtest</h1>", "<ul>"]
    parts += [f"<li>{_e(line)}</li>" for line in summary_lines(data)]
    parts += ["</ul>", "<table><thead><tr>" + "".join(f"<th>{_e(c)}</th>" for c in COLUMNS) + "</tr></thead><tbody>"]
    parts += ["<tr>" + "".join(f"<td>{_e(cell)}</td>" for cell in row) + "</tr>" for row in table_rows(data)]
    parts += ["</tbody></table>", "<h2>The curves, fitted on the references only</h2>",
              "<table><thead><tr>" + "".join(f"<th>{_e(c)}</th>" for c in CURVE_COLUMNS) + "</tr></thead><tbody>"]
    parts += ["<tr>" + "".join(f"<td>{_e(cell)}</td>" for cell in row) + "</tr>" for row in curve_rows(data)]
    parts += ["</tbody></table>"]
    for i, item in enumerate(data["results"]):
        name = f"plot-{i}.png"
        (folder / name).write_bytes(lineage_figure(item))
        title = f"{item['task']} · {item['lineage']}"
        parts += [f"<h2>{_e(title)}</h2>", f'<img src="{name}" alt="{_e(title)}" width="800">']
    parts += ['<p><a href="result.json">result.json</a> holds every number of this page.</p>', "</body></html>"]
    path = folder / "index.html"
    path.write_text("\n".join(parts) + "\n", encoding="utf-8")
    return path


__all__ = ["lineage_figure", "write_html"]
