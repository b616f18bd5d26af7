"""Score-run rows for tests of what happens after scoring (predictions, alerts, reports).

`record_fake_score` writes a `score_runs` row with a chosen L* and SE through the real
`Store.record_score_run`, so code downstream of the engine can be tested without a model.
"""

from __future__ import annotations

import hashlib
from datetime import datetime
from typing import Any

from monitor.store import Store

CALIB_V0_SHA256 = "9f269a7db0b131d819be2e51974914a3cf715cc388cceb82885f7a5a21e644d8"
CALIB_V0_ALT_SHA256 = "42eba56a92409f2fbaaf1689f6772b3bda630d41ef2ead6f8d195a104253dd3a"
TEST_SPEC = {"spec_version": "lstar-score/1", "window_len": 128, "stride": 64, "prefix_policy": "bos"}


def fake_sha(text: str) -> str:
    """A 40-hex commit sha derived from `text`."""
    return hashlib.sha1(text.encode()).hexdigest()


def record_fake_score(store: Store, *, repo: str, sha: str, lstar: float, se: float,
                      finished_at: datetime, corpus_sha256: str = CALIB_V0_SHA256,
                      spec: dict[str, Any] | None = None, checkpoint_id: int | None = None,
                      columns: dict[str, Any] | None = None) -> str:
    """Write one score run (with a single stand-in document row) and return its run id.
    `columns` overrides or adds `score_runs` columns (another axis's value and SE, model info)."""
    spec = {**TEST_SPEC, **(spec or {})}
    ce_unigram = 7.0
    run_id = hashlib.sha256(f"{repo}@{sha}:{corpus_sha256}:{finished_at.isoformat()}".encode()).hexdigest()[:32]
    run = {
        "run_id": run_id, "checkpoint_id": checkpoint_id, "model_repo": repo, "model_sha": sha,
        "model_source": "hub", "tokenizer_fingerprint": "f" * 64, "corpus_sha256": corpus_sha256,
        "spec_version": spec["spec_version"], "window_len": spec["window_len"], "stride": spec["stride"],
        "prefix_policy": spec["prefix_policy"], "dtype": "float32", "device": "cpu",
        "n_tokens": 1000, "n_bytes": 4000, "nll_sum": (ce_unigram + lstar) * 1000,
        "ce": ce_unigram + lstar, "ce_unigram": ce_unigram, "lstar": lstar,
        "l_rel": (ce_unigram + lstar) / ce_unigram, "l_gain": -lstar / ce_unigram,
        "bits_per_byte": 1.0, "tokens_per_byte": 0.25, "se_ce": se, "weighted_ppl": None,
        "reference_fingerprint": None, "slices": {}, "tcb": None, "spec": spec,
        "model": {"repo": repo, "sha": sha}, "library_versions": {}, "wall_s": 1.0,
        "tokens_per_s": 1000.0, "finished_at": finished_at, **(columns or {}),
    }
    corpus = {"sha256": corpus_sha256, "name": "test", "version": "0", "parent_sha256": corpus_sha256,
              "selection": "all", "n_documents": 1, "n_bytes": 4000}
    tokenizer = {"fingerprint": "f" * 64, "source": "test", "vocab_size": 100, "prefix_policy": "bos",
                 "prefix_token_id": 0}
    documents = [("doc-0", "all", 1000, run["nll_sum"], 4000)]
    return store.record_score_run(run, documents, corpus, tokenizer)
