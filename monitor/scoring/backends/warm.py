"""The `local` backend with warm workers: a small pool of scoring children kept alive
between jobs (`lstar run --scoring-workers N`), so a job does not pay for importing torch.

Each job is still bounded as a cold child's is (`monitor.scoring.child`):
- time: the job's limit runs from when its worker is ready (torch imported; the start-up
  itself is bounded by START_TIMEOUT_S); past it the worker is SIGKILLed and replaced, and
  the job ends `ScoringTimeout`, retried by the queue, while the other workers go on;
- memory: each worker starts under the address-space limit (`limit_child`, as a cold child),
  and is replaced after `max_jobs` jobs, when its resident memory has grown past
  `max_rss_bytes`, and after any job that failed (a failure may leave a half-loaded model or
  a fragmented heap behind);
- a worker that dies mid-job takes nothing with it: a job's rows exist only once the worker
  has written its result file and said so; a death is described (signal, last output) and
  becomes the job's error, exactly as for a cold child, so the queue returns the lease and
  retries the job, which is then scored once.

Workers die with the daemon (`PR_SET_PDEATHSIG`): each is started by a slot thread that
lives as long as the pool, since the signal follows the thread that forked the child.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import select
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from monitor.scoring.backends.base import ScoreError, ScoreJob, ScoreOutcome, workdir_default
from monitor.scoring.backends.local import check_corpus
from monitor.scoring.child import (ScoringInterrupted, ScoringTimeout, _death_error, _envelope, _OutputTail,
                                   error_from_payload, mark_children_interrupted, physical_memory,
                                   scored_from_payload)
from monitor.scoring.engine import ScoredRun
from monitor.scoring.memory_limit import PROBE_TIMEOUT_S, limit_child, proc_status_bytes
from monitor.scoring.template import ForkedWorker, TemplateUnavailable, WorkerTemplate

log = logging.getLogger(__name__)

DEFAULT_MAX_JOBS = 20
# Without a given threshold, a worker is replaced once its resident memory passes this share
# of its address-space limit (or of the machine's memory when it has none).
RSS_SHARE = 0.5
# How long a worker asked to stop may take to exit before it is killed.
STOP_WAIT_S = 5.0
# The longest a worker may take to import the scoring libraries (as the start-up probe's bound).
START_TIMEOUT_S = PROBE_TIMEOUT_S
# The longest an evaluation waits for a template the pool is starting (importing torch takes
# seconds) before it starts a child of its own: a hung template holds it no longer than this.
EVALUATION_TEMPLATE_WAIT_S = 60.0
# How long a slot waits before replacing a worker that died with no job.
IDLE_RESTART_WAIT_S = 5.0
# After this many templates that stopped or could not fork, the pool's workers start on their
# own (a template that never forked a child is not tried again at all).
MAX_TEMPLATE_FAILURES = 3


def resident_bytes(pid: int) -> int | None:
    """The resident memory (`VmRSS`) of process `pid`, in bytes; None when it cannot be read."""
    return proc_status_bytes("VmRSS", pid)


def default_max_rss(memory_bytes: int | None) -> int | None:
    """The resident-memory threshold past which a worker is replaced, when none is given."""
    base = memory_bytes if memory_bytes is not None else physical_memory()
    return int(base * RSS_SHARE) if base else None


class WarmWorker:
    """One warm scoring child (`python -m monitor.scoring.warm`) and its status pipe."""

    def __init__(self, *, memory_bytes: int | None, log_path: Path | None,
                 template: WorkerTemplate | None = None) -> None:
        self.memory_bytes = memory_bytes
        read_end, write_end = os.pipe()
        try:
            self.proc: subprocess.Popen | ForkedWorker
            if template is not None:   # forked ready from the pool's template (same limits)
                self.proc = template.fork(write_end)
            else:
                self.proc = subprocess.Popen(
                    [sys.executable, "-m", "monitor.scoring.warm", str(write_end)],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, close_fds=True,
                    pass_fds=(write_end,), preexec_fn=lambda: limit_child(memory_bytes))
        except BaseException:
            os.close(read_end)
            raise
        finally:
            os.close(write_end)
        self._status = read_end
        self._buffer = b""
        self.output = _OutputTail(self.proc.stdout, log_path)
        self.output.start()
        self.jobs = 0
        self.ready = False           # it said it has imported the scoring libraries
        self.interrupted = False

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def _next_message(self, deadline: float) -> dict[str, Any] | None:
        """The worker's next status line; None at the deadline; {} when the pipe closed (it died)."""
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([self._status], [], [], min(left, 1.0))
            if not ready:
                continue
            chunk = os.read(self._status, 1 << 16)
            if not chunk:
                return {}
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        try:
            message = json.loads(line)
        except ValueError:
            return {"garbled": line.decode("utf-8", errors="replace")}
        return message if isinstance(message, dict) else {"garbled": str(message)}

    def score(self, job: ScoreJob, *, timeout_s: float, workdir: Path) -> ScoredRun:
        """Score `job` on this worker; raise as `run_score_child` does for a cold child."""
        workdir.mkdir(parents=True, exist_ok=True)
        fd, result_name = tempfile.mkstemp(prefix="score-", suffix=".json", dir=workdir)
        os.close(fd)
        result_path = Path(result_name)
        result_path.unlink()
        self.jobs += 1
        # The job's clock starts once the worker is ready: its start-up has its own bound.
        deadline = time.monotonic() + (timeout_s if self.ready else max(timeout_s, START_TIMEOUT_S))
        try:
            line = json.dumps({**json.loads(_envelope(job.request, job.baselines)), "result": str(result_path)})
            with contextlib.suppress(BrokenPipeError, OSError):   # a dead worker says why below
                self.proc.stdin.write(line.encode() + b"\n")  # type: ignore[union-attr]
                self.proc.stdin.flush()  # type: ignore[union-attr]
            while True:
                message = self._next_message(deadline)
                if message is None:
                    self.kill()
                    if not self.ready:
                        raise ScoringTimeout(f"scoring worker (pid {self.pid}) killed: it did not start within "
                                             f"{max(timeout_s, START_TIMEOUT_S):g} s")
                    raise ScoringTimeout(f"scoring worker (pid {self.pid}) killed after the {timeout_s:g} s "
                                         "time limit")
                if message.get("ready") and not self.ready:
                    self.ready = True
                    deadline = time.monotonic() + timeout_s
                    continue
                if not message or "garbled" in message:
                    break      # it died (or broke the protocol): described below
                if message.get("done") == str(result_path):
                    break
            if not message or "garbled" in message or not result_path.exists():
                self.kill()
                if self.interrupted:
                    raise ScoringInterrupted(f"scoring worker (pid {self.pid}) was stopped by the shutdown")
                self.output.join(timeout=10)
                returncode = self.proc.returncode if self.proc.returncode is not None else -9
                raise _death_error(self.pid, returncode, self.output.text(), self.memory_bytes)
            payload = json.loads(result_path.read_text())
        finally:
            result_path.unlink(missing_ok=True)
        if not payload.get("ok"):
            raise error_from_payload(payload, self.memory_bytes)
        return scored_from_payload(payload)

    def kill(self) -> None:
        """SIGKILL the worker and reap it."""
        with contextlib.suppress(OSError):
            self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=30)
        self._close_status()

    def stop(self) -> None:
        """Ask the worker to exit (end of its stdin); kill it if it does not within STOP_WAIT_S."""
        with contextlib.suppress(OSError):
            self.proc.stdin.close()  # type: ignore[union-attr]
        try:
            self.proc.wait(timeout=STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            self.kill()
        self._close_status()
        self.output.join(timeout=5)

    def _close_status(self) -> None:
        if self._status >= 0:
            with contextlib.suppress(OSError):
                os.close(self._status)
            self._status = -1


class WarmBackend:
    """Scores jobs on a pool of `workers` warm scoring children, `workers` jobs at a time."""

    name = "local"

    def __init__(self, *, workers: int = 1, max_jobs: int = DEFAULT_MAX_JOBS, max_rss_bytes: int | None = None,
                 timeout_s: float = 3600.0, memory_bytes: int | None = None,
                 workdir: str | Path | None = None, log_path: str | Path | None = None,
                 use_template: bool = True) -> None:
        if workers < 1 or max_jobs < 1:
            raise ValueError("a warm pool needs at least one worker and one job per worker")
        self.concurrency = workers
        self.max_jobs = max_jobs
        self.max_rss_bytes = max_rss_bytes if max_rss_bytes is not None else default_max_rss(memory_bytes)
        self.timeout_s = timeout_s
        self.memory_bytes = memory_bytes
        self.workdir = Path(workdir) if workdir is not None else workdir_default()
        self.log_path = Path(log_path) if log_path is not None else None
        self._queue: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._busy: dict[int, WarmWorker] = {}       # slot -> the worker running a job now
        self._threads: list[threading.Thread] = []
        self._closed = threading.Event()
        self.started = 0                               # workers started so far
        self.recycled: list[tuple[int, str]] = []      # (pid, why) of each worker replaced
        # Workers are forked from one process that imported the scoring libraries once
        # (`monitor.scoring.template`), so a replacement does not import torch again.
        self.use_template = use_template
        self._template: WorkerTemplate | None = None
        self.templates_started = 0
        self._template_failures = 0
        self._spawning = 0       # slots waiting for a worker to be forked (the template may still import)
        self._started_at = 0.0   # when the slot threads were started (0: not yet)
        self._interrupts = 0     # interrupt() calls that ended such a wait

    def _start(self) -> bool:
        """Start the slot threads (each starts its worker at once); whether this call did."""
        with self._lock:
            if self._threads or self._closed.is_set():
                return False
            self._started_at = time.monotonic()
            for slot in range(self.concurrency):
                thread = threading.Thread(target=self._slot, args=(slot,), name=f"warm-scorer-{slot}", daemon=True)
                thread.start()
                self._threads.append(thread)
            return True

    def _template_for_spawn(self) -> WorkerTemplate | None:
        """The pool's template process, started on first use (from a slot thread, which lives
        as long as the pool: the template dies with it); None when templates are off, or
        given up (`_give_up_template`)."""
        with self._lock:
            dead = self._template if self._template is not None and not self._template.alive() else None
        if dead is not None:
            self._give_up_template(dead, f"the scoring workers' template process (pid {dead.proc.pid}) stopped "
                                         f"(exit code {dead.proc.poll()})")
        failed: str | None = None
        with self._lock:
            if self._template is None and self.use_template and not self._closed.is_set():
                try:
                    self._template = WorkerTemplate(memory_bytes=self.memory_bytes, start_timeout_s=START_TIMEOUT_S,
                                                    log_path=self.log_path)
                except OSError as exc:   # not the job's failure: its worker starts on its own
                    self.use_template = False
                    failed = f"the scoring workers' template process could not start ({type(exc).__name__}: {exc})"
                else:
                    self.templates_started += 1
            template = self._template if self.use_template else None
        if failed is not None:
            log.warning("%s; the pool's scoring workers start on their own from now on", failed)
        return template

    def _template_failed(self, template: WorkerTemplate, why: str) -> None:
        """A fork from `template` failed. A template still running and ready (its fork()
        failed: a process limit, memory) is kept, with its other children, until the
        MAX_TEMPLATE_FAILURES-th failure; any other is given up."""
        if template.ready():
            with self._lock:
                self._template_failures += 1
                keep = self._template_failures < MAX_TEMPLATE_FAILURES
            if keep:
                log.warning("%s; this scoring worker starts on its own", why)
                return
        self._give_up_template(template, why, counted=template.ready())

    def _give_up_template(self, template: WorkerTemplate, why: str, *, counted: bool = False) -> None:
        """End a template that stopped or could not fork (its children die with it), and log
        it once. A template that never forked a child (it cannot start: hung, or crashed in
        its imports), or the MAX_TEMPLATE_FAILURES-th, turns templates off for this pool: a
        new one would cost every worker the start timeout again, or the imports for nothing."""
        with self._lock:
            if self._template is not template:     # another slot gave it up already
                return
            self._template = None
            failed = not template.aborted          # aborted: ended by this pool's shutdown, not a failure
            if failed:
                self._template_failures += 0 if counted else 1
                if template.forks == 0 or self._template_failures >= MAX_TEMPLATE_FAILURES:
                    self.use_template = False
            then = "another starts with the next worker" if self.use_template else \
                "the pool's scoring workers start on their own from now on"
        if failed:
            log.warning("%s; %s", why, then)
        template.abort()
        template.close()

    def live_template(self) -> WorkerTemplate | None:
        """The pool's template process if one is running and ready (None otherwise; never
        starts one), for other children under the same limits to be forked from (active
        evaluations): one still importing would hold an evaluation up to the start timeout."""
        with self._lock:
            template = self._template
        return template if template is not None and template.ready() else None

    def evaluation_template(self, timeout_s: float = EVALUATION_TEMPLATE_WAIT_S) -> WorkerTemplate | None:
        """The template for an evaluation to be forked from: the running one, or the one the
        pool starts now (its slot threads start their workers, as for a first job), so that an
        evaluation before the daemon's first score does not import torch in a child of its own.
        None (the evaluation starts its own child) when templates are off, the pool is closed,
        no template is starting, or none is ready within `timeout_s`. Raises ScoringInterrupted
        when the shutdown ends the template it waits for (`interrupt`, `close`): a child of its
        own would import torch while the daemon stops, and the attempt was not the job's fault."""
        if not self.use_template or self._closed.is_set():
            return None
        with self._lock:
            generation = self._interrupts
        self._start()
        # Slot threads just started (by this call or by a job a moment ago) have not yet begun
        # their workers' start (`_spawning`): until then, no template starting means none yet.
        with self._lock:
            grace = self._started_at + 2.0
        deadline = time.monotonic() + timeout_s

        def stopped() -> bool:
            """The shutdown's interrupt or close came: read under the lock, after whatever was
            seen of the template (both mark themselves before they end the template)."""
            with self._lock:
                return self._interrupts != generation or self._closed.is_set()

        while not stopped():
            with self._lock:
                template, spawning, enabled = self._template, self._spawning, self.use_template
            if template is not None and template.ready():
                return template
            if not enabled or (template is not None and not template.alive()):
                if stopped():   # the template ended by the shutdown, not of its own accord
                    break
                return None
            now = time.monotonic()
            if now > deadline or (template is None and spawning == 0 and now > grace):
                return None
            time.sleep(0.05)
        raise ScoringInterrupted("the shutdown stopped the evaluation while the scoring workers' "
                                 "template was starting")

    def _spawn(self) -> WarmWorker:
        with self._lock:
            generation = self._interrupts
            self._spawning += 1
        try:
            worker = None
            template = self._template_for_spawn()
            if template is not None:
                try:
                    worker = WarmWorker(memory_bytes=self.memory_bytes, log_path=self.log_path, template=template)
                except TemplateUnavailable as exc:
                    with self._lock:
                        interrupted = self._interrupts != generation
                    if interrupted or self._closed.is_set():   # the shutdown ended the template meanwhile
                        raise ScoringInterrupted("a scoring worker was still starting when the shutdown "
                                                 "stopped the score") from None
                    self._template_failed(template, str(exc))
                    worker = None   # a worker that imports on its own, as without a template
            if worker is None:
                worker = WarmWorker(memory_bytes=self.memory_bytes, log_path=self.log_path)
        finally:
            with self._lock:
                self._spawning -= 1
        with self._lock:
            self.started += 1
        return worker

    def _retire(self, worker: WarmWorker, why: str) -> None:
        with self._lock:
            self.recycled.append((worker.pid, why))
        worker.stop()

    def _slot(self, slot: int) -> None:
        """One worker's life: start it (warming while idle), run jobs, replace it when due."""
        worker: WarmWorker | None = None
        # Start a worker while idle, except after a shutdown interrupted a start: the daemon is
        # stopping, and a job that still comes starts its own (`_run_one`).
        warm = True
        try:
            while not self._closed.is_set():
                if worker is not None and not worker.alive():
                    self._retire(worker, "died while idle")
                    worker = None
                    # Not at once: a worker that cannot start would otherwise be restarted in a loop.
                    if self._closed.wait(IDLE_RESTART_WAIT_S):
                        break
                if worker is None and warm:
                    try:
                        worker = self._spawn()
                    except ScoringInterrupted:
                        warm = False
                    except Exception:  # noqa: BLE001 - not only OSError: a slot that lost its thread
                        worker = None     # would leave its jobs waiting for ever; the job below says why
                try:
                    item = self._queue.get(timeout=0.5)
                except queue.Empty:
                    continue
                if item is None:
                    break
                job, out, cancelled, generation = item
                if cancelled.is_set():
                    continue
                with self._lock:
                    interrupted = generation != self._interrupts
                if interrupted:   # queued behind a worker start the shutdown ended: not started
                    out.put(ScoreOutcome(job, error=ScoreError.from_exception(ScoringInterrupted(
                        "the shutdown stopped the score before its scoring worker had started")),
                        worker=socket.gethostname()))
                    continue
                warm = True
                try:
                    outcome, worker, why = self._run_one(slot, worker, job)
                except Exception as exc:  # a fault of the pool, not the job: it goes back to the queue
                    outcome, why = ScoreOutcome(job, error=ScoreError.from_exception(exc),
                                                worker=socket.gethostname()), "the pool failed"
                out.put(outcome)   # before a replaced worker is stopped: the result does not wait
                if why is not None and worker is not None:
                    self._retire(worker, why)
                if why is not None:
                    worker = None
        finally:
            if worker is not None:
                worker.stop()

    def _run_one(self, slot: int, worker: WarmWorker | None,
                 job: ScoreJob) -> tuple[ScoreOutcome, WarmWorker | None, str | None]:
        """Score `job` on `worker` (a new one if it has none): the outcome, the worker, and why
        it is to be replaced (None: it takes the next job)."""
        try:
            if worker is None:
                worker = self._spawn()
        except Exception as exc:  # noqa: BLE001 - the job's error, whatever kept its worker from starting
            return ScoreOutcome(job, error=ScoreError.from_exception(exc), worker=socket.gethostname()), None, None
        where = f"{socket.gethostname()}:{worker.pid}"
        with self._lock:
            self._busy[slot] = worker
        try:
            scored = worker.score(job, timeout_s=self.timeout_s, workdir=self.workdir)
            check_corpus(job, scored)
        except Exception as exc:  # the queue classifies it (retry, fail, skip) from its class
            outcome = ScoreOutcome(job, error=ScoreError.from_exception(exc), worker=where)
        else:
            outcome = ScoreOutcome(job, scored=scored, worker=where)
        finally:
            with self._lock:
                self._busy.pop(slot, None)
        return outcome, worker, self._replace_reason(worker, outcome)

    def _replace_reason(self, worker: WarmWorker, outcome: ScoreOutcome) -> str | None:
        if not worker.alive():
            if worker.interrupted:
                return "stopped by the shutdown"
            timed_out = outcome.error is not None and outcome.error.error_class == "ScoringTimeout"
            return "killed at the time limit" if timed_out else "died"
        if not outcome.ok:
            return f"its job failed ({outcome.error.error_class})"  # type: ignore[union-attr]
        if worker.jobs >= self.max_jobs:
            return f"{worker.jobs} jobs done"
        rss = resident_bytes(worker.pid)
        if rss is not None and self.max_rss_bytes is not None and rss > self.max_rss_bytes:
            return f"resident memory {rss >> 20} MiB past {self.max_rss_bytes >> 20} MiB"
        return None

    def run(self, jobs: Iterable[ScoreJob]) -> Iterator[ScoreOutcome]:
        """Hand `jobs` to the pool; yield each outcome as soon as its worker returned it."""
        todo = list(jobs)
        if not todo:
            return
        self._start()
        out: queue.Queue = queue.Queue()
        cancelled = threading.Event()
        with self._lock:
            generation = self._interrupts
        for job in todo:
            self._queue.put((job, out, cancelled, generation))
        try:
            for _ in todo:
                yield out.get()
        finally:
            cancelled.set()     # the caller stopped early: jobs not yet started are not run

    def interrupt(self) -> int:
        """Kill the workers running a job now (the daemon's shutdown after its drain); how
        many. Their jobs end `ScoringInterrupted`: the jobs were not at fault."""
        with self._lock:
            busy = list(self._busy.values())
            spawning, template = self._spawning, self._template
            if spawning:
                self._interrupts += 1
        for worker in busy:
            worker.interrupted = True
            with contextlib.suppress(OSError):
                worker.proc.kill()
        if spawning and template is not None:
            # A slot still waits for the template (importing torch) to fork its worker: ending
            # the template ends the wait, and that job ends ScoringInterrupted too, as do the
            # evaluations forked from it (marked first: they die with it).
            mark_children_interrupted(template)
            template.abort()
        return len(busy) + spawning

    def close(self) -> None:
        """Stop every worker and the pool's threads."""
        self._closed.set()
        with self._lock:
            spawning, template = self._spawning, self._template
        if spawning and template is not None:
            mark_children_interrupted(template)
            template.abort()   # a slot waiting for the template to fork would hold the close up
        for _ in self._threads:
            self._queue.put(None)
        for thread in self._threads:
            thread.join(timeout=STOP_WAIT_S + 35)
        self._threads.clear()
        with self._lock:
            template, self._template = self._template, None
        if template is not None:
            template.close()
