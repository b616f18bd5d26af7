"""`lstar score --corpus A,B,C`: several corpora with one load of the model, each recorded as
the single-corpus score would record it (monitor/scoring/engine.py score_corpora)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import monitor.scoring.engine as engine
from monitor.cli import main
from monitor.lab.tiny_models import build_tiny_model
from monitor.scoring.engine import ScoreRequest, score_checkpoint, score_corpora
from monitor.store import Store

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow  # a tiny model scored seven times: minutes on a loaded CPU


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory, shared_dir) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", shared_dir / "tokenizers" / "gpt2",
                            arch="llama", hidden=16, layers=1, heads=2, max_positions=64)


@pytest.fixture(scope="module")
def corpora(shared_dir) -> list[Path]:
    return [shared_dir / "corpus" / "calib-v0", REPO / "data" / "lab-pool-sample" / "heldout",
            shared_dir / "corpus" / "calib-v0-alt"]


def request_for(model: Path, corpus: Path) -> ScoreRequest:
    return ScoreRequest(model=str(model), corpus_dir=corpus, docs=1, max_context=32, device="cpu",
                        dtype="float32", with_tcb=False, n_boot=10, progress=False)


def counting_loader(monkeypatch) -> list[str]:
    loads: list[str] = []
    real = engine.load_checkpoint

    def load(ref, **kwargs):
        loads.append(ref)
        return real(ref, **kwargs)

    monkeypatch.setattr(engine, "load_checkpoint", load)
    return loads


def test_several_corpora_load_the_model_once_and_equal_single_scores(tiny_dir, corpora, monkeypatch) -> None:
    loads = counting_loader(monkeypatch)
    many = score_corpora(request_for(tiny_dir, corpora[0]), corpora, db_path=None)
    assert len(loads) == 1
    singles = [score_checkpoint(request_for(tiny_dir, c), db_path=None) for c in corpora]
    assert len(loads) == 1 + len(corpora)
    assert [r["corpus"]["sha256"] for r in many] == [r["corpus"]["sha256"] for r in singles]
    assert len({r["corpus"]["sha256"] for r in many}) == 3
    for a, b in zip(many, singles):
        for key in ("lstar", "ce", "ce_unigram", "n_tokens", "n_bytes"):
            assert a[key] == pytest.approx(b[key], abs=1e-9), key


def test_the_command_records_one_run_and_baseline_per_corpus(tiny_dir, corpora, tmp_path, monkeypatch,
                                                            capsys) -> None:
    loads = counting_loader(monkeypatch)
    db = tmp_path / "state.duckdb"
    code = main(["score", str(tiny_dir), "--corpus", ",".join(str(c) for c in corpora), "--docs", "1",
                 "--max-context", "32", "--device", "cpu", "--dtype", "float32", "--no-tcb", "--db", str(db),
                 "--json"])
    assert code == 0 and len(loads) == 1
    printed = json.loads(capsys.readouterr().out)
    assert [r["corpus"]["documents"] for r in printed] == [1, 1, 1]
    with Store.open(db) as store:
        runs = store.query("SELECT run_id, corpus_sha256, lstar FROM score_runs ORDER BY lstar")
        baselines = store.query("SELECT corpus_sha256 FROM baselines")
    assert sorted(r["run_id"] for r in runs) == sorted(r["run_id"] for r in printed)
    assert {r["corpus_sha256"] for r in baselines} == {r["corpus"]["sha256"] for r in printed}


def test_a_corpus_named_twice_is_refused(tiny_dir, corpora, capsys) -> None:
    code = main(["score", str(tiny_dir), "--corpus", f"{corpora[0]},{corpora[0]}", "--no-db"])
    assert code == 2 and "names a folder twice" in capsys.readouterr().err
