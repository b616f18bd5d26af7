"""Governance reports: build, render (Markdown, HTML, JSON), plot, and deliver."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

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
    "to_json": "monitor.reports.report",
    "to_markdown": "monitor.reports.report",
    "iter_json": "monitor.reports.report",
}


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})


__all__ = ["fmt", "load_policy_curves", "ref_name", "render_plots", "report_for_cli", "short", "to_html",
           "to_json", "to_markdown", "iter_json"]
