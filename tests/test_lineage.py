"""A Hub checkpoint's declared base (model card `base_model`, `base_model_relation`), read by the
gate from the fake Hub's `cardData`, pinned to the base's commit and stored with the checkpoint."""

from __future__ import annotations

import json

import pytest

from monitor.hub.client import HubClient, RetryPolicy
from monitor.hub.gate import gate_pending
from monitor.hub.lineage import MAX_BASES, declared_base
from monitor.hub.poll import poll_once
from monitor.hub.rules import WatchRule
from monitor.demo.fakehub import FakeHub
from monitor.demo.hub_repos import tiny_model_files
from monitor.store import Store

RULES = [WatchRule(name="all", author="org")]


def card(front_matter: str) -> bytes:
    return f"---\n{front_matter}\n---\n\n# a model\n".encode()


@pytest.fixture(autouse=True)
def hf_env(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))


@pytest.fixture(scope="module")
def model_files(tmp_path_factory):
    return tiny_model_files(build_dir=tmp_path_factory.mktemp("build"))


def test_declared_relations_and_hostile_card_values() -> None:
    files = {"config.json", "model.safetensors"}
    got = declared_base({"base_model": "org/base", "base_model_relation": "finetune"}, files, {})
    assert (got.base_repo, got.relation, got.relation_source, got.problems) == ("org/base", "finetune", "declared", ())
    got = declared_base({"base_model": "org/base"}, files | {"adapter_config.json"}, {})
    assert (got.relation, got.relation_source) == ("adapter", "inferred")
    got = declared_base({"base_model": "org/base"}, files, {"quantization_config": {"quant_method": "bitsandbytes"}})
    assert (got.relation, got.relation_source) == ("quantized", "inferred")
    got = declared_base({"base_model": ["org/a", "org/b"]}, files, {})
    assert got.relation == "merge" and got.base_repo is None and got.bases == ("org/a", "org/b")
    sha = "a" * 40
    assert declared_base({"base_model": f"org/base@{sha}"}, files, {}).pinned_sha == sha
    assert declared_base({"license": "mit"}, files, {}) is None
    # Hostile values are recorded as problems, never trusted.
    many = declared_base({"base_model": [f"org/m{i}" for i in range(MAX_BASES + 1)]}, files, {})
    assert many.bases == () and "more than" in many.problems[0]
    nested = declared_base({"base_model": {"x": 1}}, files, {})
    assert nested.bases == () and "not a repo id" in nested.problems[0]
    bad = declared_base({"base_model": "../../etc/passwd", "base_model_relation": "stolen"}, files, {})
    assert bad.bases == () and any("not a repo id" in p for p in bad.problems)
    odd = declared_base({"base_model": "org/base", "base_model_relation": "stolen"}, files, {})
    assert odd.relation == "finetune" and odd.relation_source == "inferred" and "stolen" in odd.problems[0]


def test_the_gate_records_each_derivative_linked_to_its_pinned_base(tmp_path, model_files) -> None:
    store = Store.open(tmp_path / "state.duckdb")
    with FakeHub() as hub:
        base_sha = hub.add_repo("org/base", model_files)
        hub.add_repo("org/ft", {**model_files, "README.md": card(
            "base_model: org/base\nbase_model_relation: finetune")})
        hub.add_repo("org/merged", {**model_files, "README.md": card("base_model: [org/base, org/other]")})
        hub.add_repo("org/orphan", {**model_files, "README.md": card("base_model: org/missing")})
        hub.add_repo("org/plain", model_files)
        client = HubClient(hub.url, token=False, store=store, policy=RetryPolicy(attempts=1))
        poll_once(store, client, RULES)
        outcomes = {o.repo: o for o in gate_pending(store, client, RULES, cache_dir=tmp_path / "hf" / "hub")}
        # A later push to the base does not move what the fine-tune was compared with.
        hub.add_commit("org/base", {"extra.txt": b"new"})
    assert all(o.status == "gated" for o in outcomes.values()), outcomes
    ft = store.checkpoint_base(outcomes["org/ft"].id)
    assert (ft["base_repo"], ft["base_sha"], ft["relation"], ft["relation_source"]) == \
        ("org/base", base_sha, "finetune", "declared")
    assert ft["base_checkpoint_id"] == outcomes["org/base"].id      # the base is a row of its own
    merged = store.checkpoint_base(outcomes["org/merged"].id)
    assert merged["relation"] == "merge" and merged["base_repo"] is None and merged["bases"] == ["org/base", "org/other"]
    orphan = store.checkpoint_base(outcomes["org/orphan"].id)
    assert orphan["base_sha"] is None and "could not be pinned" in orphan["problem"]
    assert orphan["base_checkpoint_id"] is None
    assert store.checkpoint_base(outcomes["org/plain"].id) is None
    assert store.checkpoint_base(outcomes["org/base"].id) is None
    derived = [d["repo"] for d in store.derivatives_of("org/base", base_sha)]
    assert derived == ["org/ft"]
    meta = store.get_checkpoint(outcomes["org/ft"].id).meta["gate"]["lineage"]
    assert json.loads(json.dumps(meta))["base_sha"] == base_sha
    store.close()


def test_the_fake_hubs_card_data_refuses_alias_bombs_and_answers_json() -> None:
    """A few hundred bytes of YAML aliases would expand to gigabytes of JSON in the model-info
    answer; a date scalar is not JSON. The fake Hub serves neither as the Hub would fail to."""
    from datetime import datetime, timezone

    from monitor.demo.fakehub_state import Commit

    def commit(readme: bytes) -> Commit:
        return Commit(sha="0" * 40, parent=None, title="t", date=datetime.now(timezone.utc), author="a",
                      files={"README.md": readme})

    levels = ["a: &a [" + ",".join(["x"] * 9) + "]"]
    for prev, name in zip("abcdefgh", "bcdefghi"):
        levels.append(f"{name}: &{name} [" + ",".join([f"*{prev}"] * 9) + "]")
    bomb = ("---\n" + "\n".join(levels) + "\n---\n").encode()
    assert len(bomb) < 1000 and commit(bomb).card_data() is None
    assert commit(card("base_model: org/x\nreleased: 2020-01-01")).card_data() == \
        {"base_model": "org/x", "released": "2020-01-01"}
