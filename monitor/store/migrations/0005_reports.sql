CREATE SEQUENCE report_ids START 1;
CREATE TABLE reports (
    id           BIGINT PRIMARY KEY DEFAULT nextval('report_ids'),
    policy       VARCHAR NOT NULL,
    name         VARCHAR NOT NULL,         -- the policy's report name
    period_start TIMESTAMPTZ NOT NULL,
    period_end   TIMESTAMPTZ NOT NULL,
    folder       VARCHAR NOT NULL,         -- where report.md/.html/.json were written
    summary      JSON NOT NULL,            -- headline counts
    deliveries   JSON NOT NULL,            -- [{receiver, outcome, error}]
    created_at   TIMESTAMPTZ NOT NULL,
    UNIQUE (policy, name, period_end)
);
