-- What each score run of a Hub checkpoint measured, by content: a job whose weights,
-- config/tokenizer files, scoring options and corpus selection match an earlier run
-- is not scored again; its run is a copy linked to the first one.
CREATE TABLE score_digests (
    run_id                    VARCHAR PRIMARY KEY,
    checkpoint_id             BIGINT,
    weights_digest            VARCHAR NOT NULL,  -- sha256 over weight file names + LFS sha256
    files_digest              VARCHAR NOT NULL,  -- the same over config and tokenizer files
    request_digest            VARCHAR NOT NULL,  -- the scoring options that change a number
    corpus_sha256             VARCHAR NOT NULL,
    linked_from_run_id        VARCHAR,           -- the run whose numbers these are (no forward pass)
    linked_from_checkpoint_id BIGINT,
    created_at                TIMESTAMPTZ NOT NULL
);
CREATE INDEX score_digests_by_content ON score_digests (weights_digest, files_digest);
