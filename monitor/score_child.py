"""Scoring in a child process, so a model that eats all memory or never finishes cannot take
the daemon down with it.

The split keeps DuckDB's rule of one writing process per file: the child never opens the
database. It loads corpus, tokenizer and model, runs the forward passes and the metrics
(`engine.prepare` + `engine.compute_score(store=None)`), and hands the rows back as JSON in a
result file. The parent (the daemon) holds the checkpoint's lease, and writes the score run
together with the lease's completion in one transaction.

The parent bounds the child: wall-clock time (SIGKILL at the limit), address space
(`RLIMIT_AS`), and the child dies with its parent (`PR_SET_PDEATHSIG`), so a daemon killed
with SIGKILL leaves no orphan scorer behind.

Child protocol: `python -m monitor.score_child RESULT_FILE` reads the `ScoreRequest` as JSON
on stdin and writes `{"ok": true, "result", "run_row", "documents", "corpus_row",
"tokenizer_row"}` or `{"ok": false, "error_class", "message", "hint"}` to RESULT_FILE.
Fail points for crash tests (`LSTAR_FAILPOINT`): `hang_score_child` sleeps forever before
loading; `oom_score_child` allocates until the memory limit stops it.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
from datetime import date, datetime
from pathlib import Path
from typing import Any

from monitor import errors
from monitor.engine import ScoredRun, ScoreRequest

_PATH_FIELDS = ("corpus_dir", "tokenizer_dir", "reference_tokenizer")
_PR_SET_PDEATHSIG = 1


_ACTIVE: set[subprocess.Popen] = set()
_ACTIVE_LOCK = threading.Lock()


def kill_active_children() -> int:
    """SIGKILL every scoring child of this process (shutdown after the drain); how many."""
    with _ACTIVE_LOCK:
        children = list(_ACTIVE)
    for child in children:
        with contextlib.suppress(OSError):
            child.kill()
    return len(children)


class ScoringTimeout(TimeoutError):
    """The scoring child ran past its time limit and was killed (retryable)."""


def _json_default(value: Any) -> Any:
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"cannot encode {type(value).__name__} as JSON")


def request_to_json(request: ScoreRequest) -> str:
    """A `ScoreRequest` as JSON (paths as strings)."""
    return json.dumps(dataclasses.asdict(request), default=_json_default)


def request_from_json(text: str) -> ScoreRequest:
    """The inverse of `request_to_json`."""
    data = json.loads(text)
    for name in _PATH_FIELDS:
        if data.get(name) is not None:
            data[name] = Path(data[name])
    return ScoreRequest(**data)


def _scored_from_payload(payload: dict[str, Any]) -> ScoredRun:
    run_row = dict(payload["run_row"])
    run_row["finished_at"] = datetime.fromisoformat(run_row["finished_at"])
    documents = [tuple(d) for d in payload["documents"]]
    return ScoredRun(payload["result"], run_row, documents, payload["corpus_row"],
                     payload["tokenizer_row"])


def _error_from_payload(payload: dict[str, Any]) -> BaseException:
    name = payload.get("error_class", "")
    message = payload.get("message") or name
    if name == "MemoryError":
        return errors.ModelLoadError(f"scoring ran out of memory: {message}",
                                     hint="raise --score-memory, or score a smaller model")
    cls = getattr(errors, name, None)
    if isinstance(cls, type) and issubclass(cls, errors.LstarError):
        return cls(message, hint=payload.get("hint"))
    return RuntimeError(f"scoring child failed: {name}: {message}")


def _limit_child(memory_bytes: int | None) -> None:
    """Runs in the child between fork and exec: die with the parent, cap the address space."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:  # not Linux: the time limit still bounds an orphan
        pass
    if memory_bytes is not None:
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))


def run_score_child(request: ScoreRequest, *, timeout_s: float, memory_bytes: int | None,
                    workdir: Path, log_path: Path | None = None) -> ScoredRun:
    """Score `request` in a child process; return its rows (nothing is written here).

    Raises `ScoringTimeout` when the child is killed at `timeout_s`, `ModelLoadError` when
    it runs out of memory (or dies without an answer under a memory limit), the child's
    own `LstarError` class for bad input, and RuntimeError for anything else.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    fd, result_name = tempfile.mkstemp(prefix="score-", suffix=".json", dir=workdir)
    os.close(fd)
    result_path = Path(result_name)
    result_path.unlink()
    log = open(log_path, "ab") if log_path is not None else subprocess.DEVNULL  # noqa: SIM115
    try:
        child = subprocess.Popen(
            [sys.executable, "-m", "monitor.score_child", str(result_path)],
            stdin=subprocess.PIPE, stdout=log, stderr=log, close_fds=True,
            preexec_fn=lambda: _limit_child(memory_bytes))
        with _ACTIVE_LOCK:
            _ACTIVE.add(child)
        try:
            child.communicate(request_to_json(request).encode(), timeout=timeout_s)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
            raise ScoringTimeout(f"scoring child (pid {child.pid}) killed after the {timeout_s:g} s "
                                 "time limit") from None
        finally:
            with _ACTIVE_LOCK:
                _ACTIVE.discard(child)
        if not result_path.exists():
            what = f"signal {-child.returncode}" if child.returncode < 0 else f"exit code {child.returncode}"
            if memory_bytes is not None:
                raise errors.ModelLoadError(
                    f"scoring child died ({what}) without an answer under the "
                    f"{memory_bytes / 2**30:.2f} GiB memory limit",
                    hint="raise --score-memory if the model needs more")
            raise RuntimeError(f"scoring child died ({what}) without an answer")
        payload = json.loads(result_path.read_text())
    finally:
        if log_path is not None:
            log.close()  # type: ignore[union-attr]
        result_path.unlink(missing_ok=True)
    if not payload.get("ok"):
        raise _error_from_payload(payload)
    return _scored_from_payload(payload)


def _failpoints() -> set[str]:
    return {p.strip() for p in os.environ.get("LSTAR_FAILPOINT", "").split(",") if p.strip()}


def _write_atomically(path: Path, payload: dict[str, Any]) -> None:
    tmp = path.with_suffix(".part")
    tmp.write_text(json.dumps(payload, default=_json_default))
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    """Child entry point: score the request on stdin, write the rows to the result file."""
    args = sys.argv[1:] if argv is None else argv
    result_path = Path(args[0])
    os.environ["DISABLE_SAFETENSORS_CONVERSION"] = "1"
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    request = request_from_json(sys.stdin.read())
    points = _failpoints()
    try:
        if "hang_score_child" in points:
            while True:
                time.sleep(3600)
        if "oom_score_child" in points:
            hog = []
            while True:
                hog.append(bytearray(64 << 20))
        from monitor.engine import compute_score, prepare

        scored = compute_score(prepare(request), None)
        payload = {"ok": True, "result": scored.result, "run_row": scored.run_row,
                   "documents": scored.documents, "corpus_row": scored.corpus_row,
                   "tokenizer_row": scored.tokenizer_row}
    except MemoryError:
        hog = []  # noqa: F841 (free what the fail point held before answering)
        payload = {"ok": False, "error_class": "MemoryError",
                   "message": "the model needs more memory than the child's limit", "hint": None}
    except errors.LstarError as exc:
        payload = {"ok": False, "error_class": type(exc).__name__, "message": exc.message,
                   "hint": exc.hint}
    except Exception as exc:  # reported to the parent, which retries it
        payload = {"ok": False, "error_class": type(exc).__name__, "message": str(exc), "hint": None}
    _write_atomically(result_path, payload)
    return 0


if __name__ == "__main__":
    sys.exit(main())
