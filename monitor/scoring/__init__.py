"""Scoring: a pinned corpus, a tokenizer and a checkpoint in; L* and its variants out."""

from monitor.scoring.child import (ScoringInterrupted, default_memory_limit, kill_active_children,
                                   physical_memory, run_score_child)
from monitor.scoring.corpus import Corpus, load_corpus, manifest_sha256
from monitor.scoring.corpus_build import build_corpus
from monitor.scoring.engine import (DEFAULT_MODEL, ScoredRun, ScoreRequest, compute_score, prepare,
                                    score_checkpoint)
from monitor.scoring.loader import load_checkpoint
from monitor.scoring.tokenizer import TokenizerHandle, load_tokenizer

__all__ = ["Corpus", "DEFAULT_MODEL", "ScoreRequest", "ScoredRun", "ScoringInterrupted", "TokenizerHandle",
           "build_corpus", "compute_score", "default_memory_limit", "kill_active_children",
           "load_checkpoint", "load_corpus", "load_tokenizer", "manifest_sha256", "physical_memory",
           "prepare", "run_score_child", "score_checkpoint"]
