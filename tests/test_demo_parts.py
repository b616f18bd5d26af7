"""The demo's parts that need no training: the order of a lineage's states, the policy it writes
for its daemon passes, and the evaluation block kept ready for the policy."""

from __future__ import annotations

import pytest
import yaml

from monitor.demo.run import POLICY, POLICY_WITHOUT_REPORTS, evaluation_policy, states_in_order

FIELDS = dict(org="demo-org", corpus="0" * 64, curve="curves/add.json", webhook="http://127.0.0.1:1/hook",
              smtp_port=25, audit="/tmp/audit.jsonl")


@pytest.mark.parametrize(("states", "expected"), [
    (["clear", "at_risk", "emerged"], True),
    (["clear", "clear", "at_risk", "at_risk", "emerged", "emerged"], True),
    (["clear", "at_risk", "clear", "at_risk", "emerged"], False),      # a step back
    (["clear", "emerged"], False),                                     # at_risk never seen
    (["at_risk", "emerged"], False),                                   # clear never seen
    (["clear", "at_risk", "emerged", "at_risk"], False),
    (["clear", None, "at_risk", "emerged"], False),                    # a checkpoint with no prediction
    ([], False),
])
def test_states_in_order(states: list, expected: bool) -> None:
    assert states_in_order(states) is expected


def test_the_passes_before_the_last_write_no_report() -> None:
    full = yaml.safe_load(POLICY.format(**FIELDS))
    partial = yaml.safe_load(POLICY_WITHOUT_REPORTS.format(**FIELDS))
    assert [r["name"] for r in full["reports"]] == ["demo-report"]
    assert "reports" not in partial
    assert {k: v for k, v in full.items() if k != "reports"} == partial
    assert full["tasks"] == [{"name": "add-words", "curve": "curves/add.json"}]
    # an at_risk alert and the emerged one minutes later are both told as they happen
    assert full["route"]["group_interval"] == "0s"


def test_the_evaluation_block_is_ready_but_not_in_the_policy() -> None:
    assert evaluation_policy() == {
        "evaluations": {"per_day": 20},
        "tasks": [{"name": "add-words", "curve": "curves/add.json",
                   "evaluate": {"kind": "multiple_choice", "file": "tasks/add.jsonl", "metric": "acc",
                                "on": ["at_risk", "emerged"]}}]}
    policy = yaml.safe_load(POLICY.format(**FIELDS))
    assert "evaluations" not in policy and all("evaluate" not in t for t in policy["tasks"])
