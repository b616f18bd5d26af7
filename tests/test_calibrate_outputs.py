"""What a campaign run may remove from its output folder: only the stale curves an earlier run
of the same campaign recorded writing, unchanged since; every other file stays, with the reason.
Removals never follow a link out of `curves/`."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from monitor.calibrate.manifest import (MANIFEST_NAME, CampaignId, output_problem, prepare_output, read_manifest,
                                        remove_stale, written_hashes)
from monitor.errors import CampaignError

ME = CampaignId("tiny-cloze", "/campaigns/tiny/campaign.yaml")
OTHER = CampaignId("tiny-cloze", "/campaigns/other/campaign.yaml")


def _write(out: Path, name: str, text: str) -> dict[str, str]:
    """Write curves/<name> as a run would, and return its manifest entry."""
    path = out / "curves" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return {f"curves/{name}": hashlib.sha256(text.encode()).hexdigest()}


def _run(out: Path, me: CampaignId, files: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """One run of campaign `me` that writes `files` (name → text): what it removed and kept."""
    written: dict[str, str] = {}
    for name, text in files.items():
        written.update(_write(out, name, text))
    assert written_hashes(out, sorted(files)) == written
    cleanup = remove_stale(out, me, written)
    return sorted(p.name for p in cleanup.removed), {p.name: why for p, why in cleanup.kept}


def test_a_run_removes_only_its_own_unchanged_stale_curves_and_says_why_it_keeps_the_rest(tmp_path: Path) -> None:
    out = tmp_path / "out"
    prepare_output(out)
    removed, kept = _run(out, ME, {"a.acc.json": "A", "b.acc.json": "B", "c.acc.json": "C"})
    assert (removed, kept) == ([], {})
    _write(out, "hand.acc.json", "fitted by hand")          # never written by a run
    (out / "curves" / "b.acc.json").write_text("B, edited")  # changed since the run wrote it
    (out / "curves" / "notes.txt").write_text("not a curve")
    removed, kept = _run(out, ME, {"a.acc.json": "A2"})
    assert removed == ["c.acc.json"]
    assert not (out / "curves" / "c.acc.json").exists()
    assert kept == {"b.acc.json": "changed since this campaign wrote it",
                    "hand.acc.json": f"not written by {ME.describe()} (not in its record {MANIFEST_NAME})"}
    assert (out / "curves" / "hand.acc.json").read_text() == "fitted by hand"
    assert (out / "curves" / "b.acc.json").read_text() == "B, edited"
    assert (out / "curves" / "notes.txt").exists()
    # The record now lists exactly this run's files: the edited one is no longer the campaign's.
    entries, problem = read_manifest(out)
    assert problem is None
    assert entries == [{"campaign": ME.name, "file": ME.file,
                        "files": {"curves/a.acc.json": hashlib.sha256(b"A2").hexdigest()}}]
    removed, kept = _run(out, ME, {"a.acc.json": "A2"})
    assert removed == [] and set(kept) == {"b.acc.json", "hand.acc.json"}


def test_another_campaign_in_the_same_folder_never_removes_the_first_ones_curves(tmp_path: Path) -> None:
    out = tmp_path / "out"
    prepare_output(out)
    _run(out, ME, {"mine.acc.json": "M", "shared.acc.json": "S"})
    removed, kept = _run(out, OTHER, {"theirs.acc.json": "T", "shared.acc.json": "S"})
    assert removed == [] and kept == {"mine.acc.json": f"written by {ME.describe()}, not by this campaign"}
    # The first campaign drops both curves: its own goes; the one the other also wrote stays.
    removed, kept = _run(out, ME, {})
    assert removed == ["mine.acc.json"]
    assert kept == {"shared.acc.json": f"also written by {OTHER.describe()}",
                    "theirs.acc.json": f"written by {OTHER.describe()}, not by this campaign"}
    assert {e["file"] for e in read_manifest(out)[0]} == {ME.file, OTHER.file}


def test_an_unreadable_record_removes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "out"
    prepare_output(out)
    _run(out, ME, {"a.acc.json": "A"})
    (out / MANIFEST_NAME).write_text("{not json")
    removed, kept = _run(out, ME, {})
    assert removed == [] and kept["a.acc.json"].startswith("the record of written files is unreadable")
    assert (out / "curves" / "a.acc.json").exists()


def test_a_link_in_curves_is_never_followed(tmp_path: Path) -> None:
    """A recorded curve swapped for a link to another file: the link is kept, its target untouched."""
    out = tmp_path / "out"
    prepare_output(out)
    _run(out, ME, {"a.acc.json": "A"})
    target = tmp_path / "elsewhere.json"
    target.write_text("A")   # the very bytes recorded
    (out / "curves" / "a.acc.json").unlink()
    (out / "curves" / "a.acc.json").symlink_to(target)
    removed, kept = _run(out, ME, {})
    assert removed == [] and kept == {"a.acc.json": "not a regular file"}
    assert target.read_text() == "A"


@pytest.mark.parametrize("what", ["curves", MANIFEST_NAME, "tmp", "calibrate.duckdb", "validation.json"])
def test_a_linked_curves_folder_record_or_other_output_is_refused(what: str, tmp_path: Path) -> None:
    """Nothing the run writes in the output folder may be a link: a write would follow it."""
    out = tmp_path / "out"
    out.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "policy.acc.json").write_text("{}")
    (out / what).symlink_to(elsewhere if what in ("curves", "tmp") else elsewhere / "policy.acc.json")
    problem = output_problem(out)
    assert problem is not None and problem.startswith(f"{out / what} is a symbolic link (to {elsewhere}")
    with pytest.raises(CampaignError, match="symbolic link"):
        prepare_output(out)
    assert sorted(os.listdir(elsewhere)) == ["policy.acc.json"]
    assert (elsewhere / "policy.acc.json").read_text() == "{}"


def test_an_output_folder_swapped_for_a_link_after_loading_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "out"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out.symlink_to(elsewhere)   # `out` was checked (and resolved) before this
    with pytest.raises(CampaignError, match=f"now leads to {elsewhere}"):
        prepare_output(out)
    assert os.listdir(elsewhere) == []


def test_the_record_is_json_with_each_files_sha256(tmp_path: Path) -> None:
    out = tmp_path / "out"
    prepare_output(out)
    _run(out, ME, {"a.acc.json": "A"})
    data = json.loads((out / MANIFEST_NAME).read_text())
    assert data["schema"] == "lstar-calibrate-manifest/1"
    assert data["campaigns"][0]["files"] == {"curves/a.acc.json": hashlib.sha256(b"A").hexdigest()}
    assert [p.name for p in out.iterdir() if p.name.startswith(".")] == []   # no temporary file left
