"""One lab lineage's task values as a labels CSV (`monitor.curves.labels.read_labels_csv` format)
and, with --curve-out, the curve `monitor.curves.fit.fit_curve` fits on them (its artifact).

    PYTHONPATH=. python benchmarks/lab_lineage_labels.py benchmarks/results/lab-v3/pilot/lab.json \
        --lineage gpt2-large-s0 --task add-words --metric logp_correct --text calib --out labels.csv \
        --margin 0.4054651081081644 --curve-out curve.json

Each checkpoint of the lineage (`<family>-<size>-s<seed>`) becomes one row: checkpoint = `step<N>`
(the label `benchmarks/stress_registers.py` gives a checkpoint folder of that name), family =
the lab family, value = the task metric, n = the task's item count, and the L* axis (with its
standard error, bits per byte, l_rel and l_gain) from the record's scores on `--text` (calib:
calib-v0; heldout: the pool's held-out split). The task baseline the lab record holds for the
metric is the curve's baseline. The fit is made here rather than by `lstar curves fit` because
that command takes a baseline in [0, 1) (a probability), and a log-probability's baseline is
negative; the fit itself (isotonic, one family, so no leave-one-family-out) is the command's.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from monitor.curves.artifact import save_curve
from monitor.curves.fit import fit_curve
from monitor.curves.importers import write_labels_csv
from monitor.curves.labels import Label
from monitor.errors import LabError
from monitor.lab.record_file import load_lab


def lineage_labels(lab_path: Path, *, lineage: str, task: str, metric: str, text: str) -> tuple[list[Label], float]:
    """The lineage's labels, in step order, and the record's baseline of (task, metric)."""
    record = load_lab(lab_path)
    rows = sorted((c for c in record.checkpoints if f"{c.family}-{c.size}-s{c.seed}" == lineage),
                  key=lambda c: c.step)
    if not rows:
        raise LabError(f"{lab_path}: no checkpoint of lineage {lineage!r}",
                       hint="name a lineage as <family>-<size>-s<seed>, e.g. gpt2-large-s0")
    labels, baselines = [], set()
    for c in rows:
        if task not in c.tasks or text not in c.texts:
            raise LabError(f"{lab_path}: {c.path} has no task {task!r} or text {text!r}",
                           hint=f"tasks: {', '.join(c.tasks)}; texts: {', '.join(c.texts)}")
        scores, scored = c.tasks[task], c.texts[text]
        value = getattr(scores, metric, None)
        if not isinstance(value, float) or metric not in scores.baselines:
            raise LabError(f"{lab_path}: {c.path} has no {task} metric {metric!r} with a baseline",
                           hint="pick a metric the record gives a baseline for (acc, p_correct, logp_correct)")
        baselines.add(scores.baselines[metric])
        labels.append(Label(checkpoint=f"step{c.step}", value=value, family=c.family, task=task, metric=metric,
                            n=scores.n, lstar=scored.lstar, lstar_se=scored.lstar_se,
                            bits_per_byte=scored.bits_per_byte, l_rel=scored.l_rel, l_gain=scored.l_gain,
                            lineage=lineage, step=float(c.step), tokens=float(c.tokens_seen)))
    if len(baselines) != 1:
        raise LabError(f"{lab_path}: lineage {lineage!r} has {len(baselines)} baselines for {task}/{metric}",
                       hint="a curve needs one baseline")
    return labels, baselines.pop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("lab", type=Path)
    parser.add_argument("--lineage", required=True)
    parser.add_argument("--task", required=True)
    parser.add_argument("--metric", required=True)
    parser.add_argument("--text", default="calib", choices=("calib", "heldout"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--curve-out", type=Path, default=None)
    parser.add_argument("--margin", type=float, default=None, help="the level's margin above the baseline")
    parser.add_argument("--confidence", type=float, default=0.9)
    parser.add_argument("--resamples", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--corpus-sha", default=None, help="sha256 of the corpus the L* values are on")
    args = parser.parse_args()
    if args.curve_out is not None and args.margin is None:
        parser.error("--curve-out needs --margin")
    labels, baseline = lineage_labels(args.lab, lineage=args.lineage, task=args.task, metric=args.metric,
                                      text=args.text)
    write_labels_csv(labels, args.out)
    summary = {"rows": len(labels), "baseline": baseline, "out": str(args.out)}
    if args.curve_out is not None:
        curve = fit_curve(labels, task=args.task, metric=args.metric, baseline=baseline, margin=args.margin,
                          confidence=args.confidence, resamples=args.resamples, seed=args.seed,
                          corpus_sha256=args.corpus_sha, lofo=False, axis="lstar", family="isotonic")
        save_curve(curve, args.curve_out)
        t = curve.threshold
        summary.update(curve_id=curve.curve_id, threshold=t.estimate, interval=[t.lower, t.upper],
                       curve_out=str(args.curve_out))
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
