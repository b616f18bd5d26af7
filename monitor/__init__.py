"""lstar-monitor: tokenizer-calibrated progress (L*) for new language-model releases."""

__version__ = "0.1.0"
SCORING_SPEC_VERSION = "lstar-score/1"
# The scoring window when --max-context is not given (a model with fewer positions uses its own).
DEFAULT_MAX_CONTEXT = 2048
