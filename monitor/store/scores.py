"""Score rows: corpora, tokenizers, unigram baselines, score runs and their documents."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import duckdb

from monitor.errors import StoreError
from monitor.store.connection import StoreConnection, utcnow
from monitor.store.evaluation_queue import enqueue_evaluation
from monitor.store.rows import (AXIS_COLUMNS, CheckpointRow, CheckpointScoreRow, ScoreDocumentRow,
                                ScoredRunRef, ScoreRunRow)


def _derived_axis_columns(run: Mapping[str, Any]) -> dict[str, Any]:
    """The axis columns a run row may lack (one written by code that predates them): L* per
    byte and the SEs of L_rel and L_gain follow exactly from the other columns; the bootstrap
    SEs of bits/byte and L* per byte cannot, and stay NULL."""
    uni, se_ce = run.get("ce_unigram"), run.get("se_ce")
    rel = se_ce / uni if se_ce is not None and uni else None
    return {"lstar_per_byte": run["lstar"] * run["tokens_per_byte"] / math.log(2),
            "se_bits_per_byte": None, "se_lstar_per_byte": None, "se_l_rel": rel, "se_l_gain": rel}


# Rows one INSERT of score_documents carries (six parameters each).
DOCUMENT_ROWS_PER_INSERT = 500


def insert_document_rows(conn: duckdb.DuckDBPyConnection, rows: Sequence[Sequence[Any]]) -> None:
    """INSERT `rows` (run_id, doc_id, slice, n_tokens, nll, n_bytes) into score_documents, in
    their order, a few hundred rows a statement. DuckDB's `executemany` runs one statement per
    row: 40 ms of CPU for a score of 50 documents, against 7 ms as one statement of 50 rows
    (`tests/test_score_document_rows.py` checks the rows, their values and their order are the
    same, and that a score of no documents is refused as before)."""
    if not rows:   # executemany refuses an empty list: a score of no documents stays an error
        conn.executemany("INSERT INTO score_documents VALUES (?, ?, ?, ?, ?, ?)", rows)
    # executemany checked each row's length; flattened, a row of 7 beside a row of 5 would
    # shift values across columns instead of failing.
    wrong = next((i for i, row in enumerate(rows) if len(row) != 6), None)
    if wrong is not None:
        raise StoreError(f"document row {wrong} of the score has {len(rows[wrong])} values, not 6 "
                         "(run_id, doc_id, slice, n_tokens, nll, n_bytes): nothing of the score was written")
    for start in range(0, len(rows), DOCUMENT_ROWS_PER_INSERT):
        chunk = rows[start:start + DOCUMENT_ROWS_PER_INSERT]
        conn.execute("INSERT INTO score_documents VALUES " + ", ".join(["(?, ?, ?, ?, ?, ?)"] * len(chunk)),
                     [value for row in chunk for value in row])


class ScoreRows(StoreConnection):
    """Score rows: corpora, tokenizers, unigram baselines, score runs and their documents."""

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
            self.insert_baseline(conn, fingerprint, corpus_sha256, baseline)

    def insert_baseline(self, conn: duckdb.DuckDBPyConnection, fingerprint: str, corpus_sha256: str,
                        baseline: Mapping[str, Any]) -> None:
        """`put_baseline` inside a transaction the caller holds (a worker's baseline is
        written with its score run)."""
        conn.execute(
            "INSERT INTO baselines VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
            [fingerprint, corpus_sha256, int(baseline["n_tokens"]),
             float(baseline["ce_unigram"]), json.dumps(baseline["slices"], sort_keys=True),
             json.dumps(baseline["doc_tokens"], sort_keys=True), utcnow()])

    def baselines_for_corpus(self, corpus_sha256: str) -> list[tuple[str, str, dict[str, Any]]]:
        """Every cached baseline of one corpus selection, as (tokenizer fingerprint, corpus
        sha256, baseline): what a scoring job carries so its worker need not compute one."""
        rows = self.query("SELECT tokenizer_fingerprint FROM baselines WHERE corpus_sha256 = ? "
                          "ORDER BY tokenizer_fingerprint", [corpus_sha256])
        out = []
        for row in rows:
            baseline = self.get_baseline(row["tokenizer_fingerprint"], corpus_sha256)
            if baseline is not None:
                out.append((row["tokenizer_fingerprint"], corpus_sha256, baseline))
        return out

    # -- score runs ----------------------------------------------------------------------
    SCORE_RUN_COLUMNS = (
        "run_id", "checkpoint_id", "model_repo", "model_sha", "model_source",
        "tokenizer_fingerprint", "corpus_sha256", "spec_version", "window_len", "stride",
        "prefix_policy", "dtype", "device", "n_tokens", "n_bytes", "nll_sum", "ce", "ce_unigram",
        "lstar", "l_rel", "l_gain", "bits_per_byte", "tokens_per_byte", "se_ce", "weighted_ppl",
        "reference_fingerprint", "slices", "tcb", "spec", "model", "library_versions", "wall_s",
        "tokens_per_s", "finished_at", *AXIS_COLUMNS)
    # Columns a run row may leave out (rows made before sequential scoring): their defaults.
    OPTIONAL_COLUMNS = {"partial": False, "sequential": None}
    _JSON_COLUMNS = frozenset({"slices", "tcb", "spec", "model", "library_versions", "sequential"})

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
        missing = [c for c in self.SCORE_RUN_COLUMNS if c not in run and c not in AXIS_COLUMNS]
        if missing:
            raise StoreError(f"score run is missing columns: {', '.join(missing)}")
        run = {**self.OPTIONAL_COLUMNS, **_derived_axis_columns(run), **run}
        columns = (*self.SCORE_RUN_COLUMNS, *self.OPTIONAL_COLUMNS)
        values = [json.dumps(run[c], sort_keys=True) if c in self._JSON_COLUMNS and run[c] is not None
                  else run[c] for c in columns]
        placeholders = ", ".join("?" for _ in columns)
        self.upsert_corpus(conn, corpus)
        self.upsert_tokenizer(conn, tokenizer)
        conn.execute(f"INSERT INTO score_runs ({', '.join(columns)}) "
                     f"VALUES ({placeholders})", values)
        insert_document_rows(conn, [[run["run_id"], *doc] for doc in documents])
        enqueue_evaluation(conn, str(run["run_id"]), str(run["corpus_sha256"]), utcnow())

    def score_runs(self, *, model_repo: str | None = None, limit: int = 100) -> list[ScoreRunRow]:
        """Recent score runs, newest first."""
        where, params = ("WHERE model_repo = ?", [model_repo]) if model_repo else ("", [])
        rows = self.query(f"SELECT * FROM score_runs {where} ORDER BY finished_at DESC LIMIT ?",
                          [*params, limit])
        return [ScoreRunRow.from_row(r) for r in rows]

    def score_documents(self, run_id: str) -> list[ScoreDocumentRow]:
        """Per-document rows of one run, in corpus order of insertion."""
        rows = self.query("SELECT doc_id, slice, n_tokens, nll, n_bytes FROM score_documents "
                          "WHERE run_id = ? ORDER BY rowid", [run_id])
        return [ScoreDocumentRow.from_row(r) for r in rows]

    def score_runs_for_checkpoint(self, repo: str, sha: str | None = None, *,
                                  corpus_sha256: str | None = None,
                                  include_partial: bool = False) -> list[CheckpointScoreRow]:
        """Score runs of a checkpoint (all commits of the repo when sha is None), newest first,
        with what joining labels needs: L*, its SE, raw CE, corpus, spec and model info.
        Partial (sequential) scores only with `include_partial`: curves are fitted on
        complete scores unless asked."""
        where, params = ["model_repo = ?"], [repo]
        if not include_partial:
            where.append("NOT partial")
        if sha:
            where.append("model_sha = ?")
            params.append(sha)
        if corpus_sha256:
            where.append("corpus_sha256 = ?")
            params.append(corpus_sha256)
        rows = self.query_json(
            "SELECT run_id, model_repo, model_sha, corpus_sha256, spec_version, window_len, stride, "
            "prefix_policy, lstar, se_ce, ce, model, finished_at, ce_unigram, l_rel, l_gain, bits_per_byte, "
            "tokens_per_byte, " + ", ".join(AXIS_COLUMNS) + ", partial FROM score_runs WHERE "
            + " AND ".join(where) + " ORDER BY finished_at DESC, run_id DESC", params, ("model",))
        return [CheckpointScoreRow.from_row(r) for r in rows]

    def partial_score_run(self, *, model_repo: str, model_sha: str, corpus_sha256: str,
                          tokenizer_fingerprint: str, spec: Mapping[str, Any]) -> ScoreRunRow | None:
        """The newest partial score of this checkpoint on this corpus selection, tokenizer and
        scoring spec (window, stride, prefix, dtype, device): what a later score continues
        from. None when there is none."""
        rows = self.query(
            "SELECT * FROM score_runs WHERE partial AND model_repo = ? AND model_sha = ? AND "
            "corpus_sha256 = ? AND tokenizer_fingerprint = ? AND spec_version = ? AND window_len = ? "
            "AND stride = ? AND prefix_policy = ? AND dtype = ? AND device = ? "
            "ORDER BY finished_at DESC, run_id DESC LIMIT 1",
            [model_repo, model_sha, corpus_sha256, tokenizer_fingerprint, spec["version"],
             spec["window"], spec["stride"], spec["prefix"], spec["dtype"], spec["device"]])
        return ScoreRunRow.from_row(rows[0]) if rows else None

    def score_run(self, run_id: str) -> ScoreRunRow | None:
        """One score run by id, or None."""
        rows = self.query("SELECT * FROM score_runs WHERE run_id = ?", [run_id])
        return ScoreRunRow.from_row(rows[0]) if rows else None

    # -- identical weights ---------------------------------------------------------------
    def insert_score_digest(self, conn: duckdb.DuckDBPyConnection, run_id: str, checkpoint_id: int | None,
                            key: Mapping[str, str], *, linked_from_run_id: str | None = None,
                            linked_from_checkpoint_id: int | None = None) -> None:
        """Record what a run measured (`key`: weights_digest, files_digest, request_digest,
        corpus_sha256), inside the transaction that writes the run."""
        conn.execute("INSERT INTO score_digests VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                     [run_id, checkpoint_id, key["weights_digest"], key["files_digest"], key["request_digest"],
                      key["corpus_sha256"], linked_from_run_id, linked_from_checkpoint_id, utcnow()])

    def scored_run_with(self, key: Mapping[str, str]) -> ScoredRunRef | None:
        """The first complete run (not itself a link) that measured exactly `key`, or None.

        A partial (sequential) run is never reused: it stopped once the tasks watching *its*
        repo were settled, which says nothing of the tasks watching another."""
        rows = self.query(
            "SELECT d.run_id, d.checkpoint_id FROM score_digests d JOIN score_runs r ON r.run_id = d.run_id "
            "WHERE d.weights_digest = ? AND d.files_digest = ? AND d.request_digest = ? AND d.corpus_sha256 = ? "
            "AND d.linked_from_run_id IS NULL AND NOT r.partial ORDER BY r.finished_at, d.run_id LIMIT 1",
            [key["weights_digest"], key["files_digest"], key["request_digest"], key["corpus_sha256"]])
        return ScoredRunRef.from_row(rows[0]) if rows else None

    def link_score_run(self, conn: duckdb.DuckDBPyConnection, source: ScoredRunRef, *, run_id: str,
                       checkpoint: CheckpointRow, key: Mapping[str, str], now: datetime) -> None:
        """Record `checkpoint`'s score as a copy of run `source` (same weights, files, options and
        corpus), inside a transaction the caller holds: the run row with this checkpoint's repo
        and sha, its per-document rows, and the link naming the source."""
        src = source.run_id
        row = conn.execute("SELECT model FROM score_runs WHERE run_id = ?", [src]).fetchone()
        if row is None:
            raise StoreError(f"score run {src} to link to is missing")
        model = {**json.loads(row[0]), "repo": checkpoint.repo, "sha": checkpoint.sha,
                 "linked_from": {"run_id": src, "checkpoint_id": source.checkpoint_id}}
        columns = [c for c in (*self.SCORE_RUN_COLUMNS, *self.OPTIONAL_COLUMNS)
                   if c not in ("run_id", "checkpoint_id", "model_repo", "model_sha", "model", "finished_at")]
        conn.execute(
            f"INSERT INTO score_runs (run_id, checkpoint_id, model_repo, model_sha, model, finished_at, "
            f"{', '.join(columns)}) SELECT ?, ?, ?, ?, ?, ?, {', '.join(columns)} FROM score_runs WHERE run_id = ?",
            [run_id, checkpoint.id, checkpoint.repo, checkpoint.sha, json.dumps(model, sort_keys=True),
             now, src])
        conn.execute("INSERT INTO score_documents SELECT ?, doc_id, slice, n_tokens, nll, n_bytes "
                     "FROM score_documents WHERE run_id = ? ORDER BY rowid", [run_id, src])
        self.insert_score_digest(conn, run_id, checkpoint.id, key, linked_from_run_id=src,
                                 linked_from_checkpoint_id=source.checkpoint_id)
        enqueue_evaluation(conn, run_id, key["corpus_sha256"], now)
