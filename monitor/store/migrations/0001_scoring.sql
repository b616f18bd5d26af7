CREATE TABLE corpora (
    sha256        VARCHAR PRIMARY KEY,   -- manifest sha256 of the (selected) documents
    name          VARCHAR NOT NULL,
    version       VARCHAR NOT NULL,
    parent_sha256 VARCHAR NOT NULL,      -- manifest sha256 of the whole corpus
    selection     VARCHAR NOT NULL,      -- 'all', 'first:K', 'slices:a,b'
    n_documents   INTEGER NOT NULL,
    n_bytes       BIGINT NOT NULL,
    registered_at TIMESTAMPTZ NOT NULL
);
CREATE TABLE tokenizers (
    fingerprint     VARCHAR PRIMARY KEY,  -- sha256(canonical tokenizer.json + prefix policy)
    source          VARCHAR NOT NULL,     -- where it was loaded from
    vocab_size      INTEGER NOT NULL,
    prefix_policy   VARCHAR NOT NULL,     -- bos | eos | none
    prefix_token_id INTEGER,
    registered_at   TIMESTAMPTZ NOT NULL
);
CREATE TABLE baselines (
    tokenizer_fingerprint VARCHAR NOT NULL,
    corpus_sha256         VARCHAR NOT NULL,
    n_tokens              BIGINT NOT NULL,
    ce_unigram            DOUBLE NOT NULL,
    slices                JSON NOT NULL,   -- {slice: {n_tokens, ce_unigram}}
    doc_tokens            JSON NOT NULL,   -- {doc_id: scored tokens}
    computed_at           TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (tokenizer_fingerprint, corpus_sha256)
);
CREATE SEQUENCE checkpoint_ids START 1;
CREATE TABLE checkpoints (
    id               BIGINT PRIMARY KEY DEFAULT nextval('checkpoint_ids'),
    repo             VARCHAR NOT NULL,     -- Hub repo id, or 'local:<dir name>'
    sha              VARCHAR NOT NULL,     -- 40-hex commit sha, or sha256 of local files
    source           VARCHAR NOT NULL,     -- hub | local
    refs             JSON NOT NULL DEFAULT '[]',
    lineage          VARCHAR NOT NULL,     -- what alerts are de-duplicated over
    rule             VARCHAR,              -- watch rule that found it
    discovered_at    TIMESTAMPTZ NOT NULL,
    updated_at       TIMESTAMPTZ NOT NULL,
    status           VARCHAR NOT NULL,     -- discovered|gated|fetched|scored|skipped|failed
    reason           VARCHAR,
    attempts         INTEGER NOT NULL DEFAULT 0,
    lease_owner      VARCHAR,
    lease_expires_at TIMESTAMPTZ,
    meta             JSON NOT NULL DEFAULT '{}',
    UNIQUE (repo, sha)
);
CREATE TABLE score_runs (
    run_id                VARCHAR PRIMARY KEY,
    checkpoint_id         BIGINT,
    model_repo            VARCHAR NOT NULL,
    model_sha             VARCHAR NOT NULL,
    model_source          VARCHAR NOT NULL,
    tokenizer_fingerprint VARCHAR NOT NULL,
    corpus_sha256         VARCHAR NOT NULL,
    spec_version          VARCHAR NOT NULL,
    window_len            INTEGER NOT NULL,
    stride                INTEGER NOT NULL,
    prefix_policy         VARCHAR NOT NULL,
    dtype                 VARCHAR NOT NULL,
    device                VARCHAR NOT NULL,
    n_tokens              BIGINT NOT NULL,
    n_bytes               BIGINT NOT NULL,
    nll_sum               DOUBLE NOT NULL,
    ce                    DOUBLE NOT NULL,
    ce_unigram            DOUBLE NOT NULL,
    lstar                 DOUBLE NOT NULL,
    l_rel                 DOUBLE NOT NULL,
    l_gain                DOUBLE NOT NULL,
    bits_per_byte         DOUBLE NOT NULL,
    tokens_per_byte       DOUBLE NOT NULL,
    se_ce                 DOUBLE NOT NULL,
    weighted_ppl          DOUBLE,
    reference_fingerprint VARCHAR,
    slices                JSON NOT NULL,
    tcb                   JSON,
    spec                  JSON NOT NULL,
    model                 JSON NOT NULL,
    library_versions      JSON NOT NULL,
    wall_s                DOUBLE NOT NULL,
    tokens_per_s          DOUBLE NOT NULL,
    finished_at           TIMESTAMPTZ NOT NULL
);
CREATE INDEX score_runs_by_model ON score_runs (model_repo, model_sha);
CREATE TABLE score_documents (
    run_id   VARCHAR NOT NULL,
    doc_id   VARCHAR NOT NULL,
    slice    VARCHAR NOT NULL,
    n_tokens BIGINT NOT NULL,
    nll      DOUBLE NOT NULL,
    n_bytes  BIGINT NOT NULL,
    PRIMARY KEY (run_id, doc_id)
);
