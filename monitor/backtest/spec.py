"""What a backtest checks: its tasks (which history rows, at which level), and the policy the
replay runs under.

Two sources, one result (`BacktestSpec`):

- a policy file (`spec_from_policy`), read through the project's one bounded YAML loader
  (`monitor.policy.load_policy`). Each policy task names a curve artifact; that artifact says
  what the task's curve is (the history's task and metric, the baseline b_t, the axis, the
  confidence) and the policy task may set its own margin ε and confidence, exactly as the
  daemon resolves the level b_t + ε (`monitor.alerts.predict.margin_in_force`). The backtest
  refits that curve on the reference lineages; the policy's routes, grouping, timers and
  receivers' rate limits stay as written, every receiver turned into a file sink;
- `--task/--baseline/--margin` on the command line (`spec_from_options`): one task, an
  in-memory policy with one file receiver and the default route (group by policy, repo and
  commit; group_wait 30s, group_interval 5m, repeat_interval 4h).

Either way the replay's policy (`replay_policy`) watches every lineage, reads its scores on
the backtest's synthetic corpus, runs no active evaluation (the comparison is with the
history's own published results) and sends nothing.
"""

from __future__ import annotations

import math

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from monitor.alerts.predict import load_task_curve, margin_in_force
from monitor.curves.artifact import CurveArtifact
from monitor.curves.axes import get_axis
from monitor.errors import CurveError, PolicyError
from monitor.policy import Policy
from monitor.policy.schema import Corpora, FileConfig, Receiver, RootRoute, Task

FAMILIES = ("isotonic", "sigmoid", "auto")
BACKTEST_POLICY = "backtest"


@dataclass(frozen=True)
class BacktestTask:
    """One task of a backtest: the policy task's name, the history's task and metric, and the
    level (baseline + margin) and confidence its curve is fitted and judged at."""

    name: str
    task: str
    metric: str | None
    baseline: float
    margin: float
    confidence: float

    @property
    def level(self) -> float:
        return self.baseline + self.margin


@dataclass(frozen=True)
class BacktestSpec:
    """The tasks, their axis and curve family, and the policy to replay under (None: the
    in-memory one of `spec_from_options`)."""

    tasks: tuple[BacktestTask, ...]
    axis: str
    family: str = "isotonic"
    policy: Policy | None = None
    source: str = "options"   # "options" or the policy file's path

    def __post_init__(self) -> None:
        get_axis(self.axis)
        if self.family not in FAMILIES:
            raise CurveError(f"unknown curve family {self.family!r}", hint=f"choose from {', '.join(FAMILIES)}")
        names = [t.name for t in self.tasks]
        if len(set(names)) != len(names):
            raise CurveError(f"a task is named twice: {', '.join(sorted(names))}")


def spec_from_options(*, task: str | Sequence[str], baseline: float | None, margin: float,
                      metric: str | None = None, confidence: float = 0.9, axis: str = "lstar",
                      family: str = "isotonic") -> BacktestSpec:
    """A backtest from command-line values: one or more tasks, each `TASK` (at `baseline`) or
    `TASK=BASELINE`, all at the same margin, confidence and metric choice."""
    items = [task] if isinstance(task, str) else list(task)
    if not items:
        raise CurveError("no task to backtest", hint="give --task TASK (repeatable; TASK=BASELINE for its own baseline)")
    tasks = []
    for item in items:
        name, sep, own = item.partition("=")
        name = name.strip()
        if not name:
            raise CurveError(f"--task {item!r} has no task name", hint="write TASK or TASK=BASELINE, e.g. mmlu=0.25")
        if sep:
            try:
                b = float(own)
            except ValueError:
                raise CurveError(f"--task {item!r}: the baseline {own!r} is not a number",
                                 hint="write TASK=BASELINE, e.g. mmlu=0.25") from None
        elif baseline is None:
            raise CurveError(f"--task {name!r} has no baseline", hint="give --baseline B, or write the task as TASK=B")
        else:
            b = baseline
        if not (math.isfinite(b) and 0.0 <= b < 1.0) or not 0.0 < margin <= 1.0 or not 0.0 < confidence < 1.0:
            raise CurveError(f"task {name!r}: baseline {b}, margin {margin}, confidence {confidence} "
                             "out of range", hint="baseline in [0, 1), margin in (0, 1], confidence in (0, 1)")
        tasks.append(BacktestTask(name, name, metric, b, margin, confidence))
    return BacktestSpec(tasks=tuple(tasks), axis=axis, family=family)


def spec_from_policy(path: str | Path, *, axis: str | None = None, family: str = "isotonic") -> BacktestSpec:
    """A backtest of every task of a policy file, each from its curve artifact (see the module
    docstring); `axis` overrides the curves' own axis (they must agree otherwise)."""
    from monitor.policy.load import load_policy

    policy = load_policy(path)   # bounded read, strict validation, curve files checked
    if not policy.tasks:
        raise PolicyError(f"{path}: the policy has no tasks to backtest", hint="add a task with its curve")
    tasks, axes = [], set()
    for task in policy.tasks:
        curve = load_task_curve(policy.resolve_path(task.curve), task.budget)
        axes.add(curve.axis)
        tasks.append(BacktestTask(name=task.name, task=curve.task, metric=curve.metric, baseline=curve.baseline,
                                  margin=margin_in_force(curve, task),
                                  confidence=task.confidence if task.confidence is not None else curve.confidence))
    if axis is None:
        if len(axes) != 1:
            raise PolicyError(f"{path}: the policy's curves are on different axes ({', '.join(sorted(axes))})",
                              hint="choose one with --axis")
        axis = axes.pop()
    return BacktestSpec(tasks=tuple(tasks), axis=axis, family=family, policy=policy, source=str(path))


def policy_curves(spec: BacktestSpec) -> dict[str, CurveArtifact]:
    """{task name: the curve artifact its policy file names} (at the task's budget), to replay
    with as they are (`run_backtest(..., curves=...)`, `lstar backtest --no-refit`)."""
    if spec.policy is None:
        raise PolicyError("replaying with the policy's own curves needs a policy", hint="give --policy FILE")
    return {task.name: load_task_curve(spec.policy.resolve_path(task.curve), task.budget)
            for task in spec.policy.tasks}


def replay_policy(spec: BacktestSpec, curves: Mapping[str, Path], alerts_out: Path, *,
                  corpus_sha256: str) -> Policy:
    """The policy the replay runs under: the spec's tasks pointed at the refitted `curves`
    ({task name: artifact path}), watching every lineage, on the backtest corpus, every
    receiver a file sink appending to `alerts_out`."""
    sink = FileConfig(path=str(alerts_out.resolve()))
    if spec.policy is None:
        return Policy(name=BACKTEST_POLICY, corpora=Corpora(public=corpus_sha256),
                      tasks=[Task(name=task.name, curve=str(curves[task.name]), margin=task.margin)
                             for task in spec.tasks],
                      route=RootRoute(receiver="backtest-file"),
                      receivers=[Receiver(name="backtest-file", file=sink)])
    policy = spec.policy
    tasks = [t.model_copy(update={"curve": str(curves[t.name]), "evaluate": None, "budget": None,
                                  "derivatives": "base"}) for t in policy.tasks]
    receivers = [Receiver(name=r.name, file=sink, send_resolved=r.resolved_notifications,
                          rate_limit=r.rate_limit, retry=r.retry) for r in policy.receivers]
    return policy.model_copy(update={"tasks": tasks, "receivers": receivers, "watch": [],
                                     "corpora": Corpora(public=corpus_sha256), "calibration_gaming": None,
                                     "reports": []})


def task_names(tasks: Sequence[BacktestTask]) -> list[str]:
    return [t.name for t in tasks]


__all__ = ["BACKTEST_POLICY", "FAMILIES", "BacktestSpec", "BacktestTask", "policy_curves", "replay_policy",
           "spec_from_options", "spec_from_policy"]
