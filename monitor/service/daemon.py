"""`lstar run`: the unattended watcher — poll, gate, fetch, score, evaluate, dispatch, report.

APScheduler 3.11 is only a clock. Every job is an idempotent reconciler over the database
(the queue of checkpoints, the outbox, the Hub's circuit state), so a run the scheduler
loses (it saves `next_run_time` before running a job), a crash at any instant, or a restart
changes nothing but timing. Triggers are intervals in UTC with `coalesce=True`,
`max_instances=1` and a `misfire_grace_time` of at least one interval: a clock jump or a
DST change yields at most one late run, never two.

The jobs' bodies live in `monitor/jobs/`, one module each, which reach the daemon through
`monitor.jobs.context.JobContext`; this module schedules them (and `--once` runs them in
`ONCE_ORDER`), reloads the policies, and keeps the process healthy (the disk, the database,
stuck jobs).

One process writes the database. Jobs run in scheduler threads, each on its own DuckDB
cursor. Scoring runs in a child process (`monitor.scoring.child`) that never opens the
database: it returns the score rows as JSON, and the daemon writes them together with the
checkpoint's lease completion in one transaction. Baselines and fetch status are written
by the daemon. A child that runs out of time is killed, one that runs out of memory dies at
its address-space limit; either way the daemon goes on.

A lock (`flock` on STATE/lstar.lock, holding the pid) keeps a second daemon off the same
state directory. Under it, at start, the daemon frees every lease an earlier process left
(scores, notifications, evaluations), recording each interrupted attempt with the time it started, so
the work resumes on the first run of its job rather than when the lease would expire.
SIGTERM/SIGINT stop new work, let running jobs finish (bounded by `drain`), CHECKPOINT the
database and exit 0. Past the drain, a running score is killed and running queries are
interrupted; a job that still has not ended after `drain_grace` (blocked outside any query)
is named in the log, and the process exits 1 at once without a CHECKPOINT (the WAL is
replayed on the next start). Policy files are re-read when they change; a
bad file keeps its last good version and the error shows in the log and in /status. A missing
policy folder stops the start; no policy in force, or a receiver secret that does not resolve,
keeps /health unhealthy and makes `--once` exit 2 (`monitor.policy.readiness`).

Disk full: a job whose write fails for lack of space starts an episode (logged once,
/health unhealthy); jobs keep retrying on their ticks, and the episode ends only when a job
succeeds after committing a write that reached the database files. The operator alert that
tells of it is then written once per episode. A DuckDB fatal error invalidates the
connection: /health says so, jobs pause, and the watchdog re-opens the database (DuckDB
replays the WAL; nothing is deleted) until that works. Log-like rows older than the
retention are pruned by the `prune` job (`Store.prune_logs`).

Fail points (`LSTAR_FAILPOINT`, crash tests): `hang_<job>` makes a job sleep until
shutdown (the watchdog reports it); `enospc_writes=N` makes the first N transactions that
change rows fail at commit with DuckDB's disk-full error, `enospc_while=PATH` does so while
PATH exists; `fatal_while=PATH` makes a transaction that changes rows raise
`duckdb.FatalException` while PATH exists, after which the connection raises it for every
use, and re-opening fails, until PATH is gone; plus those of `monitor.hub.queue`,
`monitor.hub.fetch` and `monitor.scoring.child`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from monitor.constants import DAY_S
from monitor.environment import quiet_hub_progress
from monitor.errors import LstarError, PolicyError, ServiceError, StoreError
from monitor.events import configure_logging
from monitor.failpoints import failpoint_values
from monitor.hub import DEFAULT_KEEP_LAST, DEFAULT_MAX_BYTES, HubClient, RetryPolicy
from monitor.jobs import dispatch, evaluate, gate, observe, poll, prune, report, score
from monitor.policy import PolicySet, policy_files_in, policy_fingerprint
from monitor.policy.readiness import policy_problems, require_policy_folder
from monitor.scoring import ScoreRequest, default_memory_limit
from monitor.scoring.backends import ScoringBackend, make_backend
from monitor.service.api_guard import create_api_token
from monitor.service.daemon_store import (DaemonStore, StoreFailpoints, check_writable,
                                          is_database_invalidated, is_disk_full)
from monitor.service.lock import StateLock
from monitor.service.scheduler import add_interval_job, build_scheduler
from monitor.store import DB_NAME, Store, storage_error, utcnow

log = logging.getLogger("lstar.daemon")
INFO_NAME = "daemon.json"
JOB_NAMES = ("poll", "score", "evaluate", "observe", "dispatch", "reload", "report", "prune", "watchdog")
# `--once` runs each job once in this order: the order a checkpoint takes from discovery to
# alert, after the policies are loaded (docs/architecture.md, "The jobs").
ONCE_ORDER = ("reload", "poll", "score", "evaluate", "observe", "dispatch", "report", "prune")


@dataclass
class DaemonConfig:
    """Everything the daemon runs with; intervals and limits in seconds. `lstar run` builds it
    from its validated settings (`monitor.service.settings.RunSettings.daemon_config`)."""

    policies_dir: Path
    state_dir: Path
    endpoint: str | None = None
    api_port: int = 8787
    api_host: str = "127.0.0.1"      # 0.0.0.0 in a container: reads then need the token too
    api_allowed_hosts: tuple[str, ...] = ()   # Host names the API accepts beside the loopback names
    api_idle_timeout: float = 15.0   # a request must arrive whole within this; idle connections close
    api_workers: int = 8              # requests the local API serves at once (more: 503; /health, /metrics apart)
    api_connection_lifetime: float = 60.0  # an API connection closes this long after it opened
    api_max_connections: int = 4096   # open API connections; at the bound the longest-waiting one closes
    once: bool = False
    once_wait: float = 60.0           # with `once`: how long to wait for the alerts it raised to be sent
    once_summary: bool = True         # with `once`: its waiting notes and summary on stdout (else the log)
    log_format: str = "text"          # text | json (one JSON object per log line)
    cache_dir: Path | None = None
    poll_interval: float = 900.0
    score_interval: float = 60.0
    outbox_interval: float = 30.0
    reload_interval: float = 10.0
    report_interval: float = 300.0
    watchdog_interval: float = 10.0
    stuck_after: float = 7200.0       # a job running longer than this is reported as stuck
    score_timeout: float = 3600.0
    # bytes of address space for the scoring child; None: no limit
    score_memory: int | None = field(default_factory=default_memory_limit)
    cache_keep: int | None = DEFAULT_KEEP_LAST   # finished checkpoints kept in the Hub cache; None: all
    cache_max_bytes: int | None = DEFAULT_MAX_BYTES  # and at most this many bytes with the pending ones
    lease: float | None = None        # checkpoint lease; default: score_timeout + 10 min
    score_batch: int = 4              # queue jobs one scoring run takes on at most (at once on Ray)
    drain: float = 60.0
    drain_grace: float = 5.0          # after the drain: how long interrupted jobs get to end
    hub_max_wait: float = 60.0        # longer rate-limit waits end the job instead of sleeping
    hub_cooldown: float = 300.0       # circuit-breaker cool-down after repeated Hub failures
    hub_circuit_threshold: int = 5    # consecutive Hub failures that open the circuit
    retention: float = 90 * DAY_S     # log rows (Hub polls, delivery attempts) older than this are pruned
    prune_interval: float = 6 * 3600.0
    webhook_secret_file: Path | None = None
    template: ScoreRequest = field(default_factory=lambda: ScoreRequest(progress=False))
    scoring_backend: str = "local"    # where scoring runs: local (child processes) | ray
    scoring_workers: int = 1          # local: warm scoring children kept between jobs (0: a fresh child per job)
    worker_max_jobs: int = 20         # a warm worker is replaced after this many jobs
    worker_max_rss: int | None = None  # ... or once its resident memory passes this (None: half its limit)
    scoring_mode: str = "full"        # full | sequential (stop once every watching task is settled)
    ray_address: str | None = None    # the Ray cluster (else $RAY_ADDRESS, else a local one)
    ray_gpu_bytes: int | None = None  # one GPU's memory there: larger CUDA jobs span several GPUs

    @property
    def db_path(self) -> Path:
        return self.state_dir / DB_NAME

    @property
    def lease_s(self) -> float:
        return self.lease if self.lease is not None else self.score_timeout + 600.0


# -- the daemon ----------------------------------------------------------------------------------
@dataclass
class JobState:
    """What the status API tells about one job."""

    name: str
    runs: int = 0
    failures: int = 0
    running_since: float | None = None   # time.time() of the current run's start
    last_start: str | None = None
    last_success: str | None = None
    last_duration_s: float | None = None
    last_error: str | None = None
    last_result: Any = None


def make_scoring_backend(cfg: DaemonConfig) -> ScoringBackend:
    """The scoring backend `cfg` asks for (`--scoring-backend`, `--scoring-workers`, the limits)."""
    options: dict[str, Any] = {"timeout_s": cfg.score_timeout, "memory_bytes": cfg.score_memory}
    if cfg.scoring_backend == "local":
        options.update(workdir=cfg.state_dir / "tmp", log_path=cfg.state_dir / "scoring.log",
                       workers=cfg.scoring_workers, max_jobs=cfg.worker_max_jobs,
                       max_rss_bytes=cfg.worker_max_rss)
    else:
        # An address-space limit breaks CUDA's start-up; on a CPU job it still bounds the
        # scoring child on whichever node runs it.
        options.update(address=cfg.ray_address, gpu_bytes=cfg.ray_gpu_bytes,
                       memory_bytes=cfg.score_memory if cfg.template.device == "cpu" else None)
    return make_backend(cfg.scoring_backend, **options)


class Daemon:
    """The running watcher: lock, store, policies, scheduler, API. Use `run()`."""

    def __init__(self, config: DaemonConfig, *, backend: ScoringBackend | None = None) -> None:
        from monitor.service.metrics import DaemonMetrics

        self.config = config
        self.lock = StateLock(config.state_dir)
        # Unique to this start, even where a restart gets the same host name and pid (pid 1 in
        # a container): the leases of an earlier start are then never taken for its own.
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self.store: Store | None = None
        self.policy_set = PolicySet([])
        self.policy_digest: str | None = None
        # each (policy, task)'s judgement settings as last loaded, and the changes a reload found
        # that job_reload has still to re-evaluate (monitor.service.policy_change)
        self.task_settings: dict[tuple[str, str], dict[str, Any]] | None = None
        self.policy_changes: list[Any] = []
        self.policy_problems: list[str] = []   # no policy in force, missing secrets: unhealthy
        self.metrics = DaemonMetrics()
        self.metrics.store_reader = self.read_store
        self.jobs = {name: JobState(name) for name in JOB_NAMES}
        self.jobs_lock = threading.Lock()
        self.stopping = threading.Event()
        self.poll_requested = threading.Event()
        self.disk_error: dict[str, Any] | None = None
        self.disk_history: list[dict[str, Any]] = []
        self.disk_untold: list[dict[str, Any]] = []   # ended episodes whose operator alert is not written yet
        self.disk_lock = threading.RLock()
        self.db_error: dict[str, Any] | None = None   # set while the database is invalidated
        self.db_history: list[dict[str, Any]] = []
        self.db_lock = threading.RLock()
        self.faults = StoreFailpoints()
        self.job_local = threading.local()            # per job run: did it commit a real write?
        self.unfinished: list[str] = []               # jobs still running when the shutdown gave up on them
        self.live_cursors: set[Any] = set()           # the jobs' DuckDB cursors, interrupted at the drain deadline
        self.scheduler: Any = None
        self.api: Any = None   # the ApiServer, once started
        self.api_socket: Any = None   # its listening socket, made before anything is written
        self.started_at = utcnow()
        self.report_fn = report.report_function()
        # made on the first scoring run, unless the caller lends one (which it closes itself:
        # `lstar demo` keeps one warm worker for all its passes)
        self.backend: ScoringBackend | None = backend
        self.owns_backend = backend is None
        self.pin_problems: list[str] = []             # tasks these scoring settings can never evaluate
        self.job_memory: dict[str, Any] = {}          # what the jobs keep between runs (monitor.jobs.context)

    # -- life cycle ----------------------------------------------------------------------------
    def run(self) -> int:
        """Start, work until SIGTERM/SIGINT (or one pass with `once`), shut down; exit code."""
        from monitor.service.api import listen_socket

        quiet_hub_progress()
        require_policy_folder(self.config.policies_dir)   # before anything is created or opened
        # The port too: one that is taken must cost one line, not a rewritten api.token.
        try:
            self.api_socket = listen_socket(self.config.api_host, self.config.api_port)
        except ServiceError:
            # Most likely this state's own daemon holds it: say so, not "choose another port"
            # (this one would then stop at the lock).
            holder = self.lock.holder()
            if holder is None:
                raise
            raise StoreError(f"another daemon (pid {holder}) holds {self.lock.path} (and port "
                             f"{self.config.api_port} is taken)",
                             hint="it is running already; stop it first, or give this one another "
                                  "--state directory and --api-port") from None
        try:
            self.lock.acquire()
        except BaseException:
            self.api_socket.close()
            raise
        try:
            try:
                self._start()
            except BaseException:
                self._abandon_start()
                raise
            if self.config.once:
                self._run_once()
                if self.policy_problems:
                    log.error("--once: not ready: %s", "; ".join(self.policy_problems))
                    return self._shutdown() or 2
            else:
                self._install_signal_handlers()
                self._start_scheduler()
                while not self.stopping.wait(0.5):
                    pass
                log.info("stopping: no new work; waiting up to %.0f s for running jobs", self.config.drain)
            return self._shutdown()
        finally:
            self.lock.release()

    def _run_once(self) -> None:
        """Every job once, then the outbox until what this run raised is sent (bounded by
        `once_wait`), then the summary on stdout (`once_summary`)."""
        from monitor.service.once import RunTally, print_summary, wait_for_outbox

        with RunTally() as tally:
            for name in ONCE_ORDER:
                if name != "report" or self.report_fn is not None:
                    self._run_job(name)
            # `lstar demo --json` keeps stdout for its own JSON: there the notes go to the log
            say = (lambda line: print(line, flush=True)) if self.config.once_summary else log.info
            pending = wait_for_outbox(self.read_store, lambda: self._run_job("dispatch"),
                                      bound_s=self.config.once_wait, say=say)
        if self.config.once_summary:
            print_summary(tally, pending, sys.stdout)

    def _start(self) -> None:
        # Loaded here, not at import: the commands that import `monitor.service` never serve.
        from monitor.service.api import ApiServer

        cfg = self.config
        check_writable(cfg.state_dir)          # read-only or full: one clear error, nothing opened
        self.store = Store.open(cfg.db_path)   # migrations run (and are checkpointed) here
        self._reclaim_leases()
        with contextlib.suppress(Exception):   # the age of each rule's last good poll survives a restart
            for rule, at in self.store.last_successful_polls().items():
                self.metrics.rule_polled(rule, at.timestamp())
        self._reload_policies(force=True)
        self._check_policy_problems()
        self.check_scoring_pins(start=True)
        self.api = ApiServer(self, port=cfg.api_port, token=create_api_token(cfg.state_dir),
                             workers=cfg.api_workers, idle_timeout=cfg.api_idle_timeout,
                             lifetime=cfg.api_connection_lifetime, host=cfg.api_host,
                             allowed_hosts=cfg.api_allowed_hosts, max_connections=cfg.api_max_connections,
                             sock=self.api_socket).start()
        info = {"pid": os.getpid(), "url": self.api.url, "started_at": self.started_at.isoformat(),
                "db": str(cfg.db_path)}
        tmp = cfg.state_dir / (INFO_NAME + ".part")
        try:
            tmp.write_text(json.dumps(info))
            os.replace(tmp, cfg.state_dir / INFO_NAME)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise storage_error(cfg.state_dir, exc, doing=f"writing {INFO_NAME}") from exc
        log.info("lstar daemon pid %d: state %s, API %s", os.getpid(), cfg.state_dir, self.api.url)

    def _reclaim_leases(self) -> None:
        """Free the leases of every earlier holder at once, so that an interrupted score or
        delivery resumes on the first run of its job instead of when its lease would expire.

        Every holder is provably dead here. The state lock keeps any other daemon off this
        state directory, and this process has just opened the database for writing, which
        DuckDB's file lock allows only while no other process has it open; every process
        that takes a lease (a daemon, `lstar score --pending`, `lstar alerts dispatch`)
        keeps the database open for as long as it holds one. A failure here costs only time:
        the leases are then taken over when they expire.
        """
        assert self.store is not None
        now = utcnow()
        try:
            freed = [*self.store.reclaim_checkpoint_leases(self.owner, now=now),
                     *self.store.reclaim_notification_leases(self.owner, now=now),
                     *self.store.reclaim_observation_leases(self.owner, now=now)]
        except Exception as exc:  # noqa: BLE001 - logged; the leases still expire
            log.error("could not reclaim the leases of earlier processes (they are taken over when "
                      "they expire): %s", exc)
            return
        for lease in freed:
            log.warning("reclaimed the lease of %s on %s %s: attempt %d, started %s, died with its process",
                        lease.owner, lease.table, lease.id, lease.attempt, lease.started_at.isoformat())

    def _abandon_start(self) -> None:
        """Undo a start-up that failed half-way: the API stops, the database closes."""
        if self.api is not None:
            with contextlib.suppress(Exception):
                self.api.stop()
            self.api = None
        elif self.api_socket is not None:
            self.api_socket.close()
        if self.store is not None:
            with contextlib.suppress(Exception):
                self.store.close()
            self.store = None

    def _install_signal_handlers(self) -> None:
        def stop(signum: int, _frame: Any) -> None:
            log.info("received %s", signal.Signals(signum).name)
            self.stopping.set()

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)

    def intervals(self) -> dict[str, float]:
        cfg = self.config
        out = {"poll": cfg.poll_interval, "score": cfg.score_interval, "evaluate": cfg.outbox_interval,
               "observe": cfg.score_interval,
               "dispatch": cfg.outbox_interval, "reload": cfg.reload_interval,
               "prune": cfg.prune_interval, "watchdog": cfg.watchdog_interval}
        if self.report_fn is not None:
            out["report"] = cfg.report_interval
        return out

    def _start_scheduler(self) -> None:
        self.scheduler = build_scheduler(self.intervals())
        now = datetime.now(timezone.utc)
        for name, seconds in self.intervals().items():
            add_interval_job(self.scheduler, name, lambda n=name: self._run_job(n), seconds, now)
        self.scheduler.start()

    def _shutdown(self) -> int:
        if self.scheduler is not None:
            self.scheduler.shutdown(wait=False)
        deadline = time.monotonic() + self.config.drain
        while self._running_jobs() and time.monotonic() < deadline:
            time.sleep(0.1)
        if self._running_jobs():
            # A score that outlives the drain is killed; its lease goes back and it is retried.
            if self.backend is not None and self.backend.interrupt():
                log.warning("stopped the score still running after the %.0f s drain", self.config.drain)
            if "observe" in self._running_jobs():
                from monitor.scoring.child import kill_active_children

                if kill_active_children():   # an evaluation child: its lease and attempt go back
                    log.warning("stopped the evaluation still running after the %.0f s drain", self.config.drain)
            # A query that outlives it is interrupted: its job fails (its transaction rolls
            # back, the next start does that work again) instead of finding the connection
            # closed under it.
            if self._interrupt_queries():
                log.warning("interrupted the database queries still running after the %.0f s drain",
                            self.config.drain)
            deadline = time.monotonic() + self.config.drain_grace
            while self._running_jobs() and time.monotonic() < deadline:
                time.sleep(0.1)
        left = self._running_jobs()
        if left:
            log.warning("jobs still running after the %.0f s drain: %s", self.config.drain, ", ".join(left))
        if self.backend is not None and self.owns_backend:
            with contextlib.suppress(Exception):   # a cluster already gone has nothing to release
                self.backend.close()
        if self.api is not None:
            self.api.stop()
        with contextlib.suppress(OSError):
            (self.config.state_dir / INFO_NAME).unlink()
        if self.db_error is not None:  # its supervisor starts it again, which re-opens the file
            log.error("stopping with the database still invalidated: %s", self.db_error["error"])
            if self.store is not None:
                with contextlib.suppress(Exception):
                    self.store.close()
            return 1
        if left:
            # A job still inside a DuckDB call holds the connection ("connection is busy"):
            # neither CHECKPOINT nor close can run. What was committed is in the WAL, which
            # the next start replays (it holds no DDL: that is checkpointed at start-up); the
            # jobs' open transactions roll back and their work is done again then.
            self.unfinished = left
            log.error("not stopped cleanly: job(s) %s did not end within the %.0f s drain and %.0f s "
                      "grace; exiting without a CHECKPOINT (the next start replays the WAL and does "
                      "their work again)", ", ".join(left), self.config.drain, self.config.drain_grace)
            return 1
        if self.store is not None:
            try:
                self.store.checkpoint()
                self.store.close()
            except Exception as exc:  # noqa: BLE001 - reported, and the exit code says so
                log.error("CHECKPOINT or close on shutdown failed: %s", exc)
                return 1
        log.info("stopped cleanly")
        return 0

    def _running_jobs(self) -> list[str]:
        with self.jobs_lock:
            return [j.name for j in self.jobs.values() if j.running_since is not None]

    def _interrupt_queries(self) -> int:
        """Interrupt the query each job's cursor is running; returns the cursors told."""
        with self.jobs_lock:
            cursors = list(self.live_cursors)
        for cursor in cursors:
            with contextlib.suppress(Exception):   # a cursor closed meanwhile has nothing to stop
                cursor.interrupt()
        return len(cursors)

    # -- job plumbing --------------------------------------------------------------------------
    def _cursor(self) -> Any:
        store = self.store
        if store is None:
            raise StoreError(f"{self.config.db_path} is being re-opened after a fatal database error",
                             hint="see /health; try again shortly")
        return store.cursor()

    @contextlib.contextmanager
    def _cursor_store(self, *, read_only: bool) -> Iterator[DaemonStore]:
        cursor = self._cursor()
        store = DaemonStore(cursor, self.config.db_path, read_only=read_only)
        store.faults = self.faults
        store.cursor_tracker = self._track_cursor
        if not read_only:
            store.on_write = self._wrote
        with self.jobs_lock:
            self.live_cursors.add(cursor)
        try:
            yield store
        finally:
            with self.jobs_lock:
                self.live_cursors.discard(cursor)
            with contextlib.suppress(Exception):
                store.conn.close()

    def _track_cursor(self, cursor: Any) -> Callable[[], None]:
        """Interrupt `cursor` at the drain deadline too (a cursor a job's read opened of its own,
        such as a report's ranks); returns the call that forgets it."""
        with self.jobs_lock:
            self.live_cursors.add(cursor)

        def forget() -> None:
            with self.jobs_lock:
                self.live_cursors.discard(cursor)
        return forget

    def job_store(self) -> contextlib.AbstractContextManager[DaemonStore]:
        """A writable store on a fresh cursor (DuckDB connections are not thread-safe)."""
        return self._cursor_store(read_only=False)

    def read_store(self) -> contextlib.AbstractContextManager[Store]:
        """A store on a fresh cursor for the API's reads (never blocks on a job)."""
        return self._cursor_store(read_only=True)

    def _wrote(self) -> None:
        """A commit reached the database files (called in the thread that committed)."""
        self.job_local.wrote = True

    def _run_job(self, name: str) -> None:
        if self.stopping.is_set() and not self.config.once:
            return
        if self.db_error is not None and name not in ("reload", "watchdog"):
            return  # nothing can use the database until the watchdog has re-opened it
        job = self.jobs[name]
        start = time.time()
        with self.jobs_lock:
            job.running_since = start
            job.last_start = datetime.fromtimestamp(start, timezone.utc).isoformat()
        self.job_local.wrote = False
        try:
            if f"hang_{name}" in failpoint_values():
                log.warning("fail point hang_%s: job %s sleeps until shutdown", name, name)
                self.stopping.wait()
                return
            job.last_result = getattr(self, f"job_{name}")()
        except Exception as exc:  # noqa: BLE001 - a job failure must never stop the daemon
            job.failures += 1
            reason = exc.one_line() if isinstance(exc, LstarError) else f"{type(exc).__name__}: {exc}"
            job.last_error = reason
            self.metrics.job_failures.labels(job=name).inc()
            if is_database_invalidated(exc):
                self._database_invalidated(name, reason)
            elif is_disk_full(exc):
                self._disk_full(name, reason)
            else:
                log.error("job %s failed: %s", name, reason, exc_info=not isinstance(exc, LstarError))
        else:
            job.last_error = None
            job.last_success = utcnow().isoformat()
            self.metrics.last_success.labels(job=name).set(time.time())
            # Only a job that succeeded after a commit that reached the files ends an episode:
            # one that wrote nothing proves nothing about the disk.
            if self.disk_error is not None and getattr(self.job_local, "wrote", False):
                self._disk_recovered(name)
            elif self.disk_untold and self.disk_error is None:
                self._tell_disk_episodes()
        finally:
            duration = time.time() - start
            with self.jobs_lock:
                job.runs += 1
                job.running_since = None
                job.last_duration_s = round(duration, 3)
            self.metrics.job_duration.labels(job=name).observe(duration)

    def _disk_full(self, job: str, reason: str) -> None:
        """A write failed for lack of space: start the episode (told once), or count the failure."""
        with self.disk_lock:
            now = utcnow().isoformat()
            if self.disk_error is None:
                self.disk_error = {"since": now, "job": job, "failures": 0, "error": reason}
                log.error("DISK FULL: job %s could not write (%s); nothing was committed, it is retried "
                          "on the next tick. Free space in %s.", job, reason, self.config.state_dir)
            self.disk_error["failures"] += 1
            self.disk_error["last"] = now
            self.metrics.disk_full.set(1)

    def _disk_recovered(self, job: str) -> None:
        """Job `job` succeeded after committing a write that reached the database files, so
        writes work again. The episode ends once its operator alert (itself a write) is
        recorded; if that write fails for lack of space, the episode goes on."""
        with self.disk_lock:
            if self.disk_error is None:
                return  # another job ended the episode meanwhile
            episode = {**self.disk_error, "recovered_at": utcnow().isoformat(), "recovered_by": job}
            try:
                told = self._tell_disk_episode(episode)
            except Exception as exc:  # noqa: BLE001 - reported; the alert is retried later
                if is_disk_full(exc):
                    self.disk_error["failures"] += 1
                    self.disk_error["last"] = utcnow().isoformat()
                    return
                log.error("could not record the disk-full operator alert (retried later): %s", exc)
                told = False
            if not told:
                self.disk_untold.append(episode)
            self.disk_error = None
            self.disk_history = [*self.disk_history[-9:], episode]
            self.metrics.disk_full.set(0)
        log.warning("disk writes work again (full since %s, %d failed writes)", episode["since"],
                    episode["failures"])
        self.nudge("dispatch")

    def _tell_disk_episode(self, episode: dict[str, Any]) -> bool:
        """Write the operator alert of one episode (its key is the episode's start, so it is
        written once); False when no policy is in force to tell."""
        from monitor.alerts import operator_alerts

        alerts = operator_alerts(self.policies(), kind="disk-full", key=episode["since"],
                                 summary=f"the disk of {self.config.state_dir} was full; writes failed "
                                         f"from {episode['since']} to {episode['recovered_at']}",
                                 description=episode["error"], now=utcnow())
        if not alerts:
            return False
        with self.job_store() as store:
            store.raise_operator_alerts([a.as_row() for a in alerts], now=utcnow())
        return True

    def _tell_disk_episodes(self) -> None:
        """Retry the operator alerts of ended episodes that could not be written then."""
        with self.disk_lock:
            for episode in list(self.disk_untold):
                try:
                    if not self._tell_disk_episode(episode):
                        return
                except Exception as exc:  # noqa: BLE001 - tried again after the next job
                    log.error("could not record the disk-full operator alert (retried later): %s", exc)
                    return
                self.disk_untold.remove(episode)
                self.nudge("dispatch")

    def _database_invalidated(self, job: str, reason: str) -> None:
        """A DuckDB fatal error: unhealthy until the watchdog has re-opened the database."""
        with self.db_lock:
            if self.db_error is None:
                self.db_error = {"since": utcnow().isoformat(), "job": job, "error": reason,
                                 "reopen_attempts": 0, "reopen_error": None}
                self.metrics.db_invalidated.set(1)
                log.error("DATABASE INVALIDATED: job %s hit a fatal DuckDB error (%s); jobs pause and the "
                          "database is re-opened (its WAL is replayed, never deleted)", job, reason)

    def _reopen_database(self) -> None:
        """Close the invalidated connection (which closes every cursor on it) and open the file
        again; on failure, stay unhealthy and try again on the next watchdog tick."""
        with self.db_lock:
            if self.db_error is None:
                return
            self.db_error["reopen_attempts"] += 1
            old, self.store = self.store, None
            if old is not None:
                with contextlib.suppress(Exception):
                    old.close()
            try:
                self.faults.check_reopen()
                self.store = Store.open(self.config.db_path)
            except Exception as exc:  # noqa: BLE001 - reported in /health, retried
                reason = exc.one_line() if isinstance(exc, LstarError) else f"{type(exc).__name__}: {exc}"
                if self.db_error["reopen_error"] != reason:
                    log.error("could not re-open %s yet: %s", self.config.db_path, reason)
                self.db_error["reopen_error"] = reason
                return
            episode = {**self.db_error, "reopened_at": utcnow().isoformat()}
            self.db_error = None
            self.db_history = [*self.db_history[-9:], episode]
            self.metrics.db_invalidated.set(0)
        log.warning("re-opened %s after the fatal error of %s", self.config.db_path, episode["since"])

    # -- policies ------------------------------------------------------------------------------
    def policy_files(self) -> list[Path]:
        return policy_files_in(self.config.policies_dir)

    def _reload_policies(self, *, force: bool = False) -> bool:
        """Re-read the policy folder when anything in it changed; a file that fails keeps its
        last good version (or none) and its error shows in /status, the others load."""
        files = self.policy_files()
        digest = policy_fingerprint(files)  # bounded reads: a FIFO or a huge file cannot stall it
        if not force and digest == self.policy_digest:
            return False
        self.policy_digest = digest
        errors = self.policy_set.reload(files)
        self.metrics.policy_reloaded(ok=not errors)
        for path, message in errors.items():
            kept_note = "the last good version stays in force" if path in self.policy_set.policies \
                else "no version of it is in force"
            log.error("policy %s not loaded (%s):\n%s", path, kept_note, message)
        if not files:
            log.warning("no policy files (*.yaml) in %s", self.config.policies_dir)
        log.info("policies in force: %s", ", ".join(p.name for p in self.policies()) or "none")
        self._note_policy_changes()
        return True

    def _note_policy_changes(self) -> None:
        """Compare each task's judgement settings (curve, margin and level, ...) with the last
        load's; the changed tasks wait in `policy_changes` for `job_reload` to re-evaluate."""
        from monitor.service.policy_change import changed_tasks, settings_in_force, settings_judged

        settings = settings_in_force(self.policies())
        before = self.task_settings
        if before is None and self.store is not None:   # at start: what the stored predictions were judged by
            with self.job_store() as store:
                before = settings_judged(store, settings)
        if before is not None:
            self.policy_changes += changed_tasks(before, settings)
        self.task_settings = settings

    def _reevaluate_policy_changes(self) -> list[str]:
        """Re-evaluate what each noted policy change affects (resolving what no longer holds,
        through the outbox), record it and log one line each; returns the lines."""
        from monitor.service.policy_change import reevaluate_change

        lines = []
        policies = {p.name: p for p in self.policies()}
        while self.policy_changes:
            change = self.policy_changes[0]
            if change.policy in policies:
                with self.job_store() as store:   # a failure leaves the change noted: tried next tick
                    done = reevaluate_change(store, policies[change.policy], change, now=utcnow())
                log.info("%s", done.summary)
                lines.append(done.summary)
            self.policy_changes.pop(0)
        return lines

    def _check_policy_problems(self) -> None:
        """Re-check that a policy is in force and every secret its receivers name resolves
        (on every reload tick: a secret file may appear or vanish); each problem is logged
        when it appears, and /health reports them."""
        problems = policy_problems(self.config.policies_dir, self.policy_set)
        for problem in problems:
            if problem not in self.policy_problems:
                log.error("%s", problem)
        if self.policy_problems and not problems:
            log.info("every policy problem is fixed: %s", ", ".join(p.name for p in self.policies()))
        self.policy_problems = problems

    def policies(self) -> list[Any]:
        return self.policy_set.current()

    def watch_rules(self) -> list[Any]:
        return poll.watch_rules(self.policies())

    # -- the jobs ------------------------------------------------------------------------------
    def hub_client(self, store: Store):
        policy = RetryPolicy(max_wait_s=self.config.hub_max_wait, circuit_cooldown_s=self.config.hub_cooldown,
                             circuit_threshold=self.config.hub_circuit_threshold)
        return HubClient(self.config.endpoint, store=store, policy=policy)

    def check_scoring_pins(self, *, start: bool = False) -> None:
        """Compare the scoring settings with every policy curve's pin (`monitor.curves.pins`): one
        error line per task that can never be evaluated, and /health degraded while there is one;
        at start, refuse when no task of any policy can be evaluated."""
        from monitor.curves.pins import ScoringSetup, pin_problems, unevaluable_policies
        from monitor.scoring.engine import corpus_selection

        t = self.config.template
        try:
            corpus: str | None = corpus_selection(t).sha256
        except (LstarError, OSError):
            corpus = None   # scoring reports the corpus itself; the window is still checked
        policies = self.policies()
        problems = pin_problems(policies, ScoringSetup(corpus_sha256=corpus, max_context=t.max_context,
                                                       stride=t.stride, disjoint=t.disjoint))
        lines = [p.line() for p in problems]
        if lines != self.pin_problems:
            for line in lines:
                log.error("%s", line)
        self.pin_problems = lines
        if start and unevaluable_policies(policies, problems):
            raise PolicyError(f"no task of any policy can be evaluated with these scoring settings "
                              f"({len(lines)} task(s), each logged above; first: {lines[0]})",
                              hint="change the lstar run flags named there, or fit curves for these settings")

    def job_reload(self) -> dict[str, Any]:
        changed = self._reload_policies()
        self._check_policy_problems()
        if changed:
            self.check_scoring_pins()
        reevaluated = self._reevaluate_policy_changes()
        if reevaluated:
            self.nudge("dispatch")   # a resolve (or a new alert) waits in the outbox
        return {"changed": changed, "errors": {str(k): v for k, v in self.policy_set.errors.items()},
                "policy_changes": reevaluated}

    def job_poll(self) -> dict[str, Any]:
        return poll.run(self, self.poll_requested, then=gate.gate)

    def scoring_backend(self) -> ScoringBackend:
        """The backend scoring runs on (`--scoring-backend`), made on first use: connecting
        to a Ray cluster waits until there is something to score."""
        if self.backend is None:
            self.backend = make_scoring_backend(self.config)
        return self.backend

    def job_score(self) -> list[dict[str, Any]]:
        return score.run(self)

    def job_evaluate(self) -> dict[str, Any]:
        return evaluate.run(self)

    def job_observe(self) -> dict[str, Any]:
        return observe.run(self)

    def job_dispatch(self) -> dict[str, Any]:
        return dispatch.run(self)

    def job_report(self) -> Any:
        assert self.report_fn is not None
        return report.run(self, self.report_fn)

    def job_prune(self) -> dict[str, int]:
        return prune.run(self)

    def job_watchdog(self) -> dict[str, str]:
        if self.db_error is not None:
            self._reopen_database()
        stuck = self.stuck_jobs()
        for name in self.jobs:
            self.metrics.stuck.labels(job=name).set(1 if name in stuck else 0)
        for name, reason in stuck.items():
            log.error("watchdog: %s", reason)
        return stuck

    def stuck_jobs(self) -> dict[str, str]:
        """Jobs running longer than `stuck_after`, with a reason each."""
        now = time.time()
        out = {}
        with self.jobs_lock:
            for job in self.jobs.values():
                if job.running_since is not None and now - job.running_since > self.config.stuck_after:
                    out[job.name] = (f"job {job.name} has been running for {now - job.running_since:.0f} s "
                                     f"(limit {self.config.stuck_after:g} s), since {job.last_start}")
        return out

    def nudge(self, name: str) -> None:
        """Run job `name` as soon as possible (its schedule stays as it was)."""
        if self.scheduler is None or self.stopping.is_set():
            return
        with contextlib.suppress(Exception):  # the scheduler may be shutting down
            self.scheduler.modify_job(name, next_run_time=datetime.now(timezone.utc))

    def request_poll(self) -> None:
        """Poll now (a Hub webhook said something changed)."""
        self.poll_requested.set()
        self.nudge("poll")

    # -- what the API reports --------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        try:
            with self.read_store() as store:
                counts = store.checkpoint_counts()
                outages = [o for o in store.hub_outages() if o.ended_at is None]
                not_evaluated = store.not_evaluated_summary()
                observations = store.observation_summary()
        except Exception as exc:
            # While the database is invalidated the rest of the status is what the operator needs.
            if is_database_invalidated(exc):
                self._database_invalidated("status", f"{type(exc).__name__}: {exc}")
            elif self.db_error is None:
                raise
            counts, outages, not_evaluated, observations = {}, [], [], []
        with self.jobs_lock:
            jobs = {name: dict(vars(j)) for name, j in self.jobs.items()}
        for j in jobs.values():
            j["last_result"] = _summary(j["last_result"])
            j["running_for_s"] = round(time.time() - j["running_since"], 1) if j["running_since"] else None
        next_runs = {}
        if self.scheduler is not None:
            with contextlib.suppress(Exception):
                next_runs = {j.id: j.next_run_time.isoformat() if j.next_run_time else None
                             for j in self.scheduler.get_jobs()}
        for name, when in next_runs.items():
            jobs[name]["next_run"] = when
        return {"pid": os.getpid(), "started_at": self.started_at.isoformat(),
                "state_dir": str(self.config.state_dir), "db": str(self.config.db_path),
                "stopping": self.stopping.is_set(),
                "checkpoints": counts,
                "policies": [{"name": p.name, "path": str(p.path)} for p in self.policies()],
                "policy_errors": {str(k): v for k, v in self.policy_set.errors.items()},
                "jobs": jobs, "stuck": self.stuck_jobs(), "scoring_pins": list(self.pin_problems),
                "not_evaluated": not_evaluated, "observations": observations,
                "disk": {"error": self.disk_error, "history": self.disk_history},
                "database": {"error": self.db_error, "history": self.db_history},
                "hub_outages": [{k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in o.as_dict().items()}
                                for o in outages]}

    def health(self) -> tuple[bool, list[str]]:
        """(healthy, reasons): unhealthy while no policy is in force or a receiver's secret is
        missing, a job is stuck, writes fail for lack of space, the database is invalidated, or a
        policy task can never be evaluated with the scoring settings (degraded); in-memory state
        only, so it answers whatever the disk does."""
        reasons = [*self.policy_problems, *self.stuck_jobs().values()]
        reasons += [f"degraded: {line}" for line in self.pin_problems]
        db_error = self.db_error
        if db_error is not None:
            reasons.append(f"database invalidated since {db_error['since']} (nothing can be written until it "
                           f"is re-opened): {db_error['error']}")
        disk_error = self.disk_error
        if disk_error is not None:
            reasons.append(f"disk full since {disk_error['since']}: {disk_error['error']}")
        return not reasons, reasons


def _summary(value: Any) -> Any:
    """A JSON-safe, short form of a job's last result."""
    try:
        text = json.dumps(value, default=str)
    except (TypeError, ValueError):
        return str(value)[:2000]
    return json.loads(text) if len(text) <= 20000 else text[:2000]


def run_daemon(config: DaemonConfig) -> int:
    """Run the daemon in this process until stopped; returns the exit code."""
    configure_logging(config.log_format)
    for noisy in ("apscheduler", "httpx", "httpx2", "huggingface_hub"):  # one line per job run or request
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # A tick that finds its job still running is expected (max_instances=1), not a warning.
    logging.getLogger("apscheduler.scheduler").addFilter(
        lambda record: "maximum number of running instances" not in record.getMessage())
    daemon = Daemon(config)
    code = daemon.run()
    if daemon.unfinished:
        exit_now(code)
    return code


def exit_now(code: int) -> None:
    """End the process with `code` at once, the logs flushed first.

    For a shutdown that gave up on jobs still running: their threads (the scheduler's pool,
    not daemon threads) would keep the interpreter alive at exit, and a job blocked outside
    any query (no interrupt reaches it) would never let the process end."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


__all__ = ["DaemonConfig", "Daemon", "make_scoring_backend", "StateLock", "run_daemon", "build_scheduler", "add_interval_job",
           "DaemonStore", "is_disk_full"]
