"""Which task file an active evaluation runs: the content its policy validated, checked again
on every observe tick, and the very bytes checked handed to the evaluation child.

A policy fingerprints (sha256) each multiple-choice `evaluate.file` when it loads
(`monitor.policy.load.evaluate_problem`). Every observe tick reads each file again, bounded
(`monitor.curves.evaluator.read_task_file`: a regular file of at most 64 MiB, opened without
blocking, so a FIFO or a huge file put in its place is refused at once, not waited on or read
whole), and compares (`check_task_files`):

- unchanged: evaluations are scheduled under that fingerprint;
- changed and still a valid task file: the change is logged (`task_file_changed`), the policy
  takes the new fingerprint as a reload would, and the evaluations scheduled under the old
  one that have not run are superseded by new ones under the new fingerprint
  (`monitor.store.observations.ObservationRows.supersede_observations`);
- unreadable, refused or no longer a valid task file: nothing is scheduled for the task and
  its evaluations wait (pending, with the reason) until the file is mended; the problem is
  one line naming the policy, the task, the file and the fix.

An evaluation reads the file once more, bounded, when it runs (`task_file_as_scheduled`), and
runs only if the bytes have the fingerprint it was scheduled with; the child evaluates a copy
of exactly those bytes, so a file edited while a job runs cannot be what it measured. Any
other case gives the job back (`TaskFileNotAsScheduled`): it waits, pending, for the next
tick to supersede it or for the file to be restored.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from monitor.curves.evaluator import parse_mc_task, read_task_file
from monitor.errors import LabelError, LstarError
from monitor.events import event
from monitor.policy import Policy


class TaskFileNotAsScheduled(LstarError):
    """A job's task file is not, now, the content it was scheduled with: the job waits."""


@dataclass(frozen=True)
class TaskFileCheck:
    """One multiple-choice task of a policy, as this tick found its file."""

    policy: str
    task: str
    file: str                    # evaluate.file as written in the policy
    path: Path                   # where it resolves
    sha256: str | None           # the content its evaluations run now; None while it cannot be used
    problem: str | None = None   # why it cannot be used (one line: policy, task, file, fix)
    changed_from: str | None = None   # the fingerprint this tick replaced

    def settings(self, task: Any) -> dict[str, Any]:
        """What an evaluation of `task` runs under this check (its job's `settings`)."""
        ev = task.evaluate
        return {"kind": ev.kind, "metric": ev.metric, "file": str(self.path), "task_sha256": self.sha256}


def check_task_file(policy: Policy, task: Any) -> TaskFileCheck:
    """Read `task`'s `evaluate.file` bounded and compare it with the policy's fingerprint;
    a changed file that is a valid task file becomes the policy's (see the module).

    Never raises for what is on disk: a path that cannot be resolved (a symlink loop), a
    file that cannot be read and content of any hostile shape are each the check's one-line
    problem, so one bad file holds back only its own task's evaluations."""
    file = task.evaluate.file
    where = f"policy {policy.name}: task {task.name}: "
    waits = "; its evaluations wait until it is mended"
    path = Path(file)
    try:
        path = policy.resolve_path(file).resolve()
        raw = read_task_file(path)
    except LabelError as exc:
        return TaskFileCheck(policy.name, task.name, file, path, None, where + exc.one_line() + waits)
    except Exception as exc:  # noqa: BLE001 - a hostile path (a symlink loop: RuntimeError)
        return TaskFileCheck(policy.name, task.name, file, path, None,
                             f"{where}task file {path}: cannot read: {_exception_text(exc)}{waits}")
    known = policy.task_file_sha256(file)
    sha = hashlib.sha256(raw).hexdigest()
    if sha == known:
        return TaskFileCheck(policy.name, task.name, file, path, sha)
    changed = f"{where}task file {path} changed since the policy was loaded and does not load: "
    mend = f"{waits} (fix it, or restore the file)"
    try:
        parse_mc_task(raw, path)
    except LabelError as exc:
        return TaskFileCheck(policy.name, task.name, file, path, None, changed + exc.one_line() + mend)
    except Exception as exc:  # noqa: BLE001 - parse_mc_task turns every known shape into LabelError
        return TaskFileCheck(policy.name, task.name, file, path, None, changed + _exception_text(exc) + mend)
    policy.note_task_file(file, sha)
    if known is not None:
        event("task_file_changed", policy=policy.name, task=task.name, file=str(path), was=known[:12],
              now=sha[:12])
    return TaskFileCheck(policy.name, task.name, file, path, sha, changed_from=known)


def _exception_text(exc: BaseException) -> str:
    """'RuntimeError: Symlink loop from ...', on one line, bounded."""
    detail = " ".join(str(exc).split())[:200]
    return f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__


def check_task_files(policies: Sequence[Policy]) -> dict[tuple[str, str], TaskFileCheck]:
    """`check_task_file` for every multiple-choice `evaluate:` task: {(policy, task): check}.
    Each check stands alone: a task whose file cannot be used does not stop the others."""
    return {(p.name, t.name): check_task_file(p, t) for p in policies for t in p.tasks
            if t.evaluate is not None and t.evaluate.kind == "multiple_choice"}


def task_file_as_scheduled(settings: dict[str, Any], into: Path) -> Path:
    """A copy, under `into`, of the job's task file holding exactly the content it was scheduled
    with (`settings["task_sha256"]`); raises TaskFileNotAsScheduled when the file cannot be
    read bounded or holds other content. The copy keeps the file's name (the task's name is
    its stem)."""
    path = Path(settings["file"])
    try:
        raw = read_task_file(path)
    except LabelError as exc:
        raise TaskFileNotAsScheduled(exc.message, hint=f"{exc.hint + '; ' if exc.hint else ''}the evaluation "
                                                       "waits, pending, until the file is mended") from None
    sha = hashlib.sha256(raw).hexdigest()
    expected = settings.get("task_sha256")
    if expected and sha != expected:
        raise TaskFileNotAsScheduled(
            f"task file {path} changed since the evaluation was scheduled (sha256 {sha[:12]}, scheduled with "
            f"{expected[:12]})", hint="the evaluation waits, pending: the next observe tick supersedes it with "
                                      "one of the new file once the file is a valid task file")
    copy = into / "task" / path.name
    copy.parent.mkdir(parents=True, exist_ok=True)
    copy.write_bytes(raw)
    return copy


__all__ = ["TaskFileCheck", "TaskFileNotAsScheduled", "check_task_file", "check_task_files",
           "task_file_as_scheduled"]
