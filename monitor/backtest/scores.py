"""A history's checkpoint as a score run of the store: what the replay feeds the daemon's code.

The values come from the history (imported, not measured here), so each run is pinned to the
backtest's synthetic corpus and spec (`monitor.backtest.fit`), which its curves are pinned to
as well; a replay with given curves (`run_backtest(..., curves=...)`) pins the runs to those
curves' corpus and spec instead. The run's repo is the lineage's name (so the daemon's lineage, which falls back to the
repo, is the training run) and its commit a sha derived from (lineage, step). The columns of
the run's axis carry the history's value and standard error; a history without a unigram
baseline has none to give, so `ce_unigram` is 0 and the L* column holds the axis value where
the axis is not L* (documented in the alert numbers as the curve's `axis`/`value`, which is
what every state rests on). Where the history gives `raw_ce` or `lstar` themselves, those
columns carry them.
"""

from __future__ import annotations

import hashlib
import math
from datetime import datetime
from typing import Any

from monitor.backtest.history import step_text
from monitor.backtest.fit import BACKTEST_CORPUS_SHA256, BACKTEST_SPEC
from monitor.curves.artifact import ScoringRef
from monitor.curves.axes import get_axis
from monitor.curves.labels import Label
from monitor.store import Store



def spec_columns(spec: ScoringRef) -> dict[str, Any]:
    """A scoring spec as the `score_runs` columns that name it."""
    return {"spec_version": spec.spec_version, "window_len": spec.window, "stride": spec.stride,
            "prefix_policy": spec.prefix_policy}


SPEC = spec_columns(BACKTEST_SPEC)


def checkpoint_sha(lineage: str, step: float) -> str:
    """The synthetic 40-hex commit of a history checkpoint."""
    return hashlib.sha1(f"{lineage}@{step_text(step)}".encode("utf-8", "replace")).hexdigest()


def _num(value: float | None) -> float | None:
    return float(value) if value is not None and math.isfinite(value) else None


def _given(value: object, stand_in: float) -> float:
    """The history's value where it gives one (0.0 included), else the stand-in."""
    got = _num(value)
    return stand_in if got is None else got


def score_run_row(label: Label, *, axis: str, value: float, se: float, finished_at: datetime,
                  corpus_sha256: str = BACKTEST_CORPUS_SHA256,
                  scoring_spec: ScoringRef = BACKTEST_SPEC) -> dict[str, Any]:
    """The `score_runs` row of one history checkpoint on `axis` (value and SE as given), pinned
    to `corpus_sha256` and `scoring_spec` (the backtest's synthetic pair unless the replay runs
    with given curves, whose pair the history's values are then taken to be measured on)."""
    spec = spec_columns(scoring_spec)
    ax = get_axis(axis)
    lineage, step = str(label.lineage), float(label.step or 0.0)
    repo, sha = lineage, checkpoint_sha(lineage, step)
    run_id = hashlib.sha256(f"backtest:{repo}@{sha}:{finished_at.isoformat()}".encode("utf-8", "replace")
                            ).hexdigest()[:32]
    ce = _num(label.raw_ce)
    lstar = _num(label.lstar)
    if axis == "raw_ce":
        ce = value
    elif axis == "lstar":
        lstar = value
    if lstar is None:
        lstar = ce if ce is not None else value
    if ce is None:
        ce = lstar
    # A unigram baseline only where the history gives both CE and L*; the ratio columns (NOT NULL
    # in the store) are placeholders otherwise, never read unless the curve is on that axis.
    uni = ce - lstar if ce is not None and lstar is not None and ce > lstar else 0.0
    l_rel = ce / uni if uni > 0 else 1.0
    se_ce = se if axis in ("lstar", "raw_ce") else (label.lstar_se or 0.0)
    model = {"repo": repo, "sha": sha, "lineage": lineage, "step": step, "history": True}
    if label.params:
        model["n_params"] = float(label.params)
    if label.flops:
        model["flops"] = float(label.flops)
    run: dict[str, Any] = {
        "run_id": run_id, "checkpoint_id": None, "model_repo": repo, "model_sha": sha,
        "model_source": "history", "tokenizer_fingerprint": "0" * 64, "corpus_sha256": corpus_sha256,
        "spec_version": spec["spec_version"], "window_len": spec["window_len"], "stride": spec["stride"],
        "prefix_policy": spec["prefix_policy"], "dtype": "imported", "device": "none",
        "n_tokens": 1, "n_bytes": 1, "nll_sum": ce, "ce": ce, "ce_unigram": uni, "lstar": lstar,
        "l_rel": _given(label.l_rel, l_rel), "l_gain": _given(label.l_gain, 1.0 - l_rel),
        "bits_per_byte": _given(label.bits_per_byte, 0.0),
        "tokens_per_byte": 1.0, "se_ce": se_ce, "weighted_ppl": None, "reference_fingerprint": None,
        "slices": {}, "tcb": None, "spec": spec, "model": model, "library_versions": {}, "wall_s": 0.0,
        "tokens_per_s": 0.0, "finished_at": finished_at,
        "lstar_per_byte": None, "se_bits_per_byte": None, "se_lstar_per_byte": None, "se_l_rel": None,
        "se_l_gain": None,
    }
    if ax.score_column is not None and ax.score_column not in ("ce", "lstar"):
        run[ax.score_column] = value
    if ax.se_column is not None and ax.se_column != "se_ce":
        run[ax.se_column] = se
    return run


def record_history_score(store: Store, label: Label, *, axis: str, value: float, se: float,
                         finished_at: datetime, corpus_sha256: str = BACKTEST_CORPUS_SHA256,
                         scoring_spec: ScoringRef = BACKTEST_SPEC) -> str:
    """Write one history checkpoint as a score run through `Store.record_score_run`; its run id."""
    run = score_run_row(label, axis=axis, value=value, se=se, finished_at=finished_at,
                        corpus_sha256=corpus_sha256, scoring_spec=scoring_spec)
    corpus = {"sha256": corpus_sha256, "name": "backtest-history", "version": "1",
              "parent_sha256": corpus_sha256, "selection": "all", "n_documents": 1, "n_bytes": 1}
    tokenizer = {"fingerprint": "0" * 64, "source": "history", "vocab_size": 1, "prefix_policy": "none",
                 "prefix_token_id": None}
    documents = [("history", "all", 1, run["nll_sum"], 1)]
    return store.record_score_run(run, documents, corpus, tokenizer)


__all__ = ["SPEC", "checkpoint_sha", "record_history_score", "score_run_row", "spec_columns"]
