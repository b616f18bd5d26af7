"""The lineage histories of a whole batch of runs, read at once and kept as the batch is planned.

`Store.lineage_history` answers for one (policy, task, lineage) with three or four queries and a
sort of the lineage's checkpoints; an evaluation tick over N new runs asking it per run pays that
N times. `LineageBatch` reads what every run of a batch needs with a fixed number of queries
(the lineages' judged predictions with what places them, the runs' checkpoints, the newest
firing alert and the sends per receiver of each lineage, the alert keys already written), and
answers `history(...)` from memory. Each planned row is then `record`ed, so that the next run of
the same lineage sees it, as it would read it back inside the batch's transaction: its
prediction (the lineage's newest for that checkpoint), its alert (the newest firing one) and its
deliveries (the receivers' last sends). The training order of each lineage is kept by
`monitor.training_order.LatestInOrder`, not sorted again per run.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from monitor.store.rows import FiringAlertRow, LineageHistory, ReceiverSends
from monitor.training_order import LatestInOrder, Placement, place




def decoded(text: Any, default: Any) -> Any:
    """A JSON column's value, or `default` when it is empty or not JSON of the same kind."""
    if not text:
        return default
    try:
        value = json.loads(text) if isinstance(text, str) else text
    except ValueError:
        return default
    return value if isinstance(value, type(default)) else default


def placement_of(row: Mapping[str, Any]) -> Placement:
    """Where a placed prediction row sits in its lineage (`monitor.training_order.place`)."""
    return place(row["refs"], row["meta"], row["discovered_at"], row["finished_at"])


def tiebreak_of(row: Mapping[str, Any]) -> tuple[str, str]:
    return (row["commit_sha"], row["repo"])


def _later(a: datetime | None, b: datetime | None) -> datetime | None:
    return b if a is None or (b is not None and b > a) else a


@dataclass
class _Lineage:
    """One (policy, task, lineage)'s history as the batch has seen and written it."""

    order: LatestInOrder[dict[str, Any]]
    placed: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    firing: dict[str, Any] | None = None           # newest firing alert: labels, starts_at, state, commit_sha, created_at
    receivers: dict[str, list[datetime | None]] = field(default_factory=dict)   # receiver -> [firing_at, resolved_at]


class LineageBatch:
    """The histories one batch of runs of (policy, task) reads, from `AlertRows.lineage_batch`."""

    def __init__(self, policy: str, task: str, placed: Sequence[dict[str, Any]],
                 checkpoint_places: Mapping[tuple[str, str], dict[str, Any]],
                 run_places: Mapping[str, dict[str, Any]], firing: Sequence[dict[str, Any]],
                 sends: Sequence[dict[str, Any]], alert_keys: set[str]) -> None:
        self.policy, self.task = policy, task
        self._checkpoint_places = checkpoint_places
        self._run_places = run_places
        self.alert_keys = set(alert_keys)
        self._lineages: dict[str, _Lineage] = {}
        for row in placed:
            self._put(self._lineage(row["lineage"]), row)
        for row in firing:
            self._lineage(row["lineage"]).firing = row
        for row in sends:
            self._lineage(row["lineage"]).receivers[row["receiver"]] = [row["last_firing_at"],
                                                                        row["last_resolved_at"]]

    def _lineage(self, name: str) -> _Lineage:
        if name not in self._lineages:
            self._lineages[name] = _Lineage(order=LatestInOrder(placement_of, tiebreak_of))
        return self._lineages[name]

    @staticmethod
    def _put(lineage: _Lineage, row: dict[str, Any]) -> None:
        key = (row["repo"], row["commit_sha"])
        lineage.placed[key] = row
        lineage.order.put(key, row)

    def history(self, lineage: str, repo: str, commit: str, scored_at: datetime | None) -> LineageHistory:
        """What `Store.lineage_history(policy, task, lineage, (repo, commit, scored_at))` returns
        at this point of the batch."""
        line = self._lineage(lineage)
        current = line.order.latest()
        if current is None:
            state, commit_now, behind = None, None, False
        else:
            key = (repo, commit)
            if key in line.order:
                behind = (current["repo"], current["commit_sha"]) != key
            else:
                candidate = {**self._checkpoint_places.get(key, _NO_PLACE), "repo": repo, "commit_sha": commit,
                             "finished_at": scored_at}
                behind = not line.order.would_lead(candidate)
            state, commit_now = current["state"], current["commit_sha"]
        last = None
        if line.firing is not None:
            f = line.firing
            last = FiringAlertRow(id=f["id"], labels=dict(f["labels"]), starts_at=f["starts_at"], state=f["state"],
                                  commit_sha=f["commit_sha"])
        return LineageHistory(state=state, last_firing=last,
                              receivers={r: ReceiverSends(last_firing_at=v[0], last_resolved_at=v[1])
                                         for r, v in line.receivers.items()},
                              current=commit_now, behind_current=behind)

    def record(self, row: Mapping[str, Any], *, now: datetime) -> list[bool]:
        """Take a planned prediction row (written with its alerts) into the histories; returns,
        per alert of the row, whether it is new (its key not written before: only a new one is
        inserted, with its deliveries)."""
        line = self._lineage(row["lineage"])
        if row["state"] != "not_evaluated":
            key = (row["repo"], row["commit_sha"])
            old = line.placed.get(key)
            # the newest prediction of a checkpoint is the one placed (evaluated_at, then id: a new one's is larger)
            if old is None or old.get("evaluated_at") is None or now >= old["evaluated_at"]:
                place_row = self._run_places.get(row["run_id"], _NO_PLACE)
                self._put(line, {**place_row, "repo": row["repo"], "commit_sha": row["commit_sha"],
                                 "lineage": row["lineage"], "state": row["state"], "evaluated_at": now,
                                 "finished_at": place_row.get("finished_at")})
        new = []
        for alert in row.get("alerts", ()):
            fresh = alert["alert_key"] not in self.alert_keys
            new.append(fresh)
            if not fresh:
                continue
            self.alert_keys.add(alert["alert_key"])
            if alert["status"] == "firing" and alert["kind"] not in ("meta", "observe") and (
                    line.firing is None or alert["created_at"] >= line.firing["created_at"]):
                line.firing = {"id": -1, "labels": alert["labels"], "starts_at": alert["starts_at"],
                               "state": alert["state"], "commit_sha": alert["commit_sha"],
                               "created_at": alert["created_at"]}
            if alert["kind"] == "observe" or alert["status"] not in ("firing", "resolved"):
                continue
            for d in alert["deliveries"]:
                sends = line.receivers.setdefault(d["receiver"], [None, None])
                slot = 0 if alert["status"] == "firing" else 1
                sends[slot] = _later(sends[slot], now)
        return new


_NO_PLACE: dict[str, Any] = {"refs": [], "meta": {}, "discovered_at": None}


__all__ = ["LineageBatch", "decoded", "placement_of", "tiebreak_of"]
