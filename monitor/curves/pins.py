"""Can the daemon's scores ever be evaluated? Its scoring settings against every curve's pin.

A curve is pinned to the corpus selection and scoring spec its L* values were measured on
(`artifact.check_compatible` refuses any other score). The daemon scores every checkpoint with
one set of settings (`ScoringSetup`), so a task whose curve is pinned to other settings can
never be evaluated by it: `pin_problems` names each such (policy, task), the setting that
differs, the value the curve needs and the flag that changes it, before anything is scored.

Settings decided only by each model (the prefix token, a window capped by a model with fewer
positions) are not known here; a score they make incompatible is refused when it is
evaluated, and recorded `not_evaluated`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from monitor import DEFAULT_MAX_CONTEXT, SCORING_SPEC_VERSION
from monitor.curves.artifact import CurveArtifact, load_curve
from monitor.errors import CurveError


@dataclass(frozen=True)
class ScoringSetup:
    """What the daemon's scores will be measured with (`lstar run` flags).

    corpus_sha256: the sha256 of the corpus selection (None: not known, not checked);
    max_context: the window (None: each model's own, up to DEFAULT_MAX_CONTEXT);
    stride/disjoint: as `ScoringSpec` resolves them.
    """

    corpus_sha256: str | None
    max_context: int | None
    stride: int | None = None
    disjoint: bool = False
    spec_version: str = SCORING_SPEC_VERSION


@dataclass(frozen=True)
class PinProblem:
    """One (policy, task) the daemon can never evaluate, and why."""

    policy: str
    task: str
    curve: str
    setting: str
    have: str
    need: str
    fix: str

    def line(self) -> str:
        """One line for the log, /health and /status."""
        return (f"policy {self.policy}, task {self.task}: can never be evaluated: curve {self.curve} needs "
                f"{self.setting} {self.need}, the daemon scores with {self.have}; {self.fix}")

    def as_dict(self) -> dict[str, str]:
        return dict(vars(self))


def _mismatch(curve: CurveArtifact, setup: ScoringSetup) -> tuple[str, str, str, str] | None:
    """(setting, have, need, fix) of the first pin `setup` cannot meet, or None."""
    if curve.corpus_sha256 is not None and setup.corpus_sha256 is not None \
            and curve.corpus_sha256 != setup.corpus_sha256:
        return ("corpus selection", f"sha256 {setup.corpus_sha256[:12]}", f"sha256 {curve.corpus_sha256[:12]}",
                "run with --corpus and --docs selecting the documents the curve was scored on")
    ref = curve.scoring_spec
    if ref is None:
        return None
    if ref.spec_version != setup.spec_version:
        return ("scoring spec version", setup.spec_version, ref.spec_version,
                "refit the curve on scores of this version")
    if setup.max_context is not None:
        window: int | None = setup.max_context
        have = f"window {window} (--max-context {window})"
    else:
        window = DEFAULT_MAX_CONTEXT if ref.window == DEFAULT_MAX_CONTEXT else None
        have = f"each model's window up to {DEFAULT_MAX_CONTEXT} (no --max-context)"
    if window != ref.window:
        return "window", have, str(ref.window), f"run with --max-context {ref.window}"
    stride = setup.stride if setup.stride is not None else (window if setup.disjoint else max(1, window // 2))
    if stride != ref.stride:
        return ("stride", str(stride), str(ref.stride),
                f"refit the curve on scores with stride {stride} (lstar run scores with stride = window / 2)")
    return None


def pin_problems(policies: Sequence[Any], setup: ScoringSetup) -> list[PinProblem]:
    """Every (policy, task) whose curve `setup`'s scores can never meet (a curve that cannot be
    loaded included), in policy and task order."""
    problems = []
    for policy in policies:
        public = policy.corpora.public
        for task in policy.tasks:
            path = policy.resolve_path(task.curve)
            try:
                curve = load_curve(path)
            except CurveError as exc:
                problems.append(PinProblem(policy.name, task.name, str(path), "a curve that loads", "none",
                                           "a readable artifact", exc.one_line()))
                continue
            found = _mismatch(curve, setup)
            if found is None and public is not None and setup.corpus_sha256 is not None \
                    and public != setup.corpus_sha256:
                found = ("corpus selection", f"sha256 {setup.corpus_sha256[:12]}",
                         f"sha256 {public[:12]} (corpora.public)",
                         "run with --corpus and --docs selecting the policy's public corpus")
            if found is not None:
                problems.append(PinProblem(policy.name, task.name, curve.curve_id[:12], *found))
    return problems


def unevaluable_policies(policies: Sequence[Any], problems: Sequence[PinProblem]) -> bool:
    """True when there are tasks and not one of them can be evaluated (the daemon refuses to start)."""
    tasks = {(p.name, t.name) for p in policies for t in p.tasks}
    return bool(tasks) and tasks <= {(p.policy, p.task) for p in problems}
