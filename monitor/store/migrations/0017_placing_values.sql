-- The two meta values that place a checkpoint in its lineage's training order
-- (`gate.commit_date`, `listing.last_modified`: monitor.store.placing), stored beside the meta so
-- that a report or an evaluation tick placing 10^5 checkpoints reads two short values instead of
-- parsing every ~2 KB meta. Every statement that writes a checkpoint's meta writes this column
-- from the same text (placing.META_SET / META_VALUES); a row inserted without a meta ('{}') has
-- neither value.
ALTER TABLE checkpoints ADD COLUMN placing_values JSON[] DEFAULT [NULL, NULL]::JSON[];
UPDATE checkpoints SET placing_values = json_extract(meta, ['$.gate.commit_date', '$.listing.last_modified']);
