"""The warm pool's template process (`monitor.scoring.template`): its protocol as the daemon
reads it, and what the pool does when the template cannot fork.

The protocol tests play the template's side of the SOCK_SEQPACKET pair by hand (no torch
import: seconds); the fallback tests run the real template under the `hang_worker_template`
fail point, which never gets ready.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from monitor.scoring.backends import warm
from monitor.scoring.backends.warm import WarmBackend
from monitor.scoring.template import TemplateUnavailable, WorkerTemplate


class FakeTemplate:
    """The template's end of the control socket, answered by the test."""

    def __init__(self, start_timeout_s: float = 5.0) -> None:
        ours, self.theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        # A stand-in for the template process: alive until the test ends it.
        self.proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        self.template = WorkerTemplate.__new__(WorkerTemplate)
        self.template.start_timeout_s = start_timeout_s
        self.template.memory_bytes = None
        self.template.proc = self.proc
        self.template._attach(ours)
        self.say({"ready": self.proc.pid})

    def say(self, data: dict) -> None:
        self.theirs.send(json.dumps(data).encode())

    def request(self) -> tuple[dict, list[int]]:
        """The next request the daemon sent (its file descriptors closed here)."""
        message, fds, _, _ = socket.recv_fds(self.theirs, 1 << 20, 3)
        for fd in fds:
            os.close(fd)
        return json.loads(message), fds

    def close(self) -> None:
        self.theirs.close()
        self.proc.kill()
        self.proc.wait()
        self.template._reader.join(timeout=5)
        self.template._control.close()


def template_running(script: str) -> tuple[WorkerTemplate, subprocess.Popen, socket.socket]:
    """A real template process running `script` (its control socket's descriptor as its
    argument), attached to as the pool attaches: the template, its process, our socket end."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    proc = subprocess.Popen([sys.executable, "-c", script, str(theirs.fileno())],
                            pass_fds=(theirs.fileno(),), env={**os.environ, "PYTHONPATH": os.getcwd()})
    theirs.close()
    template = WorkerTemplate.__new__(WorkerTemplate)
    template.start_timeout_s, template.memory_bytes, template.proc = 30.0, None, proc
    template._attach(ours)
    return template, proc, ours


@pytest.fixture
def fake():
    template = FakeTemplate()
    try:
        yield template
    finally:
        template.close()


def wait_for(predicate, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "not within the time allowed"
        time.sleep(0.01)


def fork_answered(fake: FakeTemplate, pid: int):
    """A fork through `fake`, answered `forked: pid` with the request's own id."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(fake.template.fork_module, "monitor.curves.eval_child", ("result.json",))
        request, fds = fake.request()
        assert len(fds) == 2 and request["fork"]["module"] == "monitor.curves.eval_child"
        fake.say({"forked": pid, "id": request.get("id")})
        return future.result(timeout=5)


def test_a_worker_given_the_pid_of_one_reaped_earlier_is_alive_and_can_be_killed(fake):
    """PIDs wrap: a worker forked with the PID of one the template reaped before is not dead
    from the start, and a kill of it reaches the template."""
    first = fork_answered(fake, 4242)
    fake.say({"exit": 4242, "returncode": 0})
    wait_for(lambda: first.poll() is not None)
    assert first.returncode == 0
    second = fork_answered(fake, 4242)       # the same PID, a new process
    assert second.poll() is None
    second.kill()
    request, _ = fake.request()
    assert request == {"kill": 4242}
    with pytest.raises(subprocess.TimeoutExpired):
        second.wait(timeout=0.2)
    fake.say({"exit": 4242, "returncode": -9})
    assert second.wait(timeout=5) == -9
    for worker in (first, second):
        worker.stdin.close()
        worker.stdout.close()


def test_an_answer_that_came_after_its_fork_gave_up_goes_to_no_other_fork():
    """A fork that gave up waiting (no answer within the start timeout) leaves its late answer
    behind: the next fork must get its own child's PID, not the stale one."""
    fake = FakeTemplate(start_timeout_s=0.5)
    try:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(1) as pool:
            future = pool.submit(fake.template.fork_module, "monitor.curves.eval_child", ("a.json",))
            late, _ = fake.request()
            with pytest.raises(TemplateUnavailable):
                future.result(timeout=5)
        fake.say({"forked": 1111, "id": late.get("id")})     # the template answers at last
        time.sleep(0.2)
        worker = fork_answered(fake, 2222)
        assert worker.pid == 2222
        worker.stdin.close()
        worker.stdout.close()
    finally:
        fake.close()


def test_a_fork_closes_its_pipes_when_the_template_forked_nothing(fake):
    """Every path of a failed fork closes the two pipes it made (a template that refuses
    thousands of forks must not leak descriptors)."""
    def open_fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    from concurrent.futures import ThreadPoolExecutor

    before = open_fds()
    with ThreadPoolExecutor(1) as pool:
        for _ in range(20):
            future = pool.submit(fake.template.fork_module, "monitor.curves.eval_child", ("a.json",))
            request, _ = fake.request()
            fake.say({"forked": None, "id": request.get("id"), "error": "refused"})
            with pytest.raises(TemplateUnavailable):
                future.result(timeout=5)
    assert open_fds() <= before + 1     # the executor's thread may hold one


def test_a_template_that_never_gets_ready_is_given_up_once_not_per_worker(tmp_path, monkeypatch, caplog):
    """A template that does not get ready within the start timeout is ended, and the pool's
    workers start on their own from then on: the next worker does not wait for the template
    again, no second template is started, and that is logged once."""
    monkeypatch.setenv("LSTAR_FAILPOINT", "hang_worker_template")
    monkeypatch.setattr(warm, "START_TIMEOUT_S", 1.0)
    pool = WarmBackend(workers=1, timeout_s=300, workdir=tmp_path / "work")
    workers = []
    caplog.set_level(logging.WARNING, logger="monitor.scoring.backends.warm")
    try:
        workers.append(pool._spawn())            # waits the start timeout, then starts on its own
        started = time.monotonic()
        workers.append(pool._spawn())
        assert time.monotonic() - started < 0.9, "the second worker waited for the template again"
        assert pool.templates_started == 1
        assert pool.live_template() is None
        warnings = [r for r in caplog.records if "template" in r.getMessage()]
        assert len(warnings) == 1, [r.getMessage() for r in warnings]
    finally:
        for worker in workers:
            worker.kill()
        pool.close()
    assert all(w.proc.returncode is not None for w in workers)


def test_a_template_that_cannot_start_leaves_workers_starting_on_their_own(tmp_path, monkeypatch, caplog):
    """The template's own start failing (here: no process can be made) is not the job's
    failure: the worker starts on its own, and that is logged once."""
    def refuse(**_kwargs):
        raise OSError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(warm, "WorkerTemplate", refuse)
    pool = WarmBackend(workers=1, timeout_s=300, workdir=tmp_path / "work")
    workers = []
    caplog.set_level(logging.WARNING, logger="monitor.scoring.backends.warm")
    try:
        workers.append(pool._spawn())
        workers.append(pool._spawn())
        warnings = [r for r in caplog.records if "template" in r.getMessage()]
        assert len(warnings) == 1, [r.getMessage() for r in warnings]
        assert pool.started == 2
    finally:
        for worker in workers:
            worker.kill()
        pool.close()


def test_an_evaluation_is_not_handed_a_template_still_importing(tmp_path, monkeypatch):
    """`live_template` (what the daemon's evaluations are forked from) gives only a template
    that is ready: one still importing (or hung) would hold the evaluation up to the start
    timeout before it starts on its own."""
    monkeypatch.setenv("LSTAR_FAILPOINT", "hang_worker_template")
    pool = WarmBackend(workers=1, timeout_s=300, workdir=tmp_path / "work")
    try:
        template = pool._template_for_spawn()
        assert template is not None and template.alive()
        assert pool.live_template() is None
    finally:
        started = time.monotonic()
        pool.close()
    # One not ready reads no end of its socket: it is killed at once, not after a 10 s wait.
    assert time.monotonic() - started < 5


def test_the_shutdown_that_ends_the_template_marks_its_evaluations_interrupted(fake, tmp_path, monkeypatch):
    """`interrupt` ends a template a slot still waits for; an evaluation forked from that
    template dies with it, and must end ScoringInterrupted (its attempt given back), not as a
    child killed by SIGKILL: it is marked before the template is ended, not after."""
    from monitor.scoring import child as child_module
    from monitor.scoring.template import ForkedWorker

    evaluation = ForkedWorker(fake.template, 5151, None, None)
    marked_when_ended: list[set[int]] = []
    monkeypatch.setattr(fake.template, "abort", lambda: marked_when_ended.append(set(child_module._INTERRUPTED)))
    pool = WarmBackend(workers=1, timeout_s=300, workdir=tmp_path / "work")
    with child_module._ACTIVE_LOCK:
        child_module._ACTIVE.add(evaluation)
    try:
        pool._template, pool._spawning = fake.template, 1     # a slot waits for it to fork
        assert pool.interrupt() == 1
        assert marked_when_ended and 5151 in marked_when_ended[0]
    finally:
        with child_module._ACTIVE_LOCK:
            child_module._ACTIVE.discard(evaluation)
            child_module._INTERRUPTED.discard(5151)
        pool._template, pool._spawning = None, 0
        pool.close()


def open_fds(pid: int | str = "self") -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


FORKS = 20


@pytest.mark.slow
def test_forks_from_a_real_template_leak_no_descriptor_and_leave_no_child(tmp_path):
    """The real template (torch imported once) forks 20 children that fail at once (an empty
    stdin): each is reaped and reported with its exit status, and neither this process nor
    the template holds one descriptor more after them than before. The counts are compared
    exactly, so a descriptor kept by any fork shows (with 100 forks the test cost 14.9
    CPU-seconds, with 20 10.3, most of it the template's import of torch)."""
    template = WorkerTemplate(memory_bytes=None, start_timeout_s=300)
    try:
        first = template.fork_module("monitor.curves.eval_child", (str(tmp_path / "r.json"),))
        first.stdin.close()
        assert first.wait(timeout=60) == 1
        first.stdout.read()
        first.stdout.close()
        ours, theirs = open_fds(), open_fds(template.proc.pid)
        for i in range(FORKS):
            child = template.fork_module("monitor.curves.eval_child", (str(tmp_path / f"r{i}.json"),))
            child.stdin.close()
            assert child.wait(timeout=60) == 1       # json.loads("") in the child: exit code 1
            assert b"JSONDecodeError" in child.stdout.read()
            child.stdout.close()
        assert (open_fds(), open_fds(template.proc.pid)) == (ours, theirs)
        assert template.forks == FORKS + 1
        children = Path(f"/proc/{template.proc.pid}/task/{template.proc.pid}/children").read_text().split()
        assert children == []        # every child reaped, none left a zombie
    finally:
        template.close()
    assert template.proc.returncode == 0


def test_a_template_dies_with_the_daemon_that_started_it(tmp_path):
    """A daemon killed with SIGKILL (no close, no end of the socket read) takes its template
    with it: the parent-death signal set before the template's interpreter started."""
    script = ("import os, sys, time\n"
              "from monitor.scoring.template import WorkerTemplate\n"
              "t = WorkerTemplate(memory_bytes=None, start_timeout_s=5)\n"
              "print(t.proc.pid, flush=True)\n"
              "time.sleep(120)\n")
    env = {**os.environ, "LSTAR_FAILPOINT": "hang_worker_template", "PYTHONPATH": os.getcwd()}
    daemon = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, env=env)
    try:
        template_pid = int(daemon.stdout.readline())
        assert Path(f"/proc/{template_pid}/cmdline").read_bytes().split(b"\0")[2] == b"monitor.scoring.template"
    finally:
        daemon.kill()
        daemon.wait()
        daemon.stdout.close()
    deadline = time.monotonic() + 10
    while Path(f"/proc/{template_pid}").exists():
        state = Path(f"/proc/{template_pid}/stat").read_text().rpartition(")")[2].split()[0]
        if state in ("Z", "X"):
            break
        assert time.monotonic() < deadline, f"template {template_pid} outlived its daemon"
        time.sleep(0.05)


def test_a_forked_child_past_its_time_limit_ends_the_wait_even_if_the_template_ignores_the_kill(
        fake, tmp_path, monkeypatch):
    """A cold child SIGKILLed at its time limit is always reaped; a forked one is killed by
    a message to its template. A template that does not act on it (hung) must not hang the
    daemon's evaluation for ever: after the kill's wait the template is ended (its children
    die with it) and the evaluation ends ScoringTimeout."""
    import threading

    from monitor.scoring import child as child_module

    monkeypatch.setattr(child_module, "KILL_WAIT_S", 0.5)
    original_abort = fake.template.abort

    def abort_closes_its_socket() -> None:     # as a real template's death does
        original_abort()
        fake.theirs.close()

    monkeypatch.setattr(fake.template, "abort", abort_closes_its_socket)

    def answer() -> None:
        request, _ = fake.request()
        fake.say({"forked": 6262, "id": request.get("id")})

    threading.Thread(target=answer, daemon=True).start()
    result: list = []
    runner = threading.Thread(target=lambda: result.append(_run_catching(child_module, tmp_path, fake.template)),
                              daemon=True)
    runner.start()
    runner.join(timeout=20)
    assert not runner.is_alive(), "the evaluation still waits for a child its template never killed"
    assert type(result[0]).__name__ == "ScoringTimeout", result
    assert fake.proc.wait(timeout=5) == -9     # the template that ignored the kill was ended


def _run_catching(child_module, tmp_path, template):
    try:
        return child_module.run_child_module("monitor.curves.eval_child", "{}", what="evaluation child",
                                             prefix="eval-", timeout_s=0.3, memory_bytes=None,
                                             workdir=tmp_path / "eval", template=template)
    except Exception as exc:  # noqa: BLE001 - the test reads its class
        return exc


def test_an_evaluation_under_another_memory_limit_is_not_forked_from_the_template(fake, tmp_path):
    """A forked child inherits the template's address-space limit; an evaluation asked to run
    under another one (`--score-memory` changed since the pool started) starts on its own."""
    from monitor.scoring.child import _forked_child

    fake.template.memory_bytes = 8 << 30
    fake.theirs.setblocking(False)
    assert _forked_child(fake.template, "monitor.curves.eval_child", tmp_path / "r.json", 4 << 30) is None
    with pytest.raises(BlockingIOError):
        fake.theirs.recv(1 << 16)           # no fork was asked for


def test_what_the_template_writes_goes_to_the_scoring_log(tmp_path, monkeypatch):
    """A template that crashes says why on its standard error (faulthandler's trace, a
    traceback); it goes to the pool's scoring log, as a worker's output does, not to
    /dev/null. Here the interpreter's own warning about a bad -W option stands for it."""
    monkeypatch.setenv("LSTAR_FAILPOINT", "hang_worker_template")
    monkeypatch.setenv("PYTHONWARNINGS", "nonsense::NoSuchWarningClass")
    log_path = tmp_path / "scoring.log"
    template = WorkerTemplate(memory_bytes=None, start_timeout_s=5, log_path=log_path)
    try:
        deadline = time.monotonic() + 30
        while b"Invalid -W option" not in (log_path.read_bytes() if log_path.exists() else b""):
            assert time.monotonic() < deadline, "nothing of the template's output reached the log"
            time.sleep(0.05)
    finally:
        template.abort()
        template.close()


FORK_FAILS_ONCE = """
import errno, os, sys
import monitor.scoring.template as template
template.PROBE_MODULES = ()          # no torch here: the protocol is what is tested
real_fork, calls = os.fork, []
def fork():
    calls.append(1)
    if len(calls) == 1:
        raise OSError(errno.EAGAIN, "Resource temporarily unavailable")
    return real_fork()
os.fork = fork
sys.exit(template.main([sys.argv[1]]))
"""


def test_a_fork_that_fails_in_the_template_does_not_end_the_template(tmp_path):
    """fork() failing once in the template (EAGAIN: a process limit, memory) is answered
    "forked no child"; the template goes on, with its other children, and the next fork
    succeeds. (Before: the template died of it, and every worker and evaluation with it.)"""
    template, proc, _ = template_running(FORK_FAILS_ONCE)
    try:
        with pytest.raises(TemplateUnavailable, match="Resource temporarily unavailable"):
            template.fork_module("monitor.curves.eval_child", (str(tmp_path / "a.json"),))
        assert template.ready()
        child = template.fork_module("monitor.curves.eval_child", (str(tmp_path / "b.json"),))
        child.stdin.close()
        assert child.wait(timeout=60) == 1 and b"JSONDecodeError" in child.stdout.read()
        child.stdout.close()
    finally:
        template.close()
    assert proc.returncode == 0


def test_a_worker_start_failing_with_an_unexpected_error_fails_the_job_not_the_pool(tmp_path, monkeypatch):
    """A slot whose worker cannot start for a reason that is not an OSError (no thread left
    for its output reader, a SubprocessError from the limits set before exec, a template
    that would not die) must not lose its thread: with one slot, the pool's jobs would wait
    for ever. The job ends with the error instead."""
    def cannot_start(**_kwargs):
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(warm, "WarmWorker", cannot_start)
    pool = WarmBackend(workers=1, timeout_s=300, workdir=tmp_path / "work", use_template=False)
    outcomes: list = []
    import threading

    runner = threading.Thread(target=lambda: outcomes.extend(pool.run(["job-1"])), daemon=True)
    runner.start()
    runner.join(timeout=20)
    try:
        assert not runner.is_alive(), "the job waits for a slot whose thread died"
        [outcome] = outcomes
        assert outcome.error is not None and "can't start new thread" in outcome.error.message
    finally:
        pool.close()


NO_IMPORTS = """
import sys
import monitor.scoring.template as template
template.PROBE_MODULES = ()          # no torch here: the protocol is what is tested
sys.exit(template.main([sys.argv[1]]))
"""


def test_a_malformed_request_is_refused_and_the_template_goes_on(tmp_path):
    """A request that is not JSON, not an object, or a kill of no PID is refused (its
    descriptors closed), not the end of the template and of every child it forked."""
    template, proc, ours = template_running(NO_IMPORTS)
    try:
        wait_for(template.ready, timeout=30)
        for raw in (b"not json", b"[1, 2]", b'{"kill": "x"}', b'{"fork": 3, "id": 9}'):
            read_end, write_end = os.pipe()
            socket.send_fds(ours, [raw], [read_end, write_end])
            os.close(read_end)
            os.close(write_end)
        child = template.fork_module("monitor.curves.eval_child", (str(tmp_path / "b.json"),))
        child.stdin.close()
        assert child.wait(timeout=60) == 1
        child.stdout.close()
        assert template.ready()
        assert open_fds(proc.pid) <= 4 + 3    # stdio, the socket, the wake pipe: none of the refused fds
    finally:
        template.close()
    assert proc.returncode == 0
