"""Process settings that must hold before transformers or huggingface_hub are imported.

Set here and only here; `lstar`, the scoring child and the loader call these.
"""

from __future__ import annotations

import os


def disable_safetensors_conversion() -> None:
    """Keep transformers from sending a repo (and its token) to the external safetensors
    conversion service and loading weights from the bot's PR ref (docs/reliability.md)."""
    os.environ["DISABLE_SAFETENSORS_CONVERSION"] = "1"


def harden_environment() -> None:
    """The settings every process that may touch the Hub or a model runs with."""
    disable_safetensors_conversion()
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
