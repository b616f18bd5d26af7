"""Lab v3's power analysis: the vectorised test is v2's test, the simulator matches the exact
power at six families, and the noise it simulates is the v2 record's."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import nct, t as student

from monitor.curves.axis_choice import sign_flip_pvalue
from monitor.errors import LabError
from monitor.lab import power as P

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("families", [1, 6, 9, 17, 20])
def test_vectorised_pvalues_equal_v2s_test(families):
    rng = np.random.default_rng(families)
    diffs = rng.normal(0.2, 1.0, size=(7, families))
    diffs[0] = np.round(diffs[0], 1)          # ties between |means| must count as reaching it
    got = P.sign_flip_pvalues(diffs)
    want = [sign_flip_pvalue(row)[0] for row in diffs]
    assert got.tolist() == pytest.approx(want, abs=1e-15)


def test_smallest_p_at_six_families_is_two_in_sixty_four():
    assert P.sign_flip_pvalues(np.array([[0.1, 0.2, 0.3, 0.05, 0.4, 0.01]]))[0] == 2 / 64
    # one sign flipped: the observed |mean| is no longer the largest of the 64 patterns
    assert P.sign_flip_pvalues(np.array([[0.1, 0.2, 0.3, 0.05, 0.4, -0.01]]))[0] == 4 / 64


def test_noise_model_standardises_at_three_seeds():
    nm = P.NoiseModel()
    assert nm.family_sd(3) == pytest.approx(math.sqrt(0.021 ** 2 + 0.090 ** 2 / 3))
    assert nm.raw_effect(0.65) == pytest.approx(0.65 * 0.05604, abs=1e-4)
    assert nm.standardised_at(0.65, 3) == pytest.approx(0.65)
    assert nm.standardised_at(0.65, 1) < 0.65 < nm.standardised_at(0.65, 5)


@pytest.mark.parametrize("effect", [0.0, 0.9])
def test_simulated_power_at_six_families_matches_the_exact_power(effect):
    reps = 20_000
    sim = P.simulate_power(6, 3, effect, replicates=reps, seed=3)
    exact = P.exact_power_six(effect)            # Φ(e)^6 + Φ(−e)^6; 2/64 under the null
    if effect == 0.0:
        assert exact == pytest.approx(2 / 64)
    assert abs(sim - exact) < 4 * math.sqrt(exact * (1 - exact) / reps)


def test_simulated_power_near_the_t_tests_beyond_the_exact_range():
    """At 22 families the sign-flip test's power is close to the paired t-test's (noncentral t)."""
    n, e = 22, 0.65
    tc = student.ppf(0.975, n - 1)
    t_power = 1 - nct.cdf(tc, n - 1, e * math.sqrt(n)) + nct.cdf(-tc, n - 1, e * math.sqrt(n))
    sim = P.simulate_power(n, 3, e, replicates=1_000)
    assert abs(sim - t_power) < 0.05


def test_more_seeds_and_families_give_more_power():
    lo = P.simulate_power(10, 1, 0.79, replicates=1_000)
    hi = P.simulate_power(10, 5, 0.79, replicates=1_000)
    assert hi > lo + 0.1
    assert P.simulate_power(24, 3, 0.79, replicates=1_000) > P.simulate_power(8, 3, 0.79, replicates=1_000)


def test_families_needed_reads_the_first_family_count_that_stays_above_target():
    table = {"power": {"0.65": {"3": {"6": 0.2, "7": 0.81, "8": 0.79, "9": 0.85, "10": 0.9}}}}
    assert P.families_needed(table, 0.65, 3) == 9
    table["power"]["0.65"]["3"]["10"] = 0.7
    assert P.families_needed(table, 0.65, 3) is None


def test_bad_designs_are_refused():
    with pytest.raises(LabError):
        P.simulate_power(1, 3, 0.5)
    with pytest.raises(LabError):
        P.simulate_power(10, 3, 0.5, replicates=10)


def test_v2_noise_and_effects_are_reproduced_from_the_committed_record():
    """0.090 within families, 0.021 between family means; every effect in ONE unit, δ over the
    conservative model's SD of d_f at three seeds (0.0560): the primary (bits/byte − L*, calib)
    and bits/byte on heldout are both δ 1/36 = 0.0278, e 0.50; L*(oos) − L* on calib δ 0.0509,
    e 0.91. 0.65 and 0.79 are the same δ over the measured spreads 0.043 and 0.035."""
    from monitor.lab import record_file, records

    lab, _ = record_file.load_lab_with_sha256(ROOT / "benchmarks" / "results" / "lab-v2" / "lab.json")
    rows = list(records.race_rows(lab))
    v = P.variance_structure(rows, task="add-words", metric="exact_match", text="calib", axis="bits_per_byte")
    assert round(v["within_sd"], 3) == P.V2_WITHIN_SD
    assert round(v["between_sd"], 3) == P.V2_BETWEEN_SD
    # the family-averaged difference is the committed report's primary difference
    import json

    report = json.loads((ROOT / "benchmarks/results/lab-v2/report/lab-report.json").read_text())
    assert v["difference"] == pytest.approx(report["primary"]["difference"], abs=1e-12)
    oos = P.variance_structure(rows, task="add-words", metric="exact_match", text="calib", axis="lstar_oos")
    held = P.variance_structure(rows, task="add-words", metric="exact_match", text="heldout", axis="bits_per_byte")
    unit = math.sqrt(0.021 ** 2 + 0.090 ** 2 / 3)
    assert P.UNIT_SD == pytest.approx(unit)
    for measured, effect in zip((v, held, oos), P.V2_EFFECTS):
        assert abs(measured["difference"]) == pytest.approx(effect.delta, abs=1e-12)
        assert round(measured["difference_sd"], 4) == effect.measured_sd
        assert measured["standardised_effect"] == pytest.approx(effect.delta / unit)
        assert round(measured["standardised_effect"], 2) in P.EFFECTS
    assert P.EFFECTS == (0.5, 0.91)
    # the old numbers were δ over the measured spread: another unit
    assert (round(v["effect_over_measured_sd"], 2), round(held["effect_over_measured_sd"], 2),
            round(oos["effect_over_measured_sd"], 2)) == (0.65, 0.79, 0.90)


def test_the_variance_model_does_not_fit_its_inputs():
    """Seed noise alone (0.090/√3 = 0.052) would spread family means more than they spread
    (0.021): the conservative model, which adds the two, overstates the noise."""
    from monitor.lab import record_file, records

    lab, _ = record_file.load_lab_with_sha256(ROOT / "benchmarks" / "results" / "lab-v2" / "lab.json")
    v = P.variance_structure(list(records.race_rows(lab)), task="add-words", metric="exact_match", text="calib",
                             axis="bits_per_byte")
    assert round(v["seed_part_sd"], 3) == 0.052 > round(v["between_sd"], 3) == 0.021
    assert v["difference_sd"] < P.UNIT_SD            # the measured spread is below the model's


def test_the_measured_model_at_six_families_matches_the_exact_power():
    """Under the measured model d_f ~ N(δ, sd²) at any seed count, so at six families the power
    is Φ(δ/sd)^6 + Φ(−δ/sd)^6, whatever the unit e is stated in."""
    reps = 20_000
    model = P.NoiseModel.measured(0.043)
    sim = P.simulate_power(6, 3, 0.9, noise=model, replicates=reps, seed=5)
    exact = P.exact_power_six(0.9 * P.UNIT_SD / 0.043)
    assert abs(sim - exact) < 4 * math.sqrt(exact * (1 - exact) / reps)
    assert model.family_sd(1) == model.family_sd(3) == 0.043


def test_the_preregistration_states_the_design_under_powered_at_v2s_primary_effect():
    """24 families kept × 3 seeds (20 the minimum): below 80 % at e 0.50 under the conservative
    model, and the text says so."""
    from monitor.lab.preregistration import PREREG_DOC, load_preregistration

    pw = load_preregistration()["power"]
    design = pw["design"]
    assert (design["families_kept"], design["families_min"], design["seeds"]) == (24, 20, 3)
    cons = design["conservative"]
    assert cons["20"]["0.5"] < cons["24"]["0.5"] < 0.8
    assert cons["20"] == P.table_lookup(pw["table"], 20, 3) and cons["24"] == P.table_lookup(pw["table"], 24, 3)
    primary = next(m for m in pw["measured"] if "primary" in m["name"])
    assert design["measured"][primary["name"]]["24"] == primary["power"]["24"]
    assert P.simulate_power(24, 3, 0.5, noise=P.NoiseModel.measured(primary["measured_sd"]),
                            replicates=pw["table"]["replicates"], seed=pw["table"]["seed"]) == primary["power"]["24"]
    text = PREREG_DOC.read_text(encoding="utf-8")
    assert "under-powered" in text and f"{cons['24']['0.5']:.2f}" in text and f"{cons['20']['0.5']:.2f}" in text
