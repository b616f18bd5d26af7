"""A campaign's outputs: one curve artifact per (task, metric), and a validation report.

The labels of each task are joined with the campaign's own score run of each checkpoint
(its L*, SE, raw CE, parameter count), so every point of every curve is on one corpus
selection and one scoring spec, which pin the curve. Each curve is fitted by
`monitor.curves.fit.fit_curve` (what `lstar curves fit` runs), written with `save_curve`
(the format `policy check` accepts), and validated leave-one-family-out by
`monitor.curves.validation.lofo_validate` (what `lstar curves validate` prints). Every axis
the points have is raced for the progress axis by `monitor.curves.axis_choice.choose_axis`
(what `lstar curves validate --axes` prints). The report (`OUTPUT/validation.md` and `.json`)
carries each curve's threshold, its own warnings (`curve_warnings`: unresolved thresholds and
the like), the LOFO table and the axis table with its recommended axis; a task whose
curve cannot be fitted is reported with the reason. A curve an earlier run of the same
campaign wrote and this run did not is removed, and only such a curve
(`monitor.calibrate.manifest`). The campaign's, tasks', metrics' and families' names and the
messages quoting them come from its files: the Markdown writes each as literal text
(`monitor.escape.markdown_text`, file names as code spans), the JSON keeps them exact.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from monitor.calibrate.campaign import Campaign, TaskSpec
from monitor.calibrate.manifest import Cleanup, prepare_output, remove_stale, written_hashes
from monitor.calibrate.plan import Plan
from monitor.curves import curve_summary, curve_warnings, save_curve
from monitor.curves.artifact import CurveArtifact, ScoringRef
from monitor.curves.axis_choice import ChoiceConfig, choice_markdown, choose_axis
from monitor.curves.fit import fit_curve
from monitor.curves.labels import Label, labels_from_rows, select_labels, with_score_axes
from monitor.curves.validation import LofoResult, lofo_validate
from monitor.errors import CampaignError, CurveError, LabelError
from monitor.escape import markdown_code, markdown_text
from monitor.store import Store
from monitor.store.rows import LabelRow, ScoreRunRow

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


@dataclass
class CurveOutcome:
    """One (task, metric): its artifact and LOFO table, or why it could not be fitted."""

    task: str
    metric: str
    path: Path | None = None
    curve: CurveArtifact | None = None
    lofo: LofoResult | None = None
    error: str | None = None
    axis_choice: dict[str, Any] | None = None   # `choose_axis`'s table, or {"failed": why not}


@dataclass
class CampaignOutputs:
    """Where the campaign wrote its curves and report."""

    curves: list[CurveOutcome] = field(default_factory=list)
    report_md: Path | None = None
    report_json: Path | None = None
    cleanup: Cleanup = field(default_factory=Cleanup)   # stale curves removed, other files kept

    @property
    def failed(self) -> list[CurveOutcome]:
        return [c for c in self.curves if c.error is not None]


def curve_file_name(task: str, metric: str) -> str:
    """curves/<task>.<metric>.json, with anything but letters, digits, '_', '.', '-' as '_'."""
    return f"{_UNSAFE.sub('_', task)}.{_UNSAFE.sub('_', metric)}.json"


def _score_rows(plan: Plan, store: Store) -> tuple[dict[tuple[str, str], ScoreRunRow], str, ScoringRef]:
    """The campaign's score run of each checkpoint, by (repo, sha), and their shared pins."""
    rows: dict[tuple[str, str], ScoreRunRow] = {}
    pins: dict[tuple[str, ScoringRef], list[str]] = {}
    for work in plan.scores:
        run = store.score_run(plan.score_done[work.key])
        if run is None:  # pragma: no cover - the plan read it from this store
            raise CampaignError(f"score run {plan.score_done[work.key]} of {work.checkpoint.name} is missing")
        rows[(work.checkpoint.repo, work.checkpoint.sha)] = run
        pins.setdefault((str(run.corpus_sha256), ScoringRef.from_score_run(run.as_dict())), []).append(
            work.checkpoint.name)
    if len(pins) > 1:
        described = "; ".join(f"{ref.describe()} ({', '.join(names)})" for (_, ref), names in pins.items())
        raise CampaignError(f"the checkpoints were scored with different windows or prefixes: {described}",
                            hint="set scoring.max_context to a window every checkpoint supports, so all L* share one spec")
    (corpus, ref), = pins
    return rows, corpus, ref


def _task_labels(campaign: Campaign, task: TaskSpec, name: str, plan: Plan, store: Store,
                 scores: dict[tuple[str, str], ScoreRunRow]) -> list[Label]:
    """The campaign's labels of one task, each with its checkpoint's value and SE on every axis."""
    by_key = {(c.repo, c.sha): c for c in plan.checkpoints}
    if task.kind == "results":
        rows = _imported_rows(campaign, task, store, name)
    else:  # exactly this campaign's evaluation runs of the task
        runs = {plan.eval_done[w.key] for w in plan.evals if w.task_name == name and w.key in plan.eval_done}
        rows = [r for r in store.labels(task=name) if r.eval_run_id in runs]
    out = []
    for label in labels_from_rows([r for r in rows if (r.repo, r.sha) in by_key]):
        c = by_key[(label.repo or "", label.sha or "")]
        run = scores[(c.repo, c.sha)]
        # every axis of the run (monitor.curves.axes) with its SE, and the weights' parameter count
        out.append(with_score_axes(label.with_(checkpoint=c.name, family=c.family), run))
    return out


def _imported_rows(campaign: Campaign, task: TaskSpec, store: Store, name: str | None = None) -> list[LabelRow]:
    """Label rows imported from this task entry's results file(s) (they keep the file as source_ref)."""
    source = str(campaign.path(str(task.results)))
    folder = source.rstrip("/") + "/"
    return [r for r in store.labels(task=name) if r.eval_run_id is None
            and (r.source_ref == source or str(r.source_ref).startswith(folder))]


def _task_names(campaign: Campaign, task: TaskSpec, plan: Plan, store: Store) -> list[str]:
    if task.kind != "results":
        return sorted({w.task_name for w in plan.evals if w.task is task})
    return sorted({r.task for r in _imported_rows(campaign, task, store) if r.task})


def _baseline(task: TaskSpec, labels: list[Label], metric: str) -> float:
    if task.baseline is not None:
        return task.baseline
    for label in labels:
        if label.metric == metric and "baseline" in label.details:
            return float(label.details["baseline"])
    raise CampaignError(f"task {labels[0].task if labels else '?'}: no baseline for metric {metric!r}",
                        hint="give the task a `baseline`")


def fit_task(campaign: Campaign, task: TaskSpec, name: str, metric: str, labels: list[Label], *,
             corpus_sha256: str, ref: ScoringRef) -> CurveOutcome:
    """Fit, save and LOFO-validate one (task, metric); a fit that fails is the outcome's error."""
    fit = campaign.fit
    outcome = CurveOutcome(task=name, metric=metric)
    try:
        chosen, metric = select_labels(labels, task=name, metric=metric)
        baseline = _baseline(task, chosen, metric)
        curve = fit_curve(chosen, task=name, metric=metric, baseline=baseline, margin=fit.margin,
                          confidence=fit.confidence, resamples=fit.n_boot, seed=fit.seed,
                          corpus_sha256=corpus_sha256, scoring_spec=ref, predictor=fit.axis, lofo=True,
                          lofo_resamples=fit.lofo_n_boot)
        lofo = lofo_validate(chosen, baseline=baseline, margin=fit.margin, confidence=fit.confidence,
                             resamples=fit.lofo_n_boot, seed=fit.seed)
    except (LabelError, CurveError) as exc:
        outcome.error = exc.one_line()
        return outcome
    outcome.path = save_curve(curve, campaign.output_dir / "curves" / curve_file_name(name, metric))
    outcome.curve, outcome.lofo = curve, lofo
    try:
        outcome.axis_choice = choose_axis(chosen, baseline=baseline, margin=fit.margin, task=name, metric=metric,
                                          config=ChoiceConfig(confidence=fit.confidence,
                                                              resamples=fit.lofo_n_boot, seed=fit.seed))
    except (LabelError, CurveError) as exc:
        outcome.axis_choice = {"failed": exc.one_line()}
    return outcome


def write_outputs(campaign: Campaign, plan: Plan, store: Store, *,
                  on_progress: Callable[[str, int, int, str], None] | None = None) -> CampaignOutputs:
    """Fit every (task, metric) of the campaign and write the curves and the report."""
    scores, corpus, ref = _score_rows(plan, store)
    prepare_output(campaign.output_dir)   # still the folder checked at load, curves/ no link
    work: list[tuple[TaskSpec, str, str, list[Label]]] = []
    outputs = CampaignOutputs()
    for task in campaign.tasks:
        names = _task_names(campaign, task, plan, store)
        for name in names:
            labels = _task_labels(campaign, task, name, plan, store, scores)
            for metric in task.metrics or campaign.fit.metrics:
                work.append((task, name, metric, labels))
        if task.kind == "results" and not names:
            outputs.curves.append(CurveOutcome(
                task=str(task.results), metric=",".join(task.metrics or campaign.fit.metrics),
                error=f"{task.results} gave no label of a campaign checkpoint (see the skipped results); "
                      "check its task, metric and checkpoint columns"))
    files: dict[str, list[str]] = {}
    for _, name, metric, _ in work:
        files.setdefault(curve_file_name(name, metric), []).append(f"{name} · {metric}")
    for n, (task, name, metric, labels) in enumerate(work, start=1):
        shared = files[curve_file_name(name, metric)]
        if len(shared) > 1:   # two curves would overwrite one file: neither is written
            outputs.curves.append(CurveOutcome(task=name, metric=metric, error=(
                f"{' and '.join(shared)} would both be written to curves/{curve_file_name(name, metric)}; "
                "rename one of the tasks")))
        else:
            outputs.curves.append(fit_task(campaign, task, name, metric, labels, corpus_sha256=corpus, ref=ref))
        if on_progress is not None:
            on_progress("fit", n, len(work), f"{name} · {metric}")
    written = written_hashes(campaign.output_dir, [c.path.name for c in outputs.curves if c.path is not None])
    outputs.cleanup = remove_stale(campaign.output_dir, campaign.identity, written)
    outputs.report_json, outputs.report_md = write_report(campaign, plan, outputs, corpus_sha256=corpus, ref=ref)
    return outputs


def report_data(campaign: Campaign, plan: Plan, outputs: CampaignOutputs, *, corpus_sha256: str,
                ref: ScoringRef) -> dict[str, Any]:
    """The validation report as JSON-able data."""
    curves = []
    for c in outputs.curves:
        entry: dict[str, Any] = {"task": c.task, "metric": c.metric}
        if c.curve is None:
            entry["error"] = c.error
        else:
            entry.update(path=str(c.path), summary=curve_summary(c.curve),
                         warnings=[w.as_dict() for w in curve_warnings(c.curve)],
                         lofo=c.lofo.as_dict() if c.lofo is not None else None, axis_choice=c.axis_choice)
        curves.append(entry)
    return {"campaign": campaign.name, "corpus_sha256": corpus_sha256, "scoring_spec": ref.describe(),
            "checkpoints": plan.as_dict()["checkpoints"], "fit": campaign.fit.model_dump(), "curves": curves}


def _g(v: float | None) -> str:
    return "—" if v is None else f"{v:.4g}"


def report_markdown(data: dict[str, Any], outputs: CampaignOutputs) -> str:
    """The validation report in Markdown: per curve its threshold, warnings and LOFO table."""
    text = markdown_text
    lines = [f"# Calibration campaign {text(data['campaign'])}", "",
             f"- corpus sha256 {markdown_code(data['corpus_sha256'])}",
             f"- scoring spec {markdown_code(data['scoring_spec'])}",
             f"- {len(data['checkpoints'])} checkpoints in "
             f"{len({c['family'] for c in data['checkpoints']})} families", ""]
    for entry, c in zip(data["curves"], outputs.curves):
        lines += [f"## {text(entry['task'])} · {text(entry['metric'])}", ""]
        if c.curve is None:
            lines += [f"Not fitted: {text(entry['error'])}", ""]
            continue
        s, thr = entry["summary"], entry["summary"]["threshold"]
        lines += [f"- curve {markdown_code(s['curve_id'][:16])} → {markdown_code(Path(entry['path']).name)}",
                  f"- {s['n_checkpoints']} checkpoints, families {', '.join(map(text, s['families']))}",
                  f"- baseline b = {s['baseline']:g}, margin ε = {s['margin']:g}, threshold b + ε = {s['level']:g}",
                  f"- η̂ = {_g(thr['estimate'])} [{_g(thr['lower'])}, {_g(thr['upper'])}] at "
                  f"{thr['confidence']:.0%} ({thr['status']}); threshold "
                  f"{'resolved' if s['threshold_resolved'] else 'NOT resolved'}",
                  f"- emergence score {_g(s['emergence_score'])}", ""]
        if entry["warnings"]:
            lines += ["Warnings:", ""] + [f"- {text(w['message'])}" for w in entry["warnings"]] + [""]
        if c.lofo is not None:
            lines += [f"Leave-one-family-out ({len(c.lofo.families)} families):", "", c.lofo.to_markdown().rstrip(), ""]
            lines += [f"- skipped {text(k)}: {text(v)}" for k, v in c.lofo.skipped.items()]
            if c.lofo.skipped:
                lines.append("")
        if c.axis_choice is not None:
            lines += ["Progress axis, by leave-one-family-out evidence:", ""]
            lines += ([f"Not chosen: {text(c.axis_choice['failed'])}", ""] if "failed" in c.axis_choice
                      else [choice_markdown(c.axis_choice).rstrip(), ""])
    return "\n".join(lines).rstrip() + "\n"


def write_report(campaign: Campaign, plan: Plan, outputs: CampaignOutputs, *, corpus_sha256: str,
                 ref: ScoringRef) -> tuple[Path, Path]:
    """OUTPUT/validation.json and OUTPUT/validation.md, each written atomically."""
    data = report_data(campaign, plan, outputs, corpus_sha256=corpus_sha256, ref=ref)
    out = campaign.output_dir
    paths = []
    for name, text in (("validation.json", json.dumps(data, indent=2) + "\n"),
                       ("validation.md", report_markdown(data, outputs))):
        tmp = out / f".{name}.tmp-{os.getpid()}"
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, out / name)
        paths.append(out / name)
    return paths[0], paths[1]
