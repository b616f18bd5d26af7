-- Sequential scoring (docs/measurement.md §4): a score that stopped once every task's state was
-- settled covers only part of the corpus selection. `partial` marks it; `sequential` records
-- the documents and tokens scored out of the selection's, the stopping reason, the bound used
-- and the run a resumed score continued from. DuckDB cannot alter a table that has an index,
-- so the index is dropped and made again around the change.
DROP INDEX score_runs_by_model;
ALTER TABLE score_runs ADD COLUMN partial BOOLEAN NOT NULL DEFAULT false;
ALTER TABLE score_runs ADD COLUMN sequential JSON;
CREATE INDEX score_runs_by_model ON score_runs (model_repo, model_sha);
