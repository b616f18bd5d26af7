CREATE TABLE eval_runs (
    run_id                VARCHAR PRIMARY KEY,
    model_repo            VARCHAR NOT NULL,
    model_sha             VARCHAR NOT NULL,
    model_source          VARCHAR NOT NULL,     -- hub | local
    task                  VARCHAR NOT NULL,
    task_sha256           VARCHAR NOT NULL,     -- sha256 of the task file
    n_items               INTEGER NOT NULL,
    item_limit            INTEGER,              -- --limit, if the run used one
    tokenizer_fingerprint VARCHAR NOT NULL,
    dtype                 VARCHAR NOT NULL,
    device                VARCHAR NOT NULL,
    metrics               JSON NOT NULL,        -- {metric: {value, stderr, baseline}}
    model                 JSON NOT NULL,
    wall_s                DOUBLE NOT NULL,
    finished_at           TIMESTAMPTZ NOT NULL
);
CREATE SEQUENCE label_ids START 1;
CREATE TABLE labels (
    id           BIGINT PRIMARY KEY DEFAULT nextval('label_ids'),
    repo         VARCHAR NOT NULL,     -- checkpoint key: Hub repo id (or local path) ...
    sha          VARCHAR NOT NULL,     -- ... and commit sha; '' when the source gave none
    checkpoint   VARCHAR NOT NULL,     -- display name, e.g. repo@revision
    family       VARCHAR,
    task         VARCHAR NOT NULL,
    metric       VARCHAR NOT NULL,
    value        DOUBLE NOT NULL,
    stderr       DOUBLE,
    n            BIGINT,
    source       VARCHAR NOT NULL,     -- builtin | lm-eval | csv
    source_ref   VARCHAR NOT NULL,     -- eval run id, or the imported file's sha256
    eval_run_id  VARCHAR,              -- set for builtin labels
    score_run_id VARCHAR,              -- the score run the label was joined with, if any
    details      JSON NOT NULL DEFAULT '{}',
    created_at   TIMESTAMPTZ NOT NULL,
    UNIQUE (repo, sha, task, metric, source_ref)
);
CREATE INDEX labels_by_task ON labels (task, metric);
