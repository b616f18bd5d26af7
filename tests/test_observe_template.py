"""An evaluation run here is forked from what the scoring pool gives when it runs
(`monitor.jobs.observe._evaluate`): the pool's template; a fault of the pool costs no attempt
(the evaluation starts a child of its own); the shutdown's interruption passes through, so the
attempt is given back (tests/test_warm_workers.py covers the pool's side)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

import monitor.curves.eval_child as eval_child
import monitor.jobs.observe as observe
from monitor.scoring.child import ScoringInterrupted


class Handed(Exception):
    """Raised by the stand-in evaluation child once it has seen what it was handed."""


def evaluate_with(template, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list:
    seen: list = []

    def child(spec, **kwargs):
        seen.append(kwargs["template"])
        raise Handed

    monkeypatch.setattr(eval_child, "run_evaluation_child", child)
    monkeypatch.setattr(observe, "materialize_snapshot", lambda snapshot, dest: dest)
    job = {"settings": {"kind": "cloze", "metric": "acc"}}
    with pytest.raises(Handed):
        observe._evaluate(job, {"repo": "org/m"}, tmp_path / "snapshot", {}, None, tmp_path / "work",
                          state_dir=tmp_path, timeout_s=60, memory_bytes=None, device="cpu", dtype="float32",
                          ray=None, template=template)
    return seen


def test_the_evaluation_is_forked_from_what_the_pool_gives_when_it_runs(tmp_path, monkeypatch):
    asked: list[str] = []

    def give() -> str:
        asked.append("now")
        return "the pool's template"

    assert evaluate_with(give, tmp_path, monkeypatch) == ["the pool's template"] and asked == ["now"]
    assert evaluate_with(None, tmp_path, monkeypatch) == [None]   # Ray, or no warm pool


def test_a_pool_that_fails_to_give_a_template_costs_no_attempt(tmp_path, monkeypatch, caplog):
    def give():
        raise RuntimeError("can't start new thread")

    with caplog.at_level(logging.WARNING, logger="lstar.observe"):
        assert evaluate_with(give, tmp_path, monkeypatch) == [None]
    assert "RuntimeError: can't start new thread" in caplog.text and "a child of its own" in caplog.text


def test_the_shutdowns_interruption_while_the_pool_starts_passes_through(tmp_path, monkeypatch):
    def give():
        raise ScoringInterrupted("the shutdown stopped the evaluation")

    with pytest.raises(ScoringInterrupted):
        evaluate_with(give, tmp_path, monkeypatch)


def test_the_observe_job_asks_the_warm_pool_and_not_ray(monkeypatch):
    class Pool:
        def evaluation_template(self):
            return "template"

    class Config:
        scoring_backend = "local"

    class Ctx:
        config = Config()

        def scoring_backend(self):
            return Pool()

    give = observe._evaluation_template(Ctx())
    assert give() == "template"
    Ctx.config.scoring_backend = "ray"
    assert observe._evaluation_template(Ctx()) is None
