"""Hostile inputs to the stress tests: option values, stored documents, register pin files and
task files that the stress code must refuse in one clear line (or bound) rather than crash on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from monitor.curves.evaluator import McItem
from monitor.errors import CorpusError, SpecError, StoreError
from monitor.scoring.register_build import build_registers, load_register_pins
from monitor.store import Store
from monitor.stress.limits import flags_for
from monitor.stress.runner import run_stress
from monitor.stress.storage import save_stress_report
from monitor.stress.subject import SCHEMA, StressCheckpoint, StressOptions, StressSubject
from monitor.stress.task_format import FORMATS

MISSING_MODEL = StressCheckpoint(ref="/nonexistent/model-folder", label="m0")


def _subject(tmp_path: Path) -> StressSubject:
    return StressSubject(kind="model", name="m", checkpoints=(MISSING_MODEL,), corpus=tmp_path / "corpus")


# -- checked before anything is loaded or scored ---------------------------------------------
def test_a_test_without_its_inputs_is_refused_before_any_scoring(tmp_path) -> None:
    # the registers test needs register corpora; saying so after an hour of tokenization
    # scoring (or, here, after failing to load the model) is too late
    with pytest.raises(SpecError, match="register"):
        run_stress(_subject(tmp_path), StressOptions(), ["tokenization", "registers"])
    with pytest.raises(SpecError, match="task file"):
        run_stress(_subject(tmp_path), StressOptions(), ["tokenization", "task_format"])


@pytest.mark.parametrize("options, words", [
    (StressOptions(dropout_rates=(1.5,)), "dropout"),
    (StressOptions(dropout_rates=(float("nan"),)), "dropout"),
    (StressOptions(dropout_rates=(-0.1,)), "dropout"),
    (StressOptions(extra={"prune_fraction": 0.0}), "prune"),
    (StressOptions(extra={"prune_fraction": 1.5}), "prune"),
])
def test_out_of_range_perturbations_are_refused_not_skipped(tmp_path, options, words) -> None:
    # before: a bad rate raised TokenizerError inside the test, which noted "BPE perturbations
    # skipped" and silently dropped the pruned vocabulary as well
    with pytest.raises(SpecError, match=words):
        run_stress(_subject(tmp_path), options, ["tokenization"])


# -- stored documents --------------------------------------------------------------------------
def _doc(**sections) -> dict:
    return {"schema": SCHEMA, "subject": {"kind": "model", "name": "m", "curve_id": "c" * 64},
            "sections": sections}


def test_a_document_with_non_string_section_names_is_a_store_error(tmp_path) -> None:
    with Store.open(tmp_path / "s.duckdb") as store:
        with pytest.raises(StoreError, match="unknown sections"):
            save_stress_report(store, _doc(**{"registers": {}}) | {"sections": {1: {}, "x": {}}})


def test_flag_messages_bound_the_names_a_document_carries() -> None:
    huge = "r" * 100_000
    document = _doc(
        registers={"curves": [{"curve_id": "c" * 64, "register": huge, "threshold_shift_lstar": 1.0,
                               "threshold_interval_width": 0.1}]},
        task_format={"tasks": [{"task": huge, "instability": 0.4, "accuracy_upper_bound": 0.6}]},
        tokenization={"fits": [{"variant": huge, "alpha": 2.0, "residual_variance": 1.0}]})
    flags = flags_for(document, "c" * 64)
    assert len(flags) == 4
    assert all(len(f.message) < 400 for f in flags)


# -- register pin files ------------------------------------------------------------------------
def _pins(tmp_path: Path, **changes) -> Path:
    data = {"schema": "lstar-register/1", "register": "code", "name": "register-code", "version": "v1",
            "packages": [{"package": "libpython3.11-stdlib", "version": "3.11.2-6+deb12u9", "deb_sha256": "0" * 64}],
            "sample": {"documents": 300}, "corpus": {"sha256": "1" * 64}}
    data.update(changes)
    path = tmp_path / "pins.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


@pytest.mark.parametrize("name", ["../../escaped", "/tmp/absolute", "a/b", "..", "", 7, None])
def test_a_pin_name_that_is_not_one_folder_name_is_refused(tmp_path, name) -> None:
    with pytest.raises(CorpusError, match="name"):
        load_register_pins(_pins(tmp_path, name=name))
    # build_registers joins the name onto OUT: nothing may be created outside it
    with pytest.raises(CorpusError):
        build_registers(tmp_path / "out", [_pins(tmp_path, name=name)], cache=tmp_path / "debs", exclude=[])
    assert not (tmp_path / "escaped").exists()


@pytest.mark.parametrize("changes", [
    {"version": 3}, {"sample": {"documents": "all"}}, {"sample": {"documents": 0}}, {"sample": "300"},
    {"corpus": "abc"}, {"corpus": {"sha256": 12}},
])
def test_pin_fields_of_the_wrong_type_are_refused(tmp_path, changes) -> None:
    with pytest.raises(CorpusError, match="register pins"):
        load_register_pins(_pins(tmp_path, **changes))


def test_a_huge_pin_file_is_refused_without_reading_it_all(tmp_path) -> None:
    path = tmp_path / "huge.json"
    with path.open("w", encoding="utf-8") as f:
        f.write('{"schema": "lstar-register/1", "pad": "')
        f.write("x" * (9 << 20))
        f.write('"}')
    with pytest.raises(CorpusError, match="bytes"):
        load_register_pins(path)


def test_the_committed_pins_still_load() -> None:
    from monitor.scoring.register_build import REGISTER_PINS_DIR

    pins = sorted(REGISTER_PINS_DIR.glob("*.json"))
    assert pins and all(load_register_pins(p)["register"] in ("code", "technical", "dictionary") for p in pins)


# -- task files --------------------------------------------------------------------------------
def test_label_formats_keep_every_option_of_a_long_item() -> None:
    # 30 options: the letter labels run out at Z; before, zip() dropped options 27..30 and the
    # answer (index 29) pointed past the scored choices
    item = McItem("i0", "Pick one.", tuple(f"option {i}" for i in range(30)), 29, None)
    for surface in FORMATS:
        encoded = surface.encode(item)
        assert len(encoded.choices) == 30, surface.name
        assert len(set(encoded.choices)) == 30, surface.name     # each scored label is distinct
        assert encoded.answer == 29


def test_letter_labels_run_past_z_like_spreadsheet_columns() -> None:
    from monitor.stress.task_format import letter_label

    assert [letter_label(i) for i in (0, 25, 26, 27, 51, 52, 701, 702)] == \
        ["A", "Z", "AA", "AB", "AZ", "BA", "ZZ", "AAA"]


def test_a_hostile_register_json_falls_back_to_the_corpus_name(tmp_path) -> None:
    from monitor.stress.registers import register_name

    src = Path(__file__).resolve().parents[1] / "data" / "lab-pool-sample" / "heldout"
    folder = tmp_path / "reg"
    folder.mkdir()
    for f in src.iterdir():
        (folder / f.name).write_bytes(f.read_bytes())
    expected = register_name(folder)[0]          # no register.json: the corpus name and version
    for content in ('{"register": "' + "x" * 10_000 + '"}', '{"register": "code\\n> injected"}',
                    '{"register": ["code"]}', "{" * 100_000):
        (folder / "register.json").write_text(content, encoding="utf-8")
        assert register_name(folder)[0] == expected
    (folder / "register.json").write_text('{"register": "code"}', encoding="utf-8")
    assert register_name(folder)[0] == "code"
    (folder / "register.json").unlink()
    with (folder / "register.json").open("w") as f:      # over the bound: not read whole
        f.write('{"register": "code", "pad": "' + "x" * (9 << 20) + '"}')
    assert register_name(folder)[0] == expected


def test_a_newer_result_that_did_not_measure_a_curve_does_not_clear_its_flag(tmp_path) -> None:
    from monitor.stress.storage import stress_flags_for_curve

    curve = "e" * 64
    flagged = _doc(registers={"curves": [{"curve_id": curve, "register": "code", "threshold_shift_lstar": 0.5,
                                          "threshold_interval_width": 0.1}]},
                   task_format={"tasks": [{"task": "t", "instability": 0.3}]})
    flagged["subject"]["curve_id"] = curve
    # a later run on the same subject curve, with no curve file (registers: no refit, `curves`
    # empty) and one checkpoint (task_format: instability None): it measured nothing about the
    # curve's threshold shift or format instability, so the stored flags stand
    unmeasured = _doc(registers={"curves": [], "notes": ["no curve file given"]},
                      task_format={"tasks": [{"task": "t", "instability": None}]})
    unmeasured["subject"]["curve_id"] = curve
    # a later run that did measure them within the limits clears them
    within = _doc(registers={"curves": [{"curve_id": curve, "register": "code", "threshold_shift_lstar": 0.01,
                                         "threshold_interval_width": 0.1}]},
                  task_format={"tasks": [{"task": "t", "instability": 0.02}]})
    within["subject"]["curve_id"] = curve
    with Store.open(tmp_path / "s.duckdb") as store:
        save_stress_report(store, flagged)
        save_stress_report(store, unmeasured)
        assert sorted(f.limit for f in stress_flags_for_curve(store, curve)) == \
            ["format_instability", "register_threshold_shift"]
        save_stress_report(store, within)
        assert stress_flags_for_curve(store, curve) == []


def test_two_checkpoints_with_one_label_are_refused(tmp_path) -> None:
    # results are keyed by label ({label: {register: L*}}): a second checkpoint of the same
    # label silently overwrote the first
    twin = StressSubject(kind="model", name="m", corpus=tmp_path / "corpus",
                         checkpoints=(MISSING_MODEL, StressCheckpoint(ref="/elsewhere/m0", label="m0")))
    with pytest.raises(SpecError, match="m0"):
        run_stress(twin, StressOptions(), ["tokenization"])


def test_model_folders_of_one_name_get_distinct_labels(tmp_path) -> None:
    from monitor.commands.stress import model_checkpoints

    for parent in ("a", "b"):
        (tmp_path / parent / "final").mkdir(parents=True)
    labels = [c.label for c in model_checkpoints([str(tmp_path / "a" / "final"), str(tmp_path / "b" / "final"),
                                                  "org/name@main"], None)]
    assert len(set(labels)) == 3 and labels[2] == "org/name@main"
    assert [c.label for c in model_checkpoints([str(tmp_path / "a" / "final")], None)] == ["final"]


def test_steps_match_by_number(tmp_path) -> None:
    from monitor.commands.stress import lineage_checkpoints

    for name in ("step010", "step200"):
        (tmp_path / name).mkdir()
    assert [c.label for c in lineage_checkpoints(tmp_path, None, "10")] == ["step010"]
    assert [c.label for c in lineage_checkpoints(tmp_path, None, "step0200")] == ["step200"]
    with pytest.raises(SpecError, match="no step"):
        lineage_checkpoints(tmp_path, None, "x1")


@pytest.mark.parametrize("extra", [{"task_format_every": 0}, {"task_format_every": -2},
                                   {"task_format_items": 0}, {"task_format_items": -1},
                                   {"task_format_every": "x"}])
def test_task_item_selection_out_of_range_is_a_label_error(tmp_path, extra) -> None:
    from monitor.errors import LabelError
    from monitor.stress.task_format import format_stress

    task = tmp_path / "task.jsonl"
    task.write_text(json.dumps({"id": "q", "context": "The cat", "choices": [" a", " b"], "answer": 0}) + "\n",
                    encoding="utf-8")
    loads = []
    with pytest.raises(LabelError, match="task_format_(every|items)"):
        format_stress(_subject(tmp_path), StressOptions(task_file=task, extra={
            **extra, "task_format_loader": lambda *a: loads.append(a)}))
    assert loads == []      # refused before any model is loaded


def test_curves_show_lists_the_stress_flags_of_the_curve(tmp_path, capsys) -> None:
    # the issue puts the stress result beside the curve in `curves show`, as in policy check,
    # alert caveats and the report: the same flags, from the same stored documents
    from monitor.cli import main
    from monitor.curves.artifact import save_curve
    from monitor.curves.fit import fit_curve
    from monitor.curves.labels import Label
    from monitor.stress.storage import stress_flags_for_curve

    labels = [Label(checkpoint=f"s{i}", value=v, task="t", metric="acc", lstar=x)
              for i, (v, x) in enumerate(zip([0.25, 0.3, 0.5, 0.7, 0.75], [4.0, 3.5, 3.0, 2.6, 2.4]))]
    curve = fit_curve(labels, task="t", metric="acc", baseline=0.25, margin=0.2, resamples=50, seed=0, lofo=False)
    path = save_curve(curve, tmp_path / "curve.json")
    document = _doc(task_format={"tasks": [{"task": "cloze\n> injected", "instability": 0.3}]})
    document["subject"]["curve_id"] = curve.curve_id
    db = tmp_path / "s.duckdb"
    with Store.open(db) as store:
        save_stress_report(store, document)
        expected = [f.message for f in stress_flags_for_curve(store, curve.curve_id)]
    assert len(expected) == 1
    assert main(["curves", "show", str(path), "--db", str(db), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)["stress_flags"]
    assert [f["message"] for f in shown] == expected and shown[0]["limit"] == "format_instability"
    assert main(["curves", "show", str(path), "--db", str(db)]) == 0
    out = capsys.readouterr().out
    assert "format_instability" in out and "cloze\\n> injected" in out     # the line break shown, not made
    # no database: nothing to say, no error
    assert main(["curves", "show", str(path), "--db", str(tmp_path / "none.duckdb"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["stress_flags"] == []


def test_flags_read_only_the_documents_they_need(tmp_path, monkeypatch) -> None:
    # every prediction of a curve reads its flags: the newest document that measured each test
    # decides, so older documents (up to 16 MB each) must not all be decoded every time
    from monitor.stress.storage import stress_flags_for_curve

    curve = "f" * 64
    with Store.open(tmp_path / "s.duckdb") as store:
        for k in range(12):
            document = _doc(task_format={"tasks": [{"task": f"t{k}", "instability": 0.3}]},
                            tokenization={"fits": [{"variant": "v", "alpha": 1.5}]},
                            registers={"curves": [{"curve_id": curve, "register": "code",
                                                   "threshold_shift_lstar": 1.0, "threshold_interval_width": 0.1}]})
            document["subject"]["curve_id"] = curve
            save_stress_report(store, document)
        decoded = []
        real = json.loads
        monkeypatch.setattr(json, "loads", lambda text, *a, **k: (decoded.append(len(text)), real(text, *a, **k))[1])
        flags = stress_flags_for_curve(store, curve)
        assert sorted(f.limit for f in flags) == ["format_instability", "register_threshold_shift",
                                                  "tokenization_alpha"]
        assert {f.message for f in flags if f.limit == "format_instability"} == \
            {"stress: task t11 has format instability 0.300 > 0.10"}     # the newest
        assert sum(1 for n in decoded if n > 200) == 1                    # one document decoded, not twelve


def test_kendall_with_fewer_than_two_checkpoints_is_undefined_not_a_crash() -> None:
    import numpy as np

    from monitor.stress.registers import kendall_with_interval

    for n in (0, 1):
        out = kendall_with_interval(np.arange(n, dtype=float), np.arange(n, dtype=float), n_boot=50, seed=0)
        assert out == {"tau": None, "low": None, "high": None, "resamples_used": 0}


def test_a_given_lstar_table_missing_a_register_is_a_spec_error(tmp_path) -> None:
    from monitor.stress.registers import register_stress

    src = Path(__file__).resolve().parents[1] / "data" / "lab-pool-sample"
    folders = []
    for reg, sub in (("code", "heldout"), ("dictionary", "tasks")):
        folder = tmp_path / reg
        folder.mkdir()
        for f in (src / sub).iterdir():
            (folder / f.name).write_bytes(f.read_bytes())
        (folder / "register.json").write_text(json.dumps({"register": reg}), encoding="utf-8")
        folders.append(folder)
    subject = StressSubject(kind="lab", name="x", corpus=folders[0], checkpoints=(
        StressCheckpoint(ref="/nowhere/a", label="a"), StressCheckpoint(ref="/nowhere/b", label="b")))
    table = {"a": {"code": 1.0, "dictionary": 2.0}, "b": {"code": 1.5}}
    with pytest.raises(SpecError, match="b.*dictionary"):
        register_stress(subject, StressOptions(register_corpora=(folders[1],), extra={"lstar": table}))


def test_the_summary_table_shows_control_characters_in_names(capsys) -> None:
    # checkpoint labels are folder names and notes quote them: an ANSI escape or a line break
    # in one must not restyle the terminal or forge a line of its own
    from monitor.commands.stress import print_summary

    document = {"sections": {"tokenization": {
        "checkpoints": [{"label": "step1\x1b[2J\nFAKE LINE", "variants": [
            {"name": "base", "ce": 3.0, "ce_uni": 5.0, "lstar": -2.0}]}],
        "fits": [], "notes": ["note\rover"]}, "registers": {}}}
    print_summary(document)
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\r" not in out and "\\x1b[2J" in out
    assert not any(line.startswith("FAKE LINE") for line in out.splitlines())
