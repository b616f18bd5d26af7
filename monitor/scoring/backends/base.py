"""What a scoring backend is handed and hands back: `ScoreJob`, `ScoreOutcome`, the protocol.

A job is everything a worker needs to score one checkpoint without the database: the
request (model folder, corpus, spec), the corpus selection's sha256 the daemon expects, the
unigram baselines the store has cached for that selection, and an estimate of the memory
the model needs (for placement). An outcome is the job and either the score's rows or the
error that stopped it. Both are plain JSON, so they cross a process or a cluster unchanged:
floats are written as their shortest repr, which reads back to the same float64.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from monitor import errors
from monitor.errors import LstarError
from monitor.scoring.child import (error_from_payload, request_from_json, request_to_json,
                                   scored_from_payload, scored_to_payload)
from monitor.scoring.engine import KnownBaseline, ScoredRun, ScoreRequest


@dataclass(frozen=True)
class ScoreJob:
    """One checkpoint to score, self-contained: a worker never opens the database."""

    checkpoint_id: int | None
    repo: str
    sha: str
    request: ScoreRequest
    corpus_sha256: str | None = None   # the selection's sha the daemon expects (checked on return)
    memory_bytes: int | None = None    # estimated bytes to hold and run the model (placement)
    baselines: tuple[KnownBaseline, ...] = ()
    key: str = field(default="")       # the job's name in logs and outcomes; default repo@sha

    def name(self) -> str:
        """How logs name this job."""
        return self.key or f"{self.repo}@{self.sha[:12]}"

    def to_dict(self) -> dict[str, Any]:
        """The job as JSON-able data."""
        return {"checkpoint_id": self.checkpoint_id, "repo": self.repo, "sha": self.sha,
                "request": json.loads(request_to_json(self.request)),
                "corpus_sha256": self.corpus_sha256, "memory_bytes": self.memory_bytes,
                "baselines": [[fp, sha, dict(b)] for fp, sha, b in self.baselines], "key": self.key}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ScoreJob:
        """The inverse of `to_dict`."""
        return cls(checkpoint_id=data["checkpoint_id"], repo=data["repo"], sha=data["sha"],
                   request=request_from_json(json.dumps(data["request"])),
                   corpus_sha256=data.get("corpus_sha256"), memory_bytes=data.get("memory_bytes"),
                   baselines=tuple((str(fp), str(sha), dict(b)) for fp, sha, b in data.get("baselines") or ()),
                   key=data.get("key") or "")


@dataclass(frozen=True)
class ScoreError:
    """Why a job produced no score: the error's class name, its message and hint."""

    error_class: str
    message: str
    hint: str | None = None

    @classmethod
    def from_exception(cls, exc: BaseException) -> ScoreError:
        """Describe `exc` (an `LstarError` keeps its message and hint apart)."""
        if isinstance(exc, LstarError):
            return cls(type(exc).__name__, exc.message, exc.hint)
        return cls(type(exc).__name__, " ".join(str(exc).split()), None)

    def exception(self) -> BaseException:
        """The exception this stands for, of the class the queue classifies (retry, fail,
        skip): a domain error or a timeout keeps its class; anything else is retryable."""
        cls = getattr(errors, self.error_class, None)
        if isinstance(cls, type) and issubclass(cls, LstarError):
            return cls(self.message, hint=self.hint)
        if self.error_class in ("ScoringTimeout", "ScoringInterrupted", "ScoringMemoryError"):
            return error_from_payload(dataclasses.asdict(self))
        if self.error_class == "RuntimeError":
            return RuntimeError(self.message)
        return RuntimeError(f"{self.error_class}: {self.message}")


@dataclass(frozen=True)
class ScoreOutcome:
    """A finished job: its rows (`scored`) or why there are none (`error`)."""

    job: ScoreJob
    scored: ScoredRun | None = None
    error: ScoreError | None = None
    worker: str | None = None          # where it ran (host:pid, or the Ray node), for the log

    def __post_init__(self) -> None:
        if (self.scored is None) == (self.error is None):
            raise ValueError("a ScoreOutcome holds exactly one of scored and error")

    @property
    def ok(self) -> bool:
        return self.scored is not None

    def unwrap(self) -> ScoredRun:
        """The score's rows, or raise the job's error."""
        if self.scored is None:
            raise self.error.exception()  # type: ignore[union-attr]
        return self.scored

    def to_dict(self) -> dict[str, Any]:
        """The outcome as JSON-able data."""
        return {"job": self.job.to_dict(), "worker": self.worker,
                "scored": scored_to_payload(self.scored) if self.scored is not None else None,
                "error": dataclasses.asdict(self.error) if self.error is not None else None}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ScoreOutcome:
        """The inverse of `to_dict`."""
        error = data.get("error")
        return cls(job=ScoreJob.from_dict(data["job"]), worker=data.get("worker"),
                   scored=scored_from_payload(data["scored"]) if data.get("scored") else None,
                   error=ScoreError(**error) if error else None)

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_json(cls, text: str) -> ScoreOutcome:
        return cls.from_dict(json.loads(text))


class ScoringBackend(Protocol):
    """Runs score jobs somewhere and yields their outcomes (in any order, one per job).

    A backend never writes the database and never retries a job itself: a failed job comes
    back as an outcome with an error, and the queue's leases decide whether it runs again.
    """

    name: str
    # Jobs it runs at once (None: as many as it is given). The driver leases no more than
    # this per batch, so no lease is held by a job waiting its turn behind another.
    concurrency: int | None

    def run(self, jobs: Iterable[ScoreJob]) -> Iterator[ScoreOutcome]:
        """Score `jobs`; yield one outcome per job as each finishes."""
        ...

    def interrupt(self) -> int:
        """Stop the jobs running now (the daemon's shutdown after its drain); how many.
        Their outcomes are `ScoringInterrupted` errors: the jobs were not at fault."""
        ...

    def close(self) -> None:
        """Release what the backend holds (a cluster connection)."""
        ...


def workdir_default() -> Path:
    """Where a worker keeps its scratch files when none is configured."""
    import tempfile

    return Path(tempfile.gettempdir()) / "lstar-scoring"
