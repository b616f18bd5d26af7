"""Governance reports: build, render (Markdown, HTML, JSON), plot, and deliver."""

from monitor.reports.report import (fmt, load_policy_curves, ref_name, render_plots, report_for_cli, short,
                                    to_html, to_json, to_markdown, iter_json)

__all__ = ["fmt", "load_policy_curves", "ref_name", "render_plots", "report_for_cli", "short", "to_html",
           "to_json", "to_markdown", "iter_json"]
