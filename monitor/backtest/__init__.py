"""Backtests: replay public (or a team's own) training histories through the monitor.

`history` reads and splits a history; `spec` says which tasks at which level (a policy file or
command-line values); `fit` fits their curves on the reference lineages; `scores` and `replay`
feed each target checkpoint through the daemon's evaluation and dispatch code; `compare` holds
the metrics; `result` the JSON-safe result; `render` and `html` the terminal, Markdown and HTML
outputs; `engine.run_backtest` runs it all.
"""

from monitor.backtest.engine import compare_replay, run_backtest
from monitor.backtest.history import History, Lineage, load_history, split_history
from monitor.backtest.result import BacktestResult, LineageResult
from monitor.backtest.spec import BacktestSpec, BacktestTask, spec_from_options, spec_from_policy

__all__ = ["BacktestResult", "BacktestSpec", "BacktestTask", "History", "Lineage", "LineageResult", "compare_replay",
           "load_history", "run_backtest", "spec_from_options", "spec_from_policy", "split_history"]
