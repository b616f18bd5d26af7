"""Is the curve worth trusting? Leave-one-family-out validation, the emergence score and
resolution warnings for task curves (docs/measurement.md §2).

- `lofo_validate`: for each model family, fit the curve (`monitor.curves.stats.fit_monotone`) on
  the other families and predict the held-out one, on L* and on the alternatives it should
  beat: raw CE, log10 parameters and log10 FLOPs (`lofo_axes` does the same on any x-axes). The table reports RMSE, the share of
  checkpoints put on the wrong side of b_t + ε, a Brier score and the share extrapolated;
- `emergence_score`: how abruptly performance changes along progress (BIG-bench's score);
- `resolution_warnings`: when the test set is too small for the margin ε.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from scipy.special import ndtr

from monitor.bands import two_sided_z
from monitor.curves.artifact import LofoRow, resolution_warnings  # noqa: F401  (its home was here)
from monitor.curves.labels import Label
from monitor.curves.stats import PREDICTORS, Predictor, fit_monotone, label_weights
from monitor.errors import CurveError, LabelError


# -- emergence score and resolution ---------------------------------------------------------------
def emergence_score(values_by_progress: Sequence[float]) -> float:
    """Emergence score of Srivastava et al. (2022, BIG-bench), in the form Schaeffer, Miranda &
    Koyejo (2023, "Are Emergent Abilities of Large Language Models a Mirage?", §4) use:

        ES = sign(argmax_i y_i - argmin_i y_i) · (max_i y_i - min_i y_i)
             / sqrt( median_i (y_i - y_{i-1})² )

    with y_1..y_N the performance of checkpoints ordered by increasing scale (here: increasing
    progress, i.e. decreasing L*). Large when the change is concentrated in a few steps, about
    sqrt(N) for a straight line. ±inf when the median squared step is 0 but the range is not;
    0 for constant performance.
    """
    y = np.asarray(values_by_progress, dtype=np.float64)
    if len(y) < 3:
        raise CurveError(f"the emergence score needs at least 3 checkpoints (got {len(y)})")
    span = float(np.max(y) - np.min(y))
    if span == 0.0:
        return 0.0
    direction = float(np.sign(int(np.argmax(y)) - int(np.argmin(y))))
    scale = math.sqrt(float(np.median(np.diff(y) ** 2)))
    if scale == 0.0:
        return math.copysign(math.inf, direction)
    return direction * span / scale


# -- leave-one-family-out validation -------------------------------------------------------------
@dataclass(frozen=True)
class LofoResult:
    """Leave-one-family-out table: one row per predictor, plus per-family detail.

    rmse: root mean squared error of g(x) against held-out values;
    crossing_error: share of held-out checkpoints put on the wrong side of b_t + ε
        (predicted g(x) ≥ b_t + ε versus observed value ≥ b_t + ε);
    brier: Brier score of P(value ≥ b_t + ε) = Φ((g(x) - b_t - ε) / sqrt(se_curve² + se_obs²)),
        se_curve from the band's half-width / z, se_obs the row's own standard error;
    extrapolated: share of held-out checkpoints outside the training range of the predictor.
    """

    rows: list[LofoRow]
    families: list[str]
    per_family: list[dict[str, Any]]
    level: float
    confidence: float
    skipped: dict[str, str] = field(default_factory=dict)
    # per axis: held-out row index, g(x), P(value ≥ b_t + ε), squared error, wrong side, Brier
    points: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"level": self.level, "confidence": self.confidence, "families": self.families,
                "rows": [r.model_dump() for r in self.rows], "per_family": self.per_family,
                "skipped": self.skipped}

    def raw_ce_verdict(self) -> str | None:
        """One sentence when raw cross-entropy predicts the held-out families better than L*
        (lower pooled RMSE): then calibrating by the tokenizer buys nothing on these labels and
        the curve is not worth alerting on (docs/guide.md, step 3). None otherwise, or when
        either predictor was not validated."""
        by_name = {r.predictor: r for r in self.rows}
        lstar, raw = by_name.get("lstar"), by_name.get("raw_ce")
        if lstar is None or raw is None or not raw.rmse < lstar.rmse:
            return None
        return (f"raw CE predicts the held-out families better than L* (RMSE {raw.rmse:.4f} against "
                f"{lstar.rmse:.4f}; crossing error {raw.crossing_error:.3f} against {lstar.crossing_error:.3f}): "
                "L* adds nothing on these labels, and a curve on it is not worth alerting on")

    def to_markdown(self) -> str:
        lines = ["| predictor | RMSE | crossing error | Brier | held out | folds | extrapolated |",
                 "|---|---:|---:|---:|---:|---:|---:|"]
        for r in self.rows:
            lines.append(f"| {r.label} | {r.rmse:.4f} | {r.crossing_error:.3f} | {r.brier:.4f} | "
                         f"{r.n_heldout} | {r.n_folds} | {r.extrapolated:.2f} |")
        return "\n".join(lines) + "\n"

    def to_csv(self) -> str:
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=list(self.rows[0].model_dump()) if self.rows else ["predictor"],
                                lineterminator="\n")
        writer.writeheader()
        for r in self.rows:
            writer.writerow(r.model_dump())
        return buf.getvalue()

    def write(self, path: str | Path) -> Path:
        """Write the table as CSV, JSON or Markdown, chosen by the file's suffix."""
        path = Path(path)
        suffix = path.suffix.lower()
        if suffix == ".csv":
            text = self.to_csv()
        elif suffix == ".json":
            text = json.dumps(self.as_dict(), indent=2) + "\n"
        elif suffix in (".md", ".markdown"):
            text = self.to_markdown()
        else:
            raise CurveError(f"cannot tell the table format of {path}", hint="use .csv, .json or .md")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        return path

    def rich_table(self) -> Any:
        from rich.table import Table

        table = Table(title=f"leave-one-family-out ({len(self.families)} families, "
                            f"threshold b+ε = {self.level:g})")
        for name, justify in (("predictor", "left"), ("RMSE", "right"), ("crossing error", "right"),
                              ("Brier", "right"), ("held out", "right"), ("extrapolated", "right")):
            table.add_column(name, justify=justify)  # type: ignore[arg-type]
        for r in self.rows:
            table.add_row(r.label, f"{r.rmse:.4f}", f"{r.crossing_error:.3f}", f"{r.brier:.4f}",
                          str(r.n_heldout), f"{r.extrapolated:.0%}")
        return table


def lofo_validate(labels: Sequence[Label], *, baseline: float, margin: float,
                  predictors: Sequence[str] | None = None, confidence: float = 0.9,
                  resamples: int = 200, seed: int = 0) -> LofoResult:
    """Leave-one-family-out validation of the curve on each predictor present in every row.

    For each family: fit on all other families, predict the held-out family's checkpoints.
    Predictors default to L*, raw CE, log10 params and log10 FLOPs, each where known.
    """
    labels = list(labels)
    if any(label.family is None for label in labels):
        raise LabelError("leave-one-family-out needs a family on every row",
                         hint="add a `family` column (e.g. the tokenizer or model series)")
    names = list(predictors) if predictors is not None else list(PREDICTORS)
    axes: dict[str, tuple[Predictor, np.ndarray | None]] = {}
    for name in names:
        if name not in PREDICTORS:
            raise CurveError(f"unknown predictor {name!r}", hint=f"choose from {', '.join(PREDICTORS)}")
        axes[name] = (PREDICTORS[name], PREDICTORS[name].values(labels))
    return lofo_axes([label.value for label in labels], [str(label.family) for label in labels], axes,
                     baseline=baseline, margin=margin, n=[label.n for label in labels],
                     stderr=[label.stderr for label in labels], confidence=confidence,
                     resamples=resamples, seed=seed)


def _fit_fold(fit_family: str, x: np.ndarray, y: np.ndarray, w: np.ndarray, *, predictor: Predictor,
              level: float, confidence: float, resamples: int, seed: int, known_variance: bool,
              proportion: bool) -> Any:
    """One fold's curve of the given family (both expose predict, band and dispersion)."""
    if fit_family == "sigmoid":
        from monitor.curves.parametric import fit_sigmoid_band

        return fit_sigmoid_band(x, y, w, predictor=predictor, level=level, confidence=confidence,
                                resamples=resamples, seed=seed, proportion=proportion)
    return fit_monotone(x, y, w, predictor=predictor, level=level, confidence=confidence, resamples=resamples,
                        seed=seed, known_variance=known_variance, bounds=(0.0, 1.0) if proportion else None)


def sigmoid_fold_requests(values: Sequence[float], families: Sequence[str],
                          axes: Mapping[str, tuple[Predictor, np.ndarray | None]], *, baseline: float,
                          margin: float, n: Sequence[int | None] | None = None,
                          stderr: Sequence[float | None] | None = None, confidence: float = 0.9,
                          resamples: int = 200, seed: int = 0) -> list[tuple[tuple[str, int], Any]]:
    """The sigmoid fits `lofo_axes(..., fit_family="sigmoid")` makes, as (key, BandRequest)
    pairs keyed by (axis, family index), so that a caller running many validations (a family
    bootstrap's refits) can fit them all in one `fit_sigmoid_bands` call and hand each
    validation its fits (`lofo_axes(fits=...)`)."""
    fam = np.asarray(list(families), dtype=object)
    values = np.asarray(values, dtype=np.float64)
    weights, _ = label_weights(values, n, stderr)
    proportion = bool(np.all((values >= 0) & (values <= 1)))
    return _fold_requests(axes, values, weights, fam, sorted(set(fam.tolist())), level=baseline + margin,
                          confidence=confidence, resamples=resamples, seed=seed, proportion=proportion)


def _fold_requests(axes: Mapping[str, tuple[Predictor, np.ndarray | None]], values: np.ndarray, weights: np.ndarray,
                   fam: np.ndarray, names: Sequence[str], *, level: float, confidence: float, resamples: int,
                   seed: int, proportion: bool) -> list[tuple[tuple[str, int], Any]]:
    """Every fold's sigmoid request, keyed by (axis, family index), as `_fit_fold` would fit them."""
    from monitor.curves.parametric import BandRequest

    out = []
    for name, (predictor, x) in axes.items():
        if x is None:
            continue
        x = np.asarray(x, dtype=np.float64)
        for k, family in enumerate(names):
            train = fam != family
            out.append(((name, k), BandRequest(x[train], values[train], weights[train], predictor=predictor,
                                               level=level, confidence=confidence, resamples=resamples,
                                               seed=seed + k, proportion=proportion)))
    return out


def _probability_reaching(fit: Any, x: np.ndarray, p_hat: np.ndarray, weights: np.ndarray, *, level: float,
                          z: float) -> np.ndarray:
    """P(value ≥ level) of held-out rows: the fold's prediction with the spread of its band
    (half-width / z) and of the rows' own noise, which the training fit's dispersion scales."""
    lo, hi = fit.band(x)
    se_curve = (hi - lo) / (2.0 * z)
    se_obs = np.sqrt(fit.dispersion / weights)
    spread = np.sqrt(se_curve ** 2 + se_obs ** 2)
    with np.errstate(divide="ignore", invalid="ignore"):
        # `ndtr` is what `norm.cdf` computes for the standard normal, without its per-call
        # argument checks (about 60 µs against 1 µs, once per fold of every validation)
        return np.where(spread > 0, ndtr((p_hat - level) / np.where(spread > 0, spread, 1.0)),
                        (p_hat >= level).astype(float))


def lofo_axes(values: Sequence[float], families: Sequence[str],
              axes: Mapping[str, tuple[Predictor, np.ndarray | None]], *, baseline: float, margin: float,
              n: Sequence[int | None] | None = None, stderr: Sequence[float | None] | None = None,
              confidence: float = 0.9, resamples: int = 200, seed: int = 0,
              fit_family: str = "isotonic", fits: Mapping[tuple[str, int], Any] | None = None) -> LofoResult:
    """Leave-one-family-out validation on any set of x-axes (name -> (predictor, x per row);
    x None: the axis is missing on some rows and skipped).

    Every axis is raced with the same fit, weights, folds and seeds. `fit_family`: the curve
    fitted in each fold, isotonic (`fit_monotone`) or the sigmoid (`fit_sigmoid_band`; its band
    bootstrap uses the same `resamples`). `LofoResult.points` keeps
    each held-out row's prediction per axis (row index, g(x), P(value ≥ b_t + ε), observed),
    so differences between axes can be bootstrapped over the same checkpoints. `fits`: the
    sigmoid folds' fits already made (`sigmoid_fold_requests`), by (axis, family index).
    """
    fam = np.asarray(list(families), dtype=object)
    names = sorted(set(fam.tolist()))
    if len(names) < 2:
        raise LabelError(f"leave-one-family-out needs at least 2 families (got {len(names)})")
    if fit_family not in ("isotonic", "sigmoid"):
        raise CurveError(f"unknown fit family {fit_family!r}", hint="choose isotonic or sigmoid")
    level = baseline + margin
    values = np.asarray(values, dtype=np.float64)
    weights, known = label_weights(values, n, stderr)
    proportion = bool(np.all((values >= 0) & (values <= 1)))
    z = two_sided_z(confidence)
    rows: list[LofoRow] = []
    per_family: list[dict[str, Any]] = []
    points: dict[str, dict[str, np.ndarray]] = {}
    skipped: dict[str, str] = {}
    # The sigmoid's folds are fitted together, every axis's and family's in one call, so their
    # solves share batches (`fit_sigmoid_bands`); the isotonic fits are cheap and fitted in turn.
    if fits is not None or fit_family != "sigmoid":
        fitted = dict(fits or {})
    else:
        from monitor.curves.parametric import fit_sigmoid_bands

        pairs = _fold_requests(axes, values, weights, fam, names, level=level, confidence=confidence,
                               resamples=resamples, seed=seed, proportion=proportion)
        fitted = dict(zip([key for key, _ in pairs], fit_sigmoid_bands([request for _, request in pairs])))
    for name, (predictor, x) in axes.items():
        if x is None:
            skipped[name] = f"column {predictor.column!r} missing on some rows"
            continue
        x = np.asarray(x, dtype=np.float64)
        idx, pred, probs, sq, wrong, brier, extrap, count, folds = [], [], [], [], [], [], [], 0, 0
        for k, family in enumerate(names):
            test = fam == family
            train = ~test
            try:
                fit = fitted[(name, k)] if (name, k) in fitted else _fit_fold(
                    fit_family, x[train], values[train], weights[train], predictor=predictor, level=level,
                    confidence=confidence, resamples=resamples, seed=seed + k, known_variance=known,
                    proportion=proportion)
                if isinstance(fit, Exception):
                    raise fit
            except (LabelError, CurveError) as exc:
                skipped[f"{name}:{family}"] = exc.message
                continue
            folds += 1
            p_hat = fit.predict(x[test])
            prob = _probability_reaching(fit, x[test], p_hat, weights[test], level=level, z=z)
            observed = values[test] >= level
            outside = (x[test] < x[train].min()) | (x[test] > x[train].max())
            idx.extend(np.flatnonzero(test))
            pred.extend(p_hat)
            probs.extend(prob)
            sq.extend((p_hat - values[test]) ** 2)
            wrong.extend((p_hat >= level) != observed)
            brier.extend((prob - observed) ** 2)
            extrap.extend(outside)
            count += int(test.sum())
            per_family.append({"predictor": name, "family": family, "n": int(test.sum()),
                               "rmse": float(np.sqrt(np.mean((p_hat - values[test]) ** 2))),
                               "crossing_error": float(np.mean((p_hat >= level) != observed)),
                               "brier": float(np.mean((prob - observed) ** 2))})
        if folds == 0:
            skipped.setdefault(name, "no fold could be fitted")
            continue
        rows.append(LofoRow(predictor=name, label=predictor.label, rmse=float(np.sqrt(np.mean(sq))),
                            crossing_error=float(np.mean(wrong)), brier=float(np.mean(brier)),
                            n_heldout=count, n_folds=folds, extrapolated=float(np.mean(extrap))))
        order = np.argsort(np.asarray(idx, dtype=np.int64), kind="stable")   # by row index
        points[name] = {"index": np.asarray(idx, dtype=np.int64)[order], "p_hat": np.asarray(pred)[order],
                        "prob": np.asarray(probs)[order], "sq_error": np.asarray(sq)[order],
                        "wrong": np.asarray(wrong, dtype=np.float64)[order],
                        "brier": np.asarray(brier)[order]}
    return LofoResult(rows=rows, families=names, per_family=per_family, level=level,
                      confidence=confidence, skipped=skipped, points=points)
