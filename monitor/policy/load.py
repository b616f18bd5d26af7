"""Loading policy files: parse, validate, cross-check, and the set of policies a process runs with."""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from monitor.curves.artifact import at_budget, load_curve
from monitor.errors import LstarError, PolicyError
from monitor.files import read_bounded_text
from monitor.policy.schema import Policy
from monitor.policy.secrets import missing_secrets
from monitor.policy.vocabulary import ROUTED_VALUES, never_matches
from monitor.yamlio import YamlNode, compose_mapping, format_key_path, node_line, validation_lines


# -- loading ----------------------------------------------------------------------------------
@dataclass
class LoadedPolicy:
    """A validated policy and the node tree it came from (for cross-reference line numbers)."""

    policy: Policy
    root: YamlNode


def parse_policy(text: str, label: str, *, path: Path | None = None) -> LoadedPolicy:
    """Validate policy text (no cross-reference checks). `label` names the file in errors."""
    root, data = compose_mapping(text, label, empty="a policy needs name, route and receivers")
    try:
        policy = Policy.model_validate(data)
    except ValidationError as exc:
        lines = validation_lines(exc, root, label, Policy)
        raise PolicyError("\n".join(lines)) from None
    policy._path = path
    policy._source_sha256 = hashlib.sha256(text.encode("utf-8")).hexdigest()   # the file's bytes (UTF-8 round-trips)
    policy._loaded_at = datetime.now(timezone.utc)
    return LoadedPolicy(policy, root)


def _cross_reference_errors(loaded: LoadedPolicy, label: str, *, check_curves: bool) -> list[str]:
    policy, root = loaded.policy, loaded.root
    errors: list[str] = []

    def error(loc: Sequence[Any], message: str) -> None:
        line, _ = node_line(root, loc)
        errors.append(f"{label}:{line}: {format_key_path(loc)}: {message}")

    names = [r.name for r in policy.receivers]
    defined = ", ".join(names)
    for key, what, items in (("receivers", "receiver", policy.receivers), ("tasks", "task", policy.tasks),
                             ("watch", "watch rule", policy.watch)):
        listed = [item.name for item in items]
        for i, name in enumerate(listed):
            if listed.index(name) != i:
                error([key, i, "name"], f"{what} {name!r} is defined twice")

    for sub, node in policy.route.walk():
        if node.receiver is not None and node.receiver not in names:
            loc = _loc_of(f"route{sub}") + ["receiver"]
            error(loc, f"receiver {node.receiver!r} is not defined (defined: {defined})")
        for j, matcher in enumerate(node.matchers):
            dead = never_matches(matcher, ROUTED_VALUES)
            if dead is not None:
                error(_loc_of(f"route{sub}") + ["matchers", j], f"{dead}; this route would never be taken")
    for i, name in enumerate(policy.meta_receivers):
        if name not in names:
            error(["meta_receivers", i], f"receiver {name!r} is not defined (defined: {defined})")
    for i, report in enumerate(policy.reports):
        for j, name in enumerate(report.receivers):
            if name not in names:
                error(["reports", i, "receivers", j],
                      f"receiver {name!r} is not defined (defined: {defined})")
    if policy.calibration_gaming is not None and policy.corpora.private is None:
        error(["calibration_gaming"], "needs corpora.private (the governance corpus) beside "
                                      "corpora.public")
    if policy.calibration_gaming is not None and policy.corpora.public is None:
        error(["calibration_gaming"], "needs corpora.public beside corpora.private")
    for i, receiver in enumerate(policy.receivers):
        for key in ("secret_file", "password_file", "ca_file"):
            cfg = receiver.webhook or receiver.email
            value = getattr(cfg, key, None) if cfg is not None else None
            if value is not None and not policy.resolve_path(value).is_file():
                error(["receivers", i, receiver.kind, key],
                      f"file {value!r} does not exist (paths are relative to the policy file)")
    for i, task in enumerate(policy.tasks):
        if task.evaluate is not None:
            problem = evaluate_problem(policy, task.evaluate)
            if problem is not None:
                error(["tasks", i, "evaluate", "file" if task.evaluate.kind == "multiple_choice" else "kind"],
                      problem)
    if check_curves:
        _task_curve_errors(policy, error)
    return errors


def _task_curve_errors(policy: Policy, error: Callable[[Sequence[Any], str], None]) -> None:
    """Each task's curve file: it exists and loads, has the task's budget, was fitted on the
    policy's public corpus and at the task's confidence (one `error` per problem)."""
    for i, task in enumerate(policy.tasks):
        curve_path = policy.resolve_path(task.curve)
        if not curve_path.is_file():
            error(["tasks", i, "curve"],
                  f"curve file {task.curve!r} does not exist (paths are relative to the policy file)")
            continue
        try:
            curve = load_curve(curve_path)
        except LstarError as exc:
            error(["tasks", i, "curve"], f"curve file {task.curve!r} does not load: {exc.one_line()}")
            continue
        except Exception as exc:  # noqa: BLE001 - a hostile curve file (e.g. JSON nested 10^5 deep)
            error(["tasks", i, "curve"], f"curve file {task.curve!r} does not load: {_exception_text(exc)}")
            continue
        try:
            at_budget(curve, task.budget)
        except LstarError as exc:
            error(["tasks", i, "budget"], exc.one_line())
        public = policy.corpora.public
        if public is not None and curve.corpus_sha256 != public:
            error(["tasks", i, "curve"],
                  f"curve {task.curve!r} was fitted on corpus {str(curve.corpus_sha256)[:12]}, "
                  f"not on corpora.public {public[:12]}")
        if task.confidence is not None and not math.isclose(task.confidence, curve.confidence):
            error(["tasks", i, "confidence"],
                  f"value {task.confidence!r} differs from the {curve.confidence:g} band of curve "
                  f"{task.curve!r}; refit the curve at this confidence or drop the key")


def evaluate_problem(policy: Policy, evaluate: Any) -> str | None:
    """Why a task's `evaluate:` cannot run here (None when it can): a task file that is missing,
    not a regular file, over `TASK_FILE_MAX_BYTES` or not a multiple-choice file (read bounded,
    `monitor.curves.evaluator.read_task_file`), or lm_eval without the `bench` extra. A task
    file that loads is fingerprinted on the policy (`Policy.note_task_file`): the daemon's
    evaluations run that content, and notice when the file changes."""
    import importlib.util

    if evaluate.kind == "lm_eval":
        if importlib.util.find_spec("lm_eval") is None:
            return ("kind lm_eval needs lm-evaluation-harness, which is not installed "
                    "(pip install 'lstar-monitor[bench]', or use kind multiple_choice)")
        return None
    from monitor.curves.evaluator import load_mc_task

    path = policy.resolve_path(evaluate.file)
    if not path.exists():
        return f"task file {evaluate.file!r} does not exist (paths are relative to the policy file)"
    try:
        task = load_mc_task(path)
    except LstarError as exc:
        return f"task file {evaluate.file!r} does not load: {exc.one_line()}"
    except Exception as exc:  # noqa: BLE001 - a hostile task file
        return f"task file {evaluate.file!r} does not load: {_exception_text(exc)}"
    policy.note_task_file(evaluate.file, task.sha256)
    return None


def _exception_text(exc: BaseException) -> str:
    """'RecursionError: maximum recursion depth exceeded', on one line, bounded."""
    detail = " ".join(str(exc).split())[:200]
    return f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__


def _loc_of(path: str) -> list[Any]:
    """'route.routes[0].routes[1]' -> ['route', 'routes', 0, 'routes', 1]."""
    out: list[Any] = []
    for part in re.findall(r"[A-Za-z_][A-Za-z0-9_]*|\[\d+\]", path):
        out.append(int(part[1:-1]) if part.startswith("[") else part)
    return out


def load_policy(path: str | Path, *, check_curves: bool = True) -> Policy:
    """Read, validate and cross-check one policy file.

    Raises PolicyError whose message lists every problem found, one per line, each as
    `FILE:LINE: KEY.PATH: what is wrong with VALUE`.
    """
    path = Path(path)
    label = str(path)
    try:
        text = read_bounded_text(path, label)
        loaded = parse_policy(text, label, path=path)
        errors = _cross_reference_errors(loaded, label, check_curves=check_curves)
    except PolicyError:
        raise
    except LstarError as exc:
        raise PolicyError(f"{label}: {exc.one_line()}") from None
    except Exception as exc:  # noqa: BLE001 - hostile input must never escape as a crash
        # RecursionError, MemoryError, an OSError or a library's own exception: whatever a
        # file does to the loader is that file's error, and the other files still load.
        raise PolicyError(f"{label}: cannot be loaded ({_exception_text(exc)})",
                          hint="fix or remove the file; `lstar policy check FILE` shows its errors") from None
    if errors:
        errors.sort(key=lambda text: int(text[len(label) + 1:].split(":", 1)[0]))
        raise PolicyError("\n".join(errors))
    return loaded.policy


def clash_errors(policy: Policy, others: Sequence[Policy]) -> list[str]:
    """Why `policy` cannot be in force beside `others`: a policy name another one uses (alert
    keys start with it), or a watch rule another policy defines differently.

    Watch rules are shared by name across policies (checkpoints and watermarks refer to the
    rule's name), so the same rule written the same way in two files is one rule; written
    differently, one of them would silently not be polled.
    """
    errors = [f"{policy.path}: name: policy name {policy.name!r} is also used by {other.path}; "
              "policy names must be unique" for other in others if other.name == policy.name]
    for other in others:
        theirs = {rule.name: rule for rule in other.watch}
        for i, rule in enumerate(policy.watch):
            if rule.name in theirs and theirs[rule.name] != rule:
                errors.append(f"{policy.path}: watch[{i}].name: watch rule {rule.name!r} is also defined, "
                              f"differently, by {other.path}; rename one of them or make both the same")
    return errors


def load_policies(paths: Sequence[str | Path]) -> list[Policy]:
    """Load several policy files; their names must be unique (alert keys start with them) and
    a watch rule two of them define must be defined the same way (`clash_errors`)."""
    policies = [load_policy(p) for p in paths]
    for i, policy in enumerate(policies):
        errors = clash_errors(policy, policies[:i])
        if errors:
            raise PolicyError("\n".join(errors))
    return policies


def error_text(exc: PolicyError) -> str:
    """The error's lines, its hint (how to fix it) appended to the last one."""
    return exc.message if exc.hint is None else f"{exc.message}; {exc.hint}"


@dataclass(frozen=True)
class CheckResult:
    """Outcome of checking one file: `errors` is empty when it passed."""

    path: str
    errors: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.errors


def check_policy_files(paths: Sequence[str | Path], *, secrets: bool = True) -> list[CheckResult]:
    """Check each file (a bad file never hides the verdict on the others), then the files
    that passed against each other as the daemon loads them (`clash_errors`: a file clashes
    with the ones before it), and, with `secrets`, resolve every secret their receivers name
    (`monitor.policy.secrets`: the variable is set, the file is readable and not empty)."""
    results: list[CheckResult] = []
    loaded: list[Policy] = []
    for p in paths:
        try:
            policy = load_policy(p)
        except PolicyError as exc:
            results.append(CheckResult(str(p), tuple(error_text(exc).splitlines())))
            continue
        errors = clash_errors(policy, loaded)
        if not errors:
            loaded.append(policy)   # in force as far as the daemon goes, missing secrets or not
        if secrets:
            errors += [missing.line() for missing in missing_secrets(policy)]
        results.append(CheckResult(str(p), tuple(errors)))
    return results


class PolicySet:
    """The policies in force, kept on reload failure: a bad file never replaces a good one.

    `reload()` re-reads every file; files that fail keep their last good version and the
    errors are returned so the daemon can tell the operator (file, line, key path, value).
    """

    def __init__(self, paths: Sequence[str | Path]) -> None:
        self.paths = [Path(p) for p in paths]
        self.policies: dict[Path, Policy] = {}
        self.errors: dict[Path, str] = {}

    def reload(self, paths: Sequence[str | Path] | None = None) -> dict[Path, str]:
        """Load every file; returns {path: error} for the ones that failed (kept at last good).

        With `paths`, they become the set of files (a file no longer listed is dropped).
        """
        if paths is not None:
            self.paths = [Path(p) for p in paths]
            self.policies = {p: pol for p, pol in self.policies.items() if p in self.paths}
        errors: dict[Path, str] = {}
        for path in self.paths:
            try:
                policy = load_policy(path)
            except PolicyError as exc:
                errors[path] = error_text(exc)
                continue
            clashes = clash_errors(policy, [p for q, p in self.policies.items() if q != path])
            if clashes:
                errors[path] = "\n".join(clashes)
                continue
            self.policies[path] = policy
        self.errors = errors
        return errors

    def current(self) -> list[Policy]:
        """The policies in force (the last good version of each file)."""
        return [self.policies[p] for p in self.paths if p in self.policies]
