"""`Store`: the state file with the rows of every domain, one mixin per domain."""

from __future__ import annotations

from monitor.store.alerts import AlertRows
from monitor.store.checkpoints import CheckpointRows
from monitor.store.derivatives import DerivativeRows
from monitor.store.evaluation_gaps import EvaluationGapRows
from monitor.store.evaluation_queue import EvaluationQueueRows
from monitor.store.hub import HubRows
from monitor.store.labels import LabelRows
from monitor.store.notifications import NotificationRows
from monitor.store.observations import ObservationRows
from monitor.store.policy_changes import PolicyChangeRows
from monitor.store.reports import ReportRows
from monitor.store.scores import ScoreRows


class Store(ScoreRows, HubRows, CheckpointRows, AlertRows, NotificationRows, LabelRows, ReportRows,
            EvaluationGapRows, EvaluationQueueRows, ObservationRows, DerivativeRows, PolicyChangeRows):
    """A DuckDB state file. Use `Store.open(...)`; close it (or use `with`).

    One process writes the file; readers open it read-only. The schema lives in
    `monitor.store.migrations`; the SQL of each domain in its own module of this package.
    """
