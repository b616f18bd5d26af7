CREATE TABLE hub_watermarks (
    rule_key      VARCHAR PRIMARY KEY,   -- rule name + hash of its selection and endpoint
    rule_name     VARCHAR NOT NULL,
    endpoint      VARCHAR NOT NULL,
    last_modified TIMESTAMPTZ NOT NULL,  -- newest lastModified of a completed poll
    boundary      JSON NOT NULL,         -- repo ids listed at exactly last_modified
    updated_at    TIMESTAMPTZ NOT NULL
);
CREATE SEQUENCE hub_poll_ids START 1;
CREATE TABLE hub_polls (
    id         BIGINT PRIMARY KEY DEFAULT nextval('hub_poll_ids'),
    rule_key   VARCHAR NOT NULL,
    rule_name  VARCHAR NOT NULL,
    polled_at  TIMESTAMPTZ NOT NULL,
    ok         BOOLEAN NOT NULL,
    listed     INTEGER NOT NULL,         -- repos newer than the watermark
    new_rows   INTEGER NOT NULL,         -- checkpoint rows inserted
    requests   INTEGER NOT NULL,
    error      VARCHAR
);
CREATE TABLE hub_state (
    endpoint             VARCHAR PRIMARY KEY,
    consecutive_failures INTEGER NOT NULL,
    circuit_open_until   TIMESTAMPTZ,    -- no request before this (circuit breaker)
    blocked_until        TIMESTAMPTZ,    -- no request before this (429 Retry-After)
    last_error           VARCHAR,
    last_success_at      TIMESTAMPTZ,
    updated_at           TIMESTAMPTZ NOT NULL
);
CREATE SEQUENCE hub_outage_ids START 1;
CREATE TABLE hub_outages (
    id         BIGINT PRIMARY KEY DEFAULT nextval('hub_outage_ids'),
    endpoint   VARCHAR NOT NULL,
    started_at TIMESTAMPTZ NOT NULL,     -- when the circuit opened
    ended_at   TIMESTAMPTZ,              -- first success afterwards
    failures   INTEGER NOT NULL,
    last_error VARCHAR,
    alerted_at TIMESTAMPTZ               -- set once the daemon sent its one meta-alert
);
