"""Scoring in a child process, so a model that eats all memory or never finishes cannot take
the daemon down with it.

The split keeps DuckDB's rule of one writing process per file: the child never opens the
database. It loads corpus, tokenizer and model, runs the forward passes and the metrics
(`engine.prepare` + `engine.compute_score(store=None)`), and hands the rows back as JSON in a
result file. The parent (the daemon) holds the checkpoint's lease, and writes the score run
together with the lease's completion in one transaction.

The parent bounds the child: wall-clock time (SIGKILL at the limit), address space
(`RLIMIT_AS`; by default a share of the machine's memory, see `default_memory_limit`), and
the child dies with its parent (`PR_SET_PDEATHSIG`), so a daemon killed with SIGKILL
leaves no orphan scorer behind.

A child that fails says why in its result file; one that dies without an answer is
described from what is left: the signal that killed it, and the tail of its output (read
through a pipe, copied to the scoring log, with faulthandler's traceback for a crash in
native code). Known causes get their own error: running out of memory (retryable, naming
the limit: a shared library that no longer fits under it fails to load with an ImportError,
which is not a missing package), the regex engine's backtracking limit in a tokenizer, a
package that is not installed (skipped).

Child protocol: `python -m monitor.scoring.child RESULT_FILE` reads `{"request": ScoreRequest,
"baselines": [[tokenizer fingerprint, corpus sha256, baseline], ...]}` as JSON on stdin (the
baselines the daemon has cached, so the child computes none the store holds) and writes
`{"ok": true, "result", "run_row", "documents", "corpus_row", "tokenizer_row", "baseline",
"baseline_source"}` or `{"ok": false, "error_class", "message", "hint", "missing_module"}` to
RESULT_FILE (`missing_module`: the module a ModuleNotFoundError names, when it is not installed).
Fail points for crash tests (`LSTAR_FAILPOINT`): `hang_score_child` sleeps forever before
loading; `oom_score_child` allocates until the memory limit stops it; `segfault_score_child`
crashes in native code (SIGSEGV).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import faulthandler
import importlib.util
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from datetime import date, datetime
from pathlib import Path
from collections.abc import Sequence
from typing import Any

from monitor import errors
from monitor.environment import harden_environment
from monitor.failpoints import failpoint_values
from monitor.scoring.engine import KnownBaseline, ScoredRun, ScoreRequest, compute_score, prepare
from monitor.scoring.memory_limit import is_memory_failure, limit_child, size_text
from monitor.scoring.process_cache import PrepareCache

log = logging.getLogger(__name__)

_PATH_FIELDS = ("corpus_dir", "tokenizer_dir", "reference_tokenizer", "model_root", "adapter", "adapter_root", "hub_cache_dir")
# The default address-space limit: this share of the machine's memory, and at least
# MIN_MEMORY_LIMIT (torch alone maps a few GiB of address space it never touches).
MEMORY_SHARE = 0.75
MIN_MEMORY_LIMIT = 4 << 30
# Output kept to describe a death, and the most of one child's output the scoring log takes.
TAIL_BYTES = 16 << 10
LOG_BYTES_PER_CHILD = 8 << 20
# What in a dead child's output names the cause (running out of memory: `is_memory_failure`).
REGEX_MARKERS = ("retry-limit-in-match", "match-stack limit", "regex engine", "CompiledTooBig",
                 "BacktrackLimitExceeded")
# Error classes that stand for running out of host memory when their message says so (torch's
# CPU allocator raises RuntimeError; a CUDA OutOfMemoryError is the GPU's, not the limit's).
_MAYBE_MEMORY = ("ImportError", "ModuleNotFoundError", "OSError", "RuntimeError")
_NOTABLE = ("Error", "error", "panicked", "Fatal", "Killed", "limit", "abort", "Exception")


# How long a child SIGKILLed at its time limit may take to be reaped. A cold child always is;
# a forked one is killed by its template, which, if it does not within this, is ended itself.
KILL_WAIT_S = 30.0

_ACTIVE: set[subprocess.Popen] = set()
_INTERRUPTED: set[int] = set()
_ACTIVE_LOCK = threading.Lock()


def kill_active_children() -> int:
    """SIGKILL every scoring child of this process (shutdown after the drain); how many.

    Their `run_score_child` raises ScoringInterrupted: the job was not at fault.
    """
    with _ACTIVE_LOCK:
        children = list(_ACTIVE)
        _INTERRUPTED.update(child.pid for child in children)
    for child in children:
        with contextlib.suppress(OSError):
            child.kill()
    return len(children)


def mark_children_interrupted(template: Any) -> int:
    """Mark the active children forked from `template` as stopped by the shutdown, before the
    shutdown ends the template (they die with it); how many. Their `run_child_module` then
    raises ScoringInterrupted (the attempt is given back) instead of describing a SIGKILL."""
    with _ACTIVE_LOCK:
        pids = [child.pid for child in _ACTIVE if getattr(child, "template", None) is template]
        _INTERRUPTED.update(pids)
    return len(pids)


class ScoringTimeout(TimeoutError):
    """The scoring child ran past its time limit and was killed (retryable)."""


class ScoringInterrupted(Exception):
    """The scoring child was killed by this process's own shutdown, not by the job."""


class ScoringMemoryError(RuntimeError):
    """The scoring child ran out of memory, most often its own limit (retryable: the same
    checkpoint scores once `--score-memory` is raised)."""


def out_of_memory(detail: str, memory_bytes: int | None) -> ScoringMemoryError:
    """The error for a child that ran out of memory, naming the limit and how to raise it."""
    if memory_bytes is None:
        return ScoringMemoryError(f"scoring ran out of memory: {detail}")
    limit = size_text(memory_bytes)
    return ScoringMemoryError(f"scoring ran out of memory under the --score-memory limit of {limit} (address "
                              f"space): {detail}; raise --score-memory if the model needs more")


def physical_memory() -> int | None:
    """Bytes of memory this process may use: the machine's RAM, or its cgroup's limit if lower."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None
    for limit_file in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        with contextlib.suppress(OSError, ValueError):
            text = Path(limit_file).read_text().strip()
            if text.isdigit():
                total = min(total, int(text))
    return total if total > 0 else None


def default_memory_limit(device: str = "auto") -> int | None:
    """The scoring child's address-space limit when none is given.

    MEMORY_SHARE of the machine's memory (at least MIN_MEMORY_LIMIT), so one hostile or
    oversized checkpoint cannot take the host down. None on a host with an NVIDIA GPU
    unless scoring is pinned to the CPU: CUDA reserves far more address space than it
    uses, and an RLIMIT_AS makes its initialisation fail; pass `--score-memory` there.
    """
    if device != "cpu" and (Path("/dev/nvidiactl").exists() or Path("/proc/driver/nvidia/version").exists()):
        return None
    total = physical_memory()
    if total is None:
        return None
    return max(int(total * MEMORY_SHARE), min(total, MIN_MEMORY_LIMIT))


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


def scored_to_payload(scored: ScoredRun) -> dict[str, Any]:
    """A `ScoredRun` as a JSON-able dict (floats keep every bit: JSON writes their repr)."""
    payload = {"result": scored.result, "run_row": scored.run_row, "documents": scored.documents,
               "corpus_row": scored.corpus_row, "tokenizer_row": scored.tokenizer_row,
               "baseline": scored.baseline, "baseline_source": scored.baseline_source}
    return json.loads(json.dumps(payload, default=_json_default))


def scored_from_payload(payload: dict[str, Any]) -> ScoredRun:
    """The inverse of `scored_to_payload`."""
    run_row = dict(payload["run_row"])
    run_row["finished_at"] = datetime.fromisoformat(run_row["finished_at"])
    documents = [tuple(d) for d in payload["documents"]]
    return ScoredRun(payload["result"], run_row, documents, payload["corpus_row"],
                     payload["tokenizer_row"], baseline=payload.get("baseline"),
                     baseline_source=payload.get("baseline_source", "computed"))


def error_from_payload(payload: dict[str, Any], memory_bytes: int | None = None) -> BaseException:
    """The exception a failed score's `{error_class, message, hint}` stands for
    (`memory_bytes`: the child's address-space limit, named when it ran out of memory)."""
    name = payload.get("error_class", "")
    if name == "ScoringTimeout":
        return ScoringTimeout(str(payload.get("message") or name))
    if name == "ScoringInterrupted":
        return ScoringInterrupted(str(payload.get("message") or name))
    if name == "ScoringMemoryError":
        return ScoringMemoryError(str(payload.get("message") or name))
    return _error_from_payload(payload, memory_bytes)


def _regex_limit(message: str, how: str) -> errors.TokenizerError:
    return errors.TokenizerError(
        f"the tokenizer hit the regex engine limit ({how}): {message}",
        hint="its pre-tokenizer regex backtracks without bound on the corpus; this checkpoint cannot be scored")


def _error_from_payload(payload: dict[str, Any], memory_bytes: int | None) -> BaseException:
    name = payload.get("error_class", "")
    message = " ".join(str(payload.get("message") or name).split())[:400]
    if name == "MemoryError" or (name in _MAYBE_MEMORY and is_memory_failure(message)):
        # An ImportError such as "libtorch_cpu.so: failed to map segment from shared object"
        # is the address-space limit, not a missing package.
        return out_of_memory(f"{name}: {message}", memory_bytes)
    if any(marker in message for marker in REGEX_MARKERS):
        return _regex_limit(message, name)
    if name == "ModuleNotFoundError" and payload.get("missing_module"):
        return errors.UnsupportedCheckpointError(
            f"scoring needs a package that is not installed: {message}",
            hint="install it to score this checkpoint; it is skipped, not retried")
    cls = getattr(errors, name, None)
    if isinstance(cls, type) and issubclass(cls, errors.LstarError):
        return cls(message, hint=payload.get("hint"))
    if name == "PanicException":  # a Rust library gave up on this input: it would again
        return errors.ModelLoadError(f"scoring child failed: a Rust panic: {message}")
    return RuntimeError(f"scoring child failed: {name}: {message}")


def _excerpt(tail: str, lines: int = 3, limit: int = 400) -> str:
    """The informative last lines of a dead child's output, as one line."""
    kept = [line.strip() for line in tail.splitlines() if line.strip()]
    # Rust backtrace frames and their source locations say where, not why.
    kept = [line for line in kept if not (line[:1].isdigit() and ":" in line[:6])
            and not line.startswith(("at ", "stack backtrace:", "note: "))]
    notable = [line for line in kept if any(word in line for word in _NOTABLE)]
    picked = (notable or kept)[-lines:]
    # After faulthandler's "Fatal Python error", the first frame is where the crash happened.
    fatal = next((i for i, line in enumerate(kept) if line.startswith("Fatal Python error")), None)
    if fatal is not None:
        frame = next((line for line in kept[fatal:] if line.startswith('File "')), None)
        if frame is not None and frame not in picked:
            picked.append(f"in {frame}")
    text = " | ".join(picked)
    return text if len(text) <= limit else "..." + text[-limit:]


def _death_error(pid: int, returncode: int, tail: str, memory_bytes: int | None) -> BaseException:
    """The error for a child that exited without writing its answer."""
    signal_name = None
    if returncode < 0:
        try:
            signal_name = signal.Signals(-returncode).name
        except ValueError:
            signal_name = f"signal {-returncode}"
        how = f"killed by {signal_name}"
        if signal_name == "SIGKILL":
            how += " (the kernel's out-of-memory killer, or an operator)"
    else:
        how = f"exited with code {returncode}"
    under = f" under the {memory_bytes / 2**30:.2f} GiB address-space limit" if memory_bytes else ""
    excerpt = _excerpt(tail)
    said = f": {excerpt}" if excerpt else " (it wrote nothing)"
    if any(marker in tail for marker in REGEX_MARKERS):
        return _regex_limit(excerpt, how)
    if is_memory_failure(tail):
        return out_of_memory(f"child {how}{said}", memory_bytes)
    text = f"scoring child (pid {pid}) {how} without an answer{under}{said}"
    if signal_name not in (None, "SIGKILL", "SIGTERM", "SIGINT"):
        # A crash (SIGSEGV, SIGABRT, SIGBUS, ...) on this input happens again on a retry.
        return errors.ModelLoadError(text, hint="the whole output is in the scoring log")
    return RuntimeError(text)


class _OutputTail(threading.Thread):
    """Drains a child's combined output: copies it to the log (at most LOG_BYTES_PER_CHILD)
    and keeps the last TAIL_BYTES to describe a death."""

    def __init__(self, pipe: Any, log_path: Path | None) -> None:
        super().__init__(name="score-child-output", daemon=True)
        self.pipe, self.log_path = pipe, log_path
        self.tail = b""

    def run(self) -> None:
        log = open(self.log_path, "ab") if self.log_path is not None else None  # noqa: SIM115
        logged = 0
        try:
            while chunk := self.pipe.read1(1 << 16):
                self.tail = (self.tail + chunk)[-TAIL_BYTES:]
                if log is not None and logged < LOG_BYTES_PER_CHILD:
                    log.write(chunk[:LOG_BYTES_PER_CHILD - logged])
                    logged += min(len(chunk), LOG_BYTES_PER_CHILD - logged)
                    if logged >= LOG_BYTES_PER_CHILD:
                        log.write(b"\n[lstar: the rest of this child's output is not logged]\n")
        except (OSError, ValueError):
            pass
        finally:
            if log is not None:
                log.close()
            with contextlib.suppress(OSError):
                self.pipe.close()

    def text(self) -> str:
        return self.tail.decode("utf-8", errors="replace")


def run_score_child(request: ScoreRequest, *, timeout_s: float, memory_bytes: int | None,
                    workdir: Path, log_path: Path | None = None,
                    baselines: Sequence[KnownBaseline] = ()) -> ScoredRun:
    """Score `request` in a child process; return its rows (nothing is written here).

    `baselines` are the cached unigram baselines the child may use instead of computing one.

    Raises `ScoringTimeout` when the child is killed at `timeout_s`, `ScoringInterrupted`
    when `kill_active_children` killed it, the child's own `LstarError` class for bad input
    (`UnsupportedCheckpointError` for a package that is not installed, `TokenizerError` for
    the regex engine's limit), `ScoringMemoryError` for running out of memory (an import
    that failed to map a library under the limit included), `ModelLoadError` for a crash,
    and RuntimeError for anything else, always with the real reason: the signal and the end
    of its output.
    """
    payload = run_child_module("monitor.scoring.child", _envelope(request, baselines), what="scoring child",
                               prefix="score-", timeout_s=timeout_s, memory_bytes=memory_bytes,
                               workdir=workdir, log_path=log_path)
    return scored_from_payload(payload)


def run_child_module(module: str, stdin_text: str, *, what: str, prefix: str, timeout_s: float,
                     memory_bytes: int | None, workdir: Path, log_path: Path | None = None,
                     template: Any = None) -> dict[str, Any]:
    """Run `python -m module RESULT_FILE` under the address-space limit with `stdin_text` on its
    standard input, and return the `{"ok": true, ...}` object it wrote to RESULT_FILE.

    With `template` (a running `monitor.scoring.template.WorkerTemplate`, started under the
    same `memory_bytes`), the child is forked from it with the scoring libraries imported,
    instead of a new interpreter importing them again; if it cannot fork, a new one starts.

    The one child protocol of scoring and of active evaluation: the child is registered for
    `kill_active_children`, killed at `timeout_s`, its output's tail kept for the reason of a
    death; failures raise as `run_score_child` describes (`what` names the child in them).
    """
    workdir.mkdir(parents=True, exist_ok=True)
    fd, result_name = tempfile.mkstemp(prefix=prefix, suffix=".json", dir=workdir)
    os.close(fd)
    result_path = Path(result_name)
    result_path.unlink()
    try:
        child = _forked_child(template, module, result_path, memory_bytes)
        if child is None:
            child = subprocess.Popen(
                [sys.executable, "-m", module, str(result_path)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, close_fds=True,
                preexec_fn=lambda: limit_child(memory_bytes))
        output = _OutputTail(child.stdout, log_path)
        output.start()
        with _ACTIVE_LOCK:
            _ACTIVE.add(child)
        try:
            with contextlib.suppress(BrokenPipeError):  # a child that died at once says why below
                child.stdin.write(stdin_text.encode())  # type: ignore[union-attr]
            with contextlib.suppress(OSError):
                child.stdin.close()  # type: ignore[union-attr]
            child.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            child.kill()
            _wait_killed(child)
            raise ScoringTimeout(f"{what} (pid {child.pid}) killed after the {timeout_s:g} s "
                                 "time limit") from None
        finally:
            with _ACTIVE_LOCK:
                _ACTIVE.discard(child)
                interrupted = child.pid in _INTERRUPTED
                _INTERRUPTED.discard(child.pid)
            output.join(timeout=10)
        if interrupted:
            raise ScoringInterrupted(f"{what} (pid {child.pid}) was stopped by the shutdown")
        if not result_path.exists():
            raise _death_error(child.pid, child.returncode, output.text(), memory_bytes)
        payload = json.loads(result_path.read_text())
    finally:
        result_path.unlink(missing_ok=True)
    if not payload.get("ok"):
        raise error_from_payload(payload, memory_bytes)
    return payload


def _wait_killed(child: Any) -> None:
    """Reap a child just SIGKILLed, within KILL_WAIT_S. A forked child is killed by its
    template: one that has not within the bound is not acting on messages (hung), and is
    ended, which ends its children and the wait. A cold child still unreaped is left."""
    try:
        child.wait(timeout=KILL_WAIT_S)
    except subprocess.TimeoutExpired:
        template = getattr(child, "template", None)
        if template is None:
            return
        log.warning("template %d did not kill its child %d within %g s; ending the template", template.proc.pid,
                    child.pid, KILL_WAIT_S)
        template.abort()
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(timeout=KILL_WAIT_S)


def _forked_child(template: Any, module: str, result_path: Path, memory_bytes: int | None) -> Any:
    """`module`'s child forked from `template` (None without one, when it runs under another
    address-space limit than `memory_bytes`, which its children inherit, or when it cannot fork)."""
    if template is None or getattr(template, "memory_bytes", None) != memory_bytes:
        return None
    from monitor.scoring.template import TemplateUnavailable

    try:
        return template.fork_module(module, (str(result_path),))
    except TemplateUnavailable:
        return None


def _envelope(request: ScoreRequest, baselines: Sequence[KnownBaseline]) -> str:
    return json.dumps({"request": json.loads(request_to_json(request)),
                       "baselines": [list(b) for b in baselines]}, default=_json_default)


def missing_module(exc: ImportError) -> str | None:
    """The module `exc` says is missing, if it is genuinely not installed (a
    ModuleNotFoundError whose module cannot be found); None for any other ImportError."""
    name = exc.name if isinstance(exc, ModuleNotFoundError) else None
    if not name:
        return None
    try:
        found = importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # its parent package is missing too
        found = False
    except Exception:  # MemoryError included: not known to be missing, so not skipped
        return None
    return None if found else name


def _write_atomically(path: Path, payload: dict[str, Any]) -> None:
    tmp = path.with_suffix(".part")
    tmp.write_text(json.dumps(payload, default=_json_default))
    os.replace(tmp, path)


def score_payload(request: ScoreRequest, baselines: Sequence[KnownBaseline], *,
                  cache: PrepareCache | None = None) -> dict[str, Any]:
    """Score `request` here and describe the outcome as the result file's JSON: the rows, or
    the error's class, message and hint (the body of a scoring child and of a warm worker's
    job; `cache`: the warm worker's tokenizers and tokenized corpora). Honours the crash
    fail points of the module docstring."""
    points = set(failpoint_values())
    try:
        if "hang_score_child" in points:
            while True:
                time.sleep(3600)
        if "oom_score_child" in points:
            hog = []
            while True:
                hog.append(bytearray(64 << 20))
        if "segfault_score_child" in points:
            ctypes.string_at(0)  # reads address 0: SIGSEGV

        scored = compute_score(prepare(request, cache=cache), None, baselines=baselines)
        payload = {"ok": True, **scored_to_payload(scored)}
    except Exception as exc:  # reported to the parent, which decides whether to retry
        hog = []  # noqa: F841 (free what the fail point held before answering)
        payload = failure_payload(exc)
    except BaseException as exc:  # a Rust panic (pyo3's PanicException) is no Exception
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        payload = {"ok": False, "error_class": type(exc).__name__, "message": str(exc), "hint": None}
    return payload


def failure_payload(exc: Exception) -> dict[str, Any]:
    """A child's failure as its result file's JSON (`error_from_payload` reads it back):
    out of memory, a module that is not installed, the project's own error with its hint, or
    anything else by its class and message."""
    if isinstance(exc, MemoryError):
        said = " ".join(str(exc).split())
        return {"ok": False, "error_class": "MemoryError",
                "message": said or "an allocation failed (the model needs more memory than the child has)",
                "hint": None}
    if isinstance(exc, ImportError):
        return {"ok": False, "error_class": type(exc).__name__, "message": str(exc), "hint": None,
                "missing_module": missing_module(exc)}
    if isinstance(exc, errors.LstarError):
        return {"ok": False, "error_class": type(exc).__name__, "message": exc.message, "hint": exc.hint}
    return {"ok": False, "error_class": type(exc).__name__, "message": str(exc), "hint": None}


def main(argv: list[str] | None = None) -> int:
    """Child entry point: score the request on stdin, write the rows to the result file."""
    args = sys.argv[1:] if argv is None else argv
    result_path = Path(args[0])
    faulthandler.enable()  # a crash in native code leaves a traceback for the parent to report
    harden_environment()
    envelope = json.loads(sys.stdin.read())
    request = request_from_json(json.dumps(envelope["request"]))
    baselines = [(str(fp), str(sha), dict(b)) for fp, sha, b in envelope.get("baselines") or ()]
    payload = score_payload(request, baselines)
    _write_atomically(result_path, payload)
    return 0


if __name__ == "__main__":
    sys.exit(main())
