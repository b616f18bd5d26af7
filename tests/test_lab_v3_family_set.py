"""Lab v3's family set at the start of a run from a folder of families (`monitor.lab.family_set`):
a lossy family and a near-duplicate are dropped with their reasons, the Jaccard values recorded
are the boundary Jaccard counted by hand, the cut-off and minimum are the pre-registration's, a
chosen family that is not kept and a full race below the minimum are refused in one line, and the
record keeps the set. The reduced lab from such a folder (slow) is the third sitting of
`test_lab_v3_runner.py`'s end to end, where it reuses the lineages that test's first sitting
trained (the same tokenizer files, so the same lineage keys) instead of training them again."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from monitor.errors import LabError
from monitor.lab.family_set import FamilySetRule, check_run_families

REPO_ROOT = Path(__file__).resolve().parent.parent
SAMPLE_POOL = REPO_ROOT / "data" / "lab-pool-sample"
TEXTS = ["The cat sat on the mat.\nIt was 1234 degrees!", "naïve café — déjà vu; x = f(y) + 2",
         "  indented\ttabs and CAPS"]


def candidate_families(shared_dir: Path, folder: Path) -> Path:
    """Candidates under their pre-registered names, each a copy of every file of a folder of
    shared/tokenizers: gpt2 and smollm2 as they are, a byte-for-byte copy of gpt2 named
    gpt2-merges-8k (a near-duplicate), and the lossy bert-base-uncased (it lower-cases) named
    pool-bpe-1k. Whole folders, so a lineage of gpt2 or smollm2 raced from here has the key
    (`lineage_key_v3`: the tokenizer's files by content) of one raced from shared/tokenizers."""
    for source, name in (("gpt2", "gpt2"), ("smollm2", "smollm2"), ("gpt2", "gpt2-merges-8k"),
                         ("bert-base-uncased", "pool-bpe-1k")):
        shutil.copytree(shared_dir / "tokenizers" / source, folder / name)
    return folder


@pytest.fixture()
def families_dir(shared_dir: Path, tmp_path: Path) -> Path:
    return candidate_families(shared_dir, tmp_path / "families")


def _ends_by_hand(tokenizer_dir: Path, texts: list[str]) -> set[tuple[int, int]]:
    """Token ends as (text, byte offset), from the character offsets one token at a time."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    ends = set()
    for i, text in enumerate(texts):
        for _, end in tok.encode(text, add_special_tokens=False).offsets:
            if end > 0:
                ends.add((i, len(text[:end].encode("utf-8"))))
    return ends


def test_the_set_drops_a_lossy_family_and_a_near_duplicate(families_dir: Path) -> None:
    from monitor.lab.config import family_folders

    candidates = family_folders(families_dir)
    assert candidates == ("gpt2", "smollm2", "pool-bpe-1k", "gpt2-merges-8k")      # pre-registered order
    texts = {"train": TEXTS[:1], "heldout": TEXTS[1:2], "calib": TEXTS}
    result = check_run_families(candidates, lambda n: families_dir / n, texts, FamilySetRule(0.96, None, None))
    assert result["kept"] == result["raced"] == ["gpt2", "smollm2"]
    assert set(result["dropped"]) == {"pool-bpe-1k", "gpt2-merges-8k"}
    assert "lossy" in result["dropped"]["pool-bpe-1k"] and result["round_trip"]["failing"]["pool-bpe-1k"] > 0
    assert "1.000 with gpt2" in result["dropped"]["gpt2-merges-8k"]
    assert result["names"] == ["gpt2", "smollm2", "gpt2-merges-8k"]                # the lossless ones
    a, b = (_ends_by_hand(families_dir / n, TEXTS) for n in ("gpt2", "smollm2"))
    assert result["matrix"][0][1] == pytest.approx(len(a & b) / len(a | b), abs=1e-4)
    assert result["matrix"][0][1] < 0.96 and result["matrix"][0][2] == 1.0


def test_a_chosen_family_must_be_kept_and_a_full_race_needs_the_minimum(families_dir: Path) -> None:
    from monitor.lab.config import family_folders

    candidates = family_folders(families_dir)
    texts = {"train": TEXTS[:1], "heldout": TEXTS[1:2], "calib": TEXTS}
    with pytest.raises(LabError) as info:
        check_run_families(candidates, lambda n: families_dir / n, texts,
                           FamilySetRule(0.96, None, ("gpt2-merges-8k",)))
    assert "'gpt2-merges-8k' is not in the distinct set: boundary Jaccard 1.000 with gpt2" in info.value.one_line()
    chosen = check_run_families(candidates, lambda n: families_dir / n, texts, FamilySetRule(0.96, None, ("smollm2",)))
    assert chosen["raced"] == ["smollm2"] and chosen["kept"] == ["gpt2", "smollm2"]
    with pytest.raises(LabError) as info:
        check_run_families(candidates, lambda n: families_dir / n, texts, FamilySetRule(0.96, 3, None))
    line = info.value.one_line()
    assert "\n" not in line and "at least 3" in line
    assert "2 of 4 families kept at the pre-registered cut-off 0.96" in line


def test_the_rule_is_the_preregistrations() -> None:
    spec = json.loads((REPO_ROOT / "data" / "lab-v3-preregistration.json").read_text())["families"]
    full = FamilySetRule.preregistered(chosen=None, full_race=True)
    assert (full.cutoff, full.min_kept, full.chosen) == (spec["cutoff"], spec["min_kept"], None)
    pilot = FamilySetRule.preregistered(chosen=spec["pilot_families"], full_race=True)
    assert pilot.min_kept is None and pilot.chosen == tuple(spec["pilot_families"])
    assert FamilySetRule.preregistered(chosen=None, full_race=False).min_kept is None


def test_the_record_keeps_the_set_and_refuses_a_raced_family_that_was_dropped() -> None:
    from test_lab_v3_runner import _record

    from monitor.lab.records_v3 import parse_lab_v3

    raw = _record()                                 # families gpt2 and smollm2
    raw["family_set"] = {"cutoff": 0.96, "min_kept": None, "candidates": ["gpt2", "smollm2", "gpt2-merges-8k"],
                         "round_trip": {"excluded": []}, "names": ["gpt2", "smollm2", "gpt2-merges-8k"],
                         "matrix": [[1.0, 0.5, 1.0], [0.5, 1.0, 0.5], [1.0, 0.5, 1.0]], "kept": ["gpt2", "smollm2"],
                         "dropped": {"gpt2-merges-8k": "boundary Jaccard 1.000 with gpt2"},
                         "raced": ["gpt2", "smollm2"]}
    assert parse_lab_v3(raw).family_set.kept == ["gpt2", "smollm2"]
    raw["family_set"]["kept"] = ["gpt2"]
    with pytest.raises(LabError, match="raced families smollm2 are not kept"):
        parse_lab_v3(raw)
    raw["family_set"].update(kept=["gpt2"], raced=["gpt2"])
    with pytest.raises(LabError, match="'smollm2' is in the race but not in the family set"):
        parse_lab_v3(raw)
    raw["family_set"]["matrix"] = [[1.0]]
    with pytest.raises(LabError, match="matrix must be 3 x 3"):
        parse_lab_v3(raw)


def test_a_run_from_a_folder_refuses_a_full_race_below_the_minimum_before_training(
        families_dir: Path, shared_dir: Path, tmp_path: Path) -> None:
    from support.lab_calib import shared_with_small_calib

    from monitor.lab.config import race_v3_reduced_config
    from monitor.lab.race_v3 import run_race_v3

    assert (SAMPLE_POOL / "train" / "manifest.json").is_file(), "data/lab-pool-sample is committed: restore it"
    # every 20th calib-v0 document: the family set is checked on it before the refusal, and the
    # refusal depends only on how many families are kept
    shared_dir = shared_with_small_calib(shared_dir, tmp_path / "shared", every=20)
    config = race_v3_reduced_config(SAMPLE_POOL, shared_dir, families_dir=families_dir)
    with pytest.raises(LabError, match="2 of 4 families kept .* at least 20"):
        run_race_v3(config.with_(families=("gpt2", "smollm2", "pool-bpe-1k", "gpt2-merges-8k")), tmp_path / "lab",
                    workers=1, progress=False, family_set=FamilySetRule.preregistered(chosen=None, full_race=True))
    assert not any((tmp_path / "lab").glob("*-large-s*"))          # no lineage started


@pytest.mark.parametrize("file,size", [("tokenizer.json", (64 << 20) + 1), ("tokenizer_config.json", (1 << 20) + 1)])
def test_an_oversized_tokenizer_file_in_a_family_folder_is_refused_before_it_is_read(
        families_dir: Path, monkeypatch, file: str, size: int) -> None:
    """A hostile family folder (a sparse file the size of a disk, say) is refused in one line
    from its size alone: the tokenizer library, which would read all of it, is never called."""
    import monitor.scoring

    with open(families_dir / "smollm2" / file, "r+b" if (families_dir / "smollm2" / file).exists() else "wb") as f:
        f.truncate(size)     # sparse: no bytes written
    loaded = []
    real = monitor.scoring.load_tokenizer
    monkeypatch.setattr(monitor.scoring, "load_tokenizer", lambda p: loaded.append(p) or real(p))
    texts = {"train": TEXTS[:1], "heldout": TEXTS[1:2], "calib": TEXTS}
    with pytest.raises(LabError) as err:
        check_run_families(("gpt2", "smollm2"), lambda n: families_dir / n, texts, FamilySetRule(0.96, None, None))
    assert "\n" not in err.value.one_line() and f"smollm2/{file}" in err.value.message
    assert "larger than" in err.value.message and loaded == []


def test_a_family_file_that_is_not_a_regular_file_is_refused(families_dir: Path) -> None:
    import os

    target = families_dir / "smollm2" / "tokenizer.json"
    target.unlink()
    os.mkfifo(target)          # reading it would block for ever
    with pytest.raises(LabError) as err:
        check_run_families(("gpt2", "smollm2"), lambda n: families_dir / n, {"train": TEXTS, "heldout": TEXTS,
                                                                              "calib": TEXTS},
                           FamilySetRule(0.96, None, None))
    assert "smollm2/tokenizer.json" in err.value.message and "regular file" in err.value.message
