"""Scoring: a pinned corpus, a tokenizer and a checkpoint in; L* and its variants out."""

from __future__ import annotations

from typing import TYPE_CHECKING

from monitor.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from monitor.scoring.child import (ScoringInterrupted, default_memory_limit, kill_active_children,
                                       physical_memory, run_score_child)
    from monitor.scoring.corpus import Corpus, load_corpus, manifest_sha256
    from monitor.scoring.corpus_build import build_corpus
    from monitor.scoring.engine import (DEFAULT_MODEL, ScoredRun, ScoreRequest, compute_score, prepare,
                                        score_checkpoint)
    from monitor.scoring.loader import load_checkpoint
    from monitor.scoring.tokenizer import TokenizerHandle, load_tokenizer

# Re-exported lazily: importing the package (or one light module in it, which imports the
# package first) does not import every stage module and their libraries; a name loads its
# module when first used.
_EXPORTS = {  # name: the module that defines it, imported on first use
    "ScoringInterrupted": "monitor.scoring.child",
    "default_memory_limit": "monitor.scoring.child",
    "kill_active_children": "monitor.scoring.child",
    "physical_memory": "monitor.scoring.child",
    "run_score_child": "monitor.scoring.child",
    "Corpus": "monitor.scoring.corpus",
    "load_corpus": "monitor.scoring.corpus",
    "manifest_sha256": "monitor.scoring.corpus",
    "build_corpus": "monitor.scoring.corpus_build",
    "DEFAULT_MODEL": "monitor.scoring.engine",
    "ScoredRun": "monitor.scoring.engine",
    "ScoreRequest": "monitor.scoring.engine",
    "compute_score": "monitor.scoring.engine",
    "prepare": "monitor.scoring.engine",
    "score_checkpoint": "monitor.scoring.engine",
    "load_checkpoint": "monitor.scoring.loader",
    "TokenizerHandle": "monitor.scoring.tokenizer",
    "load_tokenizer": "monitor.scoring.tokenizer",
}


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)


__all__ = ["Corpus", "DEFAULT_MODEL", "ScoreRequest", "ScoredRun", "ScoringInterrupted", "TokenizerHandle",
           "build_corpus", "compute_score", "default_memory_limit", "kill_active_children",
           "load_checkpoint", "load_corpus", "load_tokenizer", "manifest_sha256", "physical_memory",
           "prepare", "run_score_child", "score_checkpoint"]
