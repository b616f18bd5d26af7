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


def test_the_docs_quote_the_report(report):
    primary, control = report["primary"], report["negative_control"]
    text = (ROOT / "docs" / "lab.md").read_text()
    section = text[text.index("### The race's result"):]
    section = section[:section.index("\n## ", 1) if "\n## " in section[1:] else len(section)]
    readme = (ROOT / "README.md").read_text()
    assert primary["statement"] in section and primary["statement"] in readme
    for value in (primary["difference"], primary["lower"], primary["upper"]):
        assert _quoted(value) in section and _quoted(value) in readme, value
    assert f"p {primary['p_value']:.2f}" in section and f"p {primary['p_value']:.2f}" in readme
    for axis, error in control["family_mean_crossing_error"].items():
        assert _quoted(error) in section, axis
    verdict = "did not fail" if not control["failed_to_transfer"] else "failed to transfer"
    assert verdict in section
    for s in report["secondary"]:
        row = re.search(rf"^\| {re.escape(s['task'])} · {s['metric']} \| {s['text']} \| {re.escape(_label(s['axis']))} "
                        rf"\| ([−0-9.]+) \| ([0-9.]+) \| ([0-9.]+) \| (yes|no) \|$", section, re.M)
        assert row, s
        assert row[1] == _quoted(s["difference"])
        assert row[2] == f"{s['p_value']:.4f}" and row[3] == f"{s['p_holm']:.4f}"
        assert (row[4] == "yes") == s["passes"]


def _label(axis: str) -> str:
    return {"bits_per_byte": "bits/byte", "raw_ce": "raw CE", "lstar_oos": "L\\* (out-of-sample unigram)"}[axis]


def test_the_clock_and_the_seed_0_and_1_reading_the_docs_give(record, report):
    """The two readings docs/lab.md gives beyond the verdict, recomputed from the record: how many
    lineages are above the level at each checkpoint (the clock: bytes seen's error is the
    checkpoints a threshold between the first and second misplaces), and the verdict's numbers
    on seeds 0 and 1 alone (no lineage of the third machine but llama-2's)."""
    from monitor.lab.analysis_v3 import analyse_v3
    from monitor.lab.pilot import pilot_rows
    from monitor.lab.records_v3 import parse_lab_v3, race_rows_v3

    level = report["primary_race"]["level"]
    lineages: dict = {}
    for c in record["checkpoints"]:
        lineages.setdefault((c["family"], c["seed"]), []).append(c)
    above = [sum(sorted(cs, key=lambda c: c["step"])[k]["tasks"]["add-words"]["logp_correct"] >= level
                 for cs in lineages.values()) for k in range(6)]
    assert above == [5, 46, 63, 63, 63, 63]
    misplaced = above[0] + (63 - above[1])
    assert misplaced == 22 and abs(misplaced / 378 - report["negative_control"]["family_mean_crossing_error"]["bytes_seen"]) < 1e-12
    text = (ROOT / "docs" / "lab.md").read_text()
    assert "5 of the 63 lineages are above the level" in text and "46 at the second" in text and "5 + 17 = 22" in text

    rows = [r for r in race_rows_v3(parse_lab_v3(record, where="lab.json")) if r["seed"] in (0, 1)]
    prereg = load_preregistration()
    early = analyse_v3(rows, prereg, pilot_rows=pilot_rows(rows, prereg))    # as `lstar lab report --rows` does
    errors = early["negative_control"]["family_mean_crossing_error"]
    quoted = (f"bits/byte − L\\* {early['primary']['difference']:.3f}, p {early['primary']['p_value']:.2f}, "
              f"bytes seen {errors['bytes_seen']:.3f} against L\\*'s {errors['lstar']:.3f}")
    assert quoted in " ".join(text.split()), quoted
    assert not early["negative_control"]["failed_to_transfer"] and early["primary"]["statement"] == "not distinguishable"


def test_a_family_set_that_races_fewer_than_it_kept_is_a_deviation():
    from monitor.lab.report_v3 import RECORD_SCHEMA, family_set_deviations

    record = {"schema": RECORD_SCHEMA, "family_set": {"kept": ["a", "b", "c"], "raced": ["a", "c"]}}
    assert family_set_deviations(record) == ["1 of the 3 families kept by the cut-off not raced (b); "
                                             "the pre-registration races every kept family"]
    assert family_set_deviations({**record, "family_set": {"kept": ["a"], "raced": ["a"]}}) == []
    assert family_set_deviations({**record, "family_set": None}) == []
    assert family_set_deviations({"schema": "lstar-lab-rows/3", "family_set": record["family_set"]}) == []
