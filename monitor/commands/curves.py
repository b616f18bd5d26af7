"""`lstar curves fit|show|validate|predict`: task curves from labelled checkpoints.

The curve and label modules (scipy, scikit-learn, matplotlib behind them) are imported inside
the commands, so that `lstar --help` and unrelated commands do not pay for them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from monitor.commands.options import (DB_OPTION, JSON_OPTION, MAX_RESAMPLES, MAX_SEED, STATE_OPTION, OptionError,
                                      db_file, float_option, int_option, json_option)
from monitor.commands.terminal import echo, plain_console
from monitor.errors import CurveError, LabelError
from monitor.escape import markdown_text

if TYPE_CHECKING:
    from monitor.curves import CurveArtifact, Label, ScoringRef

LABELS_HELP = ("CSV (checkpoint,family,value,n or stderr, and a column per axis: lstar, bits_per_byte, "
               "lstar_per_byte, l_rel, l_gain, raw_ce, log_params, log_flops; <axis>_se for SEs), "
               "or lm-eval results_*.json (a file or folder) joined with L* from --db. "
               "Without it, labels stored by `lstar eval` are used.")


# Performance is a share (accuracy and the like): the baseline lies in [0, 1), the margin in (0, 1].
BASELINE_OPTION = float_option(..., "--baseline", low=0.0, high=1.0, high_open=True,
                               help="The task's random baseline b_t.")
MARGIN_OPTION = float_option(..., "--margin", low=0.0, high=1.0, low_open=True,
                             help="Margin ε above the baseline.")
SEED_OPTION = int_option(0, "--seed", low=0, high=MAX_SEED, help="Bootstrap seed.")
TASK_OPTION = typer.Option(..., "--task", help="Task name (as in the labels).")
LABELS_OPTION = typer.Option(None, "--labels", help=LABELS_HELP)
METRIC_OPTION = typer.Option(None, "--metric", help="Metric variant (e.g. acc_norm).")


def confidence_option(help: str) -> Any:
    return float_option(0.9, "--confidence", low=0.0, high=1.0, low_open=True, high_open=True, help=help)


def bootstrap_option(default: int, help: str) -> Any:
    # The fit needs at least 50 resamples for its percentile bands (monitor.curves.fit).
    return int_option(default, "--bootstrap", "--n-boot", low=50, high=MAX_RESAMPLES, help=help)


def load_fit_labels(labels_path: Path | None, db_path: Path, *, task: str, corpus_sha256: str | None,
                    family: str | None, budget_column: str | None = None
                    ) -> tuple[list[Label], dict[str, Any] | None]:
    """Labels with predictors from a CSV, or from lm-eval results / the store joined with the
    store's score runs; the second value holds the corpus and spec pins of a join."""
    from monitor.store import Store

    from monitor.curves import join_scores, labels_from_rows, read_labels_csv, read_lm_eval_results

    if budget_column is not None and (labels_path is None or labels_path.suffix.lower() != ".csv"):
        raise LabelError("--budget-column needs a labels CSV (--labels FILE.csv) with that column")
    if labels_path is not None and labels_path.suffix.lower() == ".csv":
        labels = read_labels_csv(labels_path, budget_column=budget_column)
        if family is not None:
            labels = [label.with_(family=family) for label in labels]
        return labels, None
    if labels_path is not None:
        raw = read_lm_eval_results(labels_path, family=family)
    else:
        with Store.open(db_path, read_only=True) as store:
            raw = labels_from_rows(store.labels(task=task))
        if not raw:
            raise CurveError(f"no stored labels for task {task!r} in {db_path}",
                             hint="run `lstar eval MODEL --task FILE` first, or pass --labels")
        if family is not None:
            raw = [label.with_(family=family) for label in raw]
    tasks = sorted({label.task for label in raw if label.task is not None})
    if task not in tasks:
        raise LabelError(f"unknown task {task!r} in the labels", hint=f"available: {', '.join(tasks)}")
    raw = [label for label in raw if label.task == task]
    with Store.open(db_path, read_only=True) as store:
        return join_scores(raw, store, corpus_sha256=corpus_sha256)


def _resolve_pins(pins: dict[str, Any] | None, corpus_sha: str | None,
                  spec: str | None) -> tuple[str | None, ScoringRef | None]:
    from monitor.curves import ScoringRef

    given = ScoringRef.parse(spec) if spec else None
    if pins is None:
        return corpus_sha, given
    joined = ScoringRef(spec_version=pins["spec_version"], window=pins["window"], stride=pins["stride"],
                        prefix_policy=pins["prefix_policy"])
    if given is not None and given != joined:
        raise CurveError(f"--spec {given.describe()} differs from the scores' spec {joined.describe()}")
    return pins["corpus_sha256"], joined


def _fmt(v: float | None, digits: int = 4) -> str:
    return "—" if v is None else f"{v:.{digits}g}"


def _intervals(intervals: dict[str, dict[str, Any]], confidence: float) -> tuple[str, str]:
    """The reported and the diagnostic interval of η̂ (`threshold_intervals`), each saying which it is."""
    rep, diag = intervals["reported"], intervals["diagnostic"]
    return (f"[{_fmt(rep['lower'])}, {_fmt(rep['upper'])}] at {confidence:.0%} (band inversion, reported)",
            f"[{_fmt(diag['lower'])}, {_fmt(diag['upper'])}] at {confidence:.0%}, median {_fmt(diag['median'])} "
            "(diagnostic; no state rests on it)")


def _family_text(curve: CurveArtifact) -> str:
    """`sigmoid (floor …, ceiling …, k …, x0 …); widening c = … per unit beyond the data`."""
    from monitor.curves.artifact import extrapolation_widening

    text = curve.fit_family
    if curve.sigmoid is not None:
        sig = curve.sigmoid
        text += f" (floor {sig.floor:.4g}, ceiling {sig.ceiling:.4g}, k {sig.k:.4g}, x0 {sig.x0:.4g})"
    if curve.family_choice is not None:
        text += f"; chosen by forward validation ({curve.family_choice.get('ordering')})"
    source = "forward validation" if curve.extrapolation_widening is not None else "the curve's mean slope"
    text += f"; beyond the data the interval widens by {extrapolation_widening(curve):.4g} per unit ({source})"
    if curve.lineage_spread:
        text += f"; every interval widened by {curve.lineage_spread:.4g} (spread of new models, forward validation)"
    return text


def forward_table(record: dict[str, Any]) -> Table:
    """The forward-validation table of `choose_family` / `forward_validate`: per family its
    errors, coverage and widening, then its errors by extrapolation distance."""
    def pct(v: Any) -> str:
        return "—" if v is None else f"{v:.1%}"

    chosen = record.get("chosen")
    title = (f"forward validation by {record.get('ordering')} ({len(record.get('splits', []))} splits)"
             + (f": {chosen} chosen ({record.get('rule')})" if chosen else ""))
    table = Table(title=title, title_justify="left")
    # a: the spread added everywhere, c: the widening per axis unit ahead (measurement.md §3a)
    for name in ("family", "distance", "n", "MAE", "|rel|", "bias", "cover", "widened", "a", "c"):
        table.add_column(name, justify="left" if name in ("family", "distance") else "right")
    for family, row in record.get("families", {}).items():
        table.add_row(family, "all", str(row.get("n", 0)), _fmt(row.get("mae"), 3), pct(row.get("mare")), "",
                      pct(row.get("coverage")), pct(row.get("coverage_widened")), _fmt(row.get("spread"), 3),
                      _fmt(row.get("widening"), 3))
        for b in row.get("by_distance", []):
            where = "inside" if b["from"] is None else f"{b['from']:.3g}–{b['to']:.3g}"
            table.add_row("", where, str(b["n"]), _fmt(b["mae"], 3), pct(b["mare"]), f"{b['bias']:+.3f}",
                          pct(b["coverage"]), "", "", "")
    return table


def resamples_crossing(never_share: float) -> str:
    """How many bootstrap resamples of the curve cross the threshold, in words."""
    if never_share <= 0.0:
        return "every bootstrap resample crosses the threshold"
    if never_share >= 1.0:
        return "no bootstrap resample crosses the threshold"
    return f"{never_share:.1%} of bootstrap resamples never cross the threshold"


def print_summary(curve: CurveArtifact, console: Console) -> None:
    """A rich summary of a curve artifact. η̂ has two intervals in the artifact: the band
    inverted, which is reported (the states agree with it), and the bootstrap percentile of
    the resamples' crossings, a diagnostic; both rows say which they are."""
    from monitor.curves.artifact import threshold_intervals
    from monitor.curves.axes import AXES

    thr = curve.threshold
    reported, diagnostic = _intervals(threshold_intervals(thr, curve.axis), thr.confidence)
    table = Table(title=f"curve {curve.curve_id[:12]}: {curve.task} · {curve.metric}", title_justify="left",
                  show_header=False)
    table.add_column("field")
    table.add_column("value")
    pred = AXES[curve.axis]
    n_imported = sum(p.imported for p in curve.points)
    rows = [
        ("axis", f"{pred.label} ({pred.name}, {pred.unit}; {'lower' if pred.lower_is_progress else 'higher'} "
                 f"is progress)" + (f"; {n_imported} imported point(s)" if n_imported else "")),
        ("fit family", _family_text(curve)),
        ("checkpoints", f"{curve.n_checkpoints} in {len(curve.families)} families "
                        f"({', '.join(curve.families) or '—'})"),
        (f"{pred.label} range", f"{curve.x_range[0]:.4g} … {curve.x_range[1]:.4g}"),
        ("baseline b, margin ε", f"{curve.baseline:g}, {curve.margin:g} (threshold {curve.level:g})"),
        ("η̂ (threshold)", f"{_fmt(thr.estimate)} · {thr.status} · {resamples_crossing(thr.never_share)}"),
        ("η̂ interval", reported),
        ("η̂ bootstrap percentile", diagnostic),
        ("logistic check", f"threshold {_fmt(curve.logistic.threshold)}, ceiling {_fmt(curve.logistic.ceiling)}"
         if curve.logistic.converged else f"did not converge ({curve.logistic.message})"),
        ("emergence score", _fmt(curve.emergence_score, 3)),
        ("corpus", curve.corpus_sha256 or "not pinned"),
        ("scoring spec", curve.scoring_spec.describe() if curve.scoring_spec else "not pinned"),
        ("bootstrap", f"{curve.bootstrap.resamples} resamples, seed {curve.bootstrap.seed}, "
                      f"dispersion {curve.bootstrap.dispersion:.3g}"),
    ]
    if curve.budget is not None:
        from monitor.curves import at_budget

        # A budget curve has one threshold per budget level; the top-level one is only the first.
        rows = [r for r in rows if r[0] not in ("η̂ (threshold)", "η̂ interval", "η̂ bootstrap percentile",
                                                "logistic check", "emergence score")]
        rows.insert(4, ("budget", f"column {curve.budget.column!r}, levels {curve.budget.describe_levels()} "
                                  "(predictions only at these levels)"))
        for offset, value in enumerate(curve.budget.levels):
            part = at_budget(curve, value).threshold
            reported, diagnostic = _intervals(threshold_intervals(part, curve.axis), part.confidence)
            rows[5 + 2 * offset:5 + 2 * offset] = [
                (f"η̂ at budget {value:g}", f"{_fmt(part.estimate)} {reported} · {part.status}"),
                (f"η̂ at budget {value:g}, bootstrap", f"percentile {diagnostic}")]
    for key, value in rows:
        table.add_row(key, value)
    console.print(table)
    if curve.budget is not None and curve.budget.lofo:
        lofo = Table(title="leave-one-family-out: how the budget is used", title_justify="left")
        for name in ("model", "RMSE", "crossing error", "held out", "folds"):
            lofo.add_column(name, justify="left" if name == "model" else "right")
        for b in curve.budget.lofo:
            lofo.add_row(b.model, f"{b.rmse:.4f}", f"{b.crossing_error:.3f}", str(b.n_heldout), str(b.n_folds))
        console.print(lofo)
    if curve.family_choice is not None:
        console.print(forward_table(curve.family_choice))
    if curve.choice is not None:
        console.print(choice_text(curve.choice), markup=False, highlight=False, emoji=False, soft_wrap=True)
    if curve.lofo is not None:
        lofo = Table(title=f"leave-one-family-out ({len(curve.lofo.families)} families)", title_justify="left")
        for name in ("predictor", "RMSE", "crossing error", "Brier", "held out"):
            lofo.add_column(name, justify="left" if name == "predictor" else "right")
        for r in curve.lofo.rows:
            lofo.add_row(r.label, f"{r.rmse:.4f}", f"{r.crossing_error:.3f}", f"{r.brier:.4f}", str(r.n_heldout))
        console.print(lofo)


def _warn(curve: CurveArtifact) -> None:
    """The curve's own warnings (`curve_warnings`), one line each on stderr."""
    from monitor.curves import at_budget, curve_warnings

    if curve.budget is not None:  # each level has its own threshold and warnings
        for value in curve.budget.levels:
            for warning in curve_warnings(at_budget(curve, value)):
                echo(f"warning: budget {value:g}: {warning.message}", err=True)
        return
    for warning in curve_warnings(curve):
        echo(f"warning: {warning.message}", err=True)


def _validate_axes(*, task: str | None, baseline: float, margin: float, labels: Path | None,
                   metric: str | None, confidence: float, bootstrap: int, seed: int, corpus_sha: str | None,
                   family: str | None, axes: str, family_resamples: int, out: Path | None, db_path: Path,
                   as_json: bool, fit_families: str | None = None) -> None:
    """`curves validate --axes`: the axis choice of one task, or of every task of a CSV."""
    from monitor.curves import select_labels
    from monitor.curves.axis_choice import (ChoiceConfig, choice_markdown, choose_axis, parse_axes,
                                            parse_fit_families)

    names = parse_axes(axes)
    fams = parse_fit_families(fit_families)
    cfg = ChoiceConfig(confidence=confidence, resamples=bootstrap, seed=seed, family_resamples=family_resamples)
    if task is None:
        if labels is None or labels.suffix.lower() != ".csv":
            raise CurveError("give --task (every task is validated only from a labels CSV)")
        rows, _ = load_fit_labels(labels, db_path, task="", corpus_sha256=corpus_sha, family=family)
        tasks = sorted({label.task for label in rows if label.task is not None}) or [None]
    else:
        rows, _ = load_fit_labels(labels, db_path, task=task, corpus_sha256=corpus_sha, family=family)
        tasks = [task]
    choices = []
    for name in tasks:
        chosen, used = select_labels(rows, task=name, metric=metric)
        choices.append(choose_axis(chosen, baseline=baseline, margin=margin, axes=names, config=cfg,
                                   task=name, metric=used, fit_families=fams))
    data = {"schema": "lstar-axis-choice/2", "tasks": choices}
    if out is not None:
        suffix = out.suffix.lower()
        if suffix not in (".json", ".md", ".markdown"):
            raise CurveError(f"cannot tell the table format of {out}", hint="use .json or .md with --axes")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(data, indent=2) + "\n" if suffix == ".json" else
                       "\n".join(f"### {markdown_text(c['task'])} · {markdown_text(c['metric'])}\n\n"
                                 f"{choice_markdown(c)}" for c in choices),
                       encoding="utf-8")
    if as_json:
        print(json.dumps(data, indent=2))
        return
    console = plain_console()
    for c in choices:
        console.print(f"{c['task']} · {c['metric']}", style="bold", markup=False, highlight=False)
        console.print(choice_markdown(c), markup=False, highlight=False, emoji=False, soft_wrap=True)
    if out is not None:
        console.print(f"wrote {out}", soft_wrap=True, markup=False)


def _fit_chosen(rows: list[Any], *, task: str, metric: str | None, baseline: float, margin: float,
                fit_family: str, confidence: float, resamples: int, seed: int, **fit_args: Any) -> CurveArtifact:
    """`curves fit --axis auto`: choose the (axis, family) pair (`choose_axis`; both families
    with --fit-family auto, else the one named) and fit it, the choice recorded in the artifact
    with the widening its forward validation measured, where it had one."""
    from monitor.curves import select_labels
    from monitor.curves.axis_choice import FIT_FAMILIES, ChoiceConfig, choose_axis
    from monitor.curves.fit import fit_curve

    chosen, used = select_labels(rows, task=task, metric=metric)
    record = choose_axis(chosen, baseline=baseline, margin=margin, task=task, metric=used,
                         config=ChoiceConfig(confidence=confidence, seed=seed),
                         fit_families=FIT_FAMILIES if fit_family == "auto" else (fit_family,))
    pair = record["choice"]
    forward = (pair.get("forward") or {}).get("families", {}).get(pair["family"]) or {}
    return fit_curve(rows, task=task, metric=metric, baseline=baseline, margin=margin, confidence=confidence,
                     resamples=resamples, seed=seed, axis=pair["axis"], family=pair["family"],
                     widening=forward.get("widening"), spread=forward.get("spread"), choice=pair, **fit_args)


def choice_text(pair: dict[str, Any]) -> str:
    """The recorded (axis, family) choice of a curve, in words, with its candidates."""
    from monitor.curves.axis_choice import candidates_markdown

    return (f"axis and fit family chosen: {pair.get('family')} on {pair.get('axis')}, by "
            f"{pair.get('decided_by')}: {pair.get('reason')}\n\n{candidates_markdown(pair)}\nRule: {pair.get('rule')}.")


def register(app: typer.Typer) -> None:
    curves = typer.Typer(help="Task curves: fit, show, validate and apply them.", no_args_is_help=True)

    for add_command in (_fit_command, _refit_command, _show_command, _validate_command, _predict_command):
        add_command(curves)

    app.add_typer(curves, name="curves")


def _fit_command(curves: typer.Typer) -> None:
    @curves.command("fit")
    def fit(
        out: Path = typer.Option(..., "--out", help="Where to write the curve artifact (JSON)."),
        task: str = TASK_OPTION,
        baseline: float = BASELINE_OPTION,
        margin: float = MARGIN_OPTION,
        labels: Path = LABELS_OPTION,
        metric: str = METRIC_OPTION,
        confidence: float = confidence_option("Band and interval confidence."),
        bootstrap: int = bootstrap_option(1000, "Bootstrap resamples."),
        seed: int = SEED_OPTION,
        corpus_sha: str = typer.Option(None, "--corpus-sha", help="Corpus sha256 the L* values are on."),
        spec: str = typer.Option(None, "--spec", help="Scoring spec, e.g. lstar-score/1:window=2048,stride=1024,prefix=bos."),
        family: str = typer.Option(None, "--family", help="Family for every row (lm-eval/stored labels)."),
        no_lofo: bool = typer.Option(False, "--no-lofo", help="Skip leave-one-family-out validation."),
        axis: str = typer.Option("lstar", "--axis", "--predictor",
                                 help="Progress axis: lstar, bits_per_byte, lstar_per_byte, l_rel, l_gain, "
                                      "raw_ce, log_params or log_flops; or auto: the axis choice of `curves "
                                      "validate --axes` picks the axis (and, with --fit-family auto, the "
                                      "family) and the curve records the choice with its candidates."),
        fit_family: str = typer.Option("isotonic", "--fit-family",
                                       help="Curve family: isotonic (flat beyond the data), sigmoid (a "
                                            "four-parameter sigmoid in the axis, whose band reaches beyond the "
                                            "data) or auto (forward validation chooses, from smaller models or "
                                            "earlier training to larger or later; needs params, or lineage "
                                            "and step, on every row)."),
        budget_column: str = typer.Option(None, "--budget-column",
                                          help="Labels CSV column holding each row's inference budget "
                                               "(samples, majority-of-k, an ordered level): fit a curve "
                                               "monotone in both the axis and the budget."),
        state: Path = STATE_OPTION,
        db: Path | None = DB_OPTION,
        as_json: bool = json_option("Print the summary as JSON."),
    ) -> None:
        """Fit a monotone curve of task performance on a progress axis (L* by default) and write
        its artifact (with --budget-column: monotone in the axis and an inference budget)."""
        from monitor.curves import curve_summary, save_curve
        from monitor.curves.axes import get_axis
        from monitor.curves.fit import fit_curve

        if axis != "auto":
            get_axis(axis)  # an unknown axis is refused before any labels are read
        db_path = db_file(state, db)
        rows, pins = load_fit_labels(labels, db_path, task=task, corpus_sha256=corpus_sha, family=family,
                                     budget_column=budget_column)
        corpus, scoring = _resolve_pins(pins, corpus_sha, spec)
        if budget_column is not None:
            from monitor.curves.budget import fit_budget_curve

            if fit_family != "isotonic":
                raise CurveError("a budget curve is isotonic; --fit-family applies to one-axis curves")

            curve = fit_budget_curve(rows, task=task, metric=metric, baseline=baseline, margin=margin,
                                     budget_column=budget_column, confidence=confidence, resamples=bootstrap,
                                     seed=seed, corpus_sha256=corpus, scoring_spec=scoring,
                                     lofo=not no_lofo, axis=axis)
        elif axis == "auto":
            curve = _fit_chosen(rows, task=task, metric=metric, baseline=baseline, margin=margin,
                                confidence=confidence, resamples=bootstrap, seed=seed, corpus_sha256=corpus,
                                scoring_spec=scoring, lofo=not no_lofo, fit_family=fit_family)
        else:
            curve = fit_curve(rows, task=task, metric=metric, baseline=baseline, margin=margin,
                              confidence=confidence, resamples=bootstrap, seed=seed, corpus_sha256=corpus,
                              scoring_spec=scoring, lofo=not no_lofo, axis=axis, family=fit_family)
        save_curve(curve, out)
        _warn(curve)
        if as_json:
            print(json.dumps({**curve_summary(curve), "path": str(out)}, indent=2))
            return
        console = plain_console()
        print_summary(curve, console)
        console.print(f"wrote {out}", soft_wrap=True, markup=False)


def _refit_command(curves: typer.Typer) -> None:
    @curves.command("refit")
    def refit(
        curve_path: Path = typer.Argument(..., help="The curve artifact (JSON) to refit; it is not changed."),
        add_observed: bool = typer.Option(False, "--add-observed",
                                          help="Add the daemon's observations of this curve (required)."),
        out: Path = typer.Option(..., "--out", help="Where to write the new artifact (JSON)."),
        state: Path = STATE_OPTION,
        db: Path | None = DB_OPTION,
        as_json: bool = json_option("Print the summary as JSON."),
    ) -> None:
        """Refit a curve with the evaluations the daemon observed: a new artifact (new id, its
        provenance naming the parent curve and the observed checkpoints). No policy is changed;
        point one at the new file after reviewing it."""
        from monitor.store import Store

        from monitor.curves import curve_summary, save_curve
        from monitor.curves.refit import refit_with_observed

        if not add_observed:
            raise OptionError("say --add-observed: the only refit there is adds the observed "
                                     "evaluations", param_hint="--add-observed")
        if out.resolve() == curve_path.resolve():
            raise OptionError(f"{out} is the curve itself; a refit never overwrites the reviewed file",
                                     param_hint="--out")
        with Store.open(db_file(state, db), read_only=True) as store:
            curve = refit_with_observed(curve_path, store)
        save_curve(curve, out)
        _warn(curve)
        if as_json:
            print(json.dumps({**curve_summary(curve), "path": str(out), "provenance": curve.provenance}, indent=2))
            return
        console = plain_console()
        print_summary(curve, console)
        prov = curve.provenance or {}
        console.print(f"wrote {out} (refit of {str(prov.get('parent_curve_id'))[:12]} with "
                      f"{len(prov.get('observed_checkpoints') or [])} observed checkpoint(s))",
                      soft_wrap=True, markup=False)


def _show_command(curves: typer.Typer) -> None:
    @curves.command("show")
    def show(
        curve_path: Path = typer.Argument(..., help="A curve artifact (JSON)."),
        png: Path = typer.Option(None, "--png", help="Also render the curve to this PNG file."),
        as_json: bool = json_option("Print the summary as JSON."),
        state: Path = STATE_OPTION,
        db: Path | None = DB_OPTION,
    ) -> None:
        """Summarise a curve (and plot it with --png), with the stress limits its stored stress
        results exceed (`lstar stress --db`; limits in docs/stress.md)."""
        from monitor.curves import curve_summary, load_curve
        from monitor.curves.plot import plot_curve
        from monitor.stress.storage import stress_flags_in

        curve = load_curve(curve_path)
        flags = stress_flags_in(db_file(state, db), curve.curve_id)
        if png is not None:
            plot_curve(curve, png)
        if as_json:
            print(json.dumps({**curve_summary(curve), "stress_flags": [f.as_dict() for f in flags]}, indent=2))
            return
        console = plain_console()
        print_summary(curve, console)
        _warn(curve)
        for flag in flags:   # echo: one line each, a line break from a stored document shown as \n
            echo(f"stress flag {flag.limit}: {flag.message} (docs/stress.md#limits)")
        if png is not None:
            console.print(f"wrote {png}", soft_wrap=True, markup=False)


def _validate_command(curves: typer.Typer) -> None:
    @curves.command("validate")
    def validate(
        task: str = typer.Option(None, "--task", help="Task name (as in the labels); with --axes and a CSV, "
                                                      "leave out to validate every task of the file."),
        baseline: float = BASELINE_OPTION,
        margin: float = MARGIN_OPTION,
        labels: Path = LABELS_OPTION,
        metric: str = METRIC_OPTION,
        confidence: float = confidence_option("Band confidence."),
        bootstrap: int = bootstrap_option(200, "Bootstrap resamples per fold."),
        seed: int = SEED_OPTION,
        corpus_sha: str = typer.Option(None, "--corpus-sha", help="Corpus sha256 (store joins)."),
        family: str = typer.Option(None, "--family", help="Family for every row."),
        axes: str = typer.Option(None, "--axes", help="Choose the progress axis by evidence: validate these "
                                 "axes (comma-separated, or 'all': lstar, lstar_per_byte, bits_per_byte, "
                                 "l_rel, l_gain, raw_ce, log_params, log_flops) with family-level statistics "
                                 "and recommend one."),
        family_resamples: int = int_option(200, "--family-resamples", low=20, high=MAX_RESAMPLES,
                                           help="With --axes: refit-bootstrap resamples over families."),
        fit_families: str = typer.Option("all", "--fit-families",
                                         help="With --axes: the fit families compared on every axis "
                                              "(comma-separated, or 'all': isotonic, sigmoid); the (axis, "
                                              "family) pair is chosen by the rule printed with the table."),
        forward: bool = typer.Option(False, "--forward",
                                     help="Forward validation of the fit families instead: predict every larger "
                                          "model (or later stretch of training) from the smaller (earlier) ones, "
                                          "per family (isotonic, sigmoid), and the family it chooses."),
        ordering: str = typer.Option("auto", "--ordering",
                                     help="With --forward: params (model size), training (lineage and step, "
                                          "tokens or flops) or auto (params when three sizes are given)."),
        axis: str = typer.Option("lstar", "--axis", help="With --forward: the progress axis."),
        out: Path = typer.Option(None, "--out", help="Write the table (.csv, .json or .md)."),
        state: Path = STATE_OPTION,
        db: Path | None = DB_OPTION,
        as_json: bool = json_option("Print the table as JSON."),
    ) -> None:
        """Leave-one-family-out validation: L* against raw CE, log params and log FLOPs
        (with --axes: every axis, and the recommended one; with --forward: forward validation of
        the fit families, and the one `curves fit --fit-family auto` would choose)."""
        from monitor.curves import select_labels
        from monitor.curves.validation import lofo_validate

        db_path = db_file(state, db)
        if axes is not None:
            _validate_axes(task=task, baseline=baseline, margin=margin, labels=labels, metric=metric,
                           confidence=confidence, bootstrap=bootstrap, seed=seed, corpus_sha=corpus_sha,
                           family=family, axes=axes, family_resamples=family_resamples, out=out,
                           db_path=db_path, as_json=as_json, fit_families=fit_families)
            return
        if task is None:
            raise CurveError("give --task (every task of a CSV is validated only with --axes)")
        rows, _ = load_fit_labels(labels, db_path, task=task, corpus_sha256=corpus_sha, family=family)
        chosen, _metric = select_labels(rows, task=task, metric=metric)
        if forward:
            _validate_forward(chosen, task=task, metric=_metric, baseline=baseline, margin=margin,
                              confidence=confidence, axis=axis, ordering=ordering, bootstrap=bootstrap, seed=seed,
                              out=out, as_json=as_json)
            return
        result = lofo_validate(chosen, baseline=baseline, margin=margin, confidence=confidence,
                               resamples=bootstrap, seed=seed)
        if out is not None:
            result.write(out)
        if as_json:
            print(json.dumps(result.as_dict(), indent=2))
            return
        console = plain_console()
        console.print(result.rich_table())
        verdict = result.raw_ce_verdict()
        if verdict is not None:   # the case the guide says matters: said, not left to the table
            echo(f"warning: {verdict}", err=True)
        for key, reason in result.skipped.items():
            console.print(f"skipped {key}: {reason}", markup=False, emoji=False, highlight=False)
        if out is not None:
            console.print(f"wrote {out}", soft_wrap=True, markup=False)


def _validate_forward(chosen: Any, *, task: str, metric: str, baseline: float, margin: float, confidence: float,
                      axis: str, ordering: str, bootstrap: int, seed: int, out: Path | None, as_json: bool) -> None:
    """`curves validate --forward`: predict every larger (later) model from the smaller (earlier)
    ones per fit family, and print the family it chooses."""
    from monitor.curves.axes import get_axis
    from monitor.curves.fit import fit_curve
    from monitor.curves.forward import choose_family

    get_axis(axis)
    record = choose_family(chosen, fit=fit_curve, task=task, metric=metric, baseline=baseline,
                           margin=margin,
                           confidence=confidence, axis=axis, ordering=ordering, resamples=bootstrap,
                           seed=seed)
    if out is not None:
        out.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    if as_json:
        print(json.dumps(record, indent=2))
        return
    console = plain_console()
    console.print(forward_table(record))
    for key, reason in record["skipped"].items():
        console.print(f"skipped {key}: {reason}", markup=False, emoji=False, highlight=False)
    if out is not None:
        console.print(f"wrote {out}", soft_wrap=True, markup=False)


def _predict_command(curves: typer.Typer) -> None:
    @curves.command("predict")
    def predict_cmd(
        curve_path: Path = typer.Argument(..., help="A curve artifact (JSON)."),
        lstar: float = float_option(None, "--value", "--lstar",
                                    help="The checkpoint's value on the curve's axis (L* for an L* curve)."),
        se: float = float_option(0.0, "--se", low=0.0, help="Its standard error on that axis."),
        run: str = typer.Option(None, "--run", help="Take the value on the curve's axis, its SE, corpus and "
                                                    "spec from this score run."),
        corpus_sha: str = typer.Option(None, "--corpus-sha", help="Corpus of the L* (checked against the curve)."),
        spec: str = typer.Option(None, "--spec", help="Scoring spec of the L* (checked against the curve)."),
        budget: float = float_option(None, "--budget", low=0.0,
                                     help="Inference budget to predict at (a curve fitted with "
                                          "--budget-column; one of its fitted levels)."),
        state: Path = STATE_OPTION,
        db: Path | None = DB_OPTION,
        as_json: bool = JSON_OPTION,
    ) -> None:
        """P̂ = g(x) on the curve's axis, its interval widened by the SE of x, and the state
        (clear / at_risk / emerged)."""
        from monitor.store import Store

        from monitor.curves import ScoringRef, at_budget, load_curve, predict, predict_score_run
        from monitor.curves.artifact import extrapolation_text

        db_path = db_file(state, db)
        curve = at_budget(load_curve(curve_path), budget)
        if run is not None:
            if lstar is not None:
                raise CurveError("give either --run or --value, not both")
            with Store.open(db_path, read_only=True) as store:
                row = store.score_run(run)
            if row is None:
                raise CurveError(f"no score run {run!r} in {db_path}")
            result = predict_score_run(curve, row)
        else:
            if lstar is None:
                raise CurveError(f"give --value (the {curve.axis_label} of the checkpoint, and --se), "
                                 "or --run RUN_ID")
            result = predict(curve, lstar, se, corpus_sha256=corpus_sha,
                             scoring_spec=ScoringRef.parse(spec) if spec else None)
        if as_json:
            print(json.dumps(result.as_dict(), indent=2))
            return
        plain_console().print(Text.assemble(
            f"{curve.task} ({curve.metric}) at {curve.axis_label} {result.value:.4f} ± {result.se:.4f}: "
            f"P̂ = {result.p_hat:.4f} "
            f"[{result.lower:.4f}, {result.upper:.4f}] at {result.confidence:.0%} → ", (result.state, "bold"),
            f" (threshold {result.level:g}"
            + (f", budget {result.budget:g})" if result.budget is not None else ")")
            + (f" · {extrapolation_text(result.extrapolation, curve.axis)}" if result.extrapolation else "")))
