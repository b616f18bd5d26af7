-- Periodic jobs cost what is new, not what exists.
--
-- evaluation_queue: score runs some policy may still have to evaluate. A row is written in
-- the transaction that writes its score run and deleted by the evaluation tick that handled
-- it for every policy (one still waiting, e.g. for its private score, stays). A crash
-- between the two evaluates it again; the predictions' unique key makes that a no-op.
CREATE TABLE evaluation_queue (
    run_id        VARCHAR PRIMARY KEY,
    corpus_sha256 VARCHAR NOT NULL,
    queued_at     TIMESTAMPTZ NOT NULL
);
-- evaluation_scopes: for each (policy, task, corpus), what decided which runs are candidates
-- (the curve id and the watch rules, as a digest) when every run on that corpus was last
-- looked at. While it is unchanged, the queue holds every run still to evaluate; when it
-- changes (a new curve pin, other watch rules) the next tick looks at every run once.
CREATE TABLE evaluation_scopes (
    policy        VARCHAR NOT NULL,
    task          VARCHAR NOT NULL,
    corpus_sha256 VARCHAR NOT NULL,
    scope         VARCHAR NOT NULL,
    recorded_at   TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (policy, task, corpus_sha256)
);
-- notification_groups: each group's newest notification (group_interval counts from it),
-- so that grouping reads one row per due group instead of a max() over every notification.
CREATE TABLE notification_groups (
    policy           VARCHAR NOT NULL,
    receiver         VARCHAR NOT NULL,
    group_key        VARCHAR NOT NULL,
    last_created_at  TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (policy, receiver, group_key)
);
INSERT INTO notification_groups
    SELECT policy, receiver, group_key, max(created_at) FROM notifications GROUP BY policy, receiver, group_key;
