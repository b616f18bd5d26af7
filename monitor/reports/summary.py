"""What the Markdown and HTML of a report show of its long tables: the top rows, and counts.

The JSON report keeps every row. A report of a busy window (thousands of lineages or
crossings) would make pages nobody reads and figures with thousands of legend entries, so
the human formats show:

- the L* table, its stability twin and the families: the lineages with the most new scores
  (then those at risk or emerged), as many whole lineages as fit in `TOP_ROWS` rows;
- each task's states: those at risk or emerged first, then the shown lineages, at most
  `TOP_ROWS`, with the number of lineages in each state;
- crossings and new checkpoints: the first `TOP_ROWS` in time order, with counts;
- the figures: the shown lineages, at most `PLOT_LINEAGES` (one colour each).

Each cut table has a note (`omitted`) saying how many rows of how many are shown.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

TOP_ROWS = 50
PLOT_LINEAGES = 14
FIRING = ("at_risk", "emerged")


def _counts(items: list[Mapping[str, Any]], key: str) -> dict[str, int]:
    return dict(sorted(Counter(str(x[key]) for x in items).items()))


def shown_lineages(data: Mapping[str, Any], room: int = TOP_ROWS) -> list[str]:
    """The lineages a human format shows: most new scores first, then those at risk or emerged
    in some task, then by name; whole lineages while their rows fit in `room` (at least one)."""
    firing = {x["lineage"] for t in data["tasks"] for x in t["lineages"] if x["state"] in FIRING}
    rows = Counter(r["lineage"] for r in data["lstar_table"])
    ranked = sorted(data["families"], key=lambda f: (-f.get("new_scores", 0), f["lineage"] not in firing,
                                                     f["lineage"]))
    chosen, used = [], 0
    for f in ranked:
        n = rows.get(f["lineage"], 0)
        if chosen and used + n > room:
            break
        chosen.append(f["lineage"])
        used += n
    return chosen


def summarised(data: Mapping[str, Any], top: int = TOP_ROWS) -> dict[str, Any]:
    """A copy of the report data with its long tables cut to what the human formats show, and
    `omitted`: {section: "Showing N of M ..."} for each table that was cut."""
    if data.get("_summarised"):
        return dict(data)
    out = dict(data)
    omitted: dict[str, str] = {}
    keep = set(shown_lineages(data, top))
    if len(keep) < len(data["families"]):
        out["families"] = [f for f in data["families"] if f["lineage"] in keep]
        out["lstar_table"] = [r for r in data["lstar_table"] if r["lineage"] in keep]
        out["lineage_history"] = [r for r in data.get("lineage_history", []) if r["lineage"] in keep]
        omitted["lstar_table"] = (f"Showing {len(out['lstar_table']):,} of {len(data['lstar_table']):,} rows: "
                                  f"{len(keep):,} of {len(data['families']):,} lineages, those with the most new "
                                  "scores (report.json has every row)")
    tasks = []
    for t in data["tasks"]:
        task = dict(t)
        if len(t["lineages"]) > top:
            ranked = sorted(t["lineages"], key=lambda x: (x["state"] not in FIRING, x["lineage"] not in keep,
                                                          x["lineage"]))
            task["lineages"] = sorted(ranked[:top], key=lambda x: x["lineage"])
            counts = ", ".join(f"{state} {n:,}" for state, n in _counts(t["lineages"], "state").items())
            omitted[f"task:{t['task']}"] = (f"Showing {top:,} of {len(t['lineages']):,} lineages, at risk and "
                                            f"emerged first ({counts}; report.json has every row)")
        if "lstar_table" in omitted:
            task["new_points"] = [p for p in t["new_points"] if p["lineage"] in keep]
        tasks.append(task)
    out["tasks"] = tasks
    for key, what, by in (("crossings", "crossings", "to"), ("new_checkpoints", "new checkpoints", "status")):
        if len(data[key]) > top:
            out[key] = data[key][:top]
            counts = ", ".join(f"{k} {n:,}" for k, n in _counts(data[key], by).items())
            omitted[key] = (f"Showing the first {top:,} of {len(data[key]):,} {what} ({by}: {counts}; "
                            "report.json has every row)")
    out["omitted"] = omitted
    out["_summarised"] = True
    return out


def plotted_lineages(data: Mapping[str, Any]) -> list[str]:
    """The lineages the figures draw: the shown ones (`summarised`), at most `PLOT_LINEAGES`."""
    view = summarised(data)
    return shown_lineages(view, room=len(view["lstar_table"]))[:PLOT_LINEAGES]


def plotted(data: Mapping[str, Any]) -> dict[str, Any]:
    """The report data the figures draw: the shown lineages, at most `PLOT_LINEAGES` of them."""
    view = summarised(data)
    keep = set(plotted_lineages(view))   # summarised once: `summarised` of a view is a copy
    if len(keep) == len({r["lineage"] for r in view["lstar_table"]}):
        return view
    out = dict(view)
    out["lstar_table"] = [r for r in view["lstar_table"] if r["lineage"] in keep]
    out["lineage_history"] = [r for r in view.get("lineage_history", []) if r["lineage"] in keep]
    out["tasks"] = [{**t, "new_points": [p for p in t["new_points"] if p["lineage"] in keep],
                     "lineages": [x for x in t["lineages"] if x["lineage"] in keep]} for t in view["tasks"]]
    return out


__all__ = ["TOP_ROWS", "PLOT_LINEAGES", "shown_lineages", "summarised", "plotted", "plotted_lineages"]
