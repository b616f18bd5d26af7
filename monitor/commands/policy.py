"""`lstar policy check|test|routes test`: validate policy files; show what a score would trigger
and where an alert with given labels would go."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from monitor.commands.options import DB_OPTION, JSON_OPTION, STATE_OPTION, db_file, float_option
from monitor.commands.terminal import echo, plain_console
from monitor.errors import PolicyError


def expand_policy_paths(paths: list[Path]) -> list[Path]:
    """Files as given; a folder stands for its *.yaml and *.yml entries (sorted), as the
    daemon lists them (so a directory or FIFO named *.yaml is reported, not skipped)."""
    from monitor.policy import policy_files_in

    out: list[Path] = []
    for p in paths:
        out.extend(policy_files_in(p) if p.is_dir() else [p])
    return out


def policy_decisions(path: Path, *, lstar: float, se: float, repo: str, commit: str,
                     axis: str | None = None) -> dict[str, Any]:
    """For each task of the policy: the prediction and the receivers an alert would reach.

    `lstar` is the value on each task curve's axis (L* for L* curves). When the curves use more
    than one axis, `axis` names the one the value is on; tasks on other axes are listed in
    `skipped` with why.
    """
    from monitor.policy import load_policy

    from monitor.alerts import load_task_curve, predict_task, route_alert, task_labels
    from monitor.curves.axes import AXES, get_axis

    if axis is not None:
        get_axis(axis)
    if not math.isfinite(lstar) or not math.isfinite(se) or se < 0:
        raise PolicyError(f"--value {lstar} / --se {se}: give a finite value and a standard error ≥ 0")
    policy = load_policy(path)
    curves = {task.name: load_task_curve(policy.resolve_path(task.curve), task.budget) for task in policy.tasks}
    used = sorted({c.axis for c in curves.values()}, key=list(AXES).index)
    if axis is None and len(used) > 1:
        by_axis = "; ".join(f"{AXES[a].label}: {', '.join(t for t, c in curves.items() if c.axis == a)}"
                            for a in used)
        raise PolicyError(f"{path}: the task curves are on {len(used)} axes ({by_axis}); a value is on one",
                          hint=f"give --axis ({', '.join(used)}) to test the tasks on that axis")
    chosen = axis or (used[0] if used else "lstar")
    tasks, skipped = [], {}
    for task in policy.tasks:
        curve = curves[task.name]
        if curve.axis != chosen:
            skipped[task.name] = f"its curve is on {curve.axis_label}, not {AXES[chosen].label}"
            continue
        prediction = predict_task(curve, task, value=lstar, se=se)
        labels = task_labels(policy=policy.name, task=task.name, repo=repo, lineage=repo, commit=commit,
                             state=prediction.state, extra={**policy.labels, **task.labels}, axis=curve.axis)
        receivers = [t.receiver for t in route_alert(policy.route, labels)] \
            if prediction.state != "clear" else []
        tasks.append({**prediction.as_dict(), "receivers": receivers})
    out = {"policy": policy.name, "file": str(path), "axis": chosen, "axis_label": AXES[chosen].label,
           "value": lstar, "se": se, "tasks": tasks, "sent": False}
    if chosen == "lstar":
        out["lstar"] = lstar
    if skipped:
        out["skipped"] = skipped
    return out


_LABEL_RE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$")


def route_test(path: Path, labels: list[str]) -> dict[str, Any]:
    """The receivers (and the route nodes) an alert with `labels` reaches in the policy's
    routing tree, walked by the daemon's own routing code."""
    from monitor.policy import format_duration, load_policy

    from monitor.alerts import route_alert
    from monitor.policy.vocabulary import ROUTED_VALUES

    given: dict[str, str] = {}
    for text in labels:
        match = _LABEL_RE.match(text)
        if match is None:
            raise PolicyError(f"label {text!r} is not NAME=VALUE", hint="e.g. state=at_risk task=arith")
        name, value = match.groups()
        if name in given:
            raise PolicyError(f"label {name!r} is given twice")
        closed = ROUTED_VALUES.get(name)
        if closed is not None and value not in closed:
            raise PolicyError(f"label {text!r}: no alert carries it; {name} is one of {', '.join(closed)}")
        given[name] = value
    policy = load_policy(path, check_curves=False)  # routing needs no curve
    targets = route_alert(policy.route, given)
    return {"policy": policy.name, "file": str(path), "labels": given,
            "receivers": [{"receiver": t.receiver, "route": t.path, "group_by": list(t.group_by),
                           "group_wait": format_duration(t.group_wait),
                           "group_interval": format_duration(t.group_interval),
                           "repeat_interval": format_duration(t.repeat_interval)} for t in targets]}


def caveats(decision: dict[str, Any]) -> list[str]:
    """What weakens a decision, in words: an L* outside the curve's data (the curve is
    extrapolated), a threshold a curve warning leaves unresolved."""
    out = []
    if decision.get("extrapolated"):
        out.append("extrapolated")
    if not decision.get("threshold_resolved", True):
        out.append("threshold unresolved")
    return out


def _refit_warnings(path: Path) -> list[str]:
    """One line per task whose curve has a refit beside it (`lstar curves refit`): the policy
    still points at the reviewed file, which is right until a person reviews the refit."""
    from monitor.curves.refit import newer_refits
    from monitor.policy import load_policy

    try:
        policy = load_policy(path, check_curves=False)
    except Exception:  # noqa: BLE001 - it passed the check; nothing to add if it cannot be read again
        return []
    lines = []
    for i, task in enumerate(policy.tasks):
        for file, curve_id in newer_refits(policy.resolve_path(task.curve)):
            lines.append(f"tasks[{i}].curve: {task.curve!r} has a newer refit {file.name} (curve "
                         f"{curve_id[:12]}, with observed checkpoints); review it and point the task at it "
                         "to use it")
    return lines


def _residual_warnings(path: Path, database: Path) -> list[str]:
    """One line per task judging derivatives by residual without enough labelled pairs."""
    from monitor.alerts.derivative_pairs import residual_pair_warnings
    from monitor.policy import load_policy

    try:
        policy = load_policy(path, check_curves=False)
    except Exception:  # noqa: BLE001 - it passed the check; nothing to add if it cannot be read again
        return []
    return residual_pair_warnings(policy, database)


def _stress_warnings(path: Path, database: Path) -> list[str]:
    """One line per stress flag on a task's curve (monitor.stress.limits), from the stress
    results stored in the state folder's database."""
    from monitor.stress.policy_flags import policy_stress_warnings

    return policy_stress_warnings(path, database)


def register(app: typer.Typer) -> None:
    policy = typer.Typer(help="Policy files: validate them, try a score against them.",
                         no_args_is_help=True)

    for add_command in (_check_command, _test_command):
        add_command(policy)

    routes = typer.Typer(help="The routing tree of a policy.", no_args_is_help=True)

    _routes_test_command(routes)

    policy.add_typer(routes, name="routes")
    app.add_typer(policy, name="policy")


def _check_command(policy: typer.Typer) -> None:
    @policy.command("check")
    def check(files: list[Path] = typer.Argument(..., help="Policy files (a folder: its *.yaml)."),
              skip_secrets: bool = typer.Option(
                  False, "--skip-secrets",
                  help="Do not resolve the receivers' secrets (checking on a machine without them)."),
              state: Path = STATE_OPTION, db: Path | None = DB_OPTION) -> None:
        """Validate policy files strictly; prints SUCCESS or FAILED per file.

        Each error names the file, line, key path and value. The files are also checked
        against each other as the daemon loads them (unique policy names; a watch rule two
        files define must be the same), and every secret a receiver names must resolve here
        (the variable set, the file readable and not empty; values are never printed).
        A task with `derivatives: residual` is warned about when the state folder's database
        holds fewer than two labelled base/derivative pairs of one relation for its curve's
        task (its derivatives are not evaluated until it does), and a task whose curve a stored
        stress result flags (`lstar stress --db`; limits in docs/stress.md) is warned about with
        the limit it exceeds.
        Exits 0 only when every file passes (2 otherwise).
        """
        from monitor.policy import check_policy_files

        database = db_file(state, db)
        paths = expand_policy_paths(files)
        if not paths:
            raise PolicyError("no policy files found in " + ", ".join(str(f) for f in files))
        failed = 0
        for result in check_policy_files(paths, secrets=not skip_secrets):
            if result.ok:
                # echo: one line each, a line break in a file name shown as \n (scripts read these)
                echo(f"SUCCESS {result.path}")
                for line in [*_refit_warnings(Path(result.path)), *_residual_warnings(Path(result.path), database),
                             *_stress_warnings(Path(result.path), database)]:
                    echo(f"WARNING {result.path}: {line}")
                continue
            failed += 1
            for line in result.errors:
                # Errors start with the file name (and line); others get it prefixed.
                echo(f"FAILED {line}" if line.startswith(result.path) else f"FAILED {result.path}: {line}")
        if failed:
            raise PolicyError(f"{failed} of {len(paths)} policy file(s) failed the check")


def _test_command(policy: typer.Typer) -> None:
    @policy.command("test")
    def test(
        file: Path = typer.Argument(..., help="Policy file."),
        lstar: float = float_option(..., "--value", "--lstar",
                                    help="A hypothetical score's value on the task curves' axis (L* for L* curves)."),
        se: float = float_option(0.0, "--se", low=0.0, help="Its standard error on that axis."),
        axis: str = typer.Option(None, "--axis", help="The axis the value is on, where the policy's curves "
                                                      "use several (tasks on other axes are skipped)."),
        repo: str = typer.Option("example/model", "--repo", help="Repo id to route with."),
        commit: str = typer.Option("0" * 40, "--commit", help="Commit to route with."),
        as_json: bool = JSON_OPTION,
    ) -> None:
        """Print each task's decision (P̂, interval, threshold, state, receivers) for one value
        ± SE on the task curves' axis (L*, bits/byte, ...). Nothing is stored or sent."""
        result = policy_decisions(file, lstar=lstar, se=se, repo=repo, commit=commit, axis=axis)
        if as_json:
            print(json.dumps(result, indent=2))
            return
        table = Table(title=f"policy {result['policy']}: {result['axis_label']} = {lstar:.4f} ± {se:.4f} "
                            "(nothing sent)", title_justify="left")
        for col in ("task", "P̂", "interval", "threshold", "state", "caveats", "would notify"):
            table.add_column(col)
        for t in result["tasks"]:
            lo, hi = t["interval"]
            table.add_row(t["task"], f"{t['p_hat']:.3f}", f"[{lo:.3f}, {hi:.3f}] @ {t['confidence']:.0%}",
                          f"{t['threshold']:.3f}", t["state"], "\n".join(caveats(t)) or "—",
                          ", ".join(t["receivers"]) or "—")
        plain_console().print(table)
        for name, why in result.get("skipped", {}).items():
            echo(f"skipped {name}: {why}")


def _routes_test_command(routes: typer.Typer) -> None:
    @routes.command("test")
    def routes_test(
        file: Path = typer.Argument(..., help="Policy file."),
        labels: list[str] = typer.Argument(None, help="The alert's labels, NAME=VALUE each "
                                                      "(a label not given matches as empty)."),
        verify: str = typer.Option(None, "--verify-receivers",
                                   help="Comma-separated receivers expected; exit 2 when they differ."),
        as_json: bool = JSON_OPTION,
    ) -> None:
        """Print the receivers an alert with these labels reaches, and the route that takes it
        to each (as Alertmanager's `amtool config routes test`). Nothing is sent."""
        result = route_test(file, list(labels or []))
        if as_json:
            print(json.dumps(result, indent=2))
        else:
            for target in result["receivers"]:
                echo(f"{target['receiver']}  ({target['route']})")
        got = [t["receiver"] for t in result["receivers"]]
        if verify is not None:
            wanted = [name.strip() for name in verify.split(",") if name.strip()]
            if got != wanted:
                raise PolicyError(f"{file}: the labels reach {', '.join(got)}, not {', '.join(wanted)}")
