"""Curves monotone in a progress axis and an inference budget (`lstar curves fit
--budget-column`, `lstar curves predict --budget`, a policy task's `budget:`)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from scipy.optimize import minimize
from scipy.special import expit
from sklearn.isotonic import isotonic_regression

from monitor.alerts.predict import predict_task
from monitor.cli import main
from monitor.curves import at_budget, read_labels_csv
from monitor.curves.artifact import load_curve, predict, save_curve
from monitor.curves.budget import bivariate_isotonic, fit_budget_curve
from monitor.curves.fit import fit_curve
from monitor.errors import CurveError, LabelError
from monitor.policy import load_policy
from monitor.policy.schema import Task

LEVELS = (1, 4, 16)


def truth(x: np.ndarray | float, budget: float) -> np.ndarray:
    """A known performance surface rising in x and in log2(budget), 0 … 0.9."""
    return 0.9 * expit(2.5 * (np.asarray(x) - 3.0 + 0.4 * np.log2(budget)))


def write_labels(path: Path, *, n: int = 2000, seed: int = 3, drop: tuple[str, int] | None = None) -> Path:
    rng = np.random.default_rng(seed)
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["checkpoint", "family", "task", "metric", "value", "n", "lstar", "samples"])
        for family in ("a", "b", "c", "d"):
            for i, x in enumerate(np.sort(rng.uniform(0.0, 6.0, 12))):
                for budget in LEVELS:
                    if drop == (f"{family}-{i}", budget):
                        continue
                    value = rng.binomial(n, float(truth(x, budget))) / n
                    # L* is lower-is-progress: the checkpoint's progress x is -L*
                    writer.writerow([f"{family}-{i}", family, "t", "acc", f"{value:.6f}", n, f"{-x:.6f}", budget])
    return path


@pytest.fixture(scope="module")
def budget_curve(tmp_path_factory):
    path = write_labels(tmp_path_factory.mktemp("budget") / "labels.csv")
    labels = read_labels_csv(path, budget_column="samples")
    return fit_budget_curve(labels, task="t", baseline=0.0, margin=0.45, budget_column="samples",
                            resamples=200, seed=1)


# -- the bivariate isotonic fit against independent computations ------------------------------
def test_bivariate_isotonic_equals_the_constrained_least_squares_solution() -> None:
    rng = np.random.default_rng(7)
    m, levels = 7, 3
    y = rng.uniform(size=(m, levels))
    w = rng.uniform(0.5, 2.0, size=(m, levels))
    fitted = bivariate_isotonic(y, w)
    # Reference: the quadratic programme with every neighbour constraint, solved by SLSQP.
    pairs = [(i * levels + j, (i + 1) * levels + j) for i in range(m - 1) for j in range(levels)]
    pairs += [(i * levels + j, i * levels + j + 1) for i in range(m) for j in range(levels - 1)]
    a = np.zeros((len(pairs), m * levels))
    for k, (lo, hi) in enumerate(pairs):
        a[k, lo], a[k, hi] = -1.0, 1.0
    res = minimize(lambda f: float(np.sum(w.ravel() * (f - y.ravel()) ** 2)), y.ravel(),
                   jac=lambda f: 2.0 * w.ravel() * (f - y.ravel()),
                   constraints=[{"type": "ineq", "fun": lambda f: a @ f, "jac": lambda f: a}],
                   method="SLSQP", options={"ftol": 1e-15, "maxiter": 2000})
    assert res.success
    np.testing.assert_allclose(fitted, res.x.reshape(m, levels), atol=1e-7)
    assert np.all(np.diff(fitted, axis=0) >= -1e-10) and np.all(np.diff(fitted, axis=1) >= -1e-10)


def test_one_budget_level_is_ordinary_isotonic_regression() -> None:
    rng = np.random.default_rng(2)
    y = rng.uniform(size=30)
    w = rng.uniform(0.1, 3.0, size=30)
    np.testing.assert_allclose(bivariate_isotonic(y[:, None], w[:, None])[:, 0],
                               isotonic_regression(y, sample_weight=w, increasing=True), atol=1e-12)


# -- a known bivariate truth -------------------------------------------------------------------
def test_the_fit_is_monotone_in_both_arguments_and_recovers_the_truth(budget_curve) -> None:
    xs = np.linspace(0.3, 5.7, 40)     # progress; the curve's axis is L* = -x
    surfaces = []
    for budget in LEVELS:
        view = at_budget(budget_curve, float(budget))
        p = np.array([predict(view, -x).p_hat for x in xs])
        assert np.all(np.diff(p) >= -1e-12), f"not monotone in progress at budget {budget}"
        assert np.max(np.abs(p - truth(xs, budget))) < 0.12
        surfaces.append(p)
    for low, high in zip(surfaces, surfaces[1:]):
        assert np.all(high >= low - 1e-12), "not monotone in the budget"
    # The threshold moves toward less progress as the budget grows: -L* at b+ε falls.
    crossings = [-at_budget(budget_curve, float(b)).threshold.estimate for b in LEVELS]
    assert crossings[0] > crossings[1] > crossings[2]
    expected = [3.0 - 0.4 * np.log2(b) + np.log(0.45 / 0.45) / 2.5 for b in LEVELS]  # truth = 0.45 there
    np.testing.assert_allclose(crossings, expected, atol=0.35)


def test_the_bands_are_ordered_in_the_budget_so_more_compute_is_never_safer(tmp_path) -> None:
    """With no true budget effect the per-level bands scatter; each is widened so that a higher
    budget's band never lies below a lower one's, and no state inverts along the budget."""
    rng = np.random.default_rng(4)
    path = tmp_path / "flat.csv"
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["checkpoint", "family", "task", "metric", "value", "n", "lstar", "samples"])
        for i, x in enumerate(np.sort(rng.uniform(0.0, 6.0, 24))):
            for budget in (1, 2, 3):
                value = rng.binomial(30, float(0.9 * expit(2.0 * (x - 3.0)))) / 30
                writer.writerow([f"c{i}", "a", "t", "acc", f"{value:.6f}", 30, f"{-x:.6f}", budget])
    curve = fit_budget_curve(read_labels_csv(path, budget_column="samples"), task="t", baseline=0.0, margin=0.4,
                             budget_column="samples", resamples=100, seed=0, lofo=False)
    bands = [at_budget(curve, float(b)).band for b in (1, 2, 3)]
    for low, high in zip(bands, bands[1:]):
        assert np.all(np.array(high.lower) >= np.array(low.lower) - 1e-12)
        assert np.all(np.array(high.upper) >= np.array(low.upper) - 1e-12)
    rank = {"clear": 0, "at_risk": 1, "emerged": 2}
    for x in np.linspace(0.2, 5.8, 60):
        states = [rank[predict(at_budget(curve, float(b)), -x).state] for b in (1, 2, 3)]
        assert states == sorted(states), (x, states)


def test_the_artifact_round_trips_and_other_curves_keep_their_json(budget_curve, tmp_path: Path) -> None:
    path = save_curve(budget_curve, tmp_path / "c.json")
    again = load_curve(path)
    assert again.curve_id == budget_curve.curve_id and again.budget.levels == [1.0, 4.0, 16.0]
    # A curve without a budget writes no budget keys, so existing artifacts keep their ids.
    plain = write_labels(tmp_path / "plain.csv")
    rows = [label for label in read_labels_csv(plain, budget_column="samples") if label.budget == 4]
    flat = fit_curve([label.with_(budget=None) for label in rows], task="t", baseline=0.0, margin=0.45,
                     resamples=50, lofo=False)
    assert "budget" not in flat.to_json()


def test_lofo_compares_the_three_uses_of_the_budget(budget_curve) -> None:
    rows = {row.model: row for row in budget_curve.budget.lofo}
    assert set(rows) == {"bivariate", "per_level", "pooled"}
    assert all(row.n_folds == 4 and row.n_heldout == 4 * 12 * 3 for row in rows.values())
    # The budget moves performance by up to 0.6 here: ignoring it must cost accuracy.
    assert rows["pooled"].rmse > 1.5 * rows["bivariate"].rmse


# -- refusals -----------------------------------------------------------------------------------
def test_a_budget_outside_the_fitted_levels_is_refused(budget_curve) -> None:
    for budget in (2.0, 32.0, 0.5):
        with pytest.raises(CurveError, match="outside the fitted levels 1, 4, 16"):
            at_budget(budget_curve, budget)
    with pytest.raises(CurveError, match="give the budget to predict at"):
        predict(budget_curve, -3.0)


def test_an_incomplete_grid_is_refused_naming_the_cell(tmp_path: Path) -> None:
    path = write_labels(tmp_path / "l.csv", drop=("b-3", 4))
    labels = read_labels_csv(path, budget_column="samples")
    with pytest.raises(LabelError, match="no row for b-3@4"):
        fit_budget_curve(labels, task="t", baseline=0.0, margin=0.45, budget_column="samples", resamples=50)


def test_the_cli_fits_and_predicts_at_a_budget(tmp_path: Path, capsys) -> None:
    labels = write_labels(tmp_path / "l.csv")
    out = tmp_path / "curve.json"
    assert main(["curves", "fit", "--labels", str(labels), "--task", "t", "--baseline", "0", "--margin", "0.45",
                 "--budget-column", "samples", "--bootstrap", "60", "--out", str(out), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["budget"]["levels"] == [1.0, 4.0, 16.0]
    assert main(["curves", "predict", str(out), "--value", "-3", "--budget", "16", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["budget"] == 16 and got["p_hat"] > float(truth(3.0, 1))
    assert main(["curves", "predict", str(out), "--value", "-3", "--budget", "8"]) != 0
    err = capsys.readouterr().err.strip()
    assert "budget 8 is outside the fitted levels 1, 4, 16" in err and len(err.splitlines()) == 1


def test_a_policy_task_predicts_at_its_budget_and_must_state_it(budget_curve, tmp_path: Path) -> None:
    save_curve(budget_curve, tmp_path / "c.json")
    base = ("name: p\nroute: {receiver: log}\nreceivers:\n  - name: log\n    file: {path: a.jsonl}\n"
            "tasks:\n  - name: t\n    curve: c.json\n")
    (tmp_path / "p.yaml").write_text(base)
    with pytest.raises(Exception, match="give the deployment budget"):
        load_policy(tmp_path / "p.yaml")
    (tmp_path / "p.yaml").write_text(base + "    budget: 3\n")
    with pytest.raises(Exception, match="outside the fitted levels"):
        load_policy(tmp_path / "p.yaml")
    (tmp_path / "p.yaml").write_text(base + "    budget: 16\n")
    policy = load_policy(tmp_path / "p.yaml")
    task = policy.tasks[0]
    got = predict_task(budget_curve, task, value=-3.0, se=0.0)
    direct = predict(at_budget(budget_curve, 16.0), -3.0)
    assert got.p_hat == direct.p_hat and got.hi == direct.upper
    assert predict_task(budget_curve, Task(name="t", curve="c.json", budget=1.0), value=-3.0, se=0.0).p_hat \
        < got.p_hat
