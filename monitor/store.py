"""The DuckDB state file: schema, forward-only migrations, and all SQL.

One process writes the file; readers open it read-only. Every migration runs in one
transaction together with its record in `schema_migrations`, so a crash mid-migration
leaves the previous version intact. DDL happens only here, at start-up, and is followed by
a CHECKPOINT (a WAL holding DDL has failed to replay after unclean exits).
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
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
]


def utcnow() -> datetime:
    """Timezone-aware now in UTC (the only clock store code uses by default)."""
    return datetime.now(timezone.utc)


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
        """
        path = Path(path)
        if read_only and not path.exists():
            raise StoreError(f"no database at {path}",
                             hint="score something first, or run `lstar db migrate --db PATH`")
        if not read_only:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise StoreError(f"cannot create the folder for {path}: {exc.strerror}") from exc
        try:
            conn = duckdb.connect(str(path), read_only=read_only)
        except duckdb.IOException as exc:
            text = str(exc)
            if "lock" in text.lower():
                raise StoreError(
                    f"{path} is held by another process (the daemon?)",
                    hint="stop it, or use the read commands, which ask the running daemon") from exc
            raise StoreError(f"cannot open {path}: {text.splitlines()[0]}",
                             hint="if the WAL failed to replay, move the .duckdb and .wal files "
                                  "aside and restore from a backup; never delete the WAL") from exc
        except duckdb.Error as exc:
            raise StoreError(f"cannot open {path}: {str(exc).splitlines()[0]}") from exc
        store = cls(conn, path, read_only)
        if read_only:
            pending = store.pending_migrations()
            if pending:
                store.close()
                raise StoreError(f"{path} is at an older schema (pending: {', '.join(pending)})",
                                 hint="run `lstar db migrate` with no daemon running")
        elif migrate:
            store.migrate()
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
            self.conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations ("
                " name VARCHAR PRIMARY KEY, applied_at TIMESTAMPTZ NOT NULL)")
            applied = set(self.applied_migrations())
            done: list[str] = []
            for m in migrations:
                if m.name in applied:
                    continue
                with self.transaction() as conn:
                    conn.execute(m.sql)
                    conn.execute("INSERT INTO schema_migrations VALUES (?, ?)", [m.name, utcnow()])
                done.append(m.name)
            self.conn.execute("CHECKPOINT")
        return done

    def info(self) -> dict[str, Any]:
        """Schema version and row counts, for `lstar db info`."""
        tables = [r[0] for r in self.conn.execute(
            "SELECT table_name FROM information_schema.tables "
            "WHERE table_schema = 'main' ORDER BY table_name").fetchall()]
        counts = {t: self.conn.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0] for t in tables}
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
        missing = [c for c in self.SCORE_RUN_COLUMNS if c not in run]
        if missing:
            raise StoreError(f"score run is missing columns: {', '.join(missing)}")
        values = [json.dumps(run[c], sort_keys=True) if c in self._JSON_COLUMNS and run[c] is not None
                  else run[c] for c in self.SCORE_RUN_COLUMNS]
        placeholders = ", ".join("?" for _ in self.SCORE_RUN_COLUMNS)
        with self.transaction() as conn:
            self.upsert_corpus(conn, corpus)
            self.upsert_tokenizer(conn, tokenizer)
            conn.execute(f"INSERT INTO score_runs ({', '.join(self.SCORE_RUN_COLUMNS)}) "
                         f"VALUES ({placeholders})", values)
            conn.executemany("INSERT INTO score_documents VALUES (?, ?, ?, ?, ?, ?)",
                             [[run["run_id"], *doc] for doc in documents])
        self.checkpoint()
        return str(run["run_id"])

    def score_runs(self, *, model_repo: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        """Recent score runs, newest first."""
        where, params = ("WHERE model_repo = ?", [model_repo]) if model_repo else ("", [])
        return self.query(f"SELECT * FROM score_runs {where} ORDER BY finished_at DESC LIMIT ?",
                          [*params, limit])

    def score_documents(self, run_id: str) -> list[dict[str, Any]]:
        """Per-document rows of one run, in corpus order of insertion."""
        return self.query("SELECT doc_id, slice, n_tokens, nll, n_bytes FROM score_documents "
                          "WHERE run_id = ? ORDER BY rowid", [run_id])
