"""Task curves: the progress axes, labels, the multiple-choice evaluator, monotone fits, the
`lstar-curve/2` artifact, validation and plots."""

from __future__ import annotations

from typing import TYPE_CHECKING

from monitor.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from monitor.curves.axes import AXES, Axis, axis_value
    from monitor.curves.artifact import (CurveArtifact, ScoringRef, at_budget, curve_summary, curve_warnings, load_curve,
                                         predict, predict_score_run, save_curve)
    from monitor.curves.evaluator import (evaluate_checkpoint, evaluate_multiple_choice, evaluation_labels,
                                          load_mc_task)
    from monitor.curves.labels import (MC_METRICS, Label, join_scores, label_rows, labels_from_rows,
                                       read_labels_csv, read_lm_eval_results, select_labels, with_score_axes)

# Re-exported lazily: importing the package (or one light module in it, which imports the
# package first) does not import every stage module and their libraries; a name loads its
# module when first used.
_EXPORTS = {  # name: the module that defines it, imported on first use
    "AXES": "monitor.curves.axes",
    "Axis": "monitor.curves.axes",
    "axis_value": "monitor.curves.axes",
    "CurveArtifact": "monitor.curves.artifact",
    "ScoringRef": "monitor.curves.artifact",
    "at_budget": "monitor.curves.artifact",
    "curve_summary": "monitor.curves.artifact",
    "curve_warnings": "monitor.curves.artifact",
    "load_curve": "monitor.curves.artifact",
    "predict": "monitor.curves.artifact",
    "predict_score_run": "monitor.curves.artifact",
    "save_curve": "monitor.curves.artifact",
    "evaluate_checkpoint": "monitor.curves.evaluator",
    "evaluate_multiple_choice": "monitor.curves.evaluator",
    "evaluation_labels": "monitor.curves.evaluator",
    "load_mc_task": "monitor.curves.evaluator",
    "MC_METRICS": "monitor.curves.labels",
    "Label": "monitor.curves.labels",
    "join_scores": "monitor.curves.labels",
    "label_rows": "monitor.curves.labels",
    "labels_from_rows": "monitor.curves.labels",
    "read_labels_csv": "monitor.curves.labels",
    "read_lm_eval_results": "monitor.curves.labels",
    "select_labels": "monitor.curves.labels",
    "with_score_axes": "monitor.curves.labels",
}


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)


__all__ = ["AXES", "Axis", "CurveArtifact", "at_budget", "Label", "MC_METRICS", "ScoringRef", "curve_summary", "curve_warnings",
           "evaluate_checkpoint", "evaluate_multiple_choice", "evaluation_labels", "join_scores",
           "label_rows", "labels_from_rows", "load_curve", "load_mc_task", "predict", "predict_score_run",
           "read_labels_csv", "read_lm_eval_results", "save_curve", "select_labels", "axis_value",
           "with_score_axes"]
