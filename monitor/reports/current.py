"""The current checkpoint of a lineage, for the report modules: the rule itself lives in
`monitor.training_order` (one definition, used by every report, endpoint, command and by the
alert engine); this module re-exports it where the reports have always imported it from."""

from __future__ import annotations

from monitor.training_order import RULE, current_checkpoint, training_ranks

__all__ = ["RULE", "current_checkpoint", "training_ranks"]
