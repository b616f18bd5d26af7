"""Governance reports: a periodic summary per policy, as Markdown, self-contained HTML and JSON.

A report covers the period since the policy's previous report (or its `window` for the
first one) and says: which checkpoints are new; L* by lineage (family) with standard
errors; which tasks are at risk or have emerged, with intervals and thresholds; which
states changed (crossings); each checkpoint's stability diagnostics (TCB, V_eff, logit
margin); and three kinds of plot (L* over time, each task curve with the new checkpoints,
raw CE against L* per family). How checkpoints are named and ordered and numbers printed is
decided in `present.py` (one rule each), the "how to read this" notes are in `explain.py`.

    data = build_report(store, policy, now=now, period_start=start)
    write_report(data, folder)                        # report.md, report.html, report.json, *.png
    write_due_reports(store, policies, now=now, out_dir=STATE / "reports")   # the daemon's job (schedule.py)

Every written report is recorded in the `reports` table, which is also what "due" is
measured from; delivery goes to the report's receivers (file: one JSON line; webhook: the
JSON report, signed like alerts; email: Markdown text with the HTML report as alternative).
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import shutil
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from monitor.bands import extrapolation_words
from monitor.curves.axes import AXES
from monitor.errors import CurveError
from monitor.escape import html_environment, markdown_code, markdown_text
from monitor.policy import Policy
from monitor.reports import plots as report_plots
from monitor.stress.storage import stress_flags_for_curve
from monitor.reports.derivatives import derivative_sections, derivatives_markdown
from monitor.reports.explain import HOW_TO_READ
from monitor.reports.json_text import iter_json, json_default, to_json, write_json
from monitor.reports.history import history_rows, lineage_rows, table_and_families, watched_pairs
from monitor.reports.summary import plotted, plotted_lineages, summarised
from monitor.reports.version import describe_version, policy_version
from monitor.reports.present import checkpoint_name, fmt, short
from monitor.store import Store
from monitor.store.evaluation_gaps import NOT_EVALUATED
from monitor.store.report_ranks import ReportRanks
from monitor.store.rows import PredictionRow

SCHEMA = "lstar-report/2"
TEMPLATE_DIR = Path(__file__).resolve().parent / "templates"
HTML_TEMPLATE = "report.html.j2"
FIRING = ("at_risk", "emerged")


# -- gathering ---------------------------------------------------------------------------------
def load_policy_curves(policy: Policy) -> tuple[dict[str, Any], list[str]]:
    from monitor.alerts import load_task_curve

    curves, problems = {}, []
    for task in policy.tasks:
        try:
            curves[task.name] = load_task_curve(policy.resolve_path(task.curve), task.budget)
        except CurveError as exc:
            problems.append(f"task {task.name}: {exc.one_line()}")
    return curves, problems


def not_evaluated_problems(predictions: Sequence[PredictionRow], name_of: Callable[[str, str], str]) -> list[str]:
    """One report problem per (task, reason) of the scores recorded `not_evaluated`, naming them."""
    grouped: dict[tuple[str, str], list[str]] = {}
    for p in predictions:
        if p.state == NOT_EVALUATED:
            names = grouped.setdefault((p.task, str(p.detail.get("reason", ""))), [])
            if name_of(p.repo, p.commit_sha) not in names:
                names.append(name_of(p.repo, p.commit_sha))
    return [f"task {task}: {len(names)} checkpoint(s) not evaluated ({', '.join(names)}): {reason}"
            for (task, reason), names in grouped.items()]


def unresolved_problem(task: str, curve_id: str, lineages: Sequence[str], messages: Sequence[str]) -> str:
    """The report problem for a task whose curve cannot place its threshold."""
    states = (f"; the states of {', '.join(lineages)} rest on it and are not established" if lineages
              else "; predictions from it are not established")
    return (f"task {task}: the threshold of curve {curve_id[:12]} is unresolved ({'; '.join(messages)})"
            + states)


def _iso(moment: datetime | None) -> str | None:
    return moment.astimezone(timezone.utc).isoformat() if moment is not None else None


def _axis_value(p: Any) -> tuple[float, float]:
    """A stored prediction's value on its curve's axis and that axis's SE (its detail holds
    them; predictions made before curves had an axis are on L*)."""
    detail = p.detail or {}
    if "value" in detail and "se" in detail:
        return float(detail["value"]), float(detail["se"])
    return float(p.lstar), float(p.se)


def _judged_level(p: Any) -> float | None:
    """The level b + ε a stored prediction was judged at (its detail's floor and margin)."""
    detail = p.detail or {}
    if isinstance(detail.get("floor"), (int, float)) and isinstance(detail.get("margin"), (int, float)):
        return float(detail["floor"]) + float(detail["margin"])
    return None


def stale_level_problems(task: str, level: float, rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """A problem for each lineage whose state was judged at another level than the one in force
    (a policy change the daemon has not re-evaluated yet): the row and the header would disagree."""
    return [f"task {task}: the state of {x['lineage']} ({x['checkpoint']}) was judged at level {fmt(x['level'])}, "
            f"not at the level {fmt(level)} in force; the running daemon re-evaluates it when it reloads the policy"
            for x in rows if x.get("level") is not None and abs(x["level"] - level) > 1e-9]


def policy_changes_markdown(changes: Sequence[Mapping[str, Any]]) -> list[str]:
    """The policy changes of the window as Markdown lines (none: nothing)."""
    if not changes:
        return []
    return ["## Policy changes", "",
            "*How to read this:* a reload that changed a task's curve, margin (its level), confidence, budget "
            "or derivatives rule re-evaluated each lineage's current checkpoint; what no longer held was resolved.",
            "", *(f"- {fmt(c['changed_at'])}: {markdown_text(c['summary'])}" for c in changes), ""]


def _in_period(moment: datetime | None, start: datetime, end: datetime) -> bool:
    return moment is not None and start < moment <= end


def carried_states(store: Store, ranks: ReportRanks, policy: str, *, start: datetime, tasks: Iterable[str],
                   window: Sequence[PredictionRow]) -> tuple[list[PredictionRow], dict[tuple[str, str], int]]:
    """The carried-in predictions (each (task, lineage, checkpoint)'s state at `start`) that a
    report reads, whole and oldest first, with the rank of each one's checkpoint: per (task,
    lineage), the latest by (training order, evaluation time) (the state carried in, and a
    lineage's current state when the window predicted nothing newer), and those of a checkpoint
    the window predicted again (it replaces them). The others can decide nothing: DuckDB chooses
    among them by key (`ReportRanks.carried_predictions`), whatever the history's length."""
    again = sorted({(p.task, p.lineage, p.repo, p.commit_sha) for p in window})
    chosen = ranks.carried_predictions(policy, start=start, tasks=list(tasks), skip_state=NOT_EVALUATED, again=again)
    rank_of = dict(chosen)
    rows = store.predictions_by_id([ident for ident, _ in chosen])
    return rows, {(p.repo, p.commit_sha): int(rank_of[p.id]) for p in rows if rank_of[p.id] >= 0}


def _lineage_state(task: str, lineage: str, preds: Sequence[PredictionRow], carried: Sequence[PredictionRow],
                   order: Mapping[tuple[str, str], int], name_of: Callable[[str, str], str], unit: str, *,
                   start: datetime, end: datetime) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One lineage's current state for `task` and the state changes (crossings) in the window.

    `preds` are its state carried in (first) and the window's predictions, oldest first;
    `carried` every carried-in prediction read of it; `order` the checkpoints' training ranks."""
    crossings, previous, latest = [], None, -1
    for p in preds:  # crossings are the alerts' state changes, in the order they were seen
        rank = order.get((p.repo, p.commit_sha), -1)
        if rank < latest:   # an earlier checkpoint scored late: the lineage's state stays
            continue
        latest = rank
        if p.state != previous and _in_period(p.evaluated_at, start, end):
            crossings.append({"task": task, "lineage": lineage, "repo": p.repo,
                              "commit": p.commit_sha, "checkpoint": name_of(p.repo, p.commit_sha),
                              "from": previous, "to": p.state, "lstar": p.lstar,
                              "value": _axis_value(p)[0], "at": p.evaluated_at})
        previous = p.state
    # The current state is that of the lineage's current checkpoint (training_order: the
    # latest in training order; its newest prediction), not of whichever checkpoint
    # happened to be scored or evaluated last.
    newest = {(p.repo, p.commit_sha): p for p in [*carried, *preds]}
    last = max(newest.values(), key=lambda p: (order.get((p.repo, p.commit_sha), -1), p.evaluated_at))
    derived = (last.detail or {}).get("derivative")
    state = {"lineage": lineage, "repo": last.repo, "commit": last.commit_sha,
             "level": _judged_level(last),
             "checkpoint": name_of(last.repo, last.commit_sha),
             "state": last.state, "lstar": last.lstar, "se": last.se,
             # a derivative's state may rest on its base's coordinate (derivatives.py)
             "coordinate": derived.get("coordinate", "own") if derived else "own",
             "rho_measured": bool(derived.get("rho_measured")) if derived else None,
             "lstar_base": derived.get("lstar_base") if derived else None,
             "value": _axis_value(last)[0], "value_se": _axis_value(last)[1],
             "p_hat": last.p_hat, "lo": last.lo, "hi": last.hi,
             "threshold": last.threshold, "evaluated_at": last.evaluated_at,
             # beyond the curve's references: how far (the stored prediction's own)
             "extrapolation": extrapolation_words((last.detail or {}).get("extrapolation"), unit)}
    return state, crossings


def _task_section(store: Store, policy: Policy, task: Any, curve: Any, rows: Sequence[PredictionRow],
                  carried_in: Mapping[tuple[str, str], PredictionRow],
                  carried_by: Mapping[tuple[str, str], Sequence[PredictionRow]], order: Mapping[tuple[str, str], int],
                  name_of: Callable[[str, str], str], *, start: datetime,
                  end: datetime) -> tuple[dict[str, Any], list[dict[str, Any]], list[str]]:
    """One task's section (its curve, level, η̂ and each lineage's current state), the task's
    crossings in the window, and the problems it raises. `rows` are the window's judged
    predictions of the task, oldest first."""
    from monitor.alerts.predict import margin_in_force
    from monitor.curves import curve_warnings
    from monitor.curves.artifact import threshold_at

    crossings: list[dict[str, Any]] = []
    preds_by_lineage: dict[str, list[PredictionRow]] = {}
    for (carried_task, lineage), p in carried_in.items():
        if carried_task == task.name:
            preds_by_lineage[lineage] = [p]
    for p in rows:
        preds_by_lineage.setdefault(p.lineage, []).append(p)
    current = []
    for lineage, preds in sorted(preds_by_lineage.items()):
        state, seen = _lineage_state(task.name, lineage, preds, carried_by.get((task.name, lineage), []), order,
                                     name_of, AXES[curve.axis].unit, start=start, end=end)
        current.append(state)
        crossings += seen
    margin = margin_in_force(curve, task)
    eta = threshold_at(curve, margin)   # η̂ of the level this report prints, not the curve's own
    problems = stale_level_problems(task.name, eta.level, current)
    warnings = [w.as_dict() for w in curve_warnings(curve, margin)]
    unresolved = [w["message"] for w in warnings if w["unresolved"]]
    if unresolved:
        problems.append(unresolved_problem(task.name, curve.curve_id, [x["lineage"] for x in current],
                                           unresolved))
    problems += [f"task {task.name}: curve {curve.curve_id[:12]} is flagged by a stress limit: {flag.message}"
                 for flag in stress_flags_for_curve(store, curve.curve_id)]
    section = {
        "task": task.name, "metric": curve.metric, "curve_id": curve.curve_id,
        "axis": curve.axis, "axis_label": curve.axis_label,
        # the evidence behind the axis: the reviewed curve file the policy points at, and how
        # many of its points a labels file gave directly instead of a score run of this store
        "curve_file": str(policy.resolve_path(task.curve)), "curve_points": len(curve.points),
        "imported_points": sum(1 for point in curve.points if point.imported),
        "baseline": curve.baseline, "margin": margin, "level": eta.level,
        "confidence": curve.confidence, "eta": eta.estimate,
        "eta_lower": eta.lower, "eta_upper": eta.upper,
        "threshold_resolved": not unresolved, "curve_warnings": warnings,
        "lineages": current,
        "new_points": [{"lstar": p.lstar, "value": _axis_value(p)[0], "p_hat": p.p_hat, "lo": p.lo, "hi": p.hi,
                        "state": p.state, "lineage": p.lineage, "repo": p.repo,
                        "commit": p.commit_sha, "checkpoint": name_of(p.repo, p.commit_sha)}
                       for p in rows if _in_period(p.evaluated_at, start, end)
                       and p.p_hat is not None]}
    return section, crossings, problems


def build_report(store: Store, policy: Policy, *, now: datetime, period_start: datetime,
                 name: str = "adhoc") -> dict[str, Any]:
    """Everything a report says, as JSON-ready data (plots are added by `render_plots`).

    A report reads its window (period_start, now] — the scores, predictions, crossings and
    discoveries in it — and each lineage's state at the window's start (its current checkpoint
    and, per task, its state then), so its cost follows the window's activity, not the history.
    Checkpoints are named by `present.checkpoint_name` everywhere and each lineage's rows are
    in training order (`monitor.training_order`); a lineage's current checkpoint is the one
    `training_order.current_checkpoint` names (the latest in training order, never in scoring order),
    and each task's state of a lineage is that checkpoint's.
    """
    from monitor.alerts import public_corpus

    curves, problems = load_policy_curves(policy)
    corpus = public_corpus(policy, curves.values())
    watched = watched_pairs(store, policy, corpus, end=now)
    with store.report_ranks(corpus, start=period_start, end=now, watched=watched) as ranks:
        return _build_report(store, policy, ranks, curves, problems, corpus, now=now, period_start=period_start,
                             name=name)


def _carried_by_lineage(carried_all: list[PredictionRow], order: dict[tuple[str, str], int]
                        ) -> tuple[dict[tuple[str, str], list[PredictionRow]], dict[tuple[str, str], PredictionRow]]:
    """Per (task, lineage): every state carried into the window (oldest first), and the one in
    force at its start: the latest in training order (`order`), the later one on a tie."""
    carried_by: dict[tuple[str, str], list[PredictionRow]] = {}
    carried_in: dict[tuple[str, str], PredictionRow] = {}
    for p in carried_all:   # oldest first
        carried_by.setdefault((p.task, p.lineage), []).append(p)
        held = carried_in.get((p.task, p.lineage))
        if held is None or order.get((p.repo, p.commit_sha), -1) >= order.get((held.repo, held.commit_sha), -1):
            carried_in[(p.task, p.lineage)] = p
    return carried_by, carried_in


def _checkpoint_refs(store: Store, table: list[dict[str, Any]], names: dict[tuple[str, str], str],
                     predictions: list[PredictionRow]) -> dict[tuple[str, str], list[str]]:
    """The refs of each checkpoint the report may name: the table's came with their refs; the
    others a prediction names and `names` lacks are looked up (one query)."""
    known_refs = {(row["repo"], row["commit"]): row["refs"] for row in table}
    unnamed = {(p.repo, p.commit_sha) for p in predictions} - set(names) - set(known_refs)
    return {**known_refs, **store.checkpoint_refs(sorted(unnamed))}


def _checkpoint_namer(names: dict[tuple[str, str], str], refs: dict[tuple[str, str], list[str]]
                      ) -> Callable[[str, str], str]:
    """`name_of(repo, commit)`: the name the report shows, made from `refs` the first time and
    kept in `names` (which stays what the report shows)."""
    def name_of(repo: str, commit: str) -> str:
        if (repo, commit) not in names:
            names[(repo, commit)] = checkpoint_name(repo, commit, refs.get((repo, commit), []))
        return names[(repo, commit)]

    return name_of


def _task_sections(store: Store, policy: Policy, curves: dict[str, Any], predictions: list[PredictionRow],
                   carried_in: dict[tuple[str, str], PredictionRow],
                   carried_by: dict[tuple[str, str], list[PredictionRow]], order: dict[tuple[str, str], int],
                   name_of: Callable[[str, str], str], problems: list[str], *, start: datetime, end: datetime
                   ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The section of each policy task that has a curve, in the policy's order, and the
    crossings they saw; each task's problems are appended to `problems`."""
    tasks, crossings = [], []
    for task in policy.tasks:
        curve = curves.get(task.name)
        if curve is None:
            continue
        section, seen, task_problems = _task_section(
            store, policy, task, curve, [p for p in predictions if p.task == task.name], carried_in, carried_by,
            order, name_of, start=start, end=end)
        tasks.append(section)
        crossings += seen
        problems += task_problems
    return tasks, crossings


def _build_report(store: Store, policy: Policy, ranks: ReportRanks, curves: dict[str, Any], problems: list[str],
                  corpus: str | None, *, now: datetime, period_start: datetime, name: str) -> dict[str, Any]:
    """`build_report`'s body, with the ranks of every scored checkpoint held by DuckDB (`ranks`)."""
    from monitor.alerts import watches

    lineages = lineage_rows(store, ranks)
    order = lineages.order
    table, families = table_and_families(lineages)
    names = {(row["repo"], row["commit"]): row["checkpoint"] for row in table}

    window = [p for p in store.report_predictions(policy.name, start=period_start, end=now) if p.task in curves]
    # Per (task, lineage): each checkpoint's state at the window's start (the current one is
    # chosen in training order below), and the current one's (the latest in training order,
    # as the alert engine compares with), where the crossings start from.
    carried_all, carried_ranks = carried_states(store, ranks, policy.name, start=period_start, tasks=curves,
                                                window=window)
    order.update(carried_ranks)
    order.update(ranks.ranks_of([(p.repo, p.commit_sha) for p in window]))
    carried_by, carried_in = _carried_by_lineage(carried_all, order)
    discovered = [c for c in store.report_new_checkpoints(start=period_start, end=now)
                  if watches(policy, c.repo, c.rule)]
    for c in discovered:
        names.setdefault((c.repo, c.sha), checkpoint_name(c.repo, c.sha, c.refs))
    refs = _checkpoint_refs(store, table, names, [*window, *carried_all])
    name_of = _checkpoint_namer(names, refs)
    problems += not_evaluated_problems(window, name_of)
    predictions = [p for p in window if p.state != NOT_EVALUATED]
    tasks, crossings = _task_sections(store, policy, curves, predictions, carried_in, carried_by, order, name_of,
                                      problems, start=period_start, end=now)

    observe_checked(store, policy, tasks, until=now)
    record = track_record_section(store, policy)
    problems += [r["problem"] for r in record if r.get("problem")]
    crossings.sort(key=lambda c: (c["at"], c["task"], c["lineage"]))
    mentioned = [*names, *((p.repo, p.commit_sha) for p in window)]

    def prefetch(pairs: Sequence[tuple[str, str]]) -> None:
        refs.update(store.checkpoint_refs(sorted(set(pairs) - set(names) - set(refs))))

    derivatives = derivative_sections(store, corpus, mentioned, [*predictions, *carried_in.values()], name_of,
                                      prefetch)
    # An observed state supersedes the prediction: observed_unresolved counts as at risk,
    # observed_emerged as emerged, observed_clear as neither.
    at_risk = [{"task": t["task"], **x} for t in tasks for x in t["lineages"] if _in_force(x) == "at_risk"]
    emerged = [{"task": t["task"], **x} for t in tasks for x in t["lineages"] if _in_force(x) == "emerged"]
    data = {
        "schema": SCHEMA, "policy": policy.name, "report": name, "generated_at": now,
        "policy_version": policy_version(policy, curves),
        "period": {"start": period_start, "end": now}, "corpus_sha256": corpus, "problems": problems,
        "summary": {"new_checkpoints": len(discovered), "new_scores": sum(r["new"] for r in table),
                    "lineages": len(families), "at_risk": len(at_risk), "emerged": len(emerged),
                    "crossings": len(crossings)},
        "new_checkpoints": [{"repo": c.repo, "commit": c.sha, "refs": c.refs,
                             "checkpoint": name_of(c.repo, c.sha), "status": c.status,
                             "reason": c.reason, "discovered_at": c.discovered_at} for c in discovered],
        "families": list(families.values()), "lstar_table": table, "tasks": tasks, "derivatives": derivatives,
        # every scored checkpoint of each lineage the L*-over-time figure draws, in training
        # order (filled below, once the figure's lineages are known)
        "lineage_history": [],
        "at_risk": at_risk, "emerged": emerged, "crossings": crossings,
        "track_record": record,
        "superseded_evaluations": superseded_section(store, policy, since=period_start, until=now),
        # what each reload that changed a task's judgement did (monitor.service.policy_change)
        "policy_changes": store.policy_changes(policy.name, start=period_start, end=now),
        "plots": [],
        "_curves": curves,
    }
    data["lineage_history"] = history_rows(store, ranks, plotted_lineages(data))
    return data


def report_figures(data: Mapping[str, Any]) -> dict[str, Any]:
    """The report's matplotlib figures by file name (the caller closes them, or `plots.png` does).

    The family colours are assigned once, over every lineage the report mentions, and passed
    to each figure, so a family has the same colour in all of them."""
    data = plotted(data)
    colours = report_colours(data)
    # every scored checkpoint of each lineage, not only the window's rows (a report read back
    # from JSON written before the history was kept has only its table)
    history = data.get("lineage_history") or data["lstar_table"]
    figures = {"lstar_over_time.png": report_plots.lstar_over_time_figure(history, colours),
               "ce_vs_lstar.png": report_plots.ce_against_lstar_figure(data["lstar_table"], colours)}
    names = curve_figure_names([task["task"] for task in data["tasks"]], taken=figures)
    for task in data["tasks"]:
        curve = data["_curves"][task["task"]]
        figures[names[task["task"]]] = report_plots.task_curve_figure(curve, curve_points(task), colours,
                                                                      margin=task.get("margin"))
    return figures


def curve_points(task: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """What a task's curve figure marks: the window's new predictions, and each lineage's
    current checkpoint (its state now) where the window predicted nothing for it."""
    shown = {(p["repo"], p["commit"]) for p in task["new_points"]}
    return [*task["new_points"], *(x for x in task["lineages"] if (x["repo"], x["commit"]) not in shown
                                   and x.get("p_hat") is not None)]


def curve_figure_names(tasks: Sequence[str], taken: Iterable[str] = ()) -> dict[str, str]:
    """The file name of each task's curve figure: `curve_<slug>.png`, unique among `taken`.

    Slugging folds characters ("a b" and "a/b" both give `a_b`), so a task whose name slugs
    like an earlier one's gets the first hex digits of its name's sha256, as many as make it
    unique: no figure silently replaces another."""
    used = set(taken)
    names: dict[str, str] = {}
    for task in tasks:
        base = f"curve_{slug(task)}"
        digest = hashlib.sha256(task.encode("utf-8")).hexdigest()
        name, width = f"{base}.png", 8
        while name in used:
            name, width = f"{base}_{digest[:width]}.png", width + 8
        used.add(name)
        names[task] = name
    return names


def render_plots(data: dict[str, Any]) -> dict[str, bytes]:
    """PNG bytes of every figure, by file name; also lists them in `data["plots"]`."""
    figures = {name: report_plots.png(fig) for name, fig in report_figures(data).items()}
    titles = {"lstar_over_time.png": "L* over time per lineage",
              "ce_vs_lstar.png": "Raw CE against L* per family"}
    tasks = [task["task"] for task in data["tasks"]]
    titles |= {name: f"Task curve: {task}" for task, name in curve_figure_names(tasks, taken=titles).items()}
    data["plots"] = [{"file": f, "title": titles[f]} for f in figures]
    return figures


def report_colours(data: Mapping[str, Any]) -> dict[str, str]:
    """The colour of each family (lineage) in every figure of this report."""
    names = {r["lineage"] for r in data["lstar_table"]}
    names |= {p["lineage"] for t in data["tasks"] for p in [*t["new_points"], *t["lineages"]]}
    return report_plots.family_colours(names)


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)


# -- rendering (the JSON text: json_text.py) ----------------------------------------------------
def ref_name(row: Mapping[str, Any]) -> str:
    """The checkpoint of a report row as every table names it (`present.checkpoint_name`)."""
    return row.get("checkpoint") or checkpoint_name(row["repo"], row["commit"], row.get("refs") or [])


def observe_checked(store: Store, policy: Policy, tasks: Sequence[dict[str, Any]], *,
                    until: datetime | None = None) -> None:
    """Give each lineage's current checkpoint its observed state, where an evaluation checked
    it (by `until`, the report's end): `predicted_state` keeps the prediction, `observed_state`
    the observation, and `state_in_force` is the observed one (it supersedes the prediction
    for that checkpoint)."""
    pairs = [(x["repo"], x["commit"]) for t in tasks for x in t["lineages"]]
    found = store.observed_states(pairs, until=until) if pairs else {}
    for t in tasks:
        for x in t["lineages"]:
            done = [o for o in found.get((x["repo"], x["commit"]), [])
                    if o["policy"] == policy.name and o["task"] == t["task"] and o["status"] == "done"]
            x["predicted_state"] = x["state"]
            x["observed_state"] = done[-1]["observed_state"] if done else None
            x["verdict"] = done[-1]["verdict"] if done else None
            x["state_in_force"] = x["observed_state"] or x["state"]


_OBSERVED_AS = {"observed_emerged": "emerged", "observed_unresolved": "at_risk", "observed_clear": "clear"}


def _in_force(x: Mapping[str, Any]) -> str:
    """The state in force for a lineage row: the observed one where an evaluation checked it."""
    observed = x.get("observed_state")
    return _OBSERVED_AS.get(observed, x["state"]) if observed else x["state"]


def track_record_section(store: Store, policy: Policy) -> list[dict[str, Any]]:
    """The track record of each curve of the policy (`monitor.alerts.observations.track_records`):
    checked predictions, coverage with its interval against the nominal confidence,
    contradictions, and a problem line for a curve whose coverage is significantly below it."""
    from monitor.alerts.observations import track_records

    out = []
    for r in track_records(store, policy.name):
        checks = [{k: c[k] for k in ("repo", "commit_sha", "predicted_state", "predicted_lo", "predicted_hi",
                                      "observed", "observed_lo", "observed_hi", "observed_state", "verdict",
                                      "inside")} for c in r["checks"]]
        row = {**{k: v for k, v in r.items() if k != "checks"}, "checks": checks}
        if r["miscalibrated"]:
            row["problem"] = (f"curve {r['curve_id']} (task {r['task']}) is miscalibrated: its intervals held "
                              f"{r['covered']} of {r['checked']} observations, significantly below the nominal "
                              f"{r['nominal']:g} (one-sided binomial p = {r['p_value']:.3g}); refit it with "
                              "`lstar curves refit --add-observed` and review the new artifact")
        out.append(row)
    return out


def track_record_markdown(record: Sequence[Mapping[str, Any]]) -> list[str]:
    """The report's track-record section as Markdown lines."""
    out = ["## Track record", "",
           "*How to read this:* each prediction an evaluation checked: coverage is the share of observations "
           "inside the predicted interval, with its Clopper-Pearson interval, against the curve's nominal "
           "confidence; a one-sided binomial test at 0.05 (at least 5 checks) flags a curve that covers "
           "significantly less.", ""]
    if not record:
        return out + ["No prediction has been checked by an evaluation yet.", ""]
    for r in record:
        share = "n/a" if r["coverage"] is None else f"{r['coverage']:.3f}"
        interval = "" if r["coverage_lo"] is None else f" [{r['coverage_lo']:.3f}, {r['coverage_hi']:.3f}]"
        verdict = ("**miscalibrated**" if r["miscalibrated"] else
                   "untested (fewer than 5 checks)" if r["p_value"] is None else "consistent with nominal")
        out += [f"### curve {markdown_text(r['curve_id'])} ({markdown_text(r['task'])})", "",
                f"- predictions checked: {r['checked']}",
                f"- coverage: {r['covered']}/{r['checked']} = {share}{interval} against nominal {r['nominal']:g}: "
                f"{verdict}" + ("" if r["p_value"] is None else f" (p = {r['p_value']:.3g})"),
                f"- contradictions: {r['contradictions']}", "",
                "| checkpoint | predicted | interval | observed | observed interval | observed state | inside | verdict |",
                "|---|---|---|---:|---|---|---|---|"]
        for c in r["checks"]:
            out.append(f"| {markdown_text(c['repo'] + '@' + c['commit_sha'][:12])} | {c['predicted_state']} | "
                       f"[{fmt(c['predicted_lo'])}, {fmt(c['predicted_hi'])}] | {fmt(c['observed'])} | "
                       f"[{fmt(c['observed_lo'])}, {fmt(c['observed_hi'])}] | {c['observed_state']} | "
                       f"{'yes' if c['inside'] else 'no'} | {c['verdict']} |")
        out.append("")
    return out


def version_line(data: Mapping[str, Any]) -> str:
    """The policy version a report was computed under, in words (`version.describe_version`)."""
    return f"{data['policy']} {describe_version(data['policy_version'])}"


def superseded_section(store: Store, policy: Policy, *, since: datetime,
                       until: datetime | None = None) -> list[dict[str, Any]]:
    """The policy's evaluations superseded in (`since`, `until`] because their task file changed before
    they ran: which (id, task, checkpoint, the file's sha256 then), why, and by which evaluation
    (its id, the new sha256, its status)."""
    return [{k: r[k] for k in ("id", "task", "repo", "commit_sha", "task_sha256", "reason", "superseded_at",
                               "superseded_by", "by_task_sha256", "by_status")}
            for r in store.superseded_observations(policy.name, since=since, until=until)]


def superseded_markdown(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The superseded evaluations as Markdown lines (none: nothing)."""
    if not rows:
        return []
    out = ["### Superseded evaluations", "",
           "*How to read this:* an evaluation whose task file changed before it ran is not run on the old "
           "file; an evaluation of the new file checks the same prediction in its place.", "",
           "| evaluation | task | checkpoint | task file then | superseded by | task file now | its status |",
           "|---:|---|---|---|---:|---|---|"]
    for r in rows:
        out.append(f"| {r['id']} | {markdown_text(str(r['task']))} | "
                   f"{markdown_text(str(r['repo']) + '@' + str(r['commit_sha'])[:12])} | "
                   f"{markdown_code((r['task_sha256'] or '')[:12])} | {r['superseded_by']} | "
                   f"{markdown_code((r['by_task_sha256'] or '')[:12])} | {markdown_text(r['by_status'] or '')} |")
    return out + [""]


def _how_to_read(section: str) -> list[str]:
    """The italic line that tells how to read a section (`explain.HOW_TO_READ`)."""
    return [f"*How to read this:* {HOW_TO_READ[section]}", ""]


def _omitted_note(omitted: Mapping[str, str], section: str) -> list[str]:
    """The line saying how many rows a summarised section leaves out (counts, no names)."""
    return [f"*{omitted[section]}.*", ""] if section in omitted else []


def _name_cell(row: Mapping[str, Any]) -> str:
    """A checkpoint's name as a Markdown table cell."""
    return markdown_text(ref_name(row))


def _summary_markdown(data: Mapping[str, Any], s: Mapping[str, Any]) -> list[str]:
    """The title, period, policy version, counts (`s`) and problems."""
    out = [f"# Governance report: {markdown_text(data['policy'])} ({markdown_text(data['report'])})", "",
           f"Period {fmt(data['period']['start'])} → {fmt(data['period']['end'])}; corpus "
           f"`{(data['corpus_sha256'] or 'unknown')[:12]}`.", "",
           *([f"Policy {markdown_text(version_line(data))}.", ""] if data.get("policy_version") else []),
           f"- new checkpoints: {s['new_checkpoints']} (new scores: {s['new_scores']})",
           f"- lineages: {s['lineages']}", f"- at risk: {s['at_risk']}, emerged: {s['emerged']}",
           f"- crossings (state changes): {s['crossings']}", ""]
    for problem in data["problems"]:
        out.append(f"> problem: {markdown_text(problem)}")
    return out


def _lstar_markdown(data: Mapping[str, Any], omitted: Mapping[str, str]) -> list[str]:
    """The L* table by family, then each lineage's current checkpoint."""
    out = ["## L* by family", "", *_how_to_read("lstar"), *_omitted_note(omitted, "lstar_table"),
           "| lineage | checkpoint | step | released | L* | SE | CE | CE_uni | tokenizer | new |",
           "|---|---|---:|---|---:|---:|---:|---:|---|---|"]
    for r in data["lstar_table"]:
        out.append(f"| {markdown_text(r['lineage'])} | {_name_cell(r)} | {fmt(r['step'])} | "
                   f"{fmt(r['released_at'])} | {fmt(r['lstar'])} | {fmt(r['se'])} | {fmt(r['ce'])} | "
                   f"{fmt(r['ce_unigram'])} | {markdown_code(r['tokenizer'][:12])} | {'yes' if r['new'] else ''} |")
    out += ["", "Current checkpoint per lineage (the latest in training order, not the last scored):", ""]
    out += [f"- {markdown_text(f['lineage'])}: {markdown_text(f['current'])} (ordered by {f['order']}), "
            f"L* {fmt(f['latest_lstar'])}"
            for f in data["families"]]
    return out


def _task_markdown(t: Mapping[str, Any], omitted: Mapping[str, str]) -> list[str]:
    """One task's section: its level and threshold, progress axis, curve warnings and the
    state of each lineage (observed before predicted)."""
    out = [f"### {markdown_text(t['task'])} ({markdown_text(t['metric'])})", "",
           f"Level b + ε = {fmt(t['baseline'])} + {fmt(t['margin'])} = {fmt(t['level'])}; threshold η̂ = "
           f"{fmt(t['eta'])} [{fmt(t['eta_lower'])}, {fmt(t['eta_upper'])}] at {t['confidence']:.0%}"
           + ("." if t["threshold_resolved"] else " — **unresolved**."), ""]
    label = markdown_text(t.get("axis_label", "L*"))
    if "curve_file" in t:
        imported = (f", {t['imported_points']} of them imported from a labels file (not scored here)"
                    if t["imported_points"] else "")
        out += [f"Progress axis: {label}, from the curve {markdown_code(t['curve_file'])} "
                f"({t['curve_points']} labelled points{imported}).", ""]
    out += [f"- curve warning ({markdown_text(w['code'])}): {markdown_text(w['message'])}"
            for w in t["curve_warnings"]]
    out += ([""] if t["curve_warnings"] else []) + _omitted_note(omitted, f"task:{t['task']}") + [
            f"| lineage | current checkpoint | state | {label} | P̂ | interval | threshold |",
            "|---|---|---|---:|---:|---|---:|"]
    for x in t["lineages"]:
        rho = "measured" if x.get("rho_measured") else "unmeasured"
        via = f" (from L*(base) {fmt(x.get('lstar_base'))}; ρ {rho})" if x.get("coordinate") == "base" else ""
        state = (f"**{x['observed_state']}** (predicted {x['state']}){via}" if x.get("observed_state")
                 else f"**{x['state']}**{via}")
        beyond = f" ({markdown_text(x['extrapolation'])})" if x.get("extrapolation") else ""
        out.append(f"| {markdown_text(x['lineage'])} | {_name_cell(x)} | {state} | "
                   f"{fmt(x.get('value', x['lstar']))} | "
                   f"{fmt(x['p_hat'])} | [{fmt(x['lo'])}, {fmt(x['hi'])}]{beyond} | {fmt(x['threshold'])} |")
    out.append("")
    return out


def _crossings_markdown(data: Mapping[str, Any], omitted: Mapping[str, str]) -> list[str]:
    """The state changes in the period (or a line saying there were none)."""
    out = ["## Crossings", "", *_how_to_read("crossings"), *_omitted_note(omitted, "crossings")]
    if data["crossings"]:
        out += ["| task | lineage | checkpoint | from | to | L* |", "|---|---|---|---|---|---:|"]
        for c in data["crossings"]:
            out.append(f"| {markdown_text(c['task'])} | {markdown_text(c['lineage'])} | {_name_cell(c)} | "
                       f"{c['from'] or 'new'} | "
                       f"{c['to']} | {fmt(c['lstar'])} |")
    else:
        out.append("No state changed in this period.")
    return out


def _stability_markdown(data: Mapping[str, Any]) -> list[str]:
    """The tokenizer-confidence and margin diagnostics of each checkpoint in the L* table."""
    out = ["", "## Stability diagnostics", "", *_how_to_read("stability"),
           "| checkpoint | TCB mean | TCB median | TCB p10 | V_eff (tokens) | logit margin (nats) |",
           "|---|---:|---:|---:|---:|---:|"]
    for r in data["lstar_table"]:
        st = r["stability"] or {}
        out.append(f"| {_name_cell(r)} | {fmt(st.get('mean'))} | {fmt(st.get('median'))} | {fmt(st.get('p10'))} | "
                   f"{fmt(st.get('v_eff_mean'), 1)} | {fmt(st.get('margin_mean'))} |")
    return out


def _new_checkpoints_markdown(data: Mapping[str, Any], omitted: Mapping[str, str]) -> list[str]:
    """The checkpoints discovered in the period, each with its status."""
    out = ["", "## New checkpoints", "", *_omitted_note(omitted, "new_checkpoints")]
    for c in data["new_checkpoints"]:
        out.append(f"- {_name_cell(c)}: {c['status']}" + (f" ({markdown_text(c['reason'])})" if c["reason"] else ""))
    if not data["new_checkpoints"]:
        out.append("None.")
    return out


def _plots_markdown(data: Mapping[str, Any], image_prefix: str) -> list[str]:
    """Links to the plot files (or a line saying where they are written)."""
    out = ["", "## Plots", "", *_how_to_read("plots")]
    for p in data["plots"]:
        out.append(f"![{markdown_text(p['title'])}]({image_prefix}{p['file']})")
    if not data["plots"]:  # rendered without its files (printed, not written as a folder)
        out.append("*The plots are files: `lstar report --out DIR` writes them beside this report.*")
    return out


def to_markdown(data: Mapping[str, Any], *, image_prefix: str = "") -> str:
    """The report as Markdown (plots as links to the PNG files next to it). Every value that
    comes from the Hub, a policy, curve or task file or the store is written with
    `markdown_text` (a path with `markdown_code`), so it renders as the literal text it is."""
    s = data["summary"]
    data = summarised(data)
    omitted = data["omitted"]
    out = _summary_markdown(data, s)
    out += _lstar_markdown(data, omitted)
    out += ["", "## Tasks", "", *_how_to_read("tasks")]
    for t in data["tasks"]:
        out += _task_markdown(t, omitted)
    out += policy_changes_markdown(data.get("policy_changes") or [])
    out += track_record_markdown(data.get("track_record") or [])
    out += superseded_markdown(data.get("superseded_evaluations") or [])
    out += derivatives_markdown(data.get("derivatives") or [])
    out += _crossings_markdown(data, omitted)
    out += _stability_markdown(data)
    out += _new_checkpoints_markdown(data, omitted)
    out += _plots_markdown(data, image_prefix)
    return "\n".join(out) + "\n"


def to_html(data: Mapping[str, Any], figures: Mapping[str, bytes]) -> str:
    """The report as one self-contained HTML page (PNG figures embedded as data URIs)."""
    env = html_environment(TEMPLATE_DIR)
    env.filters["fmt"] = fmt
    env.filters["short"] = short
    env.globals["ref_name"] = ref_name
    env.globals["version_line"] = version_line
    env.globals["how_to_read"] = HOW_TO_READ
    images = [{"title": p["title"], "file": p["file"],
               "uri": "data:image/png;base64," + base64.b64encode(figures[p["file"]]).decode("ascii")}
              for p in data["plots"]]
    return env.get_template(HTML_TEMPLATE).render(data=summarised(data), images=images)


def write_report(data: dict[str, Any], folder: Path) -> dict[str, Path]:
    """Render every format into `folder`: report.{md,html,json} and the PNGs, all or nothing.

    The files are written into a hidden sibling folder that is renamed into place once all
    of them are written; a write that fails (a full disk) removes it, and any folder this
    call created on the way, so no empty or half-written report folder is left behind.
    """
    folder = Path(folder)
    figures = render_plots(data)
    files = {**figures, "report.md": to_markdown(data).encode("utf-8"),
             "report.html": to_html(data, figures).encode("utf-8")}
    created = missing_parents(folder)
    part = folder.with_name(f".{folder.name}.part")
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(part, ignore_errors=True)  # left by a crash mid-write
        part.mkdir()
        write_json(data, part / "report.json")   # encoded once, as it is written
        for name, blob in files.items():
            (part / name).write_bytes(blob)
        if folder.exists():
            shutil.rmtree(folder)
        os.rename(part, folder)
    except BaseException:
        shutil.rmtree(part, ignore_errors=True)
        remove_empty_folders(created)
        raise
    return {"json": folder / "report.json", "markdown": folder / "report.md", "html": folder / "report.html"}


def missing_parents(folder: Path) -> list[Path]:
    """The ancestors of `folder` that do not exist yet, deepest first."""
    missing = []
    parent = folder.parent
    while not parent.exists() and parent != parent.parent:
        missing.append(parent)
        parent = parent.parent
    return missing


def remove_empty_folders(folders: Sequence[Path]) -> None:
    """Remove each of `folders` (deepest first) that is empty; keep the rest."""
    for path in folders:
        try:
            path.rmdir()
        except OSError:
            return


def report_for_cli(store: Store, policy: Policy, *, now: datetime) -> dict[str, Any]:
    """An ad-hoc report: the period since the policy's newest recorded report (any name), or
    the longest window of its reports (7 days without any)."""
    ends = [r.period_end for r in store.reports(policy=policy.name, limit=1)]
    windows = [r.window for r in policy.reports] or [timedelta(days=7)]
    start = ends[0] if ends else now - max(windows)
    if start >= now:
        start = now - max(windows)
    return build_report(store, policy, now=now, period_start=start)


__all__ = ["SCHEMA", "build_report", "report_figures", "report_colours", "render_plots", "to_json", "iter_json",
           "write_json", "to_markdown",
           "to_html", "write_report", "report_for_cli", "version_line"]
