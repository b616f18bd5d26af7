"""docs/grafana/lstar-monitor.json: a Grafana dashboard whose every panel queries metrics the
daemon exports, named from the daemon's own Prometheus registry (`DaemonMetrics`), and which
shows every one of them."""

from __future__ import annotations

import json
import re
from pathlib import Path

from monitor.service.metrics import DaemonMetrics

DASHBOARD = Path(__file__).resolve().parents[1] / "docs" / "grafana" / "lstar-monitor.json"
METRIC_NAME = re.compile(r"\blstar_[a-zA-Z0-9_]+")
# What each kind of metric family is exposed as in the text format (prometheus_client).
SUFFIXES = {"counter": ("_total", "_created"), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count", "_created"),
            "summary": ("", "_sum", "_count", "_created"), "info": ("_info",)}


def exported() -> dict[str, str]:
    """Every series name the daemon's registry exports, mapped to its family's name."""
    names = {}
    for family in DaemonMetrics().registry.collect():
        for suffix in SUFFIXES[family.type]:
            names[family.name + suffix] = family.name
    return names


def panels() -> list[dict]:
    data = json.loads(DASHBOARD.read_text())
    found = []
    stack = list(data["panels"])
    while stack:   # rows may nest panels
        panel = stack.pop(0)
        stack += panel.get("panels", [])
        if panel.get("type") != "row":
            found.append(panel)
    return found


def test_the_exported_names_come_from_the_registry_and_its_render() -> None:
    names = exported()
    assert "lstar_polls_total" in names and "lstar_job_duration_seconds_bucket" in names
    metrics = DaemonMetrics()
    metrics.polls.labels(result="ok").inc()
    metrics.job_duration.labels(job="poll").observe(0.2)
    text = metrics.render().decode()
    rendered = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}
    assert rendered <= set(names), rendered - set(names)   # the suffix rule holds for what is rendered


def test_every_panel_queries_only_exported_metrics() -> None:
    names = exported()
    found = panels()
    assert len(found) >= 10
    assert len({p["id"] for p in found}) == len(found)
    for panel in found:
        assert panel["title"] and panel.get("gridPos"), panel.get("title")
        exprs = [t["expr"] for t in panel.get("targets", [])]
        assert exprs, f"panel {panel['title']!r} has no query"
        for expr in exprs:
            used = METRIC_NAME.findall(expr)
            assert used, f"panel {panel['title']!r}: {expr!r} names no lstar metric"
            unknown = [name for name in used if name not in names]
            assert not unknown, f"panel {panel['title']!r}: {unknown} not exported (exported: {sorted(names)})"


def test_every_exported_metric_has_a_panel() -> None:
    families = set(exported().values())
    shown = {exported()[name] for panel in panels() for t in panel.get("targets", [])
             for name in METRIC_NAME.findall(t["expr"])}
    assert families - shown == set(), f"metrics no panel shows: {sorted(families - shown)}"
