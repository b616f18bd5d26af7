"""The registers stress test (monitor/stress/registers.py): Kendall τ and its bootstrap against
scipy and a naive loop, and the threshold shift of a refitted curve on hand-made registers."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import kendalltau

from monitor.curves.artifact import save_curve
from monitor.curves.fit import fit_curve
from monitor.curves.labels import Label
from monitor.errors import SpecError
from monitor.stress.registers import register_stress, to_primary_units
from monitor.stress.subject import StressCheckpoint, StressOptions, StressSubject

REPO = Path(__file__).resolve().parents[1]
LABELS = [f"step{i}" for i in range(8)]
PRIMARY = [4.0, 3.6, 3.3, 3.1, 2.9, 2.7, 2.6, 2.5]            # L* falls with training
CODE = [5.1, 4.9, 4.2, 4.4, 3.8, 3.9, 3.5, 3.4]              # two swaps against PRIMARY
DICT = [2 * x + 1 for x in PRIMARY]                          # the same order, other units
ACCURACY = [0.25, 0.26, 0.27, 0.35, 0.5, 0.62, 0.7, 0.74]


def subject(shared_dir: Path, curve_id: str | None = None) -> StressSubject:
    return StressSubject(kind="lab", name="synthetic", corpus=shared_dir / "corpus" / "calib-v0",
                         checkpoints=tuple(StressCheckpoint(ref=f"/nowhere/{l}", label=l) for l in LABELS),
                         curve_id=curve_id)


def options(tmp_path: Path, **kw) -> StressOptions:
    table = {l: {"lstar-calib-v0": p, "code": c, "dictionary": d}
             for l, p, c, d in zip(LABELS, PRIMARY, CODE, DICT)}
    regs = (REPO / "data" / "lab-pool-sample" / "heldout", REPO / "data" / "lab-pool-sample" / "tasks")
    # two corpora standing in for registers: their names come from a register.json beside them
    folders = []
    for reg, src in zip(("code", "dictionary"), regs):
        dst = tmp_path / reg
        dst.mkdir()
        for f in src.iterdir():
            (dst / f.name).write_bytes(f.read_bytes())
        (dst / "register.json").write_text(f'{{"register": "{reg}"}}')
        folders.append(dst)
    return StressOptions(seed=3, register_corpora=tuple(folders), extra={"lstar": table, "n_boot": 300}, **kw)


def naive_tau(a: list[float], b: list[float]) -> float:
    """τ-a by counting concordant and discordant pairs (no ties in these vectors, so τ-b = τ-a)."""
    s = 0
    for i, j in itertools.combinations(range(len(a)), 2):
        s += np.sign(a[i] - a[j]) * np.sign(b[i] - b[j])
    return s / (len(a) * (len(a) - 1) / 2)


def test_kendall_tau_matches_scipy_and_a_pair_count(shared_dir, tmp_path) -> None:
    section = register_stress(subject(shared_dir), options(tmp_path))
    assert [r["name"] for r in section["registers"]] == ["lstar-calib-v0", "code", "dictionary"]
    taus = {(t["a"], t["b"]): t for t in section["kendall_tau"]}
    assert taus[("lstar-calib-v0", "code")]["tau"] == pytest.approx(kendalltau(PRIMARY, CODE).statistic, abs=1e-12)
    assert taus[("lstar-calib-v0", "code")]["tau"] == pytest.approx(naive_tau(PRIMARY, CODE), abs=1e-12)
    assert taus[("lstar-calib-v0", "code")]["tau"] == pytest.approx(24 / 28, abs=1e-12)  # 2 discordant of 28 pairs
    assert taus[("lstar-calib-v0", "dictionary")]["tau"] == pytest.approx(1.0)
    assert taus[("lstar-calib-v0", "dictionary")]["low"] == pytest.approx(1.0)


def test_bootstrap_interval_is_a_seeded_resample_over_checkpoints(shared_dir, tmp_path) -> None:
    section = register_stress(subject(shared_dir), options(tmp_path))
    row = next(t for t in section["kendall_tau"] if t["b"] == "code")
    # the same resamples drawn here independently: seed + 1000*i + j for the pair (0, 1)
    rng = np.random.default_rng(3 + 1)
    a, b = np.array(PRIMARY), np.array(CODE)
    taus = []
    for _ in range(300):
        idx = rng.integers(0, 8, 8)
        t = kendalltau(a[idx], b[idx]).statistic
        if np.isfinite(t):
            taus.append(t)
    assert row["low"] == pytest.approx(np.quantile(taus, 0.025), abs=1e-12)
    assert row["high"] == pytest.approx(np.quantile(taus, 0.975), abs=1e-12)
    assert row["low"] <= row["tau"] <= row["high"]


def test_threshold_shift_of_a_refitted_curve(shared_dir, tmp_path) -> None:
    labels = [Label(checkpoint=l, value=v, task="t", metric="acc", lstar=x)
              for l, v, x in zip(LABELS, ACCURACY, PRIMARY)]
    curve = fit_curve(labels, task="t", metric="acc", baseline=0.25, margin=0.2, resamples=200, seed=0, lofo=False)
    path = save_curve(curve, tmp_path / "curve.json")
    section = register_stress(subject(shared_dir, curve.curve_id), options(tmp_path, curve_path=path))
    rows = {r["register"]: r for r in section["curves"]}
    primary = rows["lstar-calib-v0"]
    assert primary["threshold_lstar"] == pytest.approx(curve.threshold.estimate, abs=1e-9)
    assert primary["threshold_shift_lstar"] == 0.0 and primary["crossing_error_change"] == 0.0
    assert primary["threshold_interval_width"] == pytest.approx(curve.threshold.upper - curve.threshold.lower)
    # the dictionary register is the primary in other units: its threshold is the same point
    assert rows["dictionary"]["threshold_lstar"] == pytest.approx(2 * curve.threshold.estimate + 1, abs=1e-6)
    assert rows["dictionary"]["threshold_shift_lstar"] == pytest.approx(0.0, abs=1e-6)
    # the code register: its threshold mapped back by interpolation, worked here by hand
    code = rows["code"]
    order = np.argsort(CODE)
    mapped = float(np.interp(code["threshold_lstar"], np.array(CODE)[order], np.array(PRIMARY)[order]))
    assert code["threshold_shift_lstar"] == pytest.approx(mapped - curve.threshold.estimate, abs=1e-12)
    crossed = np.array(ACCURACY) >= 0.45
    err = lambda x, t: float(np.mean((np.array(x) <= t) != crossed))  # noqa: E731
    # crossed is the value at or above the level, whatever way the curve runs along L*: the
    # primary threshold sits between 3.1 and 2.9 and splits the checkpoints as the values do
    assert crossed.tolist() == [False] * 4 + [True] * 4
    assert primary["crossing_error"] == pytest.approx(err(PRIMARY, curve.threshold.estimate), abs=1e-12)
    assert primary["crossing_error"] == 0.0
    assert code["crossing_error"] == pytest.approx(err(CODE, code["threshold_lstar"]), abs=1e-12)
    assert code["crossing_error_change"] == pytest.approx(err(CODE, code["threshold_lstar"])
                                                          - err(PRIMARY, curve.threshold.estimate), abs=1e-12)


def test_to_primary_units_interpolates_between_checkpoints() -> None:
    assert to_primary_units(4.5, np.array([5.0, 4.0, 3.0]), np.array([3.0, 2.0, 1.0])) == pytest.approx(2.5)
    assert to_primary_units(None, np.array([1.0]), np.array([1.0])) is None


def test_without_a_register_corpus_it_says_what_to_pass(shared_dir) -> None:
    with pytest.raises(SpecError, match="at least one register corpus"):
        register_stress(subject(shared_dir), StressOptions())


def test_each_checkpoint_scores_all_registers_in_one_call(shared_dir, tmp_path, monkeypatch) -> None:
    import monitor.scoring.engine as engine

    calls = []

    def fake_score_corpora(request, corpora, *, db_path):
        calls.append((request.model, [Path(c).name for c in corpora], request.docs, request.every))
        step = int(request.model.rsplit("step", 1)[1])
        return [{"ce": 5.0 - step / 10 + k, "ce_unigram": 7.0, "lstar": 4.0 - step / 10 + k, "n_tokens": 100}
                for k in range(len(corpora))]

    monkeypatch.setattr(engine, "score_corpora", fake_score_corpora)
    opts = options(tmp_path)
    opts = StressOptions(seed=0, max_documents=4, register_corpora=opts.register_corpora, extra={"every": 54, "n_boot": 50})
    section = register_stress(subject(shared_dir), opts)
    assert len(calls) == len(LABELS)
    assert all(c[1] == ["calib-v0", "code", "dictionary"] and c[2:] == (4, 54) for c in calls)
    assert section["lstar"]["step3"] == {"lstar-calib-v0": pytest.approx(3.7), "code": pytest.approx(4.7),
                                         "dictionary": pytest.approx(5.7)}
    assert all(t["tau"] == pytest.approx(1.0) for t in section["kendall_tau"])
