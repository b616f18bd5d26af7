"""One training-order rule: `monitor.training_order` is the only place that says where a
checkpoint sits in its lineage and which checkpoint is current (issue 38, item 1).

Read from the source: no other module defines a function of the rule's names, compiles its
own step pattern, or picks one prediction per lineage by time in SQL; every module that shows
or acts on a current checkpoint imports the rule from `monitor.training_order`; the old import
paths (`reports.present`, `reports.current`) hand out the very same functions.
"""

from __future__ import annotations

import ast
import re
from datetime import datetime, timedelta, timezone

from import_graph import ROOT, all_modules, imports

import monitor.training_order as rule
from monitor.reports import current, present

HOME = "monitor.training_order"
# The rule's functions: a definition of one of these names anywhere else is a second rule.
RULE_NAMES = {"current_checkpoint", "training_order", "lineage_order", "training_ranks", "parse_step", "place",
              "orders_by_step", "commit_date"}
# Each module that shows or acts on a lineage's current checkpoint (the report's rows, the watchlist,
# the status page, a policy change's re-evaluation, the alert engine's lineage history).
USERS = ("monitor.reports.history", "monitor.reports.watchlist", "monitor.service.status_page",
         "monitor.service.policy_change", "monitor.store.alerts", "monitor.reports.plots")
# One prediction per (task,) lineage chosen by a time order: "the newest" standing in for "current".
NEWEST_PER_LINEAGE = re.compile(
    r"PARTITION BY (?:\w+\.)?(?:policy, (?:\w+\.)?)?task, (?:\w+\.)?lineage\s*(?:\"\s*\")?\s*ORDER BY "
    r"(?:\w+\.)?(?:evaluated_at|finished_at)", re.IGNORECASE)
# Whole training histories replayed from label files carry their step as a number, not a ref name.
NOT_CHECKPOINT_ORDER = ("monitor.backtest", "monitor.lab")


def _sources() -> dict[str, str]:
    return {name: path.read_text(encoding="utf-8") for name, path in all_modules().items()
            if name != HOME and not name.startswith(NOT_CHECKPOINT_ORDER)}


def test_no_other_module_defines_the_rule() -> None:
    offenders = []
    for name, text in _sources().items():
        tree = ast.parse(text)
        methods = {id(f) for c in ast.walk(tree) if isinstance(c, ast.ClassDef) for f in c.body}
        for node in ast.walk(tree):
            # a function of the rule's names (a method such as the Hub client's `commit_date`,
            # which asks the Hub, is not a rule)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in RULE_NAMES and \
                    id(node) not in methods:
                offenders.append(f"{name}:{node.lineno} defines {node.name}()")
            # a step pattern of its own (`step1000`, `checkpoint-50`, `global_step200`)
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "compile" and node.args and \
                    isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str) and \
                    re.search(r"step|ckpt", node.args[0].value) and re.search(r"\\d", node.args[0].value):
                offenders.append(f"{name}:{node.lineno} compiles its own step pattern")
        # SQL that takes the newest prediction of a lineage for its state: scoring order
        flat = re.sub(r"\"\s*\n\s*\"", "", text)
        offenders += [f"{name}: picks one row per lineage by time ({m.group(0)[:60]}...)"
                      for m in NEWEST_PER_LINEAGE.finditer(flat)]
    assert offenders == []


def test_every_user_of_the_current_checkpoint_imports_the_one_rule() -> None:
    modules = all_modules()
    for user in USERS:
        found = {imp.module.rsplit(".", 1)[0] if imp.module.startswith("monitor.") else imp.module
                 for imp in imports(modules[user])}
        assert HOME in found, f"{user} does not import {HOME}"
        assert "monitor.reports.current" not in found   # the compatibility path is for outsiders only


def test_the_old_import_paths_hand_out_the_same_functions() -> None:
    assert current.current_checkpoint is rule.current_checkpoint and current.training_ranks is rule.training_ranks
    assert present.lineage_order is rule.lineage_order and present.place is rule.place
    assert present.Placement is rule.Placement and present.parse_step is rule.parse_step


def test_the_rule_worked_by_hand() -> None:
    t0 = datetime(2025, 3, 1, tzinfo=timezone.utc)
    gate = lambda hours: {"gate": {"commit_date": (t0 + timedelta(hours=hours)).isoformat()}}  # noqa: E731
    # steps as numbers, not strings: step200 < step1000 < step20000, whatever the dates
    rows = [("s20000", rule.place(["step20000"], gate(0), None, None)),
            ("s200", rule.place(["step200"], gate(5), None, None)),
            ("s1000", rule.place(["checkpoint-1000"], gate(9), None, None))]
    assert [r[0] for r in rule.lineage_order(rows, lambda r: r[1])] == ["s200", "s1000", "s20000"]
    assert rule.training_ranks(rows, lambda r: r[1], lambda r: r[0]) == {"s200": 0, "s1000": 1, "s20000": 2}
    # one checkpoint without a step: release time for all; its time from the best source
    rows.append(("main", rule.place(["main"], {"listing": {"last_modified": (t0 + timedelta(hours=7)).isoformat()}},
                                    t0 + timedelta(hours=20), t0 + timedelta(hours=30))))
    assert rows[-1][1] == rule.Placement(None, t0 + timedelta(hours=7), rule.HUB_COMMIT)
    assert rule.current_checkpoint(rows, lambda r: r[1])[0] == "s1000"   # hour 9 beats 7, 5 and 0
    # a `main` listing date does not date a branch commit; first seen, then time scored, do
    assert rule.place(["dev"], {"listing": {"last_modified": t0.isoformat()}}, None, t0).time_source == rule.SCORED
    assert rule.place(["dev"], {}, t0, t0).time_source == rule.FIRST_SEEN
    # hostile meta: wrong types and unparsable dates are no date, not a crash
    assert rule.place(["step5"], {"gate": "x", "listing": 3}, None, None) == rule.Placement(5, None, rule.SCORED)
    assert rule.place(None, {"gate": {"commit_date": "yesterday"}}, None, None).time is None
    assert rule.parse_step(["v2step3", "main"]) is None and rule.parse_step(["step1", "global_step300"]) == 300
    assert "training order" in rule.RULE and (ROOT / "monitor" / "training_order.py").exists()
