"""Task curves: the progress axes, labels, the multiple-choice evaluator, monotone fits, the
`lstar-curve/2` artifact, validation and plots."""

from monitor.curves.axes import AXES, Axis, axis_value
from monitor.curves.artifact import (CurveArtifact, ScoringRef, at_budget, curve_summary, curve_warnings, load_curve,
                                     predict, predict_score_run, save_curve)
from monitor.curves.evaluator import (evaluate_checkpoint, evaluate_multiple_choice, evaluation_labels,
                                      load_mc_task)
from monitor.curves.labels import (MC_METRICS, Label, join_scores, label_rows, labels_from_rows,
                                   read_labels_csv, read_lm_eval_results, select_labels, with_score_axes)

__all__ = ["AXES", "Axis", "CurveArtifact", "at_budget", "Label", "MC_METRICS", "ScoringRef", "curve_summary", "curve_warnings",
           "evaluate_checkpoint", "evaluate_multiple_choice", "evaluation_labels", "join_scores",
           "label_rows", "labels_from_rows", "load_curve", "load_mc_task", "predict", "predict_score_run",
           "read_labels_csv", "read_lm_eval_results", "save_curve", "select_labels", "axis_value",
           "with_score_axes"]
