"""The commands of `lstar`, listed without importing them.

`lstar --help` shows every command's one-line summary, and `lstar checkpoints` needs only the
checkpoints module: neither should pay for importing all twenty command modules (and, through
them, duckdb, pydantic, scipy or torch). This table names each top-level command, the module
under `monitor.commands` whose `register(app)` defines it, and the first paragraph of its help
as `lstar --help` prints it. `monitor.commands.lazy.LazyCommandGroup` reads it; a test
(`tests/test_cli_startup.py`) builds every module eagerly and checks the table against what
they register, so a command added, renamed or re-worded without updating it fails there.

The order is the order `lstar --help` lists them: single commands first, then groups, each
in the order of their modules.
"""

from __future__ import annotations

from typing import NamedTuple


class CommandEntry(NamedTuple):
    name: str       # as typed: `lstar <name>`
    module: str     # `monitor.commands.<module>` defines it in `register(app)`
    summary: str    # the first paragraph of its help, as `lstar --help` shows it


COMMANDS: tuple[CommandEntry, ...] = (
    CommandEntry("score", "score",
                 "Score a checkpoint on a pinned corpus: CE, CE_uni, L* and variants, bits/byte, TCB."),
    CommandEntry("poll", "poll",
                 "Discover new (repo, commit) pairs for each watch rule and run the safety gate."),
    CommandEntry("checkpoints", "checkpoints",
                 "List checkpoint rows, oldest first: repo, commit, refs, status and reason (opens the file "
                 "read-only)."),
    CommandEntry("watchlist", "watchlist",
                 "The current state of every watched lineage × task, closest to its level first."),
    CommandEntry("runs", "runs",
                 "List score runs newest first: model, revision, corpus, L*, SE, tokens/s (opens the file "
                 "read-only)."),
    CommandEntry("eval", "eval",
                 "Evaluate a checkpoint on a multiple-choice task and store the metrics as labels."),
    CommandEntry("calibrate", "calibrate",
                 "Score and evaluate a campaign's checkpoints, then fit, validate and write its task curves."),
    CommandEntry("backtest", "backtest",
                 "Backtest the monitor on training histories: when would it have warned, and how often would it "
                 "have been wrong?"),
    CommandEntry("run", "run",
                 "Run the watcher: poll, gate, fetch, score, evaluate, alert and report on schedule."),
    CommandEntry("status", "run",
                 "What the daemon is doing (asks it), or what the database holds when it is not running."),
    CommandEntry("report", "report",
                 "The governance summary of each policy since its last report (or its report window), or of\n"
                 "any window (--since/--until, --last-week, --this-week) with the state carried into it."),
    CommandEntry("demo", "demo",
                 "Run discovery → gate → score → predict → evaluate → alert → report offline; exit 0 when\n"
                 "the loop closed."),
    CommandEntry("receiver", "receiver",
                 "Receive webhooks on 127.0.0.1 and print each one, checking its Standard Webhooks signature."),
    CommandEntry("stress", "stress",
                 "Run stress tests on checkpoints: tokenization perturbations, calibration registers, task formats."),
    CommandEntry("corpus", "corpus", "Pinned corpora: inspect, verify, build new versions."),
    CommandEntry("db", "db", "The DuckDB state file: migrations and contents."),
    CommandEntry("policy", "policy", "Policy files: validate them, try a score against them."),
    CommandEntry("alerts", "alerts", "Alerts and their deliveries (the outbox)."),
    CommandEntry("silence", "silence", "Silences: stop matching alerts from being sent, until a time."),
    CommandEntry("curves", "curves", "Task curves: fit, show, validate and apply them."),
    CommandEntry("labels", "labels", "Labels files: import published training histories."),
    CommandEntry("lab", "lab",
                 "The emergence lab: train checkpoint families with different tokenizers, score and label them, "
                 "report how L* transfers thresholds."),
)

# Each command module once, in the order `lstar --help` first lists one of its commands.
COMMAND_MODULES: tuple[str, ...] = tuple(dict.fromkeys(entry.module for entry in COMMANDS))
