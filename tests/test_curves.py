"""Task curves: isotonic fit, bands and threshold coverage, logistic check, LOFO, artifacts."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest
from scipy.special import expit, logit
from scipy.stats import norm
from sklearn.isotonic import IsotonicRegression

from monitor.curves.artifact import ScoringRef, check_compatible, load_curve, predict, save_curve
from monitor.curves.fit import fit_curve
from monitor.curves.labels import Label
from monitor.curves.stats import PREDICTORS, fit_logistic, fit_monotone, isotonic_fit, label_weights
from monitor.curves.validation import emergence_score, lofo_validate, resolution_warnings
from monitor.errors import CurveError, LabelError

CORPUS = "9f269a7db0b131d819be2e51974914a3cf715cc388cceb82885f7a5a21e644d8"
OTHER_CORPUS = "42eba56a92409f2fbaaf1689f6772b3bda630d41ef2ead6f8d195a104253dd3a"
SPEC = ScoringRef(spec_version="lstar-score/1", window=2048, stride=1024, prefix_policy="bos")

# A task curve of the design's shape: floor b = 0.25 (4-way chance), ceiling 0.85, midpoint
# L* = -3, scale 0.3; performance rises as L* falls.
B, C, X0, S = 0.25, 0.85, -3.0, 0.3
EPS = 0.05


def true_curve(x):
    return B + (C - B) * expit(-(np.asarray(x) - X0) / S)


TRUE_THRESHOLD = X0 - S * logit(EPS / (C - B))   # where true_curve = B + EPS


def pava_nonincreasing(y, w):
    """Textbook pool-adjacent-violators for a non-increasing fit (x already sorted)."""
    blocks = []   # [value, weight, count]
    for yi, wi in zip(y, w):
        blocks.append([yi, wi, 1])
        while len(blocks) > 1 and blocks[-2][0] < blocks[-1][0]:
            v2, w2, n2 = blocks.pop()
            v1, w1, n1 = blocks.pop()
            blocks.append([(v1 * w1 + v2 * w2) / (w1 + w2), w1 + w2, n1 + n2])
    out = []
    for value, _, count in blocks:
        out.extend([value] * count)
    return np.array(out)


def synthetic_labels(seed=0, m=30, n=300, families=("a", "b", "c")):
    rng = np.random.default_rng(seed)
    x = rng.uniform(-4.5, -1.5, m)
    y = rng.binomial(n, true_curve(x)) / n
    return [Label(checkpoint=f"ck{i:02d}", value=float(v), family=families[i % len(families)],
                  task="cloze-v0", metric="acc", n=n, lstar=float(xi), lstar_se=0.01, raw_ce=float(xi) + 6.5)
            for i, (xi, v) in enumerate(zip(x, y))]


# -- acceptance: coverage ----------------------------------------------------------------------
def test_band_and_threshold_cover_the_true_curve_over_200_repetitions():
    reps, m, n = 200, 30, 300
    band_cover, thr_cover, never = [], [], 0
    for r in range(reps):
        rng = np.random.default_rng([2024, r])
        x = rng.uniform(-4.5, -1.5, m)
        y = rng.binomial(n, true_curve(x)) / n
        w, known = label_weights(y, [n] * m)
        assert known
        fit = fit_monotone(x, y, w, level=B + EPS, confidence=0.9, resamples=200, seed=r,
                           bounds=(0.0, 1.0))
        truth = true_curve(fit.grid_x)
        band_cover.append(np.mean((fit.lower <= truth) & (truth <= fit.upper)))
        lower, upper = fit.threshold["lower"], fit.threshold["upper"]
        never += fit.threshold["estimate"] is None
        # None as lower: unbounded toward progress; None as upper: the curve never crosses.
        thr_cover.append((lower is None or lower <= TRUE_THRESHOLD) and upper is not None
                         and TRUE_THRESHOLD <= upper)
    band, thr = float(np.mean(band_cover)), float(np.mean(thr_cover))
    print(f"\n90% band covers the true curve at {band:.3f} of grid points; "
          f"η̂ interval covers η = {TRUE_THRESHOLD:.4f} in {thr:.3f} of {reps} repetitions")
    assert band >= 0.85
    assert thr >= 0.85
    assert never == 0


# -- isotonic fit --------------------------------------------------------------------------------
def test_isotonic_equals_sklearn_and_textbook_pava_on_unweighted_data():
    rng = np.random.default_rng(7)
    x = np.round(rng.uniform(-4, -1, 40), 1)          # rounding makes ties
    y = true_curve(x) + rng.normal(0, 0.08, len(x))
    ours = isotonic_fit(x, y)
    ref = IsotonicRegression(increasing=False, out_of_bounds="clip").fit(x, y)
    np.testing.assert_allclose(ours.predict(x), ref.predict(x), rtol=0, atol=1e-12)
    grid = np.linspace(-4.5, -0.5, 50)
    np.testing.assert_allclose(ours.predict(grid), ref.predict(grid), rtol=0, atol=1e-12)
    # Independent: pool ties by hand, then textbook PAVA.
    xs = np.unique(x)
    ym = np.array([y[x == v].mean() for v in xs])
    wm = np.array([np.sum(x == v) for v in xs], dtype=float)
    np.testing.assert_allclose(ours.fitted, pava_nonincreasing(ym, wm), atol=1e-12)
    assert np.all(np.diff(ours.fitted) <= 1e-15)


def test_a_low_variance_point_pulls_the_weighted_fit():
    x = np.array([-4.0, -3.0, -2.0])
    y = np.array([0.20, 0.60, 0.10])            # 0.20 < 0.60 violates non-increasing in x
    flat = isotonic_fit(x, y)
    np.testing.assert_allclose(flat.fitted, [0.40, 0.40, 0.10])
    # The second point measured 10x more precisely (stderr 0.01 vs 0.1): weight 100x.
    w, known = label_weights(y, stderr=[0.1, 0.01, 0.1])
    np.testing.assert_allclose(w, [100.0, 10000.0, 100.0])
    pulled = isotonic_fit(x, y, w)
    expected = (0.20 * 100 + 0.60 * 10000) / 10100
    np.testing.assert_allclose(pulled.fitted, [expected, expected, 0.10])
    assert abs(pulled.fitted[0] - 0.60) < 0.005 < abs(flat.fitted[0] - 0.60)


def test_label_weights_binomial_add_one_and_stderr_precedence():
    w, known = label_weights([0.0, 0.5, 0.3], n=[100, 100, 50], stderr=[None, None, 0.02])
    p0, p1 = 1 / 102, 51 / 102
    np.testing.assert_allclose(w, [100 / (p0 * (1 - p0)), 100 / (p1 * (1 - p1)), 2500.0])
    assert known
    w, known = label_weights([3.2, 4.1], n=[10, 20])          # not a proportion: relative weights
    np.testing.assert_allclose(w, [10, 20])
    assert not known


def test_vectorised_bootstrap_equals_one_fit_per_resample():
    from monitor.curves.stats import _bootstrap

    rng = np.random.default_rng(11)
    x = np.sort(rng.uniform(-4.5, -1.5, 15))
    y = rng.binomial(200, true_curve(x)) / 200
    w, _ = label_weights(y, [200] * 15)
    t, yt, wt = -x[::-1], y[::-1], w[::-1]          # progress coordinate, ascending
    grid = np.linspace(t[0], t[-1], 25)
    curves, crossings = _bootstrap(t, yt, wt, grid, 0.3, 40, np.random.default_rng(5))
    counts = np.random.default_rng(5).multinomial(15, np.full(15, 1 / 15), size=40)
    for b in range(40):
        rows = np.repeat(np.arange(15), counts[b])               # duplicated checkpoints
        fit = IsotonicRegression().fit(t[rows], yt[rows], sample_weight=wt[rows])
        keep = np.unique(rows)
        fitted = fit.predict(t[keep])
        centroids, values = [], []
        for v in np.unique(fitted):                              # blocks of equal fitted value
            block = keep[fitted == v]
            weight = counts[b][block] * wt[block]
            centroids.append(np.sum(weight * t[block]) / np.sum(weight))
            values.append(v)
        np.testing.assert_allclose(curves[b], np.interp(grid, centroids, values), atol=1e-9)


def test_training_data_hash_ignores_order_but_not_values():
    from monitor.curves.fit import training_data_sha256

    labels = synthetic_labels()
    assert training_data_sha256(labels) == training_data_sha256(labels[::-1])
    assert training_data_sha256(labels) != training_data_sha256([labels[0].with_(value=0.99)] + labels[1:])


# -- threshold -----------------------------------------------------------------------------------
def test_threshold_is_linear_between_knots_moving_toward_lower_lstar():
    # Already monotone, so every point is its own block and the knots are the data.
    x = [-4.0, -3.0, -2.0, -1.0]
    y = [0.80, 0.50, 0.30, 0.25]
    fit = fit_monotone(x, y, [1e4] * 4, level=0.35, resamples=100, seed=0)
    np.testing.assert_allclose(fit.knots_x, x)
    np.testing.assert_allclose(fit.knots_y, y)
    # Between (-2, 0.30) and (-3, 0.50): 0.35 is reached a quarter of the way, at -2.25.
    assert fit.threshold["estimate"] == pytest.approx(-2.25)
    assert fit.threshold["status"] == "crosses"
    # Four checkpoints leave the pessimistic edge free to stay below the level (lower None).
    assert fit.threshold["lower"] is None or fit.threshold["lower"] <= -2.25
    assert -2.25 <= fit.threshold["upper"]


def test_never_crossing_is_a_valid_answer():
    x = np.linspace(-4, -1, 12)
    y = np.linspace(0.27, 0.24, 12)
    fit = fit_monotone(x, y, [2e5] * 12, level=0.40, resamples=100, seed=1)
    assert fit.threshold["estimate"] is None
    assert fit.threshold["status"] == "never"
    assert fit.threshold["upper"] is None and fit.threshold["lower"] is None
    assert fit.threshold["never_share"] == 1.0
    above = fit_monotone(x, y + 0.5, [2e5] * 12, level=0.40, resamples=100, seed=1)
    assert above.threshold["status"] == "before_range"
    assert above.threshold["estimate"] == pytest.approx(x.max())


def test_logistic_check_recovers_a_noise_free_curve():
    x = np.linspace(-4.5, -1.5, 25)
    params = fit_logistic(x, true_curve(x), np.ones(25), floor=B, margin=EPS)
    assert params["converged"]
    assert params["ceiling"] == pytest.approx(C, abs=1e-4)
    assert params["midpoint"] == pytest.approx(X0, abs=1e-4)
    assert params["scale"] == pytest.approx(S, abs=1e-4)
    assert params["threshold"] == pytest.approx(TRUE_THRESHOLD, abs=1e-3)
    assert params["threshold_in_range"] is True


# -- emergence score and resolution ------------------------------------------------------------
def test_emergence_score_hand_examples():
    # Steps .1 .1 .6 .1 -> median squared step .01 -> sqrt .1; range .9; max after min: +9.
    assert emergence_score([0.1, 0.2, 0.3, 0.9, 1.0]) == pytest.approx(9.0)
    assert emergence_score([0.0, 1.0, 2.0, 3.0]) == pytest.approx(3.0)   # a line: N - 1
    assert emergence_score([3.0, 2.0, 1.0, 0.0]) == pytest.approx(-3.0)
    assert emergence_score([0.25, 0.25, 0.25, 0.9]) == math.inf
    assert emergence_score([0.5, 0.5, 0.5]) == 0.0
    with pytest.raises(CurveError, match="at least 3"):
        emergence_score([0.1, 0.2])


def test_resolution_warnings_when_the_test_set_is_too_small():
    msgs = resolution_warnings([100, 100], baseline=0.25, margin=0.005, metric="acc")
    assert len(msgs) == 2
    assert "1/n = 0.01" in msgs[0] and "n = 100" in msgs[0]
    assert "0.0433" in msgs[1]          # sqrt(.25 * .75 / 100)
    assert resolution_warnings([10_000], baseline=0.25, margin=0.05, metric="acc") == []


# -- LOFO on a synthetic multi-tokenizer population -----------------------------------------------
# Unigram entropies H1 (nats/token) of calib-v0 from shared/README.md.
H1 = {"gpt2": 6.3867, "llama-3": 7.2180, "qwen2": 7.0712, "bert-base-uncased": 6.2588,
      "spm-unigram-toy": 5.0535, "smollm2": 6.7002}


def tokenizer_population(seed=3, per_family=10, n=300):
    """Latent progress z; raw CE = a_T·z + b_T with b_T = H1_T + a small remainder; L* = CE - H1_T;
    the task is monotone in z; parameters and FLOPs follow family-specific efficiencies."""
    rng = np.random.default_rng(seed)
    labels = []
    for name, h1 in H1.items():
        a = rng.uniform(0.95, 1.05)
        remainder = rng.normal(0.0, 0.05)
        offset_params, offset_flops = rng.uniform(-0.6, 0.6, 2)
        z = np.sort(rng.uniform(-4.2, -1.2, per_family))
        p = B + (C - B) * expit(-(z - X0) / S)
        values = rng.binomial(n, p) / n
        ce = a * z + h1 + remainder
        for i in range(per_family):
            log_n = 8.0 + 0.8 * (-z[i] - 1.2) + offset_params
            labels.append(Label(checkpoint=f"{name}-{i}", value=float(values[i]), family=name,
                                task="cloze-v0", metric="acc", n=n, lstar=float(ce[i] - h1),
                                lstar_se=0.01, raw_ce=float(ce[i]), params=float(10 ** log_n),
                                flops=float(10 ** (log_n * 1.9 + offset_flops))))
    return labels


def test_lofo_lstar_beats_raw_ce_on_threshold_crossing(tmp_path):
    labels = tokenizer_population()
    result = lofo_validate(labels, baseline=B, margin=EPS, resamples=200, seed=0)
    rows = {r.predictor: r for r in result.rows}
    assert set(rows) == {"lstar", "raw_ce", "log_params", "log_flops"}
    from rich.console import Console
    Console(width=120).print(result.rich_table())
    out = result.write(tmp_path / "lofo.csv")
    md = result.write(tmp_path / "lofo.md")
    print(md.read_text())
    print(f"LOFO table written to {out}")
    with out.open() as fh:
        written = {row["predictor"]: row for row in csv.DictReader(fh)}
    assert float(written["lstar"]["crossing_error"]) == pytest.approx(rows["lstar"].crossing_error)
    assert rows["lstar"].n_heldout == len(labels) and rows["lstar"].n_folds == len(H1)
    assert rows["lstar"].crossing_error < rows["raw_ce"].crossing_error
    assert rows["lstar"].rmse < rows["raw_ce"].rmse
    assert rows["lstar"].brier < rows["raw_ce"].brier
    # Independent check of one fold's crossing error: refit without that family by hand.
    fam = "spm-unigram-toy"
    train = [l for l in labels if l.family != fam]
    test = [l for l in labels if l.family == fam]
    w, _ = label_weights([l.value for l in train], [l.n for l in train])
    # (g itself does not depend on the bootstrap, so the seed does not matter here)
    fit = fit_monotone([l.raw_ce for l in train], [l.value for l in train], w,
                       predictor=PREDICTORS["raw_ce"], level=B + EPS, resamples=100, bounds=(0, 1))
    wrong = np.mean([(fit.predict(l.raw_ce) >= B + EPS) != (l.value >= B + EPS) for l in test])
    detail = [d for d in result.per_family if d["predictor"] == "raw_ce" and d["family"] == fam][0]
    assert detail["crossing_error"] == pytest.approx(wrong)


# -- fitting from labels, artifacts, prediction ---------------------------------------------------
@pytest.fixture(scope="module")
def curve():
    return fit_curve(synthetic_labels(), task="cloze-v0", metric="acc", baseline=B, margin=EPS,
                     resamples=300, seed=0, corpus_sha256=CORPUS, scoring_spec=SPEC, lofo_resamples=100)


def test_fit_curve_artifact_holds_what_prediction_needs(curve, tmp_path):
    assert curve.schema_ == "lstar-curve/2"
    assert curve.threshold.lower <= curve.threshold.estimate <= curve.threshold.upper
    assert curve.threshold.lower <= TRUE_THRESHOLD <= curve.threshold.upper
    assert curve.n_checkpoints == 30 and curve.families == ["a", "b", "c"]
    assert curve.lofo is not None and {r.predictor for r in curve.lofo.rows} == {"lstar", "raw_ce"}
    assert curve.logistic.converged and curve.logistic.threshold == pytest.approx(TRUE_THRESHOLD, abs=0.2)
    assert curve.emergence_score is not None
    path = save_curve(curve, tmp_path / "curve.json")
    again = load_curve(path)
    assert again == curve
    assert again.curve_id == again.content_id()
    # Same data and seed give the same curve id whenever it is fitted.
    refit = fit_curve(synthetic_labels(), task="cloze-v0", metric="acc", baseline=B, margin=EPS,
                      resamples=300, seed=0, corpus_sha256=CORPUS, scoring_spec=SPEC, lofo_resamples=100)
    assert refit.curve_id == curve.curve_id


def test_predict_states_and_widening_by_the_se(curve):
    level = B + EPS
    far = predict(curve, -4.3)
    assert far.state == "emerged" and far.lower >= level
    early = predict(curve, -1.6)
    assert early.state == "clear" and early.upper < level
    near = predict(curve, curve.threshold.estimate)
    assert near.state == "at_risk" and near.lower < level <= near.upper
    assert near.p_hat == pytest.approx(level, abs=1e-9)
    # Widening rule, computed independently from the stored band.
    x, se = -2.4, 0.15
    z = norm.ppf(0.95)
    wide = predict(curve, x, se)
    assert wide.lower == pytest.approx(np.interp(x + z * se, curve.band.x, curve.band.lower))
    assert wide.upper == pytest.approx(np.interp(x - z * se, curve.band.x, curve.band.upper))
    tight = predict(curve, x, 0.0)
    assert wide.lower <= tight.lower <= tight.p_hat <= tight.upper <= wide.upper
    assert predict(curve, -6.0).extrapolated and not predict(curve, -3.0).extrapolated


def test_corpus_and_spec_mismatch_are_errors_naming_both(curve):
    check_compatible(curve, corpus_sha256=CORPUS, scoring_spec=SPEC)   # same: fine
    with pytest.raises(CurveError) as err:
        predict(curve, -3.0, 0.01, corpus_sha256=OTHER_CORPUS)
    assert CORPUS in str(err.value) and OTHER_CORPUS in str(err.value)
    other = ScoringRef(spec_version="lstar-score/1", window=1024, stride=512, prefix_policy="bos")
    with pytest.raises(CurveError) as err:
        predict(curve, -3.0, 0.01, corpus_sha256=CORPUS, scoring_spec=other)
    assert "window=2048,stride=1024" in str(err.value) and "window=1024,stride=512" in str(err.value)
    loose = fit_curve(synthetic_labels(), task="cloze-v0", baseline=B, margin=EPS, resamples=100, lofo=False)
    assert any("not pinned" in w for w in loose.warnings)
    with pytest.raises(CurveError, match="not pinned to a corpus"):
        predict(loose, -3.0, corpus_sha256=CORPUS)


def test_scoring_ref_parses_the_cli_form():
    assert ScoringRef.parse("lstar-score/1:window=2048,stride=1024,prefix=bos") == SPEC
    assert ScoringRef.parse(SPEC.model_dump_json()) == SPEC
    with pytest.raises(CurveError, match="cannot read the scoring spec"):
        ScoringRef.parse("lstar-score/1:window=big")


def test_loading_rejects_unknown_keys_other_versions_and_edits(curve, tmp_path):
    data = json.loads(curve.to_json())
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**data, "colour": "red"}))
    with pytest.raises(CurveError, match="unknown key 'colour'"):
        load_curve(bad)
    bad.write_text(json.dumps({**data, "threshold": {**data["threshold"], "extra": 1}}))
    with pytest.raises(CurveError, match="unknown key 'threshold.extra'"):
        load_curve(bad)
    bad.write_text(json.dumps({**data, "schema": "lstar-curve/3"}))
    with pytest.raises(CurveError, match="lstar-curve/3.*reads 'lstar-curve/2'"):
        load_curve(bad)
    bad.write_text(json.dumps({**data, "margin": 0.2}))
    with pytest.raises(CurveError, match="do not match curve id"):
        load_curve(bad)
    bad.write_text(json.dumps({k: v for k, v in data.items() if k != "knots"}))
    with pytest.raises(CurveError, match="knots"):
        load_curve(bad)
    bad.write_text("[1, 2]")
    with pytest.raises(CurveError, match="not a curve artifact"):
        load_curve(bad)
    with pytest.raises(CurveError, match="no curve file"):
        load_curve(tmp_path / "missing.json")
    assert "pickle" not in curve.to_json()


def test_loading_refuses_what_is_not_a_bounded_regular_json_file(tmp_path):
    """A policy may name any path as its curve: a device, a FIFO, a huge or deeply nested file
    must be a one-line CurveError, never a hang, an endless read or a RecursionError."""
    import os

    with pytest.raises(CurveError, match="is a character device|not a regular file"):
        load_curve("/dev/zero")
    fifo = tmp_path / "curve.json"
    os.mkfifo(fifo)
    with pytest.raises(CurveError, match="named pipe"):
        load_curve(fifo)
    huge = tmp_path / "huge.json"
    with huge.open("wb") as fh:  # sparse: the size is on record, the bytes are not on disk
        fh.truncate(64 << 20)
    with pytest.raises(CurveError, match="limited to"):
        load_curve(huge)
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(CurveError, match="not a JSON curve artifact"):
        load_curve(deep)


# -- bad input ---------------------------------------------------------------------------------
def test_bad_input_gives_clear_errors():
    good = synthetic_labels()
    with pytest.raises(LabelError, match="2 checkpoint.*at least 3"):
        fit_curve(good[:2], task="cloze-v0", baseline=B, margin=EPS)
    flat = [l.with_(value=0.25) for l in good]
    with pytest.raises(CurveError, match="performance is constant"):
        fit_curve(flat, task="cloze-v0", baseline=B, margin=EPS)
    nan = [good[0].with_(value=float("nan"))] + good[1:]
    with pytest.raises(LabelError, match="ck00.*not a number"):
        fit_curve(nan, task="cloze-v0", baseline=B, margin=EPS)
    nan_x = [good[0].with_(lstar=float("nan"))] + good[1:]
    with pytest.raises(LabelError, match="'ck00': lstar is nan"):
        fit_curve(nan_x, task="cloze-v0", baseline=B, margin=EPS)
    with pytest.raises(LabelError, match="unknown task 'hellaswag'.*available: cloze-v0"):
        fit_curve(good, task="hellaswag", baseline=B, margin=EPS)
    with pytest.raises(LabelError, match="unknown metric 'f1'.*available: acc"):
        fit_curve(good, task="cloze-v0", metric="f1", baseline=B, margin=EPS)
    brier = [l.with_(metric="brier") for l in good]
    with pytest.raises(CurveError, match="lower-is-better"):
        fit_curve(brier, task="cloze-v0", baseline=B, margin=EPS)
    with pytest.raises(LabelError, match="more than once"):
        fit_curve(good + [good[0]], task="cloze-v0", baseline=B, margin=EPS)
    with pytest.raises(CurveError, match="margin"):
        fit_curve(good, task="cloze-v0", baseline=B, margin=0.0)
    with pytest.raises(LabelError, match="at least 2 families"):
        lofo_validate([l.with_(family="a") for l in good], baseline=B, margin=EPS)


@pytest.mark.parametrize("confidence", [0.5, 0.8, 0.9, 0.95, 0.975, 0.99, 0.999, 0.123456789])
def test_the_bands_z_and_the_held_out_probabilities_are_norms_numbers(confidence):
    """The fits take z from `ndtri` (kept per confidence) and the LOFO probabilities from
    `ndtr`, the functions `norm.ppf` and `norm.cdf` call, without their per-call checks: the
    same bits, also at the infinities, NaN and signed zero."""
    from scipy.special import ndtr

    from monitor.bands import two_sided_z
    from monitor.curves.stats import _band_z

    alpha = 1.0 - confidence
    assert _band_z(confidence) == float(norm.ppf(1.0 - alpha / 2.0))
    assert two_sided_z(confidence) == float(norm.ppf(0.5 + confidence / 2.0))
    x = np.concatenate([np.linspace(-40.0, 40.0, 2001) * confidence,
                        [np.inf, -np.inf, np.nan, -0.0, 0.0, 1e-300, -1e-300, 5e-324]])
    assert np.array_equal(ndtr(x), norm.cdf(x), equal_nan=True)
