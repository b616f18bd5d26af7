-- An evaluation whose task file changed before it ran is superseded, not failed: the row is
-- kept (status 'superseded', the reason, `superseded_by`) and a new row of the next
-- `generation` checks the same prediction with the new file. One row per (policy, task,
-- score run, generation); DuckDB cannot change a table's UNIQUE constraint in place, so the
-- table is copied into one with the new key.
DROP INDEX observations_by_status;
CREATE TABLE observations_superseding (
    id               BIGINT PRIMARY KEY DEFAULT nextval('observation_ids'),
    policy           VARCHAR NOT NULL,
    task             VARCHAR NOT NULL,
    run_id           VARCHAR NOT NULL,      -- the score run whose prediction is checked
    prediction_id    BIGINT NOT NULL,
    checkpoint_id    BIGINT,
    repo             VARCHAR NOT NULL,
    commit_sha       VARCHAR NOT NULL,
    lineage          VARCHAR NOT NULL,
    curve_id         VARCHAR NOT NULL,
    predicted_state  VARCHAR NOT NULL,
    predicted_lo     DOUBLE NOT NULL,
    predicted_hi     DOUBLE NOT NULL,
    predicted_p      DOUBLE,
    level            DOUBLE NOT NULL,       -- b + ε in force for the prediction
    confidence       DOUBLE NOT NULL,       -- the curve's 1 − δ
    settings         JSON NOT NULL,         -- evaluator kind, file or task, metric, its sha256
    digest           VARCHAR,               -- (weights digest, task sha256, settings); set once fetched
    status           VARCHAR NOT NULL,      -- pending | done | failed | skipped | superseded
    reason           VARCHAR,               -- why failed or skipped ('budget': over the day's budget)
    attempts         INTEGER NOT NULL DEFAULT 0,
    lease_owner      VARCHAR,
    lease_expires_at TIMESTAMPTZ,
    lease_started_at TIMESTAMPTZ,
    eval_run_id      VARCHAR,               -- eval_runs row holding the observed metrics
    linked_from      BIGINT,                -- an earlier observation of the same content
    observed         DOUBLE,                -- the observed metric
    n                BIGINT,                -- items
    k                BIGINT,                -- items right (n · observed)
    observed_lo      DOUBLE,
    observed_hi      DOUBLE,
    interval_method  VARCHAR,               -- clopper-pearson
    observed_state   VARCHAR,               -- observed_emerged | observed_clear | observed_unresolved
    verdict          VARCHAR,               -- confirmed | contradicted
    inside           BOOLEAN,               -- observed value inside [predicted_lo, predicted_hi]
    meta             JSON NOT NULL DEFAULT '{}',
    scheduled_day    DATE NOT NULL,         -- the UTC day whose budget it counts against
    created_at       TIMESTAMPTZ NOT NULL,
    updated_at       TIMESTAMPTZ NOT NULL,
    finished_at      TIMESTAMPTZ,
    generation       INTEGER NOT NULL DEFAULT 0,  -- 0, then one more for each row that supersedes another
    superseded_by    BIGINT,                -- the evaluation scheduled in this one's place
    UNIQUE (policy, task, run_id, generation)
);
INSERT INTO observations_superseding BY NAME SELECT * FROM observations;
DROP TABLE observations;
ALTER TABLE observations_superseding RENAME TO observations;
CREATE INDEX observations_by_status ON observations (status);
-- Before supersession, an evaluation whose task file changed after it was scheduled failed
-- for good, its reason starting `task file FILE changed since the evaluation was scheduled
-- (sha256 `. Those rows, all written before this migration (generation 0), wait again:
-- pending, the attempt the change cost refunded, so the next observe tick supersedes each
-- with one of the current file (or runs it, if the file is back as scheduled). Recognised
-- here once, by that exact prefix and the row's own file: after this, only pending rows are
-- ever superseded, so no failure text (which can quote the Hub) reschedules a job.
UPDATE observations
SET status = 'pending', attempts = greatest(attempts - 1, 0), lease_owner = NULL, lease_expires_at = NULL,
    lease_started_at = NULL, finished_at = NULL, updated_at = now()
WHERE status = 'failed' AND generation = 0 AND superseded_by IS NULL
  AND starts_with(reason, 'task file ' || (settings ->> '$.file')
                          || ' changed since the evaluation was scheduled (sha256 ');
