"""Governance reports: build, render (Markdown, HTML, JSON), plot, and deliver."""

from __future__ import annotations

from typing import TYPE_CHECKING

from monitor.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from monitor.reports.report import (fmt, load_policy_curves, ref_name, render_plots, report_for_cli, short,
                                        to_html, to_json, to_markdown, iter_json)

# Re-exported lazily: importing the package (or one light module in it, which imports the
# package first) does not import every stage module and their libraries; a name loads its
# module when first used.
_EXPORTS = {  # name: the module that defines it, imported on first use
    "fmt": "monitor.reports.report",
    "load_policy_curves": "monitor.reports.report",
    "ref_name": "monitor.reports.report",
    "render_plots": "monitor.reports.report",
    "report_for_cli": "monitor.reports.report",
    "short": "monitor.reports.report",
    "to_html": "monitor.reports.report",
    "to_json": "monitor.reports.json_text",
    "to_markdown": "monitor.reports.report",
    "iter_json": "monitor.reports.json_text",
}


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)


__all__ = ["fmt", "load_policy_curves", "ref_name", "render_plots", "report_for_cli", "short", "to_html",
           "to_json", "to_markdown", "iter_json"]
