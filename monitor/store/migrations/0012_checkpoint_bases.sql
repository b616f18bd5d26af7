-- What a checkpoint derives from, as its model card declares it (`base_model`,
-- `base_model_relation`) or as its files imply (an adapter config, a quantization config): the
-- base repo pinned to the commit resolved when the checkpoint was gated, the relation and where
-- it came from. `bases` holds every declared base (a merge has several; then there is no
-- single base_repo); `problem` says why a declared base could not be used or pinned.
CREATE TABLE checkpoint_bases (
    checkpoint_id BIGINT PRIMARY KEY,
    base_repo VARCHAR,
    base_sha VARCHAR,
    relation VARCHAR NOT NULL,
    relation_source VARCHAR NOT NULL,
    bases JSON NOT NULL,
    problem VARCHAR,
    recorded_at TIMESTAMPTZ NOT NULL
);
CREATE INDEX checkpoint_bases_by_base ON checkpoint_bases (base_repo, base_sha);
