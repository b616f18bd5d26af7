CREATE SEQUENCE prediction_ids START 1;
CREATE TABLE predictions (
    id            BIGINT PRIMARY KEY DEFAULT nextval('prediction_ids'),
    policy        VARCHAR NOT NULL,
    task          VARCHAR NOT NULL,       -- a task name, or 'calibration_gaming'
    run_id        VARCHAR NOT NULL,       -- the score run evaluated
    repo          VARCHAR NOT NULL,
    commit_sha    VARCHAR NOT NULL,
    lineage       VARCHAR NOT NULL,
    corpus_sha256 VARCHAR NOT NULL,
    lstar         DOUBLE NOT NULL,
    se            DOUBLE NOT NULL,
    p_hat         DOUBLE,
    lo            DOUBLE,
    hi            DOUBLE,
    threshold     DOUBLE,
    state         VARCHAR NOT NULL,       -- clear | at_risk | emerged | flagged
    curve_id      VARCHAR,
    detail        JSON NOT NULL,
    evaluated_at  TIMESTAMPTZ NOT NULL,
    UNIQUE (policy, task, run_id)
);
CREATE INDEX predictions_by_lineage ON predictions (policy, task, lineage);
CREATE SEQUENCE alert_ids START 1;
CREATE TABLE alerts (
    id            BIGINT PRIMARY KEY DEFAULT nextval('alert_ids'),
    alert_key     VARCHAR NOT NULL UNIQUE, -- policy|task|repo|commit|state: one alert each
    kind          VARCHAR NOT NULL,        -- fire | repeat | resolve | meta
    policy        VARCHAR NOT NULL,
    task          VARCHAR NOT NULL,
    repo          VARCHAR NOT NULL,
    commit_sha    VARCHAR NOT NULL,
    lineage       VARCHAR NOT NULL,
    state         VARCHAR NOT NULL,
    status        VARCHAR NOT NULL,        -- firing | resolved
    prediction_id BIGINT,
    labels        JSON NOT NULL,
    annotations   JSON NOT NULL,
    numbers       JSON NOT NULL,           -- the `lstar` object of the webhook body
    fingerprint   VARCHAR NOT NULL,
    starts_at     TIMESTAMPTZ NOT NULL,
    ends_at       TIMESTAMPTZ,
    created_at    TIMESTAMPTZ NOT NULL
);
CREATE SEQUENCE delivery_ids START 1;
CREATE TABLE deliveries (
    id               BIGINT PRIMARY KEY DEFAULT nextval('delivery_ids'),
    alert_id         BIGINT NOT NULL,
    policy           VARCHAR NOT NULL,
    receiver         VARCHAR NOT NULL,
    group_key        VARCHAR NOT NULL,
    group_labels     JSON NOT NULL,
    group_wait_s     DOUBLE NOT NULL,
    group_interval_s DOUBLE NOT NULL,
    status           VARCHAR NOT NULL,     -- pending | queued | delivered | dead | silenced
    notification_id  VARCHAR,              -- the message that carries it
    silence_id       VARCHAR,
    reason           VARCHAR,
    created_at       TIMESTAMPTZ NOT NULL,
    updated_at       TIMESTAMPTZ NOT NULL,
    UNIQUE (alert_id, receiver)
);
CREATE TABLE notifications (
    id               VARCHAR PRIMARY KEY,  -- webhook-id; the email Message-ID derives from it
    policy           VARCHAR NOT NULL,
    receiver         VARCHAR NOT NULL,
    group_key        VARCHAR NOT NULL,
    status           VARCHAR NOT NULL,     -- pending | delivered | dead | silenced
    body             JSON NOT NULL,        -- frozen at creation: every retry sends the same bytes
    n_alerts         INTEGER NOT NULL,
    is_meta          BOOLEAN NOT NULL,
    attempts         INTEGER NOT NULL DEFAULT 0,
    next_attempt_at  TIMESTAMPTZ NOT NULL,
    lease_owner      VARCHAR,
    lease_expires_at TIMESTAMPTZ,
    last_error       VARCHAR,
    dead_reason      VARCHAR,
    created_at       TIMESTAMPTZ NOT NULL,
    updated_at       TIMESTAMPTZ NOT NULL,
    delivered_at     TIMESTAMPTZ
);
CREATE SEQUENCE delivery_attempt_ids START 1;
CREATE TABLE delivery_attempts (
    id              BIGINT PRIMARY KEY DEFAULT nextval('delivery_attempt_ids'),
    notification_id VARCHAR NOT NULL,
    policy          VARCHAR NOT NULL,
    receiver        VARCHAR NOT NULL,
    attempt         INTEGER NOT NULL,
    started_at      TIMESTAMPTZ NOT NULL,
    outcome         VARCHAR NOT NULL,      -- delivered | retry | dead | gone | lease_expired
    status_code     INTEGER,
    error           VARCHAR,
    retry_after_s   DOUBLE,
    next_attempt_at TIMESTAMPTZ
);
CREATE INDEX delivery_attempts_by_receiver ON delivery_attempts (policy, receiver, started_at);
CREATE TABLE silences (
    id         VARCHAR PRIMARY KEY,
    matchers   JSON NOT NULL,              -- ["name=value", "name=~regex", ...]
    starts_at  TIMESTAMPTZ NOT NULL,
    ends_at    TIMESTAMPTZ NOT NULL,
    comment    VARCHAR NOT NULL,
    created_by VARCHAR NOT NULL,
    created_at TIMESTAMPTZ NOT NULL,
    expired_at TIMESTAMPTZ
);
CREATE TABLE endpoints (
    policy          VARCHAR NOT NULL,
    receiver        VARCHAR NOT NULL,
    disabled_at     TIMESTAMPTZ,           -- set on 410 Gone; `lstar alerts enable` clears it
    disabled_reason VARCHAR,
    blocked_until   TIMESTAMPTZ,           -- throttled (429/503 Retry-After): nothing sent before
    updated_at      TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (policy, receiver)
);
