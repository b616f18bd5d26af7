"""A template process for warm scoring workers: it imports torch and transformers once, and
each warm worker of the pool is forked from it, ready, instead of importing them again.

Importing the scoring libraries costs about 4 CPU-seconds a process (more on a loaded
machine); a pool that replaces its workers (after a crash, a time limit, a quota of jobs, a
memory threshold) paid it again for each one. With a template, a pool pays it once.

Why a fork here is safe: the template only imports. It runs no torch operation, so neither
OpenMP's nor torch's thread pools have started when it forks; the only other threads are
OpenBLAS's (started by importing numpy and scipy), which OpenBLAS shuts down before a fork
and restarts after it (its `pthread_atfork` handlers). The template starts no Python thread.
`tests/test_warm_workers.py` checks that forked workers score what a cold child and the
engine score, and that they die with the template.

Bounds, as for a worker started on its own (`monitor.scoring.backends.warm`):
- the template starts under the pool's address-space limit and dies with the process that
  started it (`limit_child`); each worker inherits the limit and dies with the template
  (`PR_SET_PDEATHSIG` again after the fork), so a daemon killed with SIGKILL takes the
  template and then every worker with it;
- the template is the workers' parent: it reaps each and reports its exit status, so a death
  is described exactly as a child's (the signal that killed it).

The daemon's active evaluations (`monitor.curves.eval_child`) are forked from the same
template when its pool has one, under the same bounds.

Protocol: `python -m monitor.scoring.template CONTROL_FD`, CONTROL_FD one end of a
`SOCK_SEQPACKET` socket pair. The template says `{"ready": PID}` once imported. A request
`{"fork": {"module", "args", "env", "cwd"}, "id": ID}` comes with two or three file descriptors (the
child's stdin, its combined stdout and stderr, and a third the child is given as its last
argument: a warm worker's status pipe); the child runs `module.main([*args, FD])` and exits.
It is answered `{"forked": PID, "id": ID}` (ID: the request's own `id`, so that an answer
that comes after its fork gave up is never taken for another's); `{"kill": PID}`
SIGKILLs a worker not yet reaped; `{"exit": PID, "returncode": N}` is sent when a worker
has exited (N negative: the signal). End of the socket ends the template. Fail point
(`LSTAR_FAILPOINT`): `hang_worker_template` sleeps for ever before the imports.
"""

from __future__ import annotations

import contextlib
import faulthandler
import importlib
import json
import logging
import os
import queue
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from monitor.scoring.memory_limit import PROBE_MODULES, limit_child

log = logging.getLogger(__name__)

_MESSAGE_BYTES = 1 << 20
# What a forked child may run (its `main(argv)`): a warm worker, or one active evaluation.
CHILD_MODULES = {"monitor.scoring.warm": "monitor.scoring.warm", "monitor.curves.eval_child": "monitor.curves.eval_child"}


# What the reader queues for a fork waiting on an answer once the template has ended.
_ENDED = ("ended", None)


class TemplateUnavailable(OSError):
    """The template process could not fork a worker (it died, or did not start in time)."""


# ---------------------------------------------------------------- the template process


def _reap(control: socket.socket, live: set[int]) -> None:
    """Reap every exited worker and report its exit status."""
    while live:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        live.discard(pid)
        control.send(json.dumps({"exit": pid, "returncode": os.waitstatus_to_exitcode(status)}).encode())


def _become_worker(request: dict[str, Any], fds: list[int], keep_closed: list[int]) -> None:
    """In the forked child: take the worker's pipes and environment, run the warm worker's
    loop, and exit (never returns)."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in keep_closed:
            with contextlib.suppress(OSError):
                os.close(fd)
        template_pid = os.getppid()
        limit_child(None)                    # die with the template (the address-space limit is inherited)
        if os.getppid() != template_pid:     # the template died before the line above
            os._exit(1)
        stdin_fd, output_fd, *extra_fds = fds
        os.dup2(stdin_fd, 0)
        os.dup2(output_fd, 1)
        os.dup2(output_fd, 2)
        os.close(stdin_fd)
        os.close(output_fd)
        os.environ.clear()
        os.environ.update(request.get("env") or {})
        if request.get("cwd"):
            os.chdir(request["cwd"])
        module = importlib.import_module(CHILD_MODULES[request["module"]])
        code = module.main([*map(str, request.get("args") or ()), *map(str, extra_fds)])
    except BaseException:  # noqa: BLE001 - the parent reads the traceback from the output pipe
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def main(argv: list[str] | None = None) -> int:
    """Template entry point: import the scoring libraries, then fork workers on request."""
    from monitor.environment import harden_environment
    from monitor.failpoints import failpoint_values

    args = sys.argv[1:] if argv is None else argv
    control = socket.socket(fileno=int(args[0]))
    faulthandler.enable()
    harden_environment()
    if "hang_worker_template" in failpoint_values():   # crash tests: a template that never gets ready
        while True:
            time.sleep(3600)
    try:
        for name in PROBE_MODULES:     # imports only: no torch operation, so no OpenMP threads yet
            importlib.import_module(name)
    except Exception:  # noqa: BLE001, S110 (a worker's job says why: its own imports fail the same way)
        pass
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    live: set[int] = set()
    control.send(json.dumps({"ready": os.getpid()}).encode())
    while True:
        with contextlib.suppress(InterruptedError):
            ready, _, _ = select.select([control, wake_r], [], [])
        if wake_r in ready:
            with contextlib.suppress(BlockingIOError):
                os.read(wake_r, 4096)
        _reap(control, live)
        if control not in ready:
            continue
        message, fds, _, _ = socket.recv_fds(control, _MESSAGE_BYTES, 3)
        if not message:
            break
        try:
            request = json.loads(message)
        except ValueError:
            request = None
        if not isinstance(request, dict):
            request = {}     # refused below: one bad message must not end every child of this template
        if "kill" in request:
            with contextlib.suppress(TypeError, ValueError, OSError):
                if int(request["kill"]) in live:      # not reaped: the pid is still this worker's
                    os.kill(int(request["kill"]), signal.SIGKILL)
            for fd in fds:
                os.close(fd)
            continue
        fork = request.get("fork")
        if len(fds) not in (2, 3) or not isinstance(fork, dict) or fork.get("module") not in CHILD_MODULES:
            for fd in fds:
                os.close(fd)
            control.send(json.dumps({"forked": None, "id": request.get("id"),
                                     "error": "not a fork request this template runs"}).encode())
            continue
        try:
            pid = os.fork()
        except OSError as exc:   # a process limit, memory: this child, not the template, fails
            for fd in fds:
                os.close(fd)
            control.send(json.dumps({"forked": None, "id": request.get("id"),
                                     "error": f"fork failed: {type(exc).__name__}: {exc}"}).encode())
            continue
        if pid == 0:
            _become_worker(fork, fds, [control.fileno(), wake_r, wake_w])
        for fd in fds:
            os.close(fd)
        live.add(pid)
        control.send(json.dumps({"forked": pid, "id": request.get("id")}).encode())
    return 0


# ---------------------------------------------------------------- the parent's side


class ForkedWorker:
    """A worker forked by the template, with the part of `subprocess.Popen` the warm pool
    uses: `pid`, `stdin`, `stdout`, `poll`, `wait`, `kill`, `returncode`."""

    def __init__(self, template: WorkerTemplate, pid: int, stdin: Any, stdout: Any) -> None:
        self.template, self.pid, self.stdin, self.stdout = template, pid, stdin, stdout

    @property
    def returncode(self) -> int | None:
        return self.template.returncode(self.pid)

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        code = self.template.wait(self.pid, timeout)
        if code is None:
            raise subprocess.TimeoutExpired(f"scoring worker {self.pid}", timeout or 0.0)
        return code

    def kill(self) -> None:
        self.template.kill(self.pid)


class WorkerTemplate:
    """The parent's handle on one template process (`python -m monitor.scoring.template`).

    Start it from a thread that lives as long as the pool: the template dies with the thread
    that forked it (`PR_SET_PDEATHSIG`), and its workers die with it."""

    def __init__(self, *, memory_bytes: int | None, start_timeout_s: float, log_path: Path | None = None) -> None:
        self.start_timeout_s = start_timeout_s
        self.memory_bytes = memory_bytes       # the address-space limit its children inherit
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        # Its output (a crash's trace, a traceback) goes where the workers' does: the scoring log.
        output: Any = subprocess.DEVNULL
        try:
            if log_path is not None:
                output = open(log_path, "ab")  # noqa: SIM115 - the child keeps its own copy
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "monitor.scoring.template", str(theirs.fileno())],
                stdin=subprocess.DEVNULL, stdout=output, stderr=output, close_fds=True,
                pass_fds=(theirs.fileno(),), preexec_fn=lambda: limit_child(memory_bytes))
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
            if output is not subprocess.DEVNULL:
                output.close()
        self._attach(ours)

    def _attach(self, control: socket.socket) -> None:
        """Start reading the template's messages from `control` (its end of the pair)."""
        self._control = control
        self._send_lock = threading.Lock()
        self._fork_lock = threading.Lock()
        self._changed = threading.Condition()
        self._exits: dict[int, int] = {}
        self._forked: queue.Queue = queue.Queue()    # (request id, PID or why none) of each answer
        self._requests = 0
        self.forks = 0          # children forked so far
        self.aborted = False    # ended by `abort` (the pool's shutdown), not by a failure
        self._ready = threading.Event()
        self._gone = threading.Event()
        self._reader = threading.Thread(target=self._read, name="worker-template", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        try:
            while True:
                message = self._control.recv(_MESSAGE_BYTES)
                if not message:
                    break
                try:
                    data = json.loads(message)
                except ValueError:
                    log.warning("template %d sent a line that is not JSON: %r", self.proc.pid, message[:200])
                    continue
                if "ready" in data:
                    self._ready.set()
                elif "forked" in data:   # (request id, PID, or why it forked none)
                    if data.get("forked") is not None:
                        # PIDs wrap: a new child may have the PID of one reaped before, whose
                        # exit status must not make the new one look dead (or unkillable).
                        with self._changed:
                            self._exits.pop(int(data["forked"]), None)
                    self._forked.put((data.get("id"), data.get("forked") or data.get("error")))
                elif "exit" in data:
                    with self._changed:
                        self._exits[int(data["exit"])] = int(data["returncode"])
                        self._changed.notify_all()
        except Exception as exc:  # noqa: BLE001 - logged; the template counts as gone
            log.warning("reading template %d's messages failed: %s: %s", self.proc.pid, type(exc).__name__, exc)
        finally:
            # The template is gone; its workers die with it (PR_SET_PDEATHSIG): SIGKILL.
            with self._changed:
                self._gone.set()
                self._changed.notify_all()
            self._forked.put(_ENDED)

    def alive(self) -> bool:
        return not self._gone.is_set() and self.proc.poll() is None

    def ready(self) -> bool:
        """Running and done importing: a fork is answered at once."""
        return self._ready.is_set() and self.alive()

    def returncode(self, pid: int) -> int | None:
        with self._changed:
            if pid in self._exits:
                return self._exits[pid]
            return -signal.SIGKILL if self._gone.is_set() else None

    def wait(self, pid: int, timeout: float | None) -> int | None:
        with self._changed:
            self._changed.wait_for(lambda: pid in self._exits or self._gone.is_set(), timeout)
        return self.returncode(pid)

    def _send(self, data: dict[str, Any], fds: tuple[int, ...] = ()) -> None:
        with self._send_lock:
            socket.send_fds(self._control, [json.dumps(data).encode()], list(fds))

    def kill(self, pid: int) -> None:
        """SIGKILL worker `pid` (through the template, which knows whether it is reaped)."""
        if self.returncode(pid) is None:
            with contextlib.suppress(OSError):
                self._send({"kill": pid})

    def fork(self, status_fd: int) -> ForkedWorker:
        """A new warm worker writing its status lines to `status_fd` (the caller keeps and
        closes its copy). Raises TemplateUnavailable when the template cannot fork one."""
        return self.fork_module("monitor.scoring.warm", (), extra_fd=status_fd)

    def fork_module(self, module: str, args: tuple[str, ...], *, extra_fd: int | None = None) -> ForkedWorker:
        """A child running `module.main([*args, EXTRA_FD])` (one of CHILD_MODULES), its stdin and
        combined output piped to this process, `extra_fd` passed on (the caller keeps and closes
        its copy). Raises TemplateUnavailable when the template cannot fork one."""
        with self._fork_lock:
            deadline = time.monotonic() + self.start_timeout_s
            while not self._ready.wait(0.2) and self.alive() and time.monotonic() < deadline:
                pass
            if not self._ready.is_set() or not self.alive():
                raise TemplateUnavailable(f"the scoring workers' template process (pid {self.proc.pid}) is not "
                                          f"running (exit code {self.proc.poll()})")
            stdin_r, stdin_w = os.pipe()
            out_r, out_w = os.pipe()
            why = "it stopped"
            self._requests += 1
            request_id = self._requests
            try:
                fds = (stdin_r, out_w) if extra_fd is None else (stdin_r, out_w, extra_fd)
                self._send({"fork": {"module": module, "args": list(args), "env": dict(os.environ),
                                     "cwd": os.getcwd()}, "id": request_id}, fds)
                pid = self._answer(request_id)
            except TemplateUnavailable:
                os.close(stdin_w)
                os.close(out_r)
                raise
            except OSError as exc:
                pid, why = None, f"{type(exc).__name__}: {exc}"
            except queue.Empty:
                pid, why = None, f"no answer within {self.start_timeout_s:g} s"
            finally:
                os.close(stdin_r)
                os.close(out_w)
            if pid is None:
                os.close(stdin_w)
                os.close(out_r)
                raise TemplateUnavailable(f"the scoring workers' template process (pid {self.proc.pid}) "
                                          f"forked no child: {why}")
            self.forks += 1
        return ForkedWorker(self, int(pid), os.fdopen(stdin_w, "wb"), os.fdopen(out_r, "rb"))

    def _answer(self, request_id: int) -> int | None:
        """The PID the template forked for request `request_id` (None: it ended; it raises
        TemplateUnavailable with the template's reason when it forked none). An answer to an earlier request that gave up waiting is dropped: it would
        otherwise name another child. Raises queue.Empty past the start timeout."""
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            answer_id, pid = self._forked.get(timeout=max(0.0, deadline - time.monotonic()))
            if (answer_id, pid) == _ENDED:          # the template ended
                self._forked.put(_ENDED)            # for any later fork too
                return None
            if answer_id == request_id:
                if not isinstance(pid, int):   # it forked none: why, in its words
                    raise TemplateUnavailable(f"the scoring workers' template process (pid {self.proc.pid}) "
                                              f"forked no child: {pid or 'no reason given'}")
                return pid
            if isinstance(pid, int):   # a late answer: its child got no pipes of ours; make sure it ends
                self.kill(pid)

    def abort(self) -> None:
        """SIGKILL the template (the shutdown, or the pool giving it up): a fork waiting for it
        fails at once, and its children die with it."""
        self.aborted = True
        with contextlib.suppress(OSError):
            self.proc.kill()

    def close(self) -> None:
        """End the template (its workers should be stopped first: they die with it). One not
        ready yet (importing, or hung) reads no end of its socket: it is killed at once."""
        if not self._ready.is_set():
            self.abort()
        with contextlib.suppress(OSError):
            self._control.shutdown(socket.SHUT_RDWR)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)
        self._reader.join(timeout=5)
        self._control.close()


if __name__ == "__main__":
    sys.exit(main())
