"""Lab v3's verdict, negative control, design checks, pre-registration pin and `lstar lab report`
on synthetic v3 rows with a known answer (`monitor.lab.synthetic_v3`)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from monitor.cli import app
from monitor.errors import LabError
from monitor.lab import power
from monitor.lab.analysis_v3 import analyse_v3
from monitor.lab.preregistration import (PREREG_DOC, PREREG_JSON, check_pin, document_sha256,
                                         load_preregistration, preregistration_sha256)
from monitor.lab.synthetic_v3 import synthetic_v3_rows

RESAMPLES = 30   # the refit bootstrap; the pre-registered 200 is for the record


@pytest.fixture(scope="module")
def prereg():
    return load_preregistration()


@pytest.fixture(scope="module")
def pilot():
    return synthetic_v3_rows(families=6, seeds=1, seed=5)


@pytest.fixture(scope="module")
def decided(prereg, pilot):
    return analyse_v3(synthetic_v3_rows(families=20, seeds=3, seed=1), prereg, pilot_rows=pilot, resamples=RESAMPLES)


def test_a_clear_winner_is_decided_by_the_rule(decided):
    p = decided["primary"]
    assert decided["pilot_gate"]["passed"]
    assert decided["negative_control"]["failed_to_transfer"] is True
    assert p["failed"] == [] and p["decided"]
    # bits/byte carries a per-family offset: L* transfers, bits/byte errs more
    assert p["difference"] > 0 and p["statement"] == "L* transfers better than bits/byte"
    assert p["difference"] == pytest.approx(sum(p["per_family"].values()) / 20)
    assert p["n_families"] == 20 and p["p_value"] < 0.05 and 0 < p["lower"] <= p["upper"]


def test_the_power_of_the_design_as_run_is_the_pre_registered_tables(decided, prereg):
    pw = decided["power"]
    assert (pw["families"], pw["seeds"]) == (20, 3)
    assert pw["source"] == "pre-registered table"
    assert pw["by_effect"] == power.table_lookup(prereg["power"]["table"], 20, 3)
    assert pw["measured"] == {m["name"]: m["power"]["20"] for m in prereg["power"]["measured"]}
    assert decided["design"]["deviations"] == []


def test_no_winner_is_not_distinguishable(prereg, pilot):
    res = analyse_v3(synthetic_v3_rows(families=20, seeds=3, seed=2, winner=None), prereg, pilot_rows=pilot,
                     resamples=RESAMPLES)
    assert res["primary"]["statement"] == "not distinguishable"
    assert not res["primary"]["decided"]


def test_shared_data_keeps_bytes_seen_a_clock_and_the_race_does_not_count(prereg, pilot):
    # The control's errors are the LOFO's, the failed check decides the statement and the data
    # rule is the design's: none reads the race's refit bootstrap, so 2 resamples check the
    # same through the same path (4.1 CPU-s at 30 resamples). Every other check of the rule
    # passes here (at 2 resamples as at 30), so the failed control alone makes the statement
    # "not distinguishable": a rule that let the race count despite it would say who won.
    res = analyse_v3(synthetic_v3_rows(families=20, seeds=3, seed=1, shared_data=True), prereg, pilot_rows=pilot,
                     resamples=2)
    c = res["negative_control"]
    e = c["family_mean_crossing_error"]
    assert c["failed_to_transfer"] is False and e["bytes_seen"] <= min(e["lstar"], e["bits_per_byte"])
    assert res["primary"]["failed"] == ["negative_control_failed_to_transfer"]
    assert res["primary"]["statement"] == "not distinguishable"
    assert any("data rule" in d for d in res["design"]["deviations"])


def test_a_stopped_gate_means_the_race_is_not_run(prereg):
    res = analyse_v3(synthetic_v3_rows(families=20, seeds=3, seed=1), prereg,
                     pilot_rows=synthetic_v3_rows(families=6, seeds=1, seed=5, skill=False))
    assert not res["pilot_gate"]["passed"]
    assert res["primary"]["statement"] == "not run: the pilot gate stopped the race"
    assert res["secondary"] == [] and res["primary_race"]["ran"] is False


def test_a_small_design_is_a_deviation_with_its_own_power(prereg, pilot):
    # The design and its power are read from the rows, not from the race's refit bootstrap, so
    # 2 resamples check the same (the race still runs through the same path): 4.2 -> 2.6 CPU-s.
    res = analyse_v3(synthetic_v3_rows(families=16, seeds=1, seed=1), prereg, pilot_rows=pilot, resamples=2)
    dev = res["design"]["deviations"]
    assert any("16 families" in d for d in dev) and any("1 seed" in d for d in dev)
    assert res["power"]["by_effect"]["0.5"] == power.table_lookup(prereg["power"]["table"], 16, 1)["0.5"]
    assert all(v is None for v in res["power"]["measured"].values())     # the measured model is for 3 seeds


def test_the_pin_covers_the_text_and_refuses_another(tmp_path):
    prereg = load_preregistration()
    assert prereg["document"]["sha256"] == document_sha256(PREREG_DOC)
    sha = preregistration_sha256()
    assert check_pin(sha) == sha
    with pytest.raises(LabError) as err:
        check_pin("0" * 64, where="lab.json")
    assert "\n" not in err.value.one_line() and "pins pre-registration sha256 0000" in err.value.message
    with pytest.raises(LabError):
        check_pin(None)
    edited = tmp_path / "p.json"
    edited.write_bytes(PREREG_JSON.read_bytes().replace(b'"alpha": 0.05', b'"alpha": 0.10'))
    assert preregistration_sha256(edited) != sha


def _rows_file(tmp_path: Path, pin: str) -> Path:
    path = tmp_path / "rows.json"
    path.write_text(json.dumps({"schema": "lstar-lab-rows/3", "preregistration_sha256": pin,
                                "rows": synthetic_v3_rows(families=8, seeds=2, steps=6, seed=3),
                                "pilot_rows": synthetic_v3_rows(families=6, seeds=1, seed=5)}))
    return path


def test_cli_report_json_on_a_v3_rows_file(tmp_path):
    path = _rows_file(tmp_path, preregistration_sha256())
    res = CliRunner().invoke(app, ["lab", "report", "--rows", str(path), "--json", "--resamples", "20",
                                   "--out", str(tmp_path / "rep")])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    for key in ("pilot_gate", "power", "primary", "negative_control"):
        assert key in out
    assert out["pilot_gate"]["passed"] and out["power"]["families"] == 8
    assert any("8 families" in d for d in out["design"]["deviations"])
    md = (tmp_path / "rep" / "lab-report.md").read_text()
    assert "## Verdict" in md and out["primary"]["statement"] in md
    # every secondary row names its axis, so two on one task, metric and text stay apart
    table = md[md.index("## Secondary comparisons"):]
    for s in out["secondary"]:
        label = {"bits_per_byte": "bits/byte", "raw_ce": "raw CE", "lstar_oos": "L* (out-of-sample unigram)"}[s["axis"]]
        assert f"| {s['text']} | {label} |" in table, s
    control = out["negative_control"]
    if control["ran"]:
        assert f"bytes seen {control['family_mean_crossing_error']['bytes_seen']:.3g}" in md


def test_cli_refuses_a_record_under_another_pre_registration(tmp_path, capsys):
    from monitor.cli import main

    path = _rows_file(tmp_path, "f" * 64)
    assert main(["lab", "report", "--rows", str(path), "--json"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and re.search(r"pins pre-registration sha256 ffff", err)
    assert not (tmp_path / "report").exists()


def test_v3_help_names_the_v3_report():
    res = CliRunner().invoke(app, ["lab", "report", "--help"])
    assert res.exit_code == 0 and "lstar-lab/3" in res.output


def test_the_committed_power_table_is_what_the_simulator_gives_and_the_text_shows_it(prereg):
    table = prereg["power"]["table"]
    for n, k, e in ((6, 3, 0.5), (9, 1, 0.91), (12, 5, 0.5)):   # cells cheap to recompute
        got = power.simulate_power(n, k, e, replicates=table["replicates"], seed=table["seed"])
        assert got == table["power"][f"{e:g}"][str(k)][str(n)]
    text = PREREG_DOC.read_text()
    for e in table["effects"]:
        assert "\n".join(power.markdown_table(table, e)) in text
    assert table["effects"] == list(power.EFFECTS)
    assert prereg["power"]["design"]["conservative"]["20"] == power.table_lookup(table, 20, 3)
    assert prereg["power"]["needed_families"]["0.5"]["3"] == power.families_needed(table, 0.5, 3)


def _per_lineage_samples(rows):
    """The sample ids a v3 record gives: one per (family, seed) lineage, as
    `assignment.DataAssignment.sample` writes them (`<family>-s<seed>-<order pin>`)."""
    return [{**r, "data": {"sample": f"{r['family']}-s{r['seed']}-{r['seed']:012d}"}} for r in rows]


def test_one_sample_per_lineage_as_the_record_writes_them_keeps_the_data_rule(prereg):
    from monitor.lab.analysis_v3 import design
    from monitor.lab.rows_v3 import check_rows_v3

    rows = check_rows_v3(_per_lineage_samples(synthetic_v3_rows(families=20, seeds=3, steps=4, seed=1)))
    d = design(rows, prereg)
    assert d["data_assignment"]["holds"] and d["deviations"] == []
    assert d["data_assignment"]["samples"]["fam00"] == ["fam00-s0-000000000000", "fam00-s1-000000000001",
                                                        "fam00-s2-000000000002"]


def test_the_data_rule_is_broken_by_a_sample_two_families_share_or_a_lineage_with_two(prereg):
    from monitor.lab.analysis_v3 import design
    from monitor.lab.rows_v3 import check_rows_v3

    rows = _per_lineage_samples(synthetic_v3_rows(families=20, seeds=3, steps=4, seed=1))
    shared = [{**r, "data": {"sample": "fam00-s0-000000000000"}} if (r["family"], r["seed"]) == ("fam01", 0) else r
              for r in rows]
    d = design(check_rows_v3(shared), prereg)
    assert d["data_assignment"]["samples_shared_by_families"] == ["fam00-s0-000000000000"]
    assert any("data rule" in x for x in d["deviations"])
    two = [{**r, "data": {"sample": "other"}} if (r["family"], r["seed"], r["step"]) == ("fam03", 1, 100) else r
           for r in rows]
    d = design(check_rows_v3(two), prereg)
    assert d["data_assignment"]["lineages_with_several_samples"] == ["fam03 seed 1"]
    assert any("data rule" in x for x in d["deviations"])


def test_holm_adjusts_across_all_five_secondaries_even_when_some_cannot_run(prereg):
    """The pre-registration adjusts "across the five": a secondary that cannot run (here the two
    on calib-v0, absent from the rows) still counts in m, so the others are not made easier."""
    from monitor.lab.analysis_v3 import secondaries
    from monitor.lab.rows_v3 import check_rows_v3

    rows = check_rows_v3([r for r in synthetic_v3_rows(families=8, seeds=1, steps=6, seed=3) if r["text"] == "heldout"])
    out = secondaries(rows, prereg)
    assert [s["ran"] for s in out] == [True, False, False, True, True]
    ran = sorted((s["p_value"], i) for i, s in enumerate(out) if s["ran"])
    # Holm by hand with m = 5: the j-th smallest (from 0) times (5 - j), running maximum, at most 1
    running, expected = 0.0, {}
    for j, (p, i) in enumerate(ran):
        running = max(running, min(1.0, (5 - j) * p))
        expected[i] = running
    for i, s in enumerate(out):
        assert s["p_holm"] == (pytest.approx(expected[i]) if s["ran"] else None)
    assert min(p for p, _ in ran) < 1 / 3     # m = 3 and m = 5 differ on these p-values
