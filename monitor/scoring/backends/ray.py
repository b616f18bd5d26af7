"""The `ray` backend: each job as a Ray task on a cluster, placed by the memory it needs.

The task runs the same child process as the local backend, on whichever node Ray picks,
so a model that eats memory or crashes takes down only that child; the task returns the
outcome as JSON. Workers never open the database: the daemon writes what comes back.

Placement: the job's estimated memory (`placement.estimate_memory`, from the safetensors
headers) is the task's `memory` resource, and a CUDA job asks for `num_gpus` (more than one
when the model is larger than one GPU; the request then loads it with `device_map="auto"`
across that node's GPUs). A job no node can hold fails at once with the numbers instead of
waiting forever for a node that does not exist.

Retries are the queue's, not Ray's: tasks run with `max_retries=0`, so a worker killed
mid-job comes back as an error outcome, the lease goes back, and the queue decides (at most
three attempts in all, then failed with the reason). Silent retries inside Ray would let a
job that kills its worker run without limit and hide it from the record.

Model and corpus paths are sent as they are: on a cluster of several machines they must be
on a file system every node mounts at the same path.

Fail point (`LSTAR_FAILPOINT`, crash tests): `kill_score_worker=MARKER` SIGKILLs the Ray
worker process at the start of the task if the file MARKER does not exist yet (creating
it: the first attempt dies, the retry runs); `kill_score_worker` with no value kills every
attempt. The driver forwards `LSTAR_FAILPOINT` to the task's environment.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from monitor.errors import LstarError, ModelLoadError
from monitor.failpoints import ENV_VAR, failpoint_values
from monitor.scoring.backends.base import ScoreError, ScoreJob, ScoreOutcome, workdir_default
from monitor.scoring.backends.local import score_job
from monitor.scoring.backends.placement import gpus_needed

INSTALL_HINT = 'install it with pip install -e ".[ray]" (or pip install "ray>=2.9,<3")'


def import_ray() -> Any:
    """The `ray` module, or a clear error saying how to install it."""
    # Ray's driver would install absl's failure-signal handler, which catches SIGTERM before the
    # daemon's own handler and aborts the process (exit -6) when a signal comes while it is
    # still running; the daemon handles its signals itself. Ray reads this when it is imported.
    os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")
    try:
        import ray
    except ImportError as exc:
        raise LstarError(f"the ray scoring backend needs the ray package, which is not installed ({exc})",
                         hint=INSTALL_HINT) from None
    return ray


def _kill_point() -> None:
    """The `kill_score_worker` fail point (see the module docstring)."""
    points = failpoint_values()
    if "kill_score_worker" not in points:
        return
    marker = points["kill_score_worker"]
    if marker:
        try:
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return              # an earlier attempt died here already: this one runs
        os.close(fd)
    os.kill(os.getpid(), signal.SIGKILL)


def score_on_worker(job_data: dict[str, Any], timeout_s: float, memory_bytes: int | None,
                    workdir: str | None) -> str:
    """The Ray task's body: score one job in a child process on this node; the outcome as JSON."""
    _kill_point()
    job = ScoreJob.from_dict(job_data)
    outcome = score_job(job, timeout_s=timeout_s, memory_bytes=memory_bytes,
                        workdir=Path(workdir) if workdir else workdir_default())
    return outcome.to_json()


def check_reachable(address: str | None, timeout_s: float = 5.0) -> None:
    """Refuse a `host:port` cluster address nothing answers on, at once: `ray.init` would
    retry for minutes. Other forms (`auto`, `local`, `ray://...`) are left to Ray."""
    if not address or "://" in address or ":" not in address:
        return
    host, _, port = address.rpartition(":")
    if not port.isdigit():
        raise LstarError(f"Ray address {address!r} is not host:port", hint="e.g. --ray-address 10.0.0.5:6379")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            pass
    except OSError as exc:
        raise LstarError(f"nothing answers at the Ray address {address} ({exc.strerror or exc})",
                         hint="start the cluster there (ray start --head), or fix --ray-address / RAY_ADDRESS") from None


def _node_capacity(ray: Any) -> tuple[int | None, int]:
    """The largest `memory` resource of any live node (None when Ray does not say), and the
    most GPUs any live node has (a task's GPUs must all be on one node)."""
    alive = [node.get("Resources", {}) for node in ray.nodes() if node.get("Alive")]
    sizes = [int(r["memory"]) for r in alive if r.get("memory")]
    return (max(sizes) if sizes else None), max((int(r.get("GPU", 0)) for r in alive), default=0)


class RayBackend:
    """Scores jobs as Ray tasks, all submitted at once, outcomes yielded as they finish."""

    name = "ray"
    concurrency = None   # the cluster queues what it cannot run yet

    def __init__(self, *, address: str | None = None, timeout_s: float = 3600.0,
                 memory_bytes: int | None = None, workdir: str | Path | None = None,
                 num_cpus: float = 1.0, gpu_bytes: int | None = None,
                 init_kwargs: dict[str, Any] | None = None) -> None:
        """Connect to the cluster at `address` (else `RAY_ADDRESS`, else a Ray instance this
        process starts). `memory_bytes` bounds each scoring child's address space on its node;
        `gpu_bytes` is one GPU's memory, used to ask for several GPUs for a larger model."""
        self._ray = import_ray()
        self.address = address or os.environ.get("RAY_ADDRESS") or None
        self.timeout_s = timeout_s
        self.memory_bytes = memory_bytes
        self.workdir = str(workdir) if workdir is not None else None
        self.num_cpus = num_cpus
        self.gpu_bytes = gpu_bytes
        self._owns = False
        self._interrupted = threading.Event()
        self._running = 0
        if not self._ray.is_initialized():
            check_reachable(self.address)
            try:
                self._ray.init(address=self.address, **(init_kwargs or {}))
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise LstarError(f"cannot connect to the Ray cluster at {self.address or '(a new local one)'}: "
                                 f"{' '.join(str(exc).split())[:300]}",
                                 hint="check --ray-address (or RAY_ADDRESS), and that `ray start` runs there") from None
            self._owns = True
        self._task = self._ray.remote(score_on_worker)

    def task_options(self, job: ScoreJob) -> tuple[dict[str, Any], ScoreJob]:
        """The task's resources, and the job as sent (with `device_map` for a multi-GPU model)."""
        options: dict[str, Any] = {"num_cpus": self.num_cpus, "max_retries": 0}
        if job.memory_bytes:
            options["memory"] = int(job.memory_bytes)
        if job.request.device.startswith("cuda"):
            gpus = gpus_needed(job.memory_bytes or 0, self.gpu_bytes) if self.gpu_bytes else 1
            options["num_gpus"] = gpus
            if gpus > 1 and job.request.device_map is None:
                job = dataclasses.replace(job, request=dataclasses.replace(job.request, device_map="auto"))
        if ENV_VAR in os.environ:
            options["runtime_env"] = {"env_vars": {ENV_VAR: os.environ[ENV_VAR]}}
        return options, job

    def _unplaceable(self, job: ScoreJob, gpus: int, capacity: tuple[int | None, int]) -> ScoreOutcome | None:
        """A job no node can hold (its memory, or its `gpus` on one node) fails at once with the
        numbers: Ray would keep it pending for ever, and the time limit only starts once it runs."""
        largest, most_gpus = capacity
        if job.memory_bytes and largest is not None and job.memory_bytes > largest:
            error = ModelLoadError(
                f"{job.name()} needs about {job.memory_bytes / 2**30:.1f} GiB to score, but the largest node "
                f"of the Ray cluster offers {largest / 2**30:.1f} GiB",
                hint="add a node with more memory to the cluster, or score it with the local backend")
        elif gpus > most_gpus:
            error = ModelLoadError(
                f"{job.name()} needs {gpus} GPU(s) on one node, but "
                + (f"the largest node of the Ray cluster has {most_gpus}" if most_gpus else
                   "the Ray cluster has no GPU"),
                hint="add a node with more GPUs, or score on the CPU (device: cpu)")
        else:
            return None
        return ScoreOutcome(job, error=ScoreError.from_exception(error), worker="ray")

    def run(self, jobs: Iterable[ScoreJob]) -> Iterator[ScoreOutcome]:
        """Submit every job, then yield outcomes in the order they finish."""
        ray = self._ray
        capacity = _node_capacity(ray)
        pending: dict[Any, ScoreJob] = {}
        try:
            for job in jobs:
                options, sent = self.task_options(job)
                refused = self._unplaceable(job, options.get("num_gpus", 0), capacity)
                if refused is not None:
                    yield refused
                    continue
                ref = self._task.options(**options).remote(sent.to_dict(), self.timeout_s, self.memory_bytes,
                                                           self.workdir)
                pending[ref] = job
                self._running = len(pending)   # a shutdown during submission cancels what was sent
            while pending:
                if self._interrupted.is_set():
                    yield from self._abandon(pending)
                    break
                # A short wait, so the daemon's shutdown is noticed while a long job runs.
                done, _ = ray.wait(list(pending), num_returns=1, timeout=0.5)
                if done:
                    ref = done[0]
                    job = pending.pop(ref)
                    self._running = len(pending)
                    yield self._collect(ref, job)
        finally:
            self._running = 0
            self._interrupted.clear()   # an interrupt is for this batch, not the next one
            for ref in pending:  # the caller stopped early: the jobs' leases go back anyway
                try:
                    ray.cancel(ref, force=True)
                except Exception:  # noqa: BLE001 (a task that already ended cannot be cancelled)
                    pass

    def _collect(self, ref: Any, job: ScoreJob) -> ScoreOutcome:
        ray = self._ray
        try:
            answer = ray.get(ref)
        except ray.exceptions.RayError as exc:
            # The worker died (killed, out of memory, its node lost) before answering.
            text = " ".join(str(exc).split())[:400]
            error = ScoreError(type(exc).__name__, f"the Ray worker scoring {job.name()} died without an "
                               f"answer: {text}")
            return ScoreOutcome(job, error=error, worker=f"ray:{socket.gethostname()}")
        try:
            outcome = ScoreOutcome.from_json(answer)
        except (KeyError, TypeError, ValueError) as exc:
            error = ScoreError("RuntimeError", f"the Ray worker's answer for {job.name()} cannot be read "
                               f"({type(exc).__name__}: {exc}); is the same lstar-monitor installed on every node?")
            return ScoreOutcome(job, error=error, worker="ray")
        # The job as the daemon built it (not as sent, which may carry device_map).
        return dataclasses.replace(outcome, job=job)

    def _abandon(self, pending: dict[Any, ScoreJob]) -> Iterator[ScoreOutcome]:
        """Cancel the running tasks after `interrupt`; their jobs go back to the queue."""
        for ref, job in list(pending.items()):
            try:
                self._ray.cancel(ref, force=True)
            except Exception:  # noqa: BLE001 (it may have just ended: its lease goes back all the same)
                pass
            del pending[ref]
            yield ScoreOutcome(job, error=ScoreError("ScoringInterrupted", f"the Ray task scoring {job.name()} "
                                                     "was cancelled by the shutdown"), worker="ray")

    def call(self, fn: Any, *args: Any, what: str = "the task") -> Any:
        """Run `fn(*args)` as one Ray task (one CPU, no retries: the caller's queue retries) and
        return its value; the daemon's shutdown (`interrupt`) cancels it, and a worker that died
        raises. Used for the daemon's active evaluations, beside the score jobs."""
        from monitor.scoring.child import ScoringInterrupted

        ray = self._ray
        options: dict[str, Any] = {"num_cpus": self.num_cpus, "max_retries": 0}
        if ENV_VAR in os.environ:
            options["runtime_env"] = {"env_vars": {ENV_VAR: os.environ[ENV_VAR]}}
        ref = ray.remote(fn).options(**options).remote(*args)
        self._running += 1
        try:
            while True:
                if self._interrupted.is_set():
                    try:
                        ray.cancel(ref, force=True)
                    except Exception:  # noqa: BLE001 (it may have just ended)
                        pass
                    raise ScoringInterrupted(f"the Ray task running {what} was cancelled by the shutdown")
                done, _ = ray.wait([ref], num_returns=1, timeout=0.5)
                if done:
                    break
            try:
                return ray.get(ref)
            except ray.exceptions.RayError as exc:
                text = " ".join(str(exc).split())[:400]
                raise RuntimeError(f"the Ray worker running {what} died without an answer: {text}") from None
        finally:
            self._running = max(0, self._running - 1)
            if not self._running:
                self._interrupted.clear()

    def interrupt(self) -> int:
        """Cancel the running tasks (the daemon's shutdown); how many were running."""
        running = self._running
        if running:
            self._interrupted.set()
        return running

    def close(self) -> None:
        """Disconnect from the cluster if this backend connected (a local instance stops)."""
        if self._owns and self._ray.is_initialized():
            self._ray.shutdown()
        self._owns = False
