"""Process settings that must hold before transformers or huggingface_hub are imported.

Set here and only here; `lstar`, the scoring child and the loader call these.
"""

from __future__ import annotations

import os
import sys


def disable_safetensors_conversion() -> None:
    """Keep transformers from sending a repo (and its token) to the external safetensors
    conversion service and loading weights from the bot's PR ref (docs/reliability.md)."""
    os.environ["DISABLE_SAFETENSORS_CONVERSION"] = "1"


def harden_environment() -> None:
    """The settings every process that may touch the Hub or a model runs with."""
    disable_safetensors_conversion()
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def quiet_hub_progress() -> None:
    """No huggingface_hub progress bars ("Fetching 1 files") in the daemon's output: it runs
    unattended, its log is read line by line, and download sizes are checked elsewhere (the
    byte caps count what arrives whether or not a bar is drawn)."""
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    if "huggingface_hub" in sys.modules:  # imported already: the variable was read at import
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
