"""The DuckDB state file: schema, forward-only migrations, and all SQL.

One process writes the file; readers open it read-only. Every migration runs in one
transaction together with its record in `schema_migrations`, so a crash mid-migration
leaves the previous version intact. DDL happens only here, at start-up, and is followed by
a CHECKPOINT (a WAL holding DDL has failed to replay after unclean exits).
"""

from __future__ import annotations

import contextlib
import errno
import json
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import duckdb

from monitor.errors import StoreError

DEFAULT_DB_PATH = Path("state") / "lstar.duckdb"


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
]


def utcnow() -> datetime:
    """Timezone-aware now in UTC (the only clock store code uses by default)."""
    return datetime.now(timezone.utc)


def storage_error(path: Path, exc: BaseException, *, doing: str) -> StoreError:
    """One clear StoreError for an OS or DuckDB failure on the state file (or folder) `path`.

    A full disk, a folder this user cannot write, and a file DuckDB cannot read (truncated,
    corrupt, or not a database) each get the fix that applies; none of them suggests
    deleting anything, least of all the WAL.
    """
    lines = str(exc).strip().splitlines()
    detail = " ".join(lines[0].split()) if lines else type(exc).__name__
    if isinstance(exc, OSError) and exc.strerror:
        detail = exc.strerror
    code = exc.errno if isinstance(exc, OSError) else None
    text = str(exc).lower()
    if code == errno.ENOSPC or "no space left" in text or "disk full" in text:
        return StoreError(f"no space left on the device holding {path} ({doing})",
                          hint="free space there and run it again; what was already written is intact")
    if code in (errno.EACCES, errno.EPERM, errno.EROFS) or "permission denied" in text \
            or "read-only file system" in text:
        return StoreError(f"cannot write {path} ({doing}): {detail}",
                          hint="make the state directory writable by the user running lstar, "
                               "or point --state/--db at one that is")
    if isinstance(exc, OSError):
        return StoreError(f"cannot use {path} ({doing}): {detail}")
    # What reading a damaged file raises; a parser or binder error (a faulty migration) is
    # not the file's fault and is not reported as such.
    damaged = (duckdb.IOException, duckdb.SerializationException, duckdb.FatalException)
    if isinstance(exc, damaged) or type(exc) is duckdb.Error or "corrupt" in text:
        wal = path.name + ".wal"
        return StoreError(f"cannot read {path} ({doing}): {detail}",
                          hint=f"the file is truncated, corrupt or not a DuckDB database: stop lstar, move "
                               f"{path.name} and {wal} (if any) aside, never deleting the WAL, and restore a "
                               f"backup or start a new state directory")
    return StoreError(f"{doing} {path} failed: {detail}")


class Store:
    """A DuckDB state file. Use `Store.open(...)`; close it (or use `with`)."""

    def __init__(self, conn: duckdb.DuckDBPyConnection, path: Path, read_only: bool) -> None:
        self._conn = conn
        self.path = path
        self.read_only = read_only
        self._lock = threading.RLock()

    # -- opening ---------------------------------------------------------------------
    @classmethod
    def open(cls, path: str | Path = DEFAULT_DB_PATH, *, read_only: bool = False,
             migrate: bool = True) -> "Store":
        """Open (and by default migrate) the state file at `path`.

        Read-only opens never create or migrate; they fail if the file is missing or behind
        the code's schema. A read-write open fails clearly when another process holds it.
        Either fails before writing anything when the file carries a migration this version
        does not know, and every other failure (a truncated or corrupt file, a folder that
        cannot be written, a full disk) is a StoreError naming the file and the fix.
        """
        path = Path(path)
        if read_only and not path.exists():
            raise StoreError(f"no database at {path}",
                             hint="score something first, or run `lstar db migrate --db PATH`")
        if not read_only:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise storage_error(path.parent, exc, doing="creating the folder of the database") from exc
        try:
            conn = duckdb.connect(str(path), read_only=read_only)
        except duckdb.IOException as exc:
            text = str(exc).lower()
            if "conflicting lock" in text or "could not set lock" in text:
                raise StoreError(
                    f"{path} is held by another process (the daemon?)",
                    hint="stop it, or use the read commands, which ask the running daemon") from exc
            raise storage_error(path, exc, doing="opening") from exc
        except duckdb.Error as exc:
            raise storage_error(path, exc, doing="opening") from exc
        store = cls(conn, path, read_only)
        try:
            if read_only:
                pending = store.pending_migrations()
                if pending:
                    raise StoreError(f"{path} is at an older schema (pending: {', '.join(pending)})",
                                     hint="run `lstar db migrate` with no daemon running")
            elif migrate:
                store.migrate()
        except BaseException as exc:
            with contextlib.suppress(Exception):
                store.close()
            if isinstance(exc, (duckdb.Error, OSError)):
                raise storage_error(path, exc, doing="reading the schema" if read_only else "migrating") \
                    from exc
            raise
        return store

    def close(self) -> None:
        """Checkpoint (when writable) and close the connection."""
        with self._lock:
            if self._conn is None:
                return
            if not self.read_only:
                with contextlib.suppress(duckdb.Error):
                    self._conn.execute("CHECKPOINT")
            self._conn.close()
            self._conn = None  # type: ignore[assignment]

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- low level ---------------------------------------------------------------------
    @property
    def conn(self) -> duckdb.DuckDBPyConnection:
        if self._conn is None:
            raise StoreError(f"{self.path} is closed")
        return self._conn

    def cursor(self) -> duckdb.DuckDBPyConnection:
        """A cursor for another thread (a DuckDB connection is not thread-safe)."""
        return self.conn.cursor()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """BEGIN ... COMMIT, rolled back on any exception."""
        with self._lock:
            conn = self.conn
            conn.execute("BEGIN TRANSACTION")
            try:
                yield conn
            except BaseException:
                with contextlib.suppress(duckdb.Error):
                    conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    def checkpoint(self) -> None:
        """Fold the WAL into the main file (after batches and on shutdown)."""
        if not self.read_only:
            with self._lock:
                self.conn.execute("CHECKPOINT")

    def query(self, sql: str, params: Sequence[Any] | None = None) -> list[dict[str, Any]]:
        """Run a read query and return rows as dicts."""
        with self._lock:
            cur = self.conn.execute(sql, params or [])
            cols = [d[0] for d in cur.description]
            return [dict(zip(cols, row)) for row in cur.fetchall()]

    # -- migrations --------------------------------------------------------------------
    def applied_migrations(self) -> list[str]:
        """Names of the migrations already applied, oldest first."""
        exists = self.conn.execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_name = 'schema_migrations'"
        ).fetchone()[0]
        if not exists:
            return []
        rows = self.conn.execute("SELECT name FROM schema_migrations ORDER BY name").fetchall()
        return [r[0] for r in rows]

    def pending_migrations(self) -> list[str]:
        """Names of the code's migrations not yet applied to this file."""
        applied = set(self.applied_migrations())
        unknown = applied - {m.name for m in MIGRATIONS}
        if unknown:
            raise StoreError(
                f"{self.path} has migrations this version does not know: {', '.join(sorted(unknown))}",
                hint="it was written by a newer lstar-monitor; upgrade rather than downgrade")
        return [m.name for m in MIGRATIONS if m.name not in applied]

    def migrate(self, migrations: Sequence[Migration] | None = None) -> list[str]:
        """Apply pending migrations, each in one transaction with its record. Idempotent."""
        if self.read_only:
            raise StoreError(f"{self.path} is open read-only; cannot migrate")
        migrations = MIGRATIONS if migrations is None else migrations
        with self._lock:
            done: list[str] = []
            try:
                self.pending_migrations()  # a file from a newer version is refused before anything is written
                self.conn.execute(
                    "CREATE TABLE IF NOT EXISTS schema_migrations ("
                    " name VARCHAR PRIMARY KEY, applied_at TIMESTAMPTZ NOT NULL)")
                applied = set(self.applied_migrations())
                for m in migrations:
                    if m.name in applied:
                        continue
                    with self.transaction() as conn:
                        conn.execute(m.sql)
                        conn.execute("INSERT INTO schema_migrations VALUES (?, ?)", [m.name, utcnow()])
                    done.append(m.name)
                self.conn.execute("CHECKPOINT")
            except (duckdb.Error, OSError) as exc:  # each migration is all or nothing: the file stays usable
                applied_now = f" after applying {', '.join(done)}" if done else ""
                raise storage_error(self.path, exc, doing=f"migrating{applied_now}") from exc
        return done

    def info(self) -> dict[str, Any]:
        """Schema version and row counts, for `lstar db info`."""
        try:  # fixed SQL over every table: a failure here is the file's
            tables = [r[0] for r in self.conn.execute(
                "SELECT table_name FROM information_schema.tables "
                "WHERE table_schema = 'main' ORDER BY table_name").fetchall()]
            counts = {t: self.conn.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0] for t in tables}
        except duckdb.Error as exc:
            raise storage_error(self.path, exc, doing="counting rows") from exc
        applied = self.applied_migrations()
        return {"path": str(self.path), "migrations": applied,
                "pending": [m.name for m in MIGRATIONS if m.name not in set(applied)],
                "tables": counts}

    # -- corpora, tokenizers, baselines --------------------------------------------------
    def upsert_corpus(self, conn: duckdb.DuckDBPyConnection, row: Mapping[str, Any]) -> None:
        """Register a corpus (selection) inside an open transaction; no-op if known."""
        conn.execute(
            "INSERT INTO corpora VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
            [row["sha256"], row["name"], row["version"], row["parent_sha256"], row["selection"],
             row["n_documents"], row["n_bytes"], utcnow()])

    def upsert_tokenizer(self, conn: duckdb.DuckDBPyConnection, row: Mapping[str, Any]) -> None:
        """Register a tokenizer fingerprint inside an open transaction; no-op if known."""
        conn.execute(
            "INSERT INTO tokenizers VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
            [row["fingerprint"], row["source"], row["vocab_size"], row["prefix_policy"],
             row["prefix_token_id"], utcnow()])

    def get_baseline(self, fingerprint: str, corpus_sha256: str) -> dict[str, Any] | None:
        """The cached unigram baseline for (tokenizer, corpus), or None."""
        rows = self.query(
            "SELECT n_tokens, ce_unigram, slices, doc_tokens FROM baselines "
            "WHERE tokenizer_fingerprint = ? AND corpus_sha256 = ?", [fingerprint, corpus_sha256])
        if not rows:
            return None
        row = rows[0]
        return {"n_tokens": int(row["n_tokens"]), "ce_unigram": float(row["ce_unigram"]),
                "slices": json.loads(row["slices"]), "doc_tokens": json.loads(row["doc_tokens"])}

    def put_baseline(self, fingerprint: str, corpus_sha256: str, baseline: Mapping[str, Any]) -> None:
        """Cache a unigram baseline (first writer wins; values are deterministic)."""
        with self.transaction() as conn:
            conn.execute(
                "INSERT INTO baselines VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                [fingerprint, corpus_sha256, int(baseline["n_tokens"]),
                 float(baseline["ce_unigram"]), json.dumps(baseline["slices"], sort_keys=True),
                 json.dumps(baseline["doc_tokens"], sort_keys=True), utcnow()])

    # -- score runs ----------------------------------------------------------------------
    SCORE_RUN_COLUMNS = (
        "run_id", "checkpoint_id", "model_repo", "model_sha", "model_source",
        "tokenizer_fingerprint", "corpus_sha256", "spec_version", "window_len", "stride",
        "prefix_policy", "dtype", "device", "n_tokens", "n_bytes", "nll_sum", "ce", "ce_unigram",
        "lstar", "l_rel", "l_gain", "bits_per_byte", "tokens_per_byte", "se_ce", "weighted_ppl",
        "reference_fingerprint", "slices", "tcb", "spec", "model", "library_versions", "wall_s",
        "tokens_per_s", "finished_at")
    _JSON_COLUMNS = frozenset({"slices", "tcb", "spec", "model", "library_versions"})

    def record_score_run(self, run: Mapping[str, Any], documents: Sequence[Sequence[Any]],
                         corpus: Mapping[str, Any], tokenizer: Mapping[str, Any]) -> str:
        """Write one score run, its per-document rows, corpus and tokenizer in one transaction.

        `documents` rows are (doc_id, slice, n_tokens, nll, n_bytes). Nothing is written if
        any part fails.
        """
        with self.transaction() as conn:
            self.insert_score_run(conn, run, documents, corpus, tokenizer)
        self.checkpoint()
        return str(run["run_id"])

    def insert_score_run(self, conn: duckdb.DuckDBPyConnection, run: Mapping[str, Any],
                         documents: Sequence[Sequence[Any]], corpus: Mapping[str, Any],
                         tokenizer: Mapping[str, Any]) -> None:
        """The writes of `record_score_run`, inside a transaction the caller holds (the queue
        completes a job and records its score in one transaction)."""
        missing = [c for c in self.SCORE_RUN_COLUMNS if c not in run]
        if missing:
            raise StoreError(f"score run is missing columns: {', '.join(missing)}")
        values = [json.dumps(run[c], sort_keys=True) if c in self._JSON_COLUMNS and run[c] is not None
                  else run[c] for c in self.SCORE_RUN_COLUMNS]
        placeholders = ", ".join("?" for _ in self.SCORE_RUN_COLUMNS)
        self.upsert_corpus(conn, corpus)
        self.upsert_tokenizer(conn, tokenizer)
        conn.execute(f"INSERT INTO score_runs ({', '.join(self.SCORE_RUN_COLUMNS)}) "
                     f"VALUES ({placeholders})", values)
        conn.executemany("INSERT INTO score_documents VALUES (?, ?, ?, ?, ?, ?)",
                         [[run["run_id"], *doc] for doc in documents])

    def score_runs(self, *, model_repo: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        """Recent score runs, newest first."""
        where, params = ("WHERE model_repo = ?", [model_repo]) if model_repo else ("", [])
        return self.query(f"SELECT * FROM score_runs {where} ORDER BY finished_at DESC LIMIT ?",
                          [*params, limit])

    def score_documents(self, run_id: str) -> list[dict[str, Any]]:
        """Per-document rows of one run, in corpus order of insertion."""
        return self.query("SELECT doc_id, slice, n_tokens, nll, n_bytes FROM score_documents "
                          "WHERE run_id = ? ORDER BY rowid", [run_id])

    # -- hub: watermarks, poll log, circuit state, outages ---------------------------------
    def get_watermark(self, rule_key: str) -> dict[str, Any] | None:
        """The watermark of a watch rule: {last_modified, boundary: [repo ids]}, or None."""
        rows = self.query("SELECT last_modified, boundary FROM hub_watermarks WHERE rule_key = ?",
                          [rule_key])
        if not rows:
            return None
        return {"last_modified": rows[0]["last_modified"], "boundary": json.loads(rows[0]["boundary"])}

    def _insert_hub_poll(self, conn: duckdb.DuckDBPyConnection, rule_key: str, rule_name: str, *,
                         now: datetime, ok: bool, listed: int, new: int, requests: int,
                         error: str | None) -> None:
        conn.execute("INSERT INTO hub_polls (rule_key, rule_name, polled_at, ok, listed, new_rows, "
                     "requests, error) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                     [rule_key, rule_name, now, ok, listed, new, requests, error])

    def record_hub_poll(self, rule_key: str, rule_name: str, *, now: datetime, ok: bool,
                        listed: int, new: int, requests: int, error: str | None = None) -> None:
        """Log one rule poll (failed polls write only this row)."""
        with self.transaction() as conn:
            self._insert_hub_poll(conn, rule_key, rule_name, now=now, ok=ok, listed=listed, new=new,
                                  requests=requests, error=error)

    def record_discoveries(self, rule_key: str, rule_name: str, endpoint: str,
                           candidates: Sequence[Any], *, watermark: datetime | None,
                           boundary: Sequence[str], now: datetime, requests: int,
                           listed: int) -> int:
        """Upsert candidate checkpoints, advance the rule's watermark and log the poll, atomically.

        `candidates` have repo, sha, refs, status, reason, meta. An existing (repo, sha) keeps
        its row and gains any new refs. Returns the number of rows inserted.
        """
        inserted = 0
        with self.transaction() as conn:
            for c in candidates:
                row = conn.execute("SELECT id, refs FROM checkpoints WHERE repo = ? AND sha = ?",
                                   [c.repo, c.sha]).fetchone()
                if row is None:
                    conn.execute(
                        "INSERT INTO checkpoints (repo, sha, source, refs, lineage, rule, discovered_at,"
                        " updated_at, status, reason, meta) VALUES (?, ?, 'hub', ?, ?, ?, ?, ?, ?, ?, ?)",
                        [c.repo, c.sha, json.dumps(sorted(c.refs)), c.repo, rule_name, now, now,
                         c.status, c.reason, json.dumps(c.meta, sort_keys=True)])
                    inserted += 1
                    continue
                old = json.loads(row[1])
                merged = sorted(set(old) | set(c.refs))
                if merged != sorted(old):
                    conn.execute("UPDATE checkpoints SET refs = ?, updated_at = ? WHERE id = ?",
                                 [json.dumps(merged), now, row[0]])
            if watermark is not None:
                conn.execute(
                    "INSERT INTO hub_watermarks VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (rule_key) DO "
                    "UPDATE SET last_modified = excluded.last_modified, boundary = excluded.boundary,"
                    " updated_at = excluded.updated_at",
                    [rule_key, rule_name, endpoint, watermark, json.dumps(list(boundary)), now])
            self._insert_hub_poll(conn, rule_key, rule_name, now=now, ok=True, listed=listed,
                                  new=inserted, requests=requests, error=None)
        self.checkpoint()
        return inserted

    def hub_polls(self, *, limit: int = 100) -> list[dict[str, Any]]:
        """Recent rule polls, newest first."""
        return self.query("SELECT * FROM hub_polls ORDER BY id DESC LIMIT ?", [limit])

    _HUB_STATE_FIELDS = ("consecutive_failures", "circuit_open_until", "blocked_until",
                         "last_error", "last_success_at")

    def get_hub_state(self, endpoint: str) -> dict[str, Any] | None:
        """Circuit and rate-limit state of a Hub endpoint, or None if never recorded."""
        rows = self.query(f"SELECT {', '.join(self._HUB_STATE_FIELDS)} FROM hub_state "
                          "WHERE endpoint = ?", [endpoint])
        return rows[0] if rows else None

    def put_hub_state(self, endpoint: str, state: Mapping[str, Any], *, now: datetime) -> None:
        """Save the circuit and rate-limit state of a Hub endpoint."""
        values = [state[f] for f in self._HUB_STATE_FIELDS]
        updates = ", ".join(f"{f} = excluded.{f}" for f in (*self._HUB_STATE_FIELDS, "updated_at"))
        with self.transaction() as conn:
            conn.execute(f"INSERT INTO hub_state (endpoint, {', '.join(self._HUB_STATE_FIELDS)}, "
                         f"updated_at) VALUES (?, ?, ?, ?, ?, ?, ?) "
                         f"ON CONFLICT (endpoint) DO UPDATE SET {updates}", [endpoint, *values, now])

    def open_hub_outage(self, endpoint: str, *, now: datetime, failures: int,
                        error: str | None) -> int:
        """Record that the circuit opened: one row per outage (an open one is updated)."""
        with self.transaction() as conn:
            row = conn.execute("SELECT id FROM hub_outages WHERE endpoint = ? AND ended_at IS NULL",
                               [endpoint]).fetchone()
            if row is not None:
                conn.execute("UPDATE hub_outages SET failures = ?, last_error = ? WHERE id = ?",
                             [failures, error, row[0]])
                return int(row[0])
            return int(conn.execute(
                "INSERT INTO hub_outages (endpoint, started_at, failures, last_error) "
                "VALUES (?, ?, ?, ?) RETURNING id", [endpoint, now, failures, error]).fetchone()[0])

    def close_hub_outage(self, endpoint: str, *, now: datetime) -> None:
        """Mark the open outage of `endpoint` (if any) as ended."""
        with self.transaction() as conn:
            conn.execute("UPDATE hub_outages SET ended_at = ? WHERE endpoint = ? AND ended_at IS NULL",
                         [now, endpoint])

    def hub_outages(self, *, unalerted_only: bool = False) -> list[dict[str, Any]]:
        """Outage rows, oldest first; `unalerted_only` gives those awaiting the meta-alert."""
        where = "WHERE alerted_at IS NULL" if unalerted_only else ""
        return self.query(f"SELECT * FROM hub_outages {where} ORDER BY id")

    def mark_hub_outage_alerted(self, outage_id: int, *, now: datetime) -> bool:
        """Compare-and-set alerted_at, so one outage yields one meta-alert."""
        with self.transaction() as conn:
            n = conn.execute("UPDATE hub_outages SET alerted_at = ? WHERE id = ? AND alerted_at IS NULL",
                             [now, outage_id]).fetchone()[0]
        return n == 1

    # -- checkpoints and their leases --------------------------------------------------------
    _CHECKPOINT_COLUMNS = ("id", "repo", "sha", "source", "refs", "lineage", "rule", "discovered_at",
                           "updated_at", "status", "reason", "attempts", "lease_owner",
                           "lease_expires_at", "meta")

    @staticmethod
    def _decode_checkpoint(row: Mapping[str, Any]) -> dict[str, Any]:
        out = dict(row)
        out["refs"] = json.loads(out["refs"]) if out.get("refs") else []
        out["meta"] = json.loads(out["meta"]) if out.get("meta") else {}
        return out

    def list_checkpoints(self, *, status: str | None = None, repo: str | None = None,
                         limit: int | None = None) -> list[dict[str, Any]]:
        """Checkpoint rows (refs and meta decoded), oldest discovery first."""
        clauses, params = [], []
        if status is not None:
            clauses.append("status = ?")
            params.append(status)
        if repo is not None:
            clauses.append("repo = ?")
            params.append(repo)
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        tail = f"LIMIT {int(limit)}" if limit is not None else ""
        rows = self.query(f"SELECT {', '.join(self._CHECKPOINT_COLUMNS)} FROM checkpoints {where} "
                          f"ORDER BY discovered_at, id {tail}", params)
        return [self._decode_checkpoint(r) for r in rows]

    def get_checkpoint(self, checkpoint_id: int) -> dict[str, Any] | None:
        """One checkpoint row by id (refs and meta decoded), or None."""
        rows = self.query(f"SELECT {', '.join(self._CHECKPOINT_COLUMNS)} FROM checkpoints "
                          "WHERE id = ?", [checkpoint_id])
        return self._decode_checkpoint(rows[0]) if rows else None

    @staticmethod
    def _merged_meta(conn: duckdb.DuckDBPyConnection, checkpoint_id: int,
                     meta: Mapping[str, Any] | None) -> str:
        old = conn.execute("SELECT meta FROM checkpoints WHERE id = ?", [checkpoint_id]).fetchone()
        merged = {**(json.loads(old[0]) if old and old[0] else {}), **(meta or {})}
        return json.dumps(merged, sort_keys=True, default=str)

    def set_checkpoint_verdict(self, checkpoint_id: int, *, expect_status: str, status: str,
                               reason: str | None, meta: Mapping[str, Any] | None,
                               now: datetime) -> bool:
        """Move an unleased row from `expect_status` to `status` (compare-and-set)."""
        with self.transaction() as conn:
            merged = self._merged_meta(conn, checkpoint_id, meta)
            n = conn.execute(
                "UPDATE checkpoints SET status = ?, reason = ?, meta = ?, updated_at = ? "
                "WHERE id = ? AND status = ? AND lease_owner IS NULL",
                [status, reason, merged, now, checkpoint_id, expect_status]).fetchone()[0]
        return n == 1

    def claim_checkpoint(self, owner: str, *, now: datetime, lease_s: float,
                         statuses: Sequence[str], max_attempts: int,
                         exclude: Sequence[int] = ()) -> dict[str, Any] | None:
        """Lease the oldest row in `statuses` that is unleased or whose lease expired.

        Compare-and-set in one transaction: attempts += 1, lease_owner, lease_expires_at.
        A row that already used `max_attempts` is marked failed instead ("gave up after N
        attempts: <last reason>") and the next one is tried. Rows whose id is in `exclude`
        are passed over. Returns the claimed row or None.
        """
        if not statuses:
            return None
        marks = ", ".join("?" for _ in statuses)
        skip = f"AND id NOT IN ({', '.join(str(int(i)) for i in exclude)})" if exclude else ""
        expires = now + timedelta(seconds=lease_s)
        while True:
            with self.transaction() as conn:
                row = conn.execute(
                    f"SELECT id, attempts, lease_owner, reason FROM checkpoints "
                    f"WHERE status IN ({marks}) AND (lease_owner IS NULL OR lease_expires_at <= ?) "
                    f"{skip} ORDER BY discovered_at, id LIMIT 1", [*statuses, now]).fetchone()
                if row is None:
                    return None
                checkpoint_id, attempts, previous_owner, reason = row
                if previous_owner is not None:
                    reason = f"lease of {previous_owner} expired during attempt {attempts}"
                if attempts >= max_attempts:
                    conn.execute(
                        "UPDATE checkpoints SET status = 'failed', reason = ?, lease_owner = NULL, "
                        "lease_expires_at = NULL, updated_at = ? WHERE id = ? AND attempts = ?",
                        [f"gave up after {attempts} attempts: {reason or 'no reason recorded'}", now,
                         checkpoint_id, attempts])
                    continue
                n = conn.execute(
                    "UPDATE checkpoints SET attempts = attempts + 1, lease_owner = ?, "
                    "lease_expires_at = ?, reason = ?, updated_at = ? WHERE id = ? AND attempts = ? "
                    "AND (lease_owner IS NULL OR lease_expires_at <= ?)",
                    [owner, expires, reason, now, checkpoint_id, attempts, now]).fetchone()[0]
            if n == 1:
                return self.get_checkpoint(checkpoint_id)

    def advance_checkpoint(self, checkpoint_id: int, owner: str, *, status: str,
                           meta: Mapping[str, Any] | None, now: datetime) -> bool:
        """Record progress (e.g. gated -> fetched) while keeping the lease; CAS on the owner."""
        with self.transaction() as conn:
            merged = self._merged_meta(conn, checkpoint_id, meta)
            n = conn.execute("UPDATE checkpoints SET status = ?, meta = ?, updated_at = ? "
                             "WHERE id = ? AND lease_owner = ?",
                             [status, merged, now, checkpoint_id, owner]).fetchone()[0]
        return n == 1

    def complete_checkpoint(self, checkpoint_id: int, owner: str, *, status: str,
                            reason: str | None, meta: Mapping[str, Any] | None, now: datetime,
                            write: Any = None) -> bool:
        """Finish a leased job: set status, drop the lease, and run `write(conn)` atomically.

        Only if `owner` still holds the lease (compare-and-set); otherwise nothing is written
        and False is returned. `write` adds the job's own rows (e.g. the score run) to the
        same transaction, so a job completes exactly once.
        """
        with self.transaction() as conn:
            held = conn.execute("SELECT 1 FROM checkpoints WHERE id = ? AND lease_owner = ?",
                                [checkpoint_id, owner]).fetchone()
            if held is None:
                return False
            merged = self._merged_meta(conn, checkpoint_id, meta)
            conn.execute("UPDATE checkpoints SET status = ?, reason = ?, meta = ?, lease_owner = NULL,"
                         " lease_expires_at = NULL, updated_at = ? WHERE id = ? AND lease_owner = ?",
                         [status, reason, merged, now, checkpoint_id, owner])
            if write is not None:
                write(conn)
        self.checkpoint()
        return True

    def release_checkpoint(self, checkpoint_id: int, owner: str, *, reason: str, now: datetime,
                           max_attempts: int, refund: bool = False) -> str | None:
        """Give a lease back after a retryable failure; fail the row once attempts are used up.

        `refund` gives the attempt back (the failure was not the job's, e.g. a Hub outage).
        Returns the row's new status, or None when `owner` no longer held the lease.
        """
        with self.transaction() as conn:
            row = conn.execute("SELECT attempts, status FROM checkpoints WHERE id = ? AND lease_owner = ?",
                               [checkpoint_id, owner]).fetchone()
            if row is None:
                return None
            attempts, status = row
            if refund:
                attempts = max(0, attempts - 1)
            elif attempts >= max_attempts:
                status, reason = "failed", f"gave up after {attempts} attempts: {reason}"
            conn.execute("UPDATE checkpoints SET status = ?, reason = ?, attempts = ?, lease_owner = NULL, "
                         "lease_expires_at = NULL, updated_at = ? WHERE id = ? AND lease_owner = ?",
                         [status, reason, attempts, now, checkpoint_id, owner])
        return status

    # -- alerts: predictions, the outbox, notifications, silences, endpoints -----------------
    class _LostRace(Exception):
        """Raised inside a transaction to roll back a compare-and-set that lost the race."""

    def evaluation_candidates(self, policy: str, task: str, corpus_sha256: str) -> list[dict[str, Any]]:
        """Score runs on `corpus_sha256` that (policy, task) has not evaluated, oldest first.

        Each row has run_id, repo, commit_sha, lstar, se, corpus_sha256, finished_at, lineage
        (the checkpoint's, else the repo) and rule (the watch rule that found it, if any).
        """
        return self.query(
            "SELECT r.run_id, r.model_repo AS repo, r.model_sha AS commit_sha, r.lstar, "
            "r.se_ce AS se, r.corpus_sha256, r.finished_at, coalesce(c.lineage, r.model_repo) AS lineage, "
            "c.rule, r.spec_version, r.window_len, r.stride, r.prefix_policy FROM score_runs r LEFT JOIN checkpoints c ON (c.id = r.checkpoint_id) OR "
            "(r.checkpoint_id IS NULL AND c.repo = r.model_repo AND c.sha = r.model_sha) "
            "WHERE r.corpus_sha256 = ? AND NOT EXISTS (SELECT 1 FROM predictions p WHERE "
            "p.policy = ? AND p.task = ? AND p.run_id = r.run_id) ORDER BY r.finished_at, r.run_id",
            [corpus_sha256, policy, task])

    def latest_score(self, repo: str, commit_sha: str, corpus_sha256: str) -> dict[str, Any] | None:
        """The newest score run of (repo, commit) on a corpus, or None."""
        rows = self.query("SELECT run_id, lstar, se_ce AS se, finished_at FROM score_runs WHERE "
                          "model_repo = ? AND model_sha = ? AND corpus_sha256 = ? "
                          "ORDER BY finished_at DESC, run_id DESC LIMIT 1", [repo, commit_sha, corpus_sha256])
        return rows[0] if rows else None

    def lineage_history(self, policy: str, task: str, lineage: str) -> dict[str, Any]:
        """What alert decisions for (policy, task, lineage) depend on.

        state: the last evaluated state (None if never); last_firing: the newest firing alert
        (labels decoded) or None; receivers: {receiver: {last_firing_at, last_resolved_at}}
        over deliveries that were not silenced.
        """
        state = self.query("SELECT state FROM predictions WHERE policy = ? AND task = ? AND lineage = ? "
                           "ORDER BY evaluated_at DESC, id DESC LIMIT 1", [policy, task, lineage])
        firing = self.query("SELECT id, labels, starts_at, state, commit_sha FROM alerts WHERE policy = ? "
                            "AND task = ? AND lineage = ? AND status = 'firing' AND kind != 'meta' "
                            "ORDER BY created_at DESC, id DESC LIMIT 1", [policy, task, lineage])
        rows = self.query(
            "SELECT d.receiver, max(CASE WHEN a.status = 'firing' THEN d.created_at END) AS last_firing_at, "
            "max(CASE WHEN a.status = 'resolved' THEN d.created_at END) AS last_resolved_at "
            "FROM deliveries d JOIN alerts a ON a.id = d.alert_id WHERE a.policy = ? AND a.task = ? "
            "AND a.lineage = ? AND d.status != 'silenced' GROUP BY d.receiver", [policy, task, lineage])
        last = None
        if firing:
            last = {**firing[0], "labels": json.loads(firing[0]["labels"])}
        return {"state": state[0]["state"] if state else None, "last_firing": last,
                "receivers": {r["receiver"]: {"last_firing_at": r["last_firing_at"],
                                              "last_resolved_at": r["last_resolved_at"]} for r in rows}}

    _PREDICTION_COLUMNS = ("policy", "task", "run_id", "repo", "commit_sha", "lineage", "corpus_sha256",
                           "lstar", "se", "p_hat", "lo", "hi", "threshold", "state", "curve_id",
                           "detail", "evaluated_at")
    _ALERT_COLUMNS = ("alert_key", "kind", "policy", "task", "repo", "commit_sha", "lineage", "state",
                      "status", "labels", "annotations", "numbers", "fingerprint", "starts_at",
                      "ends_at", "created_at")

    def _insert_alert(self, conn: duckdb.DuckDBPyConnection, alert: Mapping[str, Any],
                      prediction_id: int | None, now: datetime) -> int:
        """Insert an alert and its deliveries unless its key exists; returns deliveries written."""
        values = [json.dumps(alert[c], sort_keys=True) if c in ("labels", "annotations", "numbers")
                  else alert[c] for c in self._ALERT_COLUMNS]
        row = conn.execute(
            f"INSERT INTO alerts ({', '.join(self._ALERT_COLUMNS)}, prediction_id) VALUES "
            f"({', '.join('?' for _ in self._ALERT_COLUMNS)}, ?) ON CONFLICT (alert_key) DO NOTHING "
            "RETURNING id", [*values, prediction_id]).fetchone()
        if row is None:
            return 0
        for d in alert["deliveries"]:
            conn.execute(
                "INSERT INTO deliveries (alert_id, policy, receiver, group_key, group_labels, group_wait_s,"
                " group_interval_s, status, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, "
                "'pending', ?, ?)",
                [row[0], alert["policy"], d["receiver"], d["group_key"],
                 json.dumps(d["group_labels"], sort_keys=True), d["group_wait_s"],
                 d["group_interval_s"], now, now])
        return len(alert["deliveries"])

    def write_outbox(self, predictions: Sequence[Mapping[str, Any]], *, now: datetime,
                     before_commit: Any = None) -> dict[str, int]:
        """Write predictions, their alerts and one delivery row per receiver in ONE transaction.

        Each prediction may carry `alerts` (dicts with the alert columns and `deliveries`).
        A prediction already recorded for (policy, task, run_id), or an alert whose key
        exists, writes nothing, so evaluating the same score twice sends nothing twice.
        `before_commit(conn)` runs last inside the transaction (crash tests kill there).
        """
        counts = {"predictions": 0, "alerts": 0, "deliveries": 0}
        with self.transaction() as conn:
            for p in predictions:
                values = [json.dumps(p[c], sort_keys=True, default=str) if c == "detail" else p[c]
                          for c in self._PREDICTION_COLUMNS]
                row = conn.execute(
                    f"INSERT INTO predictions ({', '.join(self._PREDICTION_COLUMNS)}) VALUES "
                    f"({', '.join('?' for _ in self._PREDICTION_COLUMNS)}) "
                    "ON CONFLICT (policy, task, run_id) DO NOTHING RETURNING id", values).fetchone()
                if row is None:
                    continue
                counts["predictions"] += 1
                for alert in p.get("alerts", ()):
                    written = self._insert_alert(conn, alert, row[0], now)
                    if written or not alert["deliveries"]:
                        counts["alerts"] += 1 if written else 0
                    counts["deliveries"] += written
            if before_commit is not None:
                before_commit(conn)
        self.checkpoint()
        return counts

    def pending_deliveries(self) -> list[dict[str, Any]]:
        """Deliveries not yet put into a notification, with their alert's labels, oldest first."""
        rows = self.query(
            "SELECT d.id, d.alert_id, d.policy, d.receiver, d.group_key, d.group_labels, d.group_wait_s,"
            " d.group_interval_s, d.created_at, a.labels, a.kind FROM deliveries d JOIN alerts a "
            "ON a.id = d.alert_id WHERE d.status = 'pending' ORDER BY d.created_at, d.id")
        for r in rows:
            r["labels"] = json.loads(r["labels"])
            r["group_labels"] = json.loads(r["group_labels"])
        return rows

    def set_deliveries_status(self, delivery_ids: Sequence[int], status: str, *, now: datetime,
                              reason: str | None = None, silence_id: str | None = None) -> int:
        """Move pending deliveries to `status` (silenced, dead); returns rows changed."""
        if not delivery_ids:
            return 0
        marks = ", ".join("?" for _ in delivery_ids)
        with self.transaction() as conn:
            return int(conn.execute(
                f"UPDATE deliveries SET status = ?, reason = ?, silence_id = ?, updated_at = ? "
                f"WHERE id IN ({marks}) AND status = 'pending'",
                [status, reason, silence_id, now, *delivery_ids]).fetchone()[0])

    def last_notification_at(self, policy: str, receiver: str, group_key: str) -> datetime | None:
        """When the group's newest notification was created (group_interval counts from it)."""
        row = self.conn.execute("SELECT max(created_at) FROM notifications WHERE policy = ? AND "
                                "receiver = ? AND group_key = ?", [policy, receiver, group_key]).fetchone()
        return row[0] if row else None

    def alerts_by_id(self, alert_ids: Sequence[int]) -> list[dict[str, Any]]:
        """Alert rows (JSON decoded) in the order of `alert_ids`."""
        if not alert_ids:
            return []
        marks = ", ".join("?" for _ in alert_ids)
        rows = {r["id"]: r for r in self.query(f"SELECT * FROM alerts WHERE id IN ({marks})", list(alert_ids))}
        out = []
        for i in alert_ids:
            r = dict(rows[i])
            for c in ("labels", "annotations", "numbers"):
                r[c] = json.loads(r[c])
            out.append(r)
        return out

    def create_notification(self, notification: Mapping[str, Any], delivery_ids: Sequence[int], *,
                            now: datetime) -> bool:
        """Freeze a group of pending deliveries into one notification (compare-and-set).

        False (nothing written) when any of the deliveries is no longer pending.
        """
        marks = ", ".join("?" for _ in delivery_ids)
        try:
            with self.transaction() as conn:
                self._freeze_notification(conn, notification, delivery_ids, marks, now)
        except Store._LostRace:
            return False
        return True

    def _freeze_notification(self, conn: duckdb.DuckDBPyConnection, notification: Mapping[str, Any],
                             delivery_ids: Sequence[int], marks: str, now: datetime) -> None:
        n = conn.execute(f"UPDATE deliveries SET status = 'queued', notification_id = ?, updated_at = ? "
                         f"WHERE id IN ({marks}) AND status = 'pending'",
                         [notification["id"], now, *delivery_ids]).fetchone()[0]
        if n != len(delivery_ids):
            raise Store._LostRace()
        conn.execute(
            "INSERT INTO notifications (id, policy, receiver, group_key, status, body, n_alerts, is_meta,"
            " next_attempt_at, created_at, updated_at) VALUES (?, ?, ?, ?, 'pending', ?, ?, ?, ?, ?, ?)",
            [notification["id"], notification["policy"], notification["receiver"],
             notification["group_key"], notification["body"], notification["n_alerts"],
             notification["is_meta"], now, now, now])

    def due_notifications(self, now: datetime) -> list[dict[str, Any]]:
        """Pending notifications whose next attempt is due and that no live lease holds."""
        return self.query(
            "SELECT id, policy, receiver, attempts, next_attempt_at, created_at FROM notifications "
            "WHERE status = 'pending' AND next_attempt_at <= ? AND (lease_owner IS NULL OR "
            "lease_expires_at <= ?) ORDER BY next_attempt_at, created_at, id", [now, now])

    def claim_notification(self, notification_id: str, owner: str, *, now: datetime,
                           lease_s: float) -> dict[str, Any] | None:
        """Lease one due notification (compare-and-set; attempts += 1) and return it.

        A lease left by a process that died is taken over, and the attempt it was making is
        recorded as `lease_expired` (a crash may have sent it: the receiver can de-duplicate
        on the webhook-id, which stays the same).
        """
        try:
            with self.transaction() as conn:
                self._lease_notification(conn, notification_id, owner, now, lease_s)
        except Store._LostRace:
            return None
        rows = self.query("SELECT * FROM notifications WHERE id = ?", [notification_id])
        return rows[0] if rows else None

    def _lease_notification(self, conn: duckdb.DuckDBPyConnection, notification_id: str, owner: str,
                            now: datetime, lease_s: float) -> None:
        row = conn.execute(
            "SELECT attempts, lease_owner, lease_expires_at, policy, receiver FROM notifications "
            "WHERE id = ? AND status = 'pending' AND next_attempt_at <= ? AND "
            "(lease_owner IS NULL OR lease_expires_at <= ?)", [notification_id, now, now]).fetchone()
        if row is None:
            raise Store._LostRace()
        attempts, previous, expired_at, policy, receiver = row
        if previous is not None:
            conn.execute(
                "INSERT INTO delivery_attempts (notification_id, policy, receiver, attempt, started_at,"
                " outcome, error) VALUES (?, ?, ?, ?, ?, 'lease_expired', ?)",
                [notification_id, policy, receiver, attempts, expired_at,
                 f"lease of {previous} expired during attempt {attempts} (the process died?); "
                 "the message may have been sent"])
        n = conn.execute(
            "UPDATE notifications SET attempts = attempts + 1, lease_owner = ?, lease_expires_at = ?, "
            "updated_at = ? WHERE id = ? AND attempts = ? AND status = 'pending'",
            [owner, now + timedelta(seconds=lease_s), now, notification_id, attempts]).fetchone()[0]
        if n != 1:
            raise Store._LostRace()

    def finish_notification(self, notification_id: str, owner: str, *, status: str,
                            attempt: Mapping[str, Any], now: datetime,
                            next_attempt_at: datetime | None = None, error: str | None = None,
                            endpoint: Mapping[str, Any] | None = None,
                            meta_alert: Mapping[str, Any] | None = None) -> bool:
        """Record one attempt and its consequences in one transaction (only if `owner` holds the lease).

        status: pending (retry at `next_attempt_at`), delivered, or dead (`error` is the reason).
        endpoint: {disabled_reason} or {blocked_until} to store for the receiver.
        meta_alert: an alert (with deliveries) telling the operator, written atomically.
        """
        with self.transaction() as conn:
            row = conn.execute("SELECT policy, receiver, attempts FROM notifications WHERE id = ? AND "
                               "lease_owner = ?", [notification_id, owner]).fetchone()
            if row is None:
                return False
            policy, receiver, attempts = row
            conn.execute(
                "INSERT INTO delivery_attempts (notification_id, policy, receiver, attempt, started_at, "
                "outcome, status_code, error, retry_after_s, next_attempt_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [notification_id, policy, receiver, attempts, attempt["started_at"], attempt["outcome"],
                 attempt.get("status_code"), attempt.get("error"), attempt.get("retry_after_s"),
                 next_attempt_at])
            if status == "pending":
                conn.execute("UPDATE notifications SET status = 'pending', lease_owner = NULL, "
                             "lease_expires_at = NULL, next_attempt_at = ?, last_error = ?, updated_at = ? "
                             "WHERE id = ?", [next_attempt_at, error, now, notification_id])
            elif status == "delivered":
                conn.execute("UPDATE notifications SET status = 'delivered', lease_owner = NULL, "
                             "lease_expires_at = NULL, delivered_at = ?, updated_at = ? WHERE id = ?",
                             [now, now, notification_id])
                conn.execute("UPDATE deliveries SET status = 'delivered', updated_at = ? "
                             "WHERE notification_id = ?", [now, notification_id])
            elif status == "dead":
                conn.execute("UPDATE notifications SET status = 'dead', lease_owner = NULL, "
                             "lease_expires_at = NULL, last_error = ?, dead_reason = ?, updated_at = ? "
                             "WHERE id = ?", [error, error, now, notification_id])
                conn.execute("UPDATE deliveries SET status = 'dead', reason = ?, updated_at = ? "
                             "WHERE notification_id = ?", [error, now, notification_id])
            else:
                raise StoreError(f"unknown notification status {status!r}")
            if endpoint is not None:
                self._put_endpoint(conn, policy, receiver, endpoint, now)
            if meta_alert is not None:
                self._insert_alert(conn, meta_alert, None, now)
        self.checkpoint()
        return True

    def kill_notifications(self, policy: str, receiver: str, *, reason: str, now: datetime,
                           meta_alert: Mapping[str, Any] | None = None) -> list[str]:
        """Dead-letter every pending notification of a receiver (e.g. it was disabled)."""
        with self.transaction() as conn:
            ids = [r[0] for r in conn.execute(
                "SELECT id FROM notifications WHERE policy = ? AND receiver = ? AND status = 'pending' "
                "AND (lease_owner IS NULL OR lease_expires_at <= ?)", [policy, receiver, now]).fetchall()]
            for nid in ids:
                conn.execute("UPDATE notifications SET status = 'dead', dead_reason = ?, last_error = ?, "
                             "lease_owner = NULL, lease_expires_at = NULL, updated_at = ? WHERE id = ?",
                             [reason, reason, now, nid])
                conn.execute("UPDATE deliveries SET status = 'dead', reason = ?, updated_at = ? "
                             "WHERE notification_id = ?", [reason, now, nid])
            if meta_alert is not None and ids:
                self._insert_alert(conn, meta_alert, None, now)
        return ids

    def silence_notification(self, notification_id: str, *, silence_id: str, now: datetime) -> bool:
        """A pending notification all of whose alerts are silenced now is never sent."""
        with self.transaction() as conn:
            n = conn.execute("UPDATE notifications SET status = 'silenced', updated_at = ?, last_error = ? "
                             "WHERE id = ? AND status = 'pending' AND (lease_owner IS NULL OR "
                             "lease_expires_at <= ?)", [now, f"silenced by {silence_id}", notification_id,
                                                        now]).fetchone()[0]
            if n == 1:
                conn.execute("UPDATE deliveries SET status = 'silenced', silence_id = ?, updated_at = ? "
                             "WHERE notification_id = ?", [silence_id, now, notification_id])
        return n == 1

    def notification(self, notification_id: str) -> dict[str, Any] | None:
        """One notification row (body decoded), or None."""
        rows = self.query("SELECT * FROM notifications WHERE id = ?", [notification_id])
        if not rows:
            return None
        row = dict(rows[0])
        row["body"] = json.loads(row["body"])
        return row

    def notifications(self, *, status: str | None = None) -> list[dict[str, Any]]:
        """Notification rows (body left as JSON text), oldest first."""
        where, params = ("WHERE status = ?", [status]) if status else ("", [])
        return self.query(f"SELECT * FROM notifications {where} ORDER BY created_at, id", params)

    def attempt_times(self, policy: str, receiver: str, *, since: datetime) -> list[datetime]:
        """Start times of sends through a receiver since `since` (the rate limit counts these)."""
        rows = self.conn.execute(
            "SELECT started_at FROM delivery_attempts WHERE policy = ? AND receiver = ? AND started_at > ? "
            "AND outcome != 'lease_expired' ORDER BY started_at", [policy, receiver, since]).fetchall()
        return [r[0] for r in rows]

    def delivery_attempts(self, notification_id: str | None = None) -> list[dict[str, Any]]:
        """Every recorded attempt (of one notification), oldest first."""
        where, params = ("WHERE notification_id = ?", [notification_id]) if notification_id else ("", [])
        return self.query(f"SELECT * FROM delivery_attempts {where} ORDER BY id", params)

    # endpoints (per policy receiver): disabled on 410, blocked while throttled
    def _put_endpoint(self, conn: duckdb.DuckDBPyConnection, policy: str, receiver: str,
                      change: Mapping[str, Any], now: datetime) -> None:
        conn.execute("INSERT INTO endpoints (policy, receiver, updated_at) VALUES (?, ?, ?) "
                     "ON CONFLICT (policy, receiver) DO NOTHING", [policy, receiver, now])
        if "disabled_reason" in change:
            reason = change["disabled_reason"]
            conn.execute("UPDATE endpoints SET disabled_at = ?, disabled_reason = ?, updated_at = ? "
                         "WHERE policy = ? AND receiver = ?",
                         [now if reason is not None else None, reason, now, policy, receiver])
        if "blocked_until" in change:
            conn.execute("UPDATE endpoints SET blocked_until = ?, updated_at = ? WHERE policy = ? AND "
                         "receiver = ?", [change["blocked_until"], now, policy, receiver])

    def endpoint(self, policy: str, receiver: str) -> dict[str, Any] | None:
        """Disabled/blocked state of a receiver, or None when nothing was ever recorded."""
        rows = self.query("SELECT * FROM endpoints WHERE policy = ? AND receiver = ?", [policy, receiver])
        return rows[0] if rows else None

    def enable_endpoint(self, policy: str, receiver: str, *, now: datetime) -> bool:
        """Clear a receiver's disabled mark (after the operator fixed it); True if it was disabled."""
        with self.transaction() as conn:
            n = conn.execute("UPDATE endpoints SET disabled_at = NULL, disabled_reason = NULL, "
                             "blocked_until = NULL, updated_at = ? WHERE policy = ? AND receiver = ? "
                             "AND disabled_at IS NOT NULL", [now, policy, receiver]).fetchone()[0]
        return n == 1

    # silences
    def add_silence(self, silence: Mapping[str, Any]) -> str:
        """Store a silence (matchers as strings) and return its id."""
        with self.transaction() as conn:
            conn.execute("INSERT INTO silences (id, matchers, starts_at, ends_at, comment, created_by, "
                         "created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                         [silence["id"], json.dumps(list(silence["matchers"])), silence["starts_at"],
                          silence["ends_at"], silence["comment"], silence["created_by"],
                          silence["created_at"]])
        return str(silence["id"])

    def silences(self, *, active_at: datetime | None = None) -> list[dict[str, Any]]:
        """Silences (matchers decoded), newest first; `active_at` keeps those active then."""
        where, params = "", []
        if active_at is not None:
            where = ("WHERE starts_at <= ? AND ends_at > ? AND (expired_at IS NULL OR expired_at > ?)")
            params = [active_at, active_at, active_at]
        rows = self.query(f"SELECT * FROM silences {where} ORDER BY created_at DESC, id", params)
        for r in rows:
            r["matchers"] = json.loads(r["matchers"])
        return rows

    def expire_silence(self, silence_id: str, *, now: datetime) -> bool:
        """End a silence now; False when no unexpired silence has that id."""
        with self.transaction() as conn:
            n = conn.execute("UPDATE silences SET expired_at = ? WHERE id = ? AND expired_at IS NULL "
                             "AND ends_at > ?", [now, silence_id, now]).fetchone()[0]
        return n == 1

    # reading alerts back (lstar alerts list|show|retry)
    def list_alerts(self, *, limit: int = 50, policy: str | None = None) -> list[dict[str, Any]]:
        """Newest alerts first, each with a `deliveries` summary [{receiver, status, reason}]."""
        where, params = ("WHERE a.policy = ?", [policy]) if policy else ("", [])
        rows = self.query(f"SELECT a.id, a.created_at, a.kind, a.policy, a.task, a.repo, a.commit_sha, "
                          f"a.state, a.status FROM alerts a {where} ORDER BY a.created_at DESC, a.id DESC "
                          f"LIMIT ?", [*params, limit])
        ids = [r["id"] for r in rows]
        if ids:
            marks = ", ".join("?" for _ in ids)
            per: dict[int, list[dict[str, Any]]] = {}
            for d in self.query(f"SELECT alert_id, receiver, status, reason, notification_id FROM deliveries "
                                f"WHERE alert_id IN ({marks}) ORDER BY id", ids):
                per.setdefault(d.pop("alert_id"), []).append(d)
            for r in rows:
                r["deliveries"] = per.get(r["id"], [])
        return rows

    def alert_detail(self, alert_id: int) -> dict[str, Any] | None:
        """One alert with its prediction, deliveries, notifications and every attempt."""
        found = self.query("SELECT id FROM alerts WHERE id = ?", [alert_id])
        if not found:
            return None
        alert = self.alerts_by_id([alert_id])[0]
        alert["deliveries"] = self.query("SELECT * FROM deliveries WHERE alert_id = ? ORDER BY id", [alert_id])
        ids = sorted({d["notification_id"] for d in alert["deliveries"] if d["notification_id"]})
        alert["notifications"] = []
        for nid in ids:
            n = self.query("SELECT id, receiver, status, attempts, next_attempt_at, last_error, dead_reason, "
                           "created_at, delivered_at FROM notifications WHERE id = ?", [nid])[0]
            n["attempts_log"] = self.delivery_attempts(nid)
            alert["notifications"].append(n)
        pred = self.query("SELECT * FROM predictions WHERE id = ?", [alert["prediction_id"]]) \
            if alert["prediction_id"] is not None else []
        alert["prediction"] = {**pred[0], "detail": json.loads(pred[0]["detail"])} if pred else None
        return alert

    def requeue_notifications(self, notification_ids: Sequence[str], *, now: datetime) -> list[str]:
        """Give dead notifications a fresh retry budget (`lstar alerts retry`); returns those changed."""
        done = []
        with self.transaction() as conn:
            for nid in notification_ids:
                n = conn.execute("UPDATE notifications SET status = 'pending', attempts = 0, next_attempt_at = ?,"
                                 " dead_reason = NULL, updated_at = ? WHERE id = ? AND status = 'dead'",
                                 [now, now, nid]).fetchone()[0]
                if n == 1:
                    conn.execute("UPDATE deliveries SET status = 'queued', reason = NULL, updated_at = ? "
                                 "WHERE notification_id = ?", [now, nid])
                    done.append(nid)
        return done

    # -- task labels and evaluation runs -------------------------------------------------------
    LABEL_COLUMNS = ("repo", "sha", "checkpoint", "family", "task", "metric", "value", "stderr", "n",
                     "source", "source_ref", "eval_run_id", "score_run_id", "details", "created_at")

    def record_labels(self, labels: Sequence[Mapping[str, Any]], *,
                      eval_run: Mapping[str, Any] | None = None, now: datetime | None = None) -> int:
        """Insert label rows (and the evaluation run they came from) in one transaction.

        A row whose (repo, sha, task, metric, source_ref) is already stored is skipped, so
        importing the same file twice adds nothing. Returns the number of rows inserted.
        """
        now = now or utcnow()
        inserted = 0
        with self.transaction() as conn:
            if eval_run is not None:
                conn.execute(
                    "INSERT INTO eval_runs (run_id, model_repo, model_sha, model_source, task, task_sha256, "
                    "n_items, item_limit, tokenizer_fingerprint, dtype, device, metrics, model, wall_s, "
                    "finished_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    [eval_run["run_id"], eval_run["model_repo"], eval_run["model_sha"],
                     eval_run["model_source"], eval_run["task"], eval_run["task_sha256"],
                     eval_run["n_items"], eval_run.get("item_limit"), eval_run["tokenizer_fingerprint"],
                     eval_run["dtype"], eval_run["device"], json.dumps(eval_run["metrics"], sort_keys=True),
                     json.dumps(eval_run["model"], sort_keys=True, default=str), eval_run["wall_s"],
                     eval_run.get("finished_at") or now])
            for row in labels:
                values = [row.get("sha") or "" if c == "sha" else
                          json.dumps(row.get("details") or {}, sort_keys=True, default=str) if c == "details" else
                          row.get("created_at") or now if c == "created_at" else row.get(c)
                          for c in self.LABEL_COLUMNS]
                inserted += conn.execute(
                    f"INSERT INTO labels ({', '.join(self.LABEL_COLUMNS)}) VALUES "
                    f"({', '.join('?' for _ in self.LABEL_COLUMNS)}) ON CONFLICT DO NOTHING", values).fetchone()[0]
        self.checkpoint()
        return inserted

    def labels(self, *, task: str | None = None, metric: str | None = None,
               repo: str | None = None) -> list[dict[str, Any]]:
        """Stored labels, oldest first, optionally of one task, metric or repo."""
        where, params = [], []
        for column, value in (("task", task), ("metric", metric), ("repo", repo)):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        sql = "SELECT * FROM labels" + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY id"
        rows = self.query(sql, params)
        for row in rows:
            row["details"] = json.loads(row["details"])
        return rows

    def eval_runs(self, *, model_repo: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        """Recent evaluation runs, newest first."""
        where, params = ("WHERE model_repo = ?", [model_repo]) if model_repo else ("", [])
        rows = self.query(f"SELECT * FROM eval_runs {where} ORDER BY finished_at DESC LIMIT ?",
                          [*params, limit])
        for row in rows:
            row["metrics"] = json.loads(row["metrics"])
            row["model"] = json.loads(row["model"])
        return rows

    def score_runs_for_checkpoint(self, repo: str, sha: str | None = None, *,
                                  corpus_sha256: str | None = None) -> list[dict[str, Any]]:
        """Score runs of a checkpoint (all commits of the repo when sha is None), newest first,
        with what joining labels needs: L*, its SE, raw CE, corpus, spec and model info."""
        where, params = ["model_repo = ?"], [repo]
        if sha:
            where.append("model_sha = ?")
            params.append(sha)
        if corpus_sha256:
            where.append("corpus_sha256 = ?")
            params.append(corpus_sha256)
        rows = self.query(
            "SELECT run_id, model_repo, model_sha, corpus_sha256, spec_version, window_len, stride, "
            "prefix_policy, lstar, se_ce, ce, model, finished_at FROM score_runs WHERE "
            + " AND ".join(where) + " ORDER BY finished_at DESC, run_id DESC", params)
        for row in rows:
            row["model"] = json.loads(row["model"])
        return rows

    def score_run(self, run_id: str) -> dict[str, Any] | None:
        """One score run by id, or None."""
        rows = self.query("SELECT * FROM score_runs WHERE run_id = ?", [run_id])
        return rows[0] if rows else None

    # -- daemon: operator alerts and status counts ---------------------------------------------
    def raise_operator_alerts(self, alerts: Sequence[Mapping[str, Any]], *, now: datetime,
                              hub_outage_id: int | None = None) -> int:
        """Insert operator alerts (meta-alerts with deliveries) in one transaction.

        With `hub_outage_id`, the outage is marked alerted in the same transaction
        (compare-and-set), and nothing is written if it already was: one meta-alert per
        outage however often the daemon restarts. Returns the deliveries written.
        """
        written = 0
        with self.transaction() as conn:
            if hub_outage_id is not None:
                n = conn.execute("UPDATE hub_outages SET alerted_at = ? WHERE id = ? AND alerted_at IS NULL",
                                 [now, hub_outage_id]).fetchone()[0]
                if n != 1:
                    return 0
            for alert in alerts:
                written += self._insert_alert(conn, alert, None, now)
        return written

    def checkpoint_counts(self) -> dict[str, int]:
        """How many checkpoint rows are in each status."""
        rows = self.query("SELECT status, count(*) AS n FROM checkpoints GROUP BY status ORDER BY status")
        return {r["status"]: int(r["n"]) for r in rows}

    # -- governance reports ---------------------------------------------------------------------
    def report_score_runs(self, corpus_sha256: str | None) -> list[dict[str, Any]]:
        """Score runs (on one corpus, or all), oldest first, with their checkpoint's lineage,
        rule, refs and discovery time (JSON columns decoded)."""
        where, params = ("WHERE r.corpus_sha256 = ?", [corpus_sha256]) if corpus_sha256 else ("", [])
        rows = self.query(
            "SELECT r.run_id, r.model_repo AS repo, r.model_sha AS commit_sha, r.tokenizer_fingerprint, "
            "r.corpus_sha256, r.n_tokens, r.ce, r.ce_unigram, r.lstar, r.se_ce, r.bits_per_byte, r.tcb, "
            "r.finished_at, coalesce(c.lineage, r.model_repo) AS lineage, c.rule, c.refs, c.discovered_at "
            "FROM score_runs r LEFT JOIN checkpoints c ON (c.id = r.checkpoint_id) OR "
            "(r.checkpoint_id IS NULL AND c.repo = r.model_repo AND c.sha = r.model_sha) "
            f"{where} ORDER BY r.finished_at, r.run_id", params)
        for row in rows:
            row["tcb"] = json.loads(row["tcb"]) if row["tcb"] else None
            row["refs"] = json.loads(row["refs"]) if row["refs"] else []
        return rows

    def report_predictions(self, policy: str) -> list[dict[str, Any]]:
        """Every prediction of a policy, oldest first (detail decoded)."""
        rows = self.query("SELECT * FROM predictions WHERE policy = ? ORDER BY evaluated_at, id", [policy])
        for row in rows:
            row["detail"] = json.loads(row["detail"])
        return rows

    def last_report(self, policy: str, name: str) -> dict[str, Any] | None:
        """The newest recorded report of (policy, report name), or None."""
        rows = self.query("SELECT * FROM reports WHERE policy = ? AND name = ? "
                          "ORDER BY period_end DESC, id DESC LIMIT 1", [policy, name])
        return rows[0] if rows else None

    def record_report(self, report: Mapping[str, Any]) -> int | None:
        """Record a written report; None when (policy, name, period_end) is already recorded."""
        with self.transaction() as conn:
            row = conn.execute(
                "INSERT INTO reports (policy, name, period_start, period_end, folder, summary, deliveries, "
                "created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING RETURNING id",
                [report["policy"], report["name"], report["period_start"], report["period_end"],
                 report["folder"], json.dumps(report["summary"], sort_keys=True, default=str),
                 json.dumps(report["deliveries"], sort_keys=True, default=str),
                 report["created_at"]]).fetchone()
        return int(row[0]) if row else None

    def set_report_deliveries(self, report_id: int, deliveries: Sequence[Mapping[str, Any]]) -> None:
        """Store how the delivery of a recorded report went."""
        with self.transaction() as conn:
            conn.execute("UPDATE reports SET deliveries = ? WHERE id = ?",
                         [json.dumps(list(deliveries), sort_keys=True, default=str), report_id])

    def reports(self, *, policy: str | None = None, limit: int = 50) -> list[dict[str, Any]]:
        """Recorded reports, newest first (summary and deliveries decoded)."""
        where, params = ("WHERE policy = ?", [policy]) if policy else ("", [])
        rows = self.query(f"SELECT * FROM reports {where} ORDER BY period_end DESC, id DESC LIMIT ?",
                          [*params, limit])
        for row in rows:
            row["summary"] = json.loads(row["summary"])
            row["deliveries"] = json.loads(row["deliveries"])
        return rows

    # -- retention: log rows that grow with time ------------------------------------------------
    def prune_logs(self, cutoff: datetime) -> dict[str, int]:
        """Delete log rows older than `cutoff` that nothing reads any more, in one transaction;
        returns the rows deleted per table.

        - hub_polls: polls before the cutoff, except each rule's newest one;
        - delivery_attempts: every attempt of a notification delivered (or silenced) before the
          cutoff; attempts of pending or dead-lettered notifications stay, they explain an
          undelivered alert;
        - hub_outages: outages that ended before the cutoff and whose meta-alert was raised; an
          open or not yet alerted outage stays.

        Watermarks, checkpoints, scores, labels, predictions, alerts, deliveries and
        notifications are state (de-duplication, repeat intervals, provenance): never pruned.
        """
        with self.transaction() as conn:
            polls = conn.execute(
                "DELETE FROM hub_polls WHERE polled_at < ? AND id NOT IN "
                "(SELECT max(id) FROM hub_polls GROUP BY rule_key)", [cutoff]).fetchone()[0]
            attempts = conn.execute(
                "DELETE FROM delivery_attempts WHERE notification_id IN (SELECT id FROM notifications "
                "WHERE (status = 'delivered' AND delivered_at < ?) OR (status = 'silenced' AND updated_at < ?))",
                [cutoff, cutoff]).fetchone()[0]
            outages = conn.execute(
                "DELETE FROM hub_outages WHERE ended_at IS NOT NULL AND ended_at < ? AND alerted_at IS NOT NULL",
                [cutoff]).fetchone()[0]
        return {"hub_polls": int(polls), "delivery_attempts": int(attempts), "hub_outages": int(outages)}
