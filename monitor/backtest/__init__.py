"""Backtests: replay public (or a team's own) training histories through the monitor.

`history` reads and splits a history; `spec` says which tasks at which level (a policy file or
command-line values); `fit` fits their curves on the reference lineages; `scores` and `replay`
feed each target checkpoint through the daemon's evaluation and dispatch code; `compare` holds
the metrics; `result` the JSON-safe result; `render` and `html` the terminal, Markdown and HTML
outputs; `engine.run_backtest` runs it all.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from monitor.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from monitor.backtest.engine import compare_replay, run_backtest
    from monitor.backtest.history import History, Lineage, load_history, split_history
    from monitor.backtest.result import BacktestResult, LineageResult
    from monitor.backtest.spec import BacktestSpec, BacktestTask, spec_from_options, spec_from_policy

# Re-exported lazily: importing the package (or one light module in it, which imports the
# package first) does not import every stage module and their libraries; a name loads its
# module when first used.
_EXPORTS = {  # name: the module that defines it, imported on first use
    "compare_replay": "monitor.backtest.engine",
    "run_backtest": "monitor.backtest.engine",
    "History": "monitor.backtest.history",
    "Lineage": "monitor.backtest.history",
    "load_history": "monitor.backtest.history",
    "split_history": "monitor.backtest.history",
    "BacktestResult": "monitor.backtest.result",
    "LineageResult": "monitor.backtest.result",
    "BacktestSpec": "monitor.backtest.spec",
    "BacktestTask": "monitor.backtest.spec",
    "spec_from_options": "monitor.backtest.spec",
    "spec_from_policy": "monitor.backtest.spec",
}


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)


__all__ = ["BacktestResult", "BacktestSpec", "BacktestTask", "History", "Lineage", "LineageResult", "compare_replay",
           "load_history", "run_backtest", "spec_from_options", "spec_from_policy", "split_history"]
