"""`lstar lab report` on a lab v3 record (`lstar-lab/3`) end to end: the record is built through
records_v3's own types from synthetic rows with a known answer, written with `write_lab`, and
reported through the CLI. The pilot gate reads the pre-registered pilot's rows (its families at
seed 0) of the record, and `--pilot` gives that gate alone for a pilot-only record."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from monitor.cli import app
from monitor.lab.analysis_v3 import analyse_v3
from monitor.lab.pilot import pilot_gate
from monitor.lab.preregistration import load_preregistration, preregistration_sha256
from monitor.lab.records import write_lab
from monitor.lab.records_v3 import LAB_SCHEMA_V3, LabRecordV3
from monitor.lab.synthetic_v3 import synthetic_v3_rows

RESAMPLES = 20
STEPS = 6


@pytest.fixture(scope="module")
def prereg() -> dict[str, Any]:
    return load_preregistration()


def _names(prereg: dict[str, Any], n: int) -> list[str]:
    """The pre-registered pilot's six families first, then made-up ones."""
    pilot = list(prereg["families"]["pilot_families"])
    return pilot + [f"extra-{i:02d}" for i in range(n - len(pilot))]


def _renamed(rows: list[dict[str, Any]], names: list[str]) -> list[dict[str, Any]]:
    return [{**r, "family": names[int(r["family"][3:])]} for r in rows]


def _text(axes: dict[str, float]) -> dict[str, Any]:
    ce = axes["raw_ce"]
    return {"ce": ce, "ce_uni": ce - axes["lstar"], "ce_uni_oos": ce - axes["lstar_oos"], "lstar": axes["lstar"],
            "lstar_oos": axes["lstar_oos"], "lstar_se": 0.01, "l_rel": 1.0, "l_gain": 0.0,
            "bits_per_byte": axes["bits_per_byte"], "unigram_bits_per_byte": 3.0,
            "bpb_minus_unigram": axes["bits_per_byte"] - 3.0, "n_tokens": 1000, "n_bytes": 3000}


def _task(metrics: dict[str, float], baselines: dict[str, float]) -> dict[str, Any]:
    return {**metrics, "brier": 0.5, "n": 231, "baselines": dict(baselines)}


CLOZE = {"acc": 0.3, "exact_match": 0.3, "p_correct": 0.3, "logp_correct": -1.3}
CLOZE_BASE = {"acc": 0.25, "exact_match": 0.0, "p_correct": 0.25, "logp_correct": math.log(0.25)}


def record_from_rows(rows: list[dict[str, Any]], *, pin: str | None) -> LabRecordV3:
    """A valid lstar-lab/3 record whose race rows are `rows` (heldout and calib of each checkpoint)."""
    by_ck: dict[tuple[str, int, int], dict[str, dict[str, Any]]] = {}
    for r in rows:
        by_ck.setdefault((r["family"], r["seed"], r["step"]), {})[r["text"]] = r
    families = list(dict.fromkeys(r["family"] for r in rows))
    data, checkpoints = [], []
    for fam in families:
        for seed in sorted({s for f, s, _ in by_ck if f == fam}):
            order = hashlib.sha256(f"{fam}:{seed}".encode()).hexdigest()
            sample = f"{fam}-s{seed}-{order[:12]}"
            data.append({"family": fam, "seed": seed, "sample": sample, "spread": 2.0,
                         "weights": {"dictionary": 0.75, "documentation": 0.25},
                         "bytes_by_source": {"dictionary": 750, "documentation": 250},
                         "share_by_source": {"dictionary": 0.75, "documentation": 0.25}, "chunks": 4,
                         "stream_bytes": 1000, "order_sha256": order, "rule": "synthetic"})
            for (f, s, step), pair in by_ck.items():
                if (f, s) != (fam, seed):
                    continue
                h = pair["heldout"]
                checkpoints.append({
                    "family": fam, "size": "large", "seed": seed, "step": step, "bytes_seen": h["bytes_seen"],
                    "tokens_seen": h["tokens_seen"], "vocab_used": 900, "path": f"{fam}-large-s{seed}/step{step}",
                    "texts": {t: _text(pair[t]["axes"]) for t in ("heldout", "calib")},
                    "tasks": {"add-words": _task(h["metrics"]["add-words"], h["baselines"]["add-words"]),
                              "cloze": _task(CLOZE, CLOZE_BASE)},
                    "sample": sample})
    fam_rows = [{"family": f, "role": "primary", "tokenizer_fingerprint": f"fp-{f}", "lossless": True,
                 "round_trip": {"calib": {"documents": 216, "failing": 0}}, "reason": None,
                 "tokenizer_sha256": hashlib.sha256(f.encode()).hexdigest(), "provenance": None} for f in families]
    return LabRecordV3.model_validate({"schema": LAB_SCHEMA_V3, "config": {"version": 3},
                                       "preregistration_sha256": pin, "families": fam_rows, "data": data,
                                       "checkpoints": checkpoints})


@pytest.fixture(scope="module")
def full(prereg, tmp_path_factory) -> tuple[Path, list[dict[str, Any]]]:
    rows = _renamed(synthetic_v3_rows(families=20, seeds=3, steps=STEPS, seed=1), _names(prereg, 20))
    path = write_lab(record_from_rows(rows, pin=preregistration_sha256()), tmp_path_factory.mktemp("lab") / "lab.json")
    return path, rows


def _invoke(*args: str):
    return CliRunner().invoke(app, ["lab", "report", *args])


def test_report_json_of_a_v3_record(full, prereg, tmp_path):
    path, rows = full
    res = _invoke("--lab", str(path), "--json", "--resamples", str(RESAMPLES), "--out", str(tmp_path / "rep"))
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    for key in ("pilot_gate", "power", "primary", "negative_control"):
        assert key in out
    # the pilot: the six pre-registered families at seed 0, counted by hand from the rows
    gate = out["pilot_gate"]
    pilot_names = prereg["families"]["pilot_families"]
    assert gate["ran"] and gate["passed"]
    assert gate["pilot"]["present"] == pilot_names and gate["pilot"]["missing"] == []
    assert gate["pilot"]["from"] == "rows"
    assert gate["families"] == sorted(pilot_names)
    assert gate["n_rows"] == len(pilot_names) * STEPS
    by_hand = [r for r in rows if r["family"] in pilot_names and r["seed"] == 0]
    by_hand_gate = pilot_gate(by_hand, prereg)
    assert gate["axes"]["lstar"]["crossing_error"] == pytest.approx(by_hand_gate["axes"]["lstar"]["crossing_error"])
    # the power of 20 families x 3 seeds is the pre-registered design's
    assert out["power"]["families"] == 20 and out["power"]["seeds"] == 3
    assert out["power"]["by_effect"] == pytest.approx(prereg["power"]["design"]["conservative"]["20"])
    # the primary and the control: the same numbers as the analysis of the rows themselves,
    # without the record in between
    direct = analyse_v3(rows, prereg, pilot_rows=by_hand, resamples=RESAMPLES)
    assert out["primary"]["difference"] == pytest.approx(direct["primary"]["difference"])
    assert out["primary"]["p_value"] == pytest.approx(direct["primary"]["p_value"])
    assert out["primary"]["statement"] == direct["primary"]["statement"] == "L* transfers better than bits/byte"
    assert out["negative_control"]["ran"] and out["negative_control"]["failed_to_transfer"] is True
    assert out["negative_control"]["family_mean_crossing_error"] == pytest.approx(
        direct["negative_control"]["family_mean_crossing_error"])
    assert out["preregistration_sha256"] == preregistration_sha256()
    assert (tmp_path / "rep" / "lab-report.md").is_file()


def test_pilot_mode_on_a_pilot_only_record_gives_the_full_records_gate(full, prereg, tmp_path):
    path, rows = full
    pilot_only = [r for r in rows if r["family"] in prereg["families"]["pilot_families"] and r["seed"] == 0]
    small = write_lab(record_from_rows(pilot_only, pin=preregistration_sha256()), tmp_path / "pilot" / "lab.json")
    res = _invoke("--pilot", str(small.parent), "--json")
    assert res.exit_code == 0, res.output
    alone = json.loads(res.output)
    assert set(alone) == {"pilot_gate", "preregistration_sha256", "source"}
    res = _invoke("--pilot", str(path), "--json")
    assert res.exit_code == 0, res.output
    from_full = json.loads(res.output)
    assert alone["pilot_gate"]["passed"] and alone["pilot_gate"]["axes"] == from_full["pilot_gate"]["axes"]
    assert not (tmp_path / "pilot" / "report").exists()      # --pilot writes nothing


def test_pilot_mode_stops_without_skill_and_refuses_another_pin(prereg, tmp_path, capsys):
    from monitor.cli import main

    rows = _renamed(synthetic_v3_rows(families=6, seeds=1, steps=STEPS, skill=False, seed=4), _names(prereg, 6))
    path = write_lab(record_from_rows(rows, pin=preregistration_sha256()), tmp_path / "lab.json")
    res = _invoke("--pilot", str(path))
    assert res.exit_code == 1 and "pilot gate: stopped" in res.output
    other = write_lab(record_from_rows(rows, pin="e" * 64), tmp_path / "other" / "lab.json")
    assert main(["lab", "report", "--pilot", str(other)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "pins pre-registration sha256 eeee" in err


def test_a_record_without_the_pilot_families_has_no_gate(prereg, tmp_path):
    rows = synthetic_v3_rows(families=6, seeds=1, steps=STEPS, seed=2)          # families fam00..fam05
    path = write_lab(record_from_rows(rows, pin=preregistration_sha256()), tmp_path / "lab.json")
    res = _invoke("--pilot", str(path), "--json")
    assert res.exit_code == 1
    gate = json.loads(res.output)["pilot_gate"]
    assert not gate["ran"] and gate["pilot"]["present"] == [] and "seed 0" in gate["reason"]


def test_a_pilot_that_is_not_the_pre_registered_one_is_a_deviation(prereg, tmp_path):
    """The pilot is the six pre-registered families at seed 0: a record that lacks one of them,
    or a rows file whose pilot rows are other families, still gets its gate, with the
    difference listed among the design's deviations (and in the gate's own coverage)."""
    names = _names(prereg, 8)
    rows = _renamed(synthetic_v3_rows(families=8, seeds=1, steps=STEPS, seed=1), names)
    lacking = [r for r in rows if r["family"] != "starcoder2"]
    path = write_lab(record_from_rows(lacking, pin=preregistration_sha256()), tmp_path / "a" / "lab.json")
    out = json.loads(_invoke("--lab", str(path), "--json", "--resamples", "20", "--out", str(tmp_path / "ra")).output)
    assert out["pilot_gate"]["pilot"]["missing"] == ["starcoder2"]
    assert [d for d in out["design"]["deviations"] if "pilot" in d] == [
        "the pilot gate read 5 of the 6 pre-registered pilot families (missing: starcoder2)"]
    assert out["pilot_gate"]["pilot"]["deviations"] == [
        "the pilot gate read 5 of the 6 pre-registered pilot families (missing: starcoder2)"]
    rows_file = tmp_path / "rows.json"
    rows_file.write_text(json.dumps({"schema": "lstar-lab-rows/3", "preregistration_sha256": preregistration_sha256(),
                                     "rows": rows, "pilot_rows": synthetic_v3_rows(families=6, seeds=1, seed=5)}))
    out = json.loads(_invoke("--rows", str(rows_file), "--json", "--resamples", "20", "--out", str(tmp_path / "rb")).output)
    pilot_devs = [d for d in out["design"]["deviations"] if "pilot" in d]
    assert pilot_devs == ["the pilot gate read 0 of the 6 pre-registered pilot families (missing: "
                          + ", ".join(prereg["families"]["pilot_families"]) + ")",
                          "the pilot rows hold families outside the pre-registered pilot: "
                          + ", ".join(f"fam{i:02d}" for i in range(6))]
    full = json.loads(_invoke("--lab", str(write_lab(record_from_rows(rows, pin=preregistration_sha256()),
                                                      tmp_path / "c" / "lab.json")),
                              "--json", "--resamples", "20", "--out", str(tmp_path / "rc")).output)
    assert not [d for d in full["design"]["deviations"] if "pilot" in d]
