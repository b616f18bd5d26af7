"""What places a checkpoint in its lineage, as the state stores it.

`monitor.training_order.place` reads two values of a checkpoint's ~2 KB meta: the gate's commit
date and the listing's last-modified time. Parsing every meta to find them was most of a
report's time and memory at 10^5 checkpoints, so the two values, as DuckDB's `json_extract`
reads them from the meta (`PLACEMENT_EXTRACT`), are stored beside it in
`checkpoints.placing_values` (migration 0017). Every statement that writes a checkpoint's meta
writes that column from the same text in the same statement (`META_SET`, `META_VALUES`);
`tests/test_placing_values.py` holds every such statement of the code to it and checks the
column against the meta after the daemon's own writes.
"""

from __future__ import annotations

# The meta keys `training_order.commit_date` reads, extracted together (one parse of the meta)
# as a list of two JSON values (a key whose value is absent is null, which it reads as absent).
PLACEMENT_EXTRACT = "json_extract({meta}, ['$.gate.commit_date', '$.listing.last_modified'])"
# the object built from that list (`{placed}`, the list or NULL): the shape of the meta that
# `training_order.place` reads, for a query that hands Python something to place
PLACEMENT_OBJECT = ("json_object('gate', json_object('commit_date', {placed}[1]), "
                    "'listing', json_object('last_modified', {placed}[2]))")
# the stored list (`PLACEMENT_EXTRACT` of the row's meta)
PLACING_VALUES = "placing_values"
# A statement writing a checkpoint's meta from a parameter writes the placing values from the
# same text: in an UPDATE's SET list, and as an INSERT's last two columns and values. The meta's
# text is passed twice, once for each `?`.
META_SET = "meta = ?, placing_values = " + PLACEMENT_EXTRACT.format(meta="CAST(? AS JSON)")
META_COLUMNS = "meta, placing_values"
META_VALUES = "?, " + PLACEMENT_EXTRACT.format(meta="CAST(? AS JSON)")

__all__ = ["META_COLUMNS", "META_SET", "META_VALUES", "PLACEMENT_EXTRACT", "PLACEMENT_OBJECT", "PLACING_VALUES"]
