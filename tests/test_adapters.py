"""LoRA adapters on the Hub: gated against their pinned base before any weight byte, fetched
with it, merged in the scoring child with peft, scored; hostile adapters refused first."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors

from monitor.hub.client import HubClient, RetryPolicy
from monitor.hub.gate import gate_pending
from monitor.hub.poll import poll_once
from monitor.hub.rules import WatchRule
from monitor.demo.fakehub import FakeHub
from monitor.demo.hub_repos import lora_adapter_files, tiny_model_files
from monitor.scoring import ScoreRequest
from monitor.scoring.loader import load_checkpoint
from monitor.scoring.scoring_driver import score_in_process, score_queue
from monitor.store import Store

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
RULES = [WatchRule(name="all", author="org")]
RANK, ALPHA = 4, 8


@pytest.fixture(autouse=True)
def hf_env(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))


@pytest.fixture(scope="module")
def base_files(tmp_path_factory):
    # Adapters are checked against their base's weights, not its vocabulary: the 1,000-id toy
    # tokenizer spares each score (two of them in scoring children) most of gpt-neox's
    # 50,277-id output layer (the file went from 25.8 to 21.5 CPU-seconds, measured alone, 2026-11-30).
    return tiny_model_files("spm-unigram-toy", build_dir=tmp_path_factory.mktemp("build"))


def lora_files(base: dict[str, bytes], *, config: dict | None = None, rank: int = RANK, module: str = "query_key_value",
               seed: int = 1) -> dict[str, bytes]:
    """A LoRA adapter for the tiny base, written as peft writes one, with non-zero updates: the
    demo's builder (`lora_adapter_files`, its draws in module-name order), with `config`'s keys
    over its adapter_config.json and a card that declares the relation."""
    files = lora_adapter_files(base, "org/base", rank=rank, alpha=ALPHA, module=module, seed=seed)
    cfg = {**json.loads(files["adapter_config.json"]), **(config or {})}
    card = b"---\nbase_model: org/base\nbase_model_relation: adapter\nlibrary_name: peft\n---\n# adapter\n"
    return {**files, "adapter_config.json": json.dumps(cfg).encode(), "README.md": card}


def hub_client(hub: FakeHub, store: Store | None = None) -> HubClient:
    return HubClient(hub.url, token=False, store=store, policy=RetryPolicy(attempts=1))


def gate_all(hub: FakeHub, store: Store, cache: Path) -> dict:
    client = hub_client(hub, store)
    poll_once(store, client, RULES)
    return {o.repo: o for o in gate_pending(store, client, RULES, cache_dir=cache)}


def manual_merge(base: dict[str, bytes], adapter: dict[str, bytes]) -> dict[str, torch.Tensor]:
    """W + (alpha / r) · B @ A for every adapted weight, computed here without peft."""
    weights = load_safetensors(base["model.safetensors"])
    lora = load_safetensors(adapter["adapter_model.safetensors"])
    merged = dict(weights)
    for name in weights:
        stem = "base_model.model." + name[: -len(".weight")]
        if f"{stem}.lora_A.weight" in lora:
            delta = lora[f"{stem}.lora_B.weight"] @ lora[f"{stem}.lora_A.weight"]
            merged[name] = weights[name] + (ALPHA / RANK) * delta
    return merged


def test_the_test_adapter_is_the_same_whatever_order_safetensors_hands_the_tensors(base_files, monkeypatch) -> None:
    """The adapter is a function of its arguments: safetensors' `load` returns the tensors in an
    order that changes from process to process (seen: three processes, three orders), and the
    seeded draws must not follow it (they did in an earlier copy of the builder: the derivative
    test's adapter L* took one of two values from run to run)."""
    import safetensors.torch

    load = safetensors.torch.load
    built = []
    for backwards in (False, True):     # the tensors handed in name order, then in reverse
        monkeypatch.setattr(safetensors.torch, "load", lambda data, b=backwards: dict(sorted(load(data).items(), reverse=b)))
        built.append(lora_files(base_files))
    assert built[0] == built[1] and len(load(built[0]["adapter_model.safetensors"])) == 4


def test_an_adapter_is_gated_fetched_with_its_base_merged_and_scored(tmp_path, base_files) -> None:
    store = Store.open(tmp_path / "state.duckdb")
    cache = tmp_path / "hf" / "hub"
    adapter = lora_files(base_files)
    with FakeHub() as hub:
        base_sha = hub.add_repo("org/base", base_files)
        lora_sha = hub.add_repo("org/lora", adapter)
        outcomes = gate_all(hub, store, cache)
        assert outcomes["org/lora"].status == "gated", outcomes["org/lora"].reason
        row = store.get_checkpoint(outcomes["org/lora"].id)
        facts = row.meta["gate"]["adapter"]
        assert (facts["base_repo"], facts["base_sha"], facts["r"]) == ("org/base", base_sha, RANK)
        assert store.checkpoint_base(row.id)["relation"] == "adapter"
        template = ScoreRequest(corpus_dir=SHARED / "corpus" / "calib-v0", docs=2, max_context=64, n_boot=50,
                                tcb_positions=16, progress=False, dtype="float32", device="cpu")
        results = score_queue(store, hub_client(hub, store), score_in_process(store, template), owner="t",
                              cache_dir=cache)
    by_repo = {store.get_checkpoint(r.id).repo: r for r in results}
    assert by_repo["org/lora"].status == "scored", by_repo["org/lora"]
    runs = {r["model_repo"]: r for r in store.query("SELECT model_repo, model_sha, model FROM score_runs")}
    model_info = json.loads(runs["org/lora"]["model"])
    assert runs["org/lora"]["model_sha"] == lora_sha
    assert model_info["base"] == {"repo": "org/base", "sha": base_sha, "relation": "adapter"}
    assert model_info["adapter"]["r"] == RANK
    # The adapter changes the model: its L* differs from its base's.
    lstars = {r["model_repo"]: r["lstar"] for r in store.query("SELECT model_repo, lstar FROM score_runs")}
    assert lstars["org/lora"] != lstars["org/base"]
    store.close()


def test_the_merged_model_equals_an_independent_merge(tmp_path, base_files) -> None:
    base_dir, adapter_dir = tmp_path / "base", tmp_path / "adapter"
    adapter = lora_files(base_files)
    for folder, files in ((base_dir, base_files), (adapter_dir, adapter)):
        folder.mkdir()
        for name, data in files.items():
            (folder / name).write_bytes(data)
    merged = load_checkpoint(str(base_dir), dtype="float32", device="cpu", adapter=adapter_dir)
    reference = load_checkpoint(str(base_dir), dtype="float32", device="cpu")
    merged_weights = manual_merge(base_files, adapter)
    missing, unexpected = reference.model.load_state_dict(merged_weights, strict=False)
    adapted = [n for n in merged_weights if "query_key_value.weight" in n]
    assert len(adapted) == 2 and not set(adapted) & set(unexpected) and not set(adapted) & set(missing)
    ids = torch.tensor([[1, 5, 9, 2, 7, 3, 11, 4]])
    with torch.no_grad():
        got = merged.model(ids).logits
        want = reference.model(ids).logits
        plain = load_checkpoint(str(base_dir), dtype="float32", device="cpu").model(ids).logits
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert (got - plain).abs().max() > 1e-3    # the update is not a no-op
    assert merged.adapter["r"] == RANK and merged.adapter["n_adapter_params"] > 0


@pytest.mark.parametrize("case, reason", [
    ("remote_code", "remote code: adapter_config.json has auto_mapping to 'evil.models'"),
    ("rank", "adapter shapes for gpt_neox.layers.0.attention.query_key_value do not match the base"),
    ("module", "which the base does not have"),
    ("pickle_base", "base org/pickled@"),
    ("pickle_adapter", "pickle adapter weights refused"),
    ("no_base", "the adapter names no base model"),
    # Config keys peft would act on: each would make the scored model something other than
    # W + scale·B·A, or stall the scorer (a PiSSA SVD iteration count, a pathological regex).
    ("pissa", "init_lora_weights 'pissa_niter_1000000000' is not supported"),
    ("regex", "target_modules as a regular expression is not supported"),
    ("dora", "use_dora is not supported"),
    ("untargeted", "which its target_modules do not name"),
])
def test_a_hostile_adapter_is_refused_before_any_weight_is_read(tmp_path, base_files, case, reason) -> None:
    store = Store.open(tmp_path / "state.duckdb")
    adapter = lora_files(base_files)
    if case == "remote_code":
        adapter = lora_files(base_files, config={"auto_mapping": {"base_model_class": "X", "parent_library": "evil.models"}})
    elif case == "rank":
        adapter = lora_files(base_files, config={"r": 8})
    elif case == "module":
        adapter = lora_files(base_files)
        cfg = json.loads(adapter["adapter_config.json"])
        tensors = load_safetensors(adapter["adapter_model.safetensors"])
        renamed = {k.replace("query_key_value", "not_a_module"): v for k, v in tensors.items()}
        adapter = {**adapter, "adapter_model.safetensors": save_safetensors(renamed),
                   "adapter_config.json": json.dumps(cfg).encode()}
    elif case == "pickle_base":
        cfg = json.loads(adapter["adapter_config.json"])
        adapter = {**adapter, "adapter_config.json": json.dumps({**cfg, "base_model_name_or_path": "org/pickled"}).encode(),
                   "README.md": b"---\nbase_model: org/pickled\n---\n"}
    elif case == "pickle_adapter":
        buffer = io.BytesIO()
        torch.save({"x": torch.zeros(1)}, buffer)
        adapter = {k: v for k, v in adapter.items() if k != "adapter_model.safetensors"}
        adapter["adapter_model.bin"] = buffer.getvalue()
    elif case == "pissa":
        adapter = lora_files(base_files, config={"init_lora_weights": "pissa_niter_1000000000"})
    elif case == "regex":
        adapter = lora_files(base_files, config={"target_modules": "(.+)+!"})
    elif case == "dora":
        adapter = lora_files(base_files, config={"use_dora": True})
    elif case == "untargeted":
        adapter = lora_files(base_files, config={"target_modules": ["dense"]})
    elif case == "no_base":
        cfg = json.loads(adapter["adapter_config.json"])
        adapter = {**adapter, "adapter_config.json": json.dumps({**cfg, "base_model_name_or_path": None}).encode(),
                   "README.md": b"---\nlibrary_name: peft\n---\n"}
    with FakeHub() as hub:
        hub.add_repo("org/base", base_files)
        pickled = {k: v for k, v in base_files.items() if k != "model.safetensors"}
        buffer = io.BytesIO()
        torch.save(load_safetensors(base_files["model.safetensors"]), buffer)
        hub.add_repo("org/pickled", {**pickled, "pytorch_model.bin": buffer.getvalue()})
        hub.add_repo("org/lora", adapter)
        hub.reset_log()
        outcomes = gate_all(hub, store, tmp_path / "hf" / "hub")
        weight_reads = [r for r in hub.requests if "/resolve/" in r.path
                        and r.path.endswith((".safetensors", ".bin")) and "range" not in r.headers]
    got = outcomes["org/lora"]
    assert got.status == "skipped" and reason in got.reason, got.reason
    assert not weight_reads, weight_reads          # headers only, by range requests
    store.close()


def test_a_card_naming_two_bases_is_overruled_by_the_config_and_that_is_recorded(tmp_path, base_files) -> None:
    """An adapter has one base: a card naming two (its config's among them) is gated against
    the config's, and the lineage records that the card was overruled, naming both; a card
    whose bases leave out the config's (or a config naming none) is refused like a card naming
    another base."""
    store = Store.open(tmp_path / "state.duckdb")
    adapter = lora_files(base_files)
    two = {**adapter, "README.md": b"---\nbase_model:\n- org/other\n- org/base\nlibrary_name: peft\n---\n"}
    cfg = json.loads(adapter["adapter_config.json"])
    neither = {**two, "adapter_config.json": json.dumps({**cfg, "base_model_name_or_path": "org/third"}).encode()}
    unnamed = {**two, "adapter_config.json": json.dumps({**cfg, "base_model_name_or_path": None}).encode()}
    with FakeHub() as hub:
        base_sha = hub.add_repo("org/base", base_files)
        hub.add_repo("org/third", base_files)
        hub.add_repo("org/lora", two)
        hub.add_repo("org/lora-neither", neither)
        hub.add_repo("org/lora-unnamed", unnamed)
        outcomes = gate_all(hub, store, tmp_path / "hf" / "hub")
    got = outcomes["org/lora"]
    assert got.status == "gated", got.reason
    lineage = store.checkpoint_base(got.id)
    assert (lineage["base_repo"], lineage["base_sha"], lineage["relation"]) == ("org/base", base_sha, "adapter")
    assert lineage["bases"] == ["org/base"]
    assert lineage["problem"] == ("the model card names 2 bases (org/other, org/base); an adapter applies to one, "
                                  "so its adapter_config.json base org/base is used")
    refused = outcomes["org/lora-neither"]
    assert refused.status == "skipped"
    assert "the model card names bases org/other, org/base but adapter_config.json names org/third" in refused.reason
    refused = outcomes["org/lora-unnamed"]
    assert refused.status == "skipped"
    assert "names 2 bases (org/other, org/base) and adapter_config.json names none" in refused.reason
    store.close()


@pytest.mark.slow
def test_the_scoring_child_merges_the_adapter_and_dedupe_tells_it_from_its_base(tmp_path, base_files) -> None:
    """The daemon's path: each job in a scoring child (the daemon's default pool of one warm
    worker, `WarmBackend`), the adapter and its base laid out flat beside each other; the
    adapter's content key includes its base's."""
    from monitor.scoring.backends import WarmBackend
    from monitor.scoring.scoring_driver import score_queue_on

    store = Store.open(tmp_path / "state.duckdb")
    cache = tmp_path / "hf" / "hub"
    with FakeHub() as hub:
        hub.add_repo("org/base", base_files)
        hub.add_repo("org/lora", lora_files(base_files))
        gate_all(hub, store, cache)
        template = ScoreRequest(corpus_dir=SHARED / "corpus" / "calib-v0", docs=2, max_context=32, n_boot=10,
                                with_tcb=False, progress=False, dtype="float32", device="cpu")
        # One warm worker scores both jobs, as the daemon's does: a fresh child per job (the
        # `LocalBackend`) imported torch twice for the same merge (19.2 CPU-seconds for this
        # test before, measured alone under load, 2026-11-30).
        backend = WarmBackend(workers=1, timeout_s=300, workdir=tmp_path / "w")
        try:
            results = score_queue_on(store, hub_client(hub, store), backend, template, owner="t",
                                     state_dir=tmp_path, cache_dir=cache)
        finally:
            backend.close()
        assert backend.started == 1   # both jobs in one child process
    assert sorted(r.status for r in results) == ["scored", "scored"], results
    rows = {r["model_repo"]: r for r in store.query("SELECT model_repo, lstar, model FROM score_runs")}
    assert json.loads(rows["org/lora"]["model"])["base"]["repo"] == "org/base"
    assert rows["org/lora"]["lstar"] != rows["org/base"]["lstar"]
    metas = {store.get_checkpoint(r.id).repo: store.get_checkpoint(r.id).meta for r in results}
    assert metas["org/lora"]["weights_digest"] != metas["org/base"]["weights_digest"]
    assert not list((tmp_path / "tmp").glob("checkpoint-*"))    # the flat copies are removed
    store.close()
