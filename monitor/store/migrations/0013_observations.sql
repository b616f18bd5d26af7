-- Active evaluations (observations): a task run on a checkpoint whose predicted state called
-- for one, as a leased job like scoring. One row per (policy, task, score run): the
-- prediction it checks (its interval, state and level), the job's lease and attempts, the
-- content digest that dedupes identical work, and once done the observed label with its
-- binomial interval, the observed state, and whether the observation lay inside the
-- predicted interval (the curve's track record). Rows skipped for the day's budget say so.
CREATE SEQUENCE observation_ids START 1;
CREATE TABLE observations (
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
    status           VARCHAR NOT NULL,      -- pending | done | failed | skipped
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
    UNIQUE (policy, task, run_id)
);
CREATE INDEX observations_by_status ON observations (status);
-- A curve whose coverage is significantly below its nominal confidence: one alert per episode.
CREATE SEQUENCE miscalibration_ids START 1;
CREATE TABLE curve_miscalibrations (
    id         BIGINT PRIMARY KEY DEFAULT nextval('miscalibration_ids'),
    policy     VARCHAR NOT NULL,
    curve_id   VARCHAR NOT NULL,
    detail     JSON NOT NULL,
    started_at TIMESTAMPTZ NOT NULL,
    ended_at   TIMESTAMPTZ,
    alerted_at TIMESTAMPTZ
);
