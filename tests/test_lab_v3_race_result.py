"""The committed lab v3 race (benchmarks/results/lab-v3/race/) against the issue's design and the
pre-registered rule: `lstar lab report --json` on the committed lab.json gives the committed
report, the record is the design the pre-registration asks for (families past the cut-off,
seeds, the in-distribution primary text, data of its own per lineage), the lineages kept between
sittings are the record's, and the numbers docs/lab.md and the README quote are the report's."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from monitor.cli import app
from monitor.lab.preregistration import load_preregistration, preregistration_sha256

ROOT = Path(__file__).resolve().parents[1]
RACE = ROOT / "benchmarks" / "results" / "lab-v3" / "race"
REPORT = RACE / "report"
PILOT = ROOT / "benchmarks" / "results" / "lab-v3" / "pilot"


@pytest.fixture(scope="module")
def record() -> dict:
    return json.loads((RACE / "lab.json").read_text())


@pytest.fixture(scope="module")
def rows(record: dict) -> list:
    """The race rows of the record, validated once for the tests that recompute from them."""
    from monitor.lab.records_v3 import parse_lab_v3, race_rows_v3

    return race_rows_v3(parse_lab_v3(record, where="lab.json"))


@pytest.fixture(scope="module")
def report() -> dict:
    return json.loads((REPORT / "lab-report.json").read_text())


def test_the_committed_race_gives_the_committed_report(tmp_path):
    """`lstar lab report --lab lab.json --json` recomputed now: what it prints (pilot gate, power,
    primary, negative control) and the report it writes are the committed report's."""
    result = CliRunner().invoke(app, ["lab", "report", "--lab", str(RACE / "lab.json"), "--json",
                                      "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    printed = json.loads(result.output)
    written = json.loads((tmp_path / "lab-report.json").read_text())
    committed = json.loads((REPORT / "lab-report.json").read_text())
    for key in ("pilot_gate", "power", "primary", "negative_control"):
        assert printed[key] == committed[key], key
    for data in (written, committed):
        data.pop("source")
    assert written == committed
    assert (tmp_path / "lab-report.md").read_text().replace(str(RACE / "lab.json"), "benchmarks/results/lab-v3/race/lab.json") \
        == (REPORT / "lab-report.md").read_text()


def test_the_race_is_the_design_the_issue_and_pre_registration_ask_for(record, report):
    prereg = load_preregistration()
    assert record["preregistration_sha256"] == preregistration_sha256()
    chosen = record["family_set"]
    assert chosen["cutoff"] == prereg["families"]["cutoff"] == 0.96 and len(chosen["kept"]) == 24
    raced = sorted({c["family"] for c in record["checkpoints"]})
    assert raced == sorted(chosen["raced"]) and len(raced) == 21 >= prereg["families"]["min_kept"]
    assert set(raced) <= set(chosen["kept"])
    lineages = {(c["family"], c["seed"]) for c in record["checkpoints"]}
    assert lineages == {(f, s) for f in raced for s in (0, 1, 2)}
    assert all(len([c for c in record["checkpoints"] if (c["family"], c["seed"]) == key]) == 6 for key in lineages)
    # the primary text is the pool's held-out split; every lineage reads a sample of its own
    assert report["primary"]["text"] == "heldout" and "heldout" in record["config"]["texts"]
    samples = [d["sample"] for d in record["data"]]
    assert len(samples) == len(set(samples)) == 63
    assert report["design"]["data_assignment"]["holds"]
    # the one deviation: 21 of the 24 kept families raced (deviation 1 in docs/lab.md)
    assert report["design"]["n_families"] == 21 and report["power"]["families"] == 21
    assert report["power"]["seeds"] == 3
    (deviation,) = report["design"]["deviations"]
    assert deviation.startswith("3 of the 24 families kept by the cut-off not raced (pool-bpe-lines-8k, "
                                "pool-bpe-lines-2k, pool-bpe-lines-32k)")


def test_the_pilots_lineages_are_raced_as_the_gate_read_them(record):
    pilot = json.loads((PILOT / "lab.json").read_text())
    keys = {(c["family"], c["seed"]) for c in pilot["checkpoints"]}
    raced = [c for c in record["checkpoints"] if (c["family"], c["seed"]) in keys]
    assert raced == pilot["checkpoints"]


def test_the_lineages_kept_between_sittings_are_the_records(record):
    kept = sorted(p for p in (RACE / "lineages").glob("*.json") if not p.name.endswith(".timing.json"))
    assert len(kept) == 63 - 6
    for path in kept:
        lineage = json.loads(path.read_text())
        family, seed = lineage["data"]["family"], lineage["data"]["seed"]
        assert [c for c in record["checkpoints"] if (c["family"], c["seed"]) == (family, seed)] == lineage["checkpoints"]
        assert lineage["data"] in record["data"]
        timing = json.loads(path.with_name(path.name.removesuffix(".json") + ".timing.json").read_text())
        assert timing["machine"]["torch"].startswith("2.13.0")


def _quoted(value: float, digits: int = 3) -> str:
    return f"{value:.{digits}f}".replace("-", "−")


def _flat(text: str) -> str:
    """Text with its line breaks and indentation as single spaces (a quote may wrap)."""
    return " ".join(text.split())


def _texts() -> tuple[str, str, str]:
    """(docs/lab.md's "The race's result", its lab-in-brief result paragraph, README's v3 bullet text)."""
    text = (ROOT / "docs" / "lab.md").read_text()
    section = text[text.index("### The race's result"):text.index("# Version 1")]
    brief = text[text.index("**Result** ([The race's result]"):text.index("## Results of the full run")]
    readme = (ROOT / "README.md").read_text()
    bullet = readme[readme.index("  Version 3, built so that the race can decide"):readme.index("- **Backtests on real")]
    return _flat(section), _flat(brief), _flat(bullet)


def test_the_docs_and_readme_quote_the_verdict(report):
    primary, control = report["primary"], report["negative_control"]
    section, brief, bullet = _texts()
    errors = control["family_mean_crossing_error"]
    headline = (f"not distinguishable** again (bits/byte − L\\* {_quoted(primary['difference'])} in crossing error, "
                f"sign-flip p {primary['p_value']:.2f}, 95 % interval [{_quoted(primary['lower'])}, "
                f"{_quoted(primary['upper'])}])")
    assert headline in bullet
    assert headline.replace("** again", "**") in brief
    clock = (f"crossing error {_quoted(errors['bytes_seen'])} against L\\*'s {_quoted(errors['lstar'])} and "
             f"bits/byte's {_quoted(errors['bits_per_byte'])}")
    assert clock in bullet and clock in brief
    assert primary["statement"] == "not distinguishable" and not primary["decided"]
    assert not control["failed_to_transfer"] and "negative_control_failed_to_transfer" in primary["failed"]
    row = re.search(r"\| primary \| ([0-9.]+) \(bits/byte errs more in (\d+) families, L\\\* in (\d+), equal in (\d+)\) "
                    r"\| p ([0-9.]+) \| \[([−0-9.]+), ([−0-9.]+)\] \|", section)
    assert row, "the verdict's table"
    diffs = list(primary["per_family"].values())
    assert row[1] == _quoted(primary["difference"]) and row[5] == f"{primary['p_value']:.2f}"
    assert (row[6], row[7]) == (_quoted(primary["lower"]), _quoted(primary["upper"]))
    assert [int(row[i]) for i in (2, 3, 4)] == [sum(d > 1e-12 for d in diffs), sum(d < -1e-12 for d in diffs),
                                                 sum(abs(d) <= 1e-12 for d in diffs)]
    for axis, label in (("bytes_seen", "bytes seen (negative control)"), ("lstar", "L\\*"), ("bits_per_byte", "bits/byte")):
        assert f"| {label} | {_quoted(errors[axis])} |" in section, axis
    assert f"level {_quoted(report['primary_race']['level'])} ({report['primary_race']['above_level']} of 378" in section


def test_the_docs_quote_the_power_as_run_and_at_the_races_own_spread(report):
    """The power the report gives (the pre-registered table) and the power at the spread the
    race's per-family differences actually have, simulated as the pre-registration's power was."""
    from statistics import stdev

    from monitor.lab.power import NoiseModel, UNIT_SD, simulate_power

    section, brief, bullet = _texts()
    power = report["power"]
    by_effect = [f"{power['by_effect'][e]:.2f}" for e in ("0.5", "0.91")]
    measured = sorted(f"{v:.2f}" for v in power["measured"].values())
    assert f"({by_effect[0]} at standardised effect 0.50 and {by_effect[1]} at 0.91 under the" in section
    assert f"{measured[0]}, {measured[1]} and {measured[2]} under the spread of v2's three effects" in section
    sd = stdev(report["primary"]["per_family"].values())
    assert f"spread with SD {sd:.3f}, {sd / UNIT_SD:.1f} times the {UNIT_SD:.3f}" in section
    assert f"(SD {sd:.3f})" in bullet and f"(SD {sd:.3f})" in brief
    noise = NoiseModel.measured(sd)
    at = {delta: simulate_power(21, 3, delta / UNIT_SD, noise=noise) for delta in (0.0278, 0.0344, 0.0509)}
    assert (f"power {at[0.0278]:.2f} at v2's effect (0.0278), {at[0.0344]:.2f} at the observed 0.034 and "
            f"{at[0.0509]:.2f} at v2's largest") in section
    assert f"power {at[0.0278]:.2f}–{at[0.0509]:.2f} at v2's effect sizes" in bullet
    assert f"little power at v2's effect sizes ({at[0.0278]:.2f}–{at[0.0509]:.2f})" in brief


def test_the_docs_quote_the_secondaries(rows, report):
    from monitor.lab.analysis_v3 import compare
    from monitor.lab.preregistration import load_preregistration

    section, _, bullet = _texts()
    for s in report["secondary"]:
        row = re.search(rf"\| {re.escape(s['task'])} · {s['metric']} \| {s['text']} \| {re.escape(_label(s['axis']))} "
                        rf"\| ([−0-9.]+) \| ([0-9.]+) \| ([0-9.]+) \| (yes|no) \|", section)
        assert row, s
        assert row[1] == _quoted(s["difference"])
        assert row[2] == f"{s['p_value']:.4f}" and row[3] == f"{s['p_holm']:.4f}"
        assert (row[4] == "yes") == s["passes"]
    # the one that passes, against predicting "above" for every checkpoint
    raw = compare(rows, load_preregistration(), task="add-words", metric="logp_correct", text="heldout",
                  axes=("raw_ce",), bootstrap=False)
    versus = raw["axes"]["raw_ce"]["vs_reference"]["crossing_error"]
    passing = [s for s in report["secondary"] if s["passes"]]
    assert [(s["axis"], s["text"]) for s in passing] == [("raw_ce", "heldout")]
    assert abs(versus["difference"] - passing[0]["difference"]) < 1e-12
    diffs = list(versus["per_family"].values())
    above, equal = sum(d > 1e-12 for d in diffs), sum(abs(d) <= 1e-12 for d in diffs)
    assert f"(above it in {above} families, equal in {equal}; Holm p {passing[0]['p_holm']:.4f})" in section
    below = raw["n_rows"] - raw["above_level"]
    error = raw["axes"]["raw_ce"]["family_mean"]["crossing_error"]
    assert f"its family-averaged error, {error:.3f}, is that" in section
    assert f"({below} of 378 below it, {below / 378:.3f})" in section
    assert f"({error:.3f} against {below / 378:.3f})" in bullet and f"Holm p {passing[0]['p_holm']:.4f}" in bullet


def _label(axis: str) -> str:
    return {"bits_per_byte": "bits/byte", "raw_ce": "raw CE", "lstar_oos": "L\\* (out-of-sample unigram)"}[axis]


def test_the_clock_the_rmse_and_the_seed_0_and_1_readings(record, rows, report):
    """The readings docs/lab.md gives beyond the verdict, recomputed from the record: how many
    lineages are above the level at each checkpoint (bytes seen's error is the checkpoints a
    threshold between the first and second misplaces) and where each first reaches it; the
    RMSE's reversed order; and the verdict's numbers on seeds 0 and 1 alone (no lineage of the
    third machine)."""
    import numpy as np

    from monitor.lab.analysis_v3 import analyse_v3
    from monitor.lab.pilot import pilot_rows
    from monitor.lab.power import sign_flip_pvalues

    section, brief, _ = _texts()
    level = report["primary_race"]["level"]
    lineages: dict = {}
    for c in record["checkpoints"]:
        lineages.setdefault((c["family"], c["seed"]), []).append(c)
    reached = {}
    for key, cs in lineages.items():
        above = [c["tasks"]["add-words"]["logp_correct"] >= level for c in sorted(cs, key=lambda c: c["step"])]
        first = above.index(True)
        assert all(above[first:]), key      # once above the level, a lineage stays above it
        reached[key] = first + 1
    counts = [sum(r <= k for r in reached.values()) for k in range(1, 7)]
    assert counts == [5, 46, 63, 63, 63, 63]
    firsts = [sum(r == k for r in reached.values()) for k in (1, 2, 3)]
    assert "5 of the 63 lineages are above it at their first checkpoint, 46 at the second and all 63" in section
    assert f"by {firsts[0]}, {firsts[1]} and {firsts[2]} lineages" in section
    assert "(5 already at the first)" in brief
    misplaced = counts[0] + (63 - counts[1])
    assert misplaced == 22 and abs(misplaced / 378 - report["negative_control"]["family_mean_crossing_error"]["bytes_seen"]) < 1e-12
    assert "misplaces 5 + 17 = 22 of 378 checkpoints" in section
    families = sorted({f for f, _ in reached})
    mixed = [f for f in families if len({reached[(f, s)] for s in (0, 1, 2)}) > 1]
    late = [f for f in families if min(reached[(f, s)] for s in (0, 1, 2)) > 2]
    assert f"the three seeds of {len(mixed)} of the 21 families first reach the level" in section and late == ["llama-2"]
    first_bytes = [c["bytes_seen"] for cs in lineages.values() for c in cs if c["step"] == min(x["step"] for x in cs)]
    assert f"({min(first_bytes):,}–{max(first_bytes):,} bytes at the first" in section

    axes = report["primary_race"]["axes"]
    rmse = {a: {r["family"]: r["rmse"] for r in axes[a]["per_family"]} for a in ("bits_per_byte", "lstar")}
    diff = np.array([rmse["bits_per_byte"][f] - rmse["lstar"][f] for f in families])
    p = sign_flip_pvalues(diff)[0]
    means = {a: axes[a]["family_mean"]["rmse"] for a in ("bits_per_byte", "lstar", "bytes_seen")}
    assert (f"{means['bits_per_byte']:.3f} on bits/byte against {means['lstar']:.3f} on L\\* (bytes seen "
            f"{means['bytes_seen']:.3f}), lower on bits/byte in {int(np.sum(diff < 0))} of the 21 families, "
            f"sign-flip p {p:.3f}") in section

    early_rows = [r for r in rows if r["seed"] in (0, 1)]
    prereg = load_preregistration()
    early = analyse_v3(early_rows, prereg, pilot_rows=pilot_rows(early_rows, prereg))    # as `lstar lab report --rows` does
    errors = early["negative_control"]["family_mean_crossing_error"]
    assert (f"bits/byte − L\\* {early['primary']['difference']:.3f}, p {early['primary']['p_value']:.2f}, "
            f"bytes seen {errors['bytes_seen']:.3f} against L\\*'s {errors['lstar']:.3f} and bits/byte's "
            f"{errors['bits_per_byte']:.3f}") in section
    assert not early["negative_control"]["failed_to_transfer"] and early["primary"]["statement"] == "not distinguishable"


def test_a_family_set_that_races_fewer_than_it_kept_is_a_deviation(report):
    """Families kept by the cut-off without a checkpoint in the record are a deviation, whatever
    the record's own list of raced families says; the report's markdown escapes the names."""
    from monitor.lab.report_v3 import RECORD_SCHEMA, family_set_deviations, to_markdown

    checkpoints = [{"family": "a"}, {"family": "c"}]
    record = {"schema": RECORD_SCHEMA, "family_set": {"kept": ["a", "b", "c", "b"], "raced": ["a", "b", "c"]},
              "checkpoints": checkpoints}
    assert family_set_deviations(record) == [("1 of the 3 families kept by the cut-off not raced (b); "
                                              "the pre-registration races every kept family")]
    assert family_set_deviations({**record, "checkpoints": [*checkpoints, {"family": "b"}]}) == []
    assert family_set_deviations({**record, "family_set": None}) == []
    assert family_set_deviations({**record, "schema": "lstar-lab-rows/3"}) == []
    hostile = {**record, "family_set": {"kept": ["a", "x|<b>y</b>\n# z"], "raced": ["a"]}}
    (deviation,) = family_set_deviations(hostile)
    md = to_markdown({**report, "design": {**report["design"], "deviations": [deviation]}})
    line = next(x for x in md.splitlines() if x.startswith("- Deviations"))
    assert "<b>" not in md and "x|" not in line and "\n# z" not in md
