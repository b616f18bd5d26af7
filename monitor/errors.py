"""Domain errors, all in one place.

Every error carries a message that names the thing at fault (file, key, repo, document)
and, where one exists, how to fix it. `monitor.cli` is the only place these become exit
codes; library code raises, never exits.
"""

from __future__ import annotations


class LstarError(Exception):
    """Base class of every error the user can cause or fix."""

    exit_code = 2

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        self.message = message
        self.hint = hint
        super().__init__(message if hint is None else f"{message} ({hint})")

    def one_line(self) -> str:
        """The message as one line, hint included, for the CLI."""
        text = self.message if self.hint is None else f"{self.message}; {self.hint}"
        return " ".join(text.split())


class CorpusError(LstarError):
    """A corpus is missing, malformed, or does not match its manifest."""


class TokenizerError(LstarError):
    """A tokenizer is missing or unusable."""


class ModelLoadError(LstarError):
    """A checkpoint cannot be loaded (missing files, unknown architecture, ...)."""


class UnsafeCheckpointError(ModelLoadError):
    """A checkpoint was refused for safety (pickle weights, remote code, path escape)."""


class UnsupportedCheckpointError(ModelLoadError):
    """A checkpoint this installation cannot load, e.g. its quantization backend is not
    installed: the queue skips it with the reason instead of retrying."""


class SpecError(LstarError):
    """A scoring spec or flag combination is invalid (e.g. window longer than the model allows)."""


class StoreError(LstarError):
    """The DuckDB state file cannot be opened, migrated, or written."""

    exit_code = 3


class CursorError(LstarError):
    """A listing's `--cursor` (`?cursor=`) is not one this listing handed out."""


class HubError(LstarError):
    """The Hub answered with an error or could not be reached."""

    exit_code = 4


class GateRefusedError(LstarError):
    """A candidate checkpoint failed the safety or budget gate."""


class IntegrityError(LstarError):
    """A downloaded file's size or sha256 does not match what the Hub announced."""


class LabelError(LstarError):
    """Task labels are missing, malformed, or too few to fit."""


class CurveError(LstarError):
    """A curve cannot be fitted, loaded, or applied to a score."""


class PolicyError(LstarError):
    """A policy file is invalid."""


class DeliveryError(LstarError):
    """An alert could not be delivered."""


class CampaignError(LstarError):
    """A calibration campaign file is malformed, or one of its jobs cannot run."""


class LabError(LstarError):
    """A lab configuration, run folder or lab record (lab.json) that cannot be used."""


class ServiceError(LstarError):
    """The daemon cannot serve its local API (e.g. the port is already in use)."""
