"""The schema as forward-only migrations: each one a named list of SQL statements, applied in order
and recorded in `schema_migrations`."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Migration:
    """One named, forward-only schema step."""

    name: str
    sql: str


MIGRATIONS: list[Migration] = [
    Migration(
        "0001_scoring",
        """
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
        """,
    ),
    Migration(
        "0002_labels",
        """
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
        """,
    ),
    Migration(
        "0003_hub",
        """
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
        """,
    ),
    Migration(
        "0004_alerts",
        """
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
        """,
    ),
    Migration(
        "0005_reports",
        """
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
        """,
    ),
    Migration(
        "0006_score_digests",
        """
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
        """,
    ),
]
