-- A stretch of time in which a policy's scores could not be evaluated (predictions rows with
-- state 'not_evaluated', whose detail holds the reason): from the first such row until the
-- newest score of every (task, lineage) is evaluated again. One operator alert each.
CREATE SEQUENCE evaluation_gap_ids START 1;
CREATE TABLE evaluation_gaps (
    id         BIGINT PRIMARY KEY DEFAULT nextval('evaluation_gap_ids'),
    policy     VARCHAR NOT NULL,
    reason     VARCHAR NOT NULL,      -- the first reason seen in it
    started_at TIMESTAMPTZ NOT NULL,
    ended_at   TIMESTAMPTZ,
    alerted_at TIMESTAMPTZ            -- set with its one operator alert
);
