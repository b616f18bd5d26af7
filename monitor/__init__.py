"""lstar-monitor: tokenizer-calibrated progress (L*) for new language-model releases."""

__version__ = "0.1.0"
SCORING_SPEC_VERSION = "lstar-score/1"
