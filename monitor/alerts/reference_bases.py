"""Reference bases: the pinned base of a watched derivative, queued to be scored when a policy
asks for it (`lineage: {score_bases: true}`).

A derivative is judged from its base's coordinate L*(base) (`monitor.alerts.derivatives`),
which needs the base scored on the same corpus and spec. A base that no watch rule finds is
added as a checkpoint row of its own — source hub, no watch rule, no refs, the commit the
derivative was pinned to — so it goes through the same gate, budgets and scoring queue as any
checkpoint; its meta's `reference_base` says which derivatives and policies asked for it. A
commit the store already has is never added again. Its `rule` is `reference:RULE`, RULE the
watch rule that found the derivative: the gate, given `reference_rules(rules)` beside the
rules, applies that rule's budgets to it. A reference base is scored, not watched: no watch
rule has that name, so a policy whose rules do not match its repo never alerts on it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from monitor.alerts.prediction_eval import watches
from monitor.events import event
from monitor.hub import WatchRule
from monitor.policy import Policy
from monitor.store import Store


REFERENCE_PREFIX = "reference:"


def reference_rules(rules: Sequence[WatchRule]) -> list[WatchRule]:
    """A copy of each rule named `reference:NAME`, with its budgets: what the gate looks a
    reference base's rule up in (`gate_pending(store, client, [*rules, *reference_rules(rules)])`)."""
    return [rule.model_copy(update={"name": REFERENCE_PREFIX + rule.name}) for rule in rules]


@dataclass(frozen=True)
class ReferenceBase:
    """One base queued as a reference checkpoint."""

    id: int
    repo: str
    sha: str
    reason: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def add_reference_bases(store: Store, policies: Sequence[Policy], *, now: datetime) -> list[ReferenceBase]:
    """Queue the unqueued pinned base of every derivative a policy with `lineage.score_bases`
    watches (idempotent: a second call adds nothing). Returns the rows added."""
    asking = [p for p in policies if p.lineage.score_bases]
    if not asking:
        return []
    added = []
    for base in store.unqueued_bases():
        wanted = [(p.name, d) for d in base["derivatives"] for p in asking if watches(p, d["repo"], d["rule"])]
        if not wanted:
            continue
        names = sorted({name for name, _ in wanted})
        derivatives = list({d["checkpoint"]: d for _, d in wanted}.values())
        first = derivatives[0]
        reason = (f"the pinned base of {first['repo']}@{first['sha'][:12]} ({first['relation']})"
                  + (f" and {len(derivatives) - 1} more derivative(s)" if len(derivatives) > 1 else "")
                  + f", scored as a reference because policy {', '.join(names)} sets lineage.score_bases")
        why = {"reason": reason, "policies": names,
               "derivatives": [{"checkpoint": d["checkpoint"], "repo": d["repo"], "sha": d["sha"],
                                "relation": d["relation"]} for d in derivatives]}
        rule = first["rule"]
        new_id = store.add_reference_base(base["repo"], base["sha"], why=why, now=now,
                                          rule=None if rule is None else REFERENCE_PREFIX + rule)
        if new_id is None:
            continue
        added.append(ReferenceBase(new_id, base["repo"], base["sha"], reason))
        event("reference_base", checkpoint=new_id, repo=base["repo"], commit=base["sha"], reason=reason)
    if added:
        store.checkpoint()
    return added
