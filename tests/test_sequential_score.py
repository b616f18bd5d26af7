"""A sequential score of a tiny model: it stops early, is recorded partial, and a later full
score continues it to the full score's numbers."""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from monitor.alerts.predict import predict_task
from monitor.alerts.sequential_plan import task_entry
from monitor.cli import app
from monitor.lab.tiny_models import build_tiny_model
from monitor.policy import Task
from monitor.scoring import ScoreRequest, score_checkpoint
from monitor.scoring.engine import corpus_selection
from monitor.scoring.sequential_run import sequential_plan
from monitor.store import Store
from support.sequential import synthetic_curve, write_policy

NUMBERS = ("ce", "ce_unigram", "lstar", "l_rel", "l_gain", "bits_per_byte", "tokens_per_byte", "se_ce",
           "nll_sum")


@pytest.fixture(scope="module")
def setup(tmp_path_factory, shared_dir):
    root = tmp_path_factory.mktemp("seq")
    model = build_tiny_model(root / "model", shared_dir / "tokenizers" / "spm-unigram-toy", seed=1,
                             max_positions=128)
    request = ScoreRequest(model=str(model), corpus_dir=shared_dir / "corpus" / "calib-v0", every=3,
                           max_context=64, disjoint=True, dtype="float32", device="cpu", with_tcb=False,
                           progress=False, n_boot=200, batch_size=32)
    full = score_checkpoint(request, db_path=root / "full.duckdb")
    sha = corpus_selection(request).sha256
    # a task far from this model's L*: its state is settled after the minimum of blocks
    curve = synthetic_curve(root / "curves" / "far.json", midpoint=full["lstar"] - 3.0, corpus_sha256=sha)
    return {"root": root, "request": request, "full": full, "curve": root / "curves" / "far.json",
            "curve_obj": curve}


def _numbers(result):
    return {k: result[k] for k in NUMBERS} | {"n_tokens": result["n_tokens"],
                                             "slices": {s: {k: v[k] for k in ("ce", "lstar", "se_ce", "n_tokens")}
                                                        for s, v in result["slices"].items()}}


@pytest.mark.slow
def test_partial_then_full_gives_the_full_scores_numbers(setup):
    from dataclasses import replace

    root, full = setup["root"], setup["full"]
    db = root / "resume.duckdb"
    plan = sequential_plan([task_entry("p", "far", setup["curve_obj"])], block_documents=6)
    partial = score_checkpoint(replace(setup["request"], sequential=plan), db_path=db)
    seq = partial["sequential"]
    assert partial["partial"] is True and seq["reason"] == "settled"
    assert seq["tasks"] == [{"task": "p/far", "state": "clear", "settled_at_look": seq["looks"]}]
    assert seq["documents_scored"] < seq["documents_total"] == full["corpus"]["documents"]
    assert seq["tokens_total"] == full["n_tokens"] and seq["tokens_scored"] == partial["n_tokens"]
    # the estimate of the whole selection's CE is close to the full score's
    assert abs(partial["ce"] - full["ce"]) < 5 * seq["se_estimator"]
    assert partial["ce_unigram"] == full["ce_unigram"]     # CE_uni of the whole selection

    resumed = score_checkpoint(setup["request"], db_path=db)
    rec = resumed["sequential"]
    assert resumed["partial"] is False and rec["resumed_from"] == partial["run_id"]
    assert rec["documents_resumed"] == seq["documents_scored"]
    # only the documents the partial run had not scored were scored now
    assert rec["tokens_scored_now"] == full["n_tokens"] - partial["n_tokens"]
    ours, theirs = _numbers(resumed), _numbers(full)
    for key in NUMBERS:
        assert math.isclose(ours[key], theirs[key], rel_tol=1e-12, abs_tol=1e-12), key
    assert ours["n_tokens"] == theirs["n_tokens"]
    for name, part in theirs["slices"].items():
        for key, value in part.items():
            assert math.isclose(ours["slices"][name][key], value, rel_tol=1e-12, abs_tol=1e-12), (name, key)
    with Store.open(db) as store:
        runs = {r.run_id: r for r in store.score_runs()}
        assert runs[partial["run_id"]].partial and not runs[resumed["run_id"]].partial
        assert len(store.score_documents(resumed["run_id"])) == full["corpus"]["documents"]
        # curves are fitted on complete scores only, unless asked
        repo, sha = full["model"]["repo"], full["model"]["sha"]
        assert [r.run_id for r in store.score_runs_for_checkpoint(repo, sha)] == [resumed["run_id"]]
        assert len(store.score_runs_for_checkpoint(repo, sha, include_partial=True)) == 2


@pytest.mark.slow
def test_until_settled_cli_prints_states_tokens_and_reason(setup, tmp_path):
    # performance crosses the threshold b + ε = 0.30 at midpoint + 2.4·width: at this L*
    near = synthetic_curve(tmp_path / "near.json", midpoint=setup["full"]["lstar"] - 0.12, width=0.05,
                           corpus_sha256=setup["curve_obj"].corpus_sha256)
    assert near is not None
    policies = tmp_path / "policies"
    policies.mkdir()
    write_policy(policies, {"far": setup["curve"], "near": tmp_path / "near.json"})
    req = setup["request"]
    result = CliRunner().invoke(app, [
        "score", req.model, "--corpus", str(req.corpus_dir), "--every", "3", "--max-context", "64", "--disjoint",
        "--dtype", "float32", "--device", "cpu", "--no-tcb", "--until-settled", str(policies),
        "--block-docs", "6", "--db", str(tmp_path / "cli.duckdb"), "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    full = setup["full"]
    assert out["tokens_total"] == full["n_tokens"]
    assert set(out["states"]) == {"seq/far", "seq/near"}
    assert out["states"]["seq/far"] == "clear"
    # each state is the one the full score gives (predict_task at the full score's L* and SE)
    for name, curve in (("far", setup["curve_obj"]), ("near", near)):
        expected = predict_task(curve, Task(name=name, curve="x"), lstar=full["lstar"], se=full["se_ce"])
        assert out["states"][f"seq/{name}"] == expected.state, (name, out)
    assert out["stopping_reason"] in ("settled", "exhausted")
    assert out["partial"] == (out["stopping_reason"] == "settled") == (out["tokens_scored"] < full["n_tokens"])
    assert out["documents_scored"] % 6 == 0 or out["documents_scored"] == out["documents_total"]
    assert out["bound"].startswith("normal-union") and out["delta"] == pytest.approx(1 - near.confidence)
