"""Checkpoint loading: refusals before any weight is read, identity hash, limits, lm_head bias."""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import pickle
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from monitor.errors import HubError, ModelLoadError, SpecError, UnsafeCheckpointError
from monitor.lab.tiny_models import build_tiny_model
from monitor.scoring.forward import ScoringSpec
from monitor.scoring.loader import (check_checkpoint_dir, checkpoint_hash, load_checkpoint,
                                    max_positions_from_config, parse_hub_ref, resolve_hub_revision)


class CanaryPayload:
    """Unpickling this object creates a file: proof that loading a pickle runs code."""

    def __init__(self, canary: Path) -> None:
        self.canary = canary

    def __reduce__(self):
        return (pathlib.Path.touch, (pathlib.Path(self.canary),))


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory, shared_dir) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny"), shared_dir / "tokenizers" / "gpt2",
                            arch="llama", max_positions=64)


def _llama_config(**extra) -> dict:
    return {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 8,
            "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1,
            "num_attention_heads": 2, "max_position_embeddings": 32, **extra}


def test_pickle_only_checkpoint_is_refused_and_never_unpickled(tmp_path):
    canary = tmp_path / "canary-pickle"
    # the payload is live: plain unpickling of the same object does create its canary
    witness = tmp_path / "witness"
    pickle.loads(pickle.dumps(CanaryPayload(witness)))
    assert witness.exists()

    ckpt = tmp_path / "pickle-only"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps(_llama_config()))
    torch.save({"model.embed_tokens.weight": torch.zeros(8, 8), "trap": CanaryPayload(canary)},
               ckpt / "pytorch_model.bin")
    with pytest.raises(UnsafeCheckpointError, match=r"only pickle weights \(pytorch_model.bin\)"):
        check_checkpoint_dir(ckpt)
    with pytest.raises(UnsafeCheckpointError, match="pickle"):
        load_checkpoint(str(ckpt), device="cpu")
    assert not canary.exists()


def test_remote_code_config_is_refused_and_never_imported(tmp_path):
    canary = tmp_path / "canary-remote"
    module_source = f"import pathlib\npathlib.Path({str(canary)!r}).touch()\n"
    # the module is live: executing it creates the canary (checked on a copy of the path)
    witness = tmp_path / "witness"
    exec(module_source.replace(str(canary), str(witness)), {})
    assert witness.exists()

    ckpt = tmp_path / "remote-code"
    ckpt.mkdir()
    (ckpt / "modeling_evil.py").write_text(module_source)
    (ckpt / "config.json").write_text(json.dumps({
        "model_type": "evil_lm", "architectures": ["EvilForCausalLM"],
        "auto_map": {"AutoConfig": "modeling_evil.EvilConfig",
                     "AutoModelForCausalLM": "modeling_evil.EvilForCausalLM"}}))
    save_file({"w": torch.zeros(2)}, str(ckpt / "model.safetensors"))
    with pytest.raises(UnsafeCheckpointError, match=r"needs remote code .*'evil_lm'"):
        check_checkpoint_dir(ckpt)
    with pytest.raises(UnsafeCheckpointError):
        load_checkpoint(str(ckpt), device="cpu")
    assert not canary.exists()


def test_unknown_architecture_missing_config_and_non_causal(tmp_path):
    unknown = tmp_path / "unknown"
    unknown.mkdir()
    (unknown / "config.json").write_text(json.dumps({"model_type": "quantum_transformer_9000"}))
    save_file({"w": torch.zeros(2)}, str(unknown / "model.safetensors"))
    with pytest.raises(ModelLoadError, match="unknown architecture, model_type 'quantum_transformer_9000'") as exc:
        check_checkpoint_dir(unknown)
    assert not isinstance(exc.value, UnsafeCheckpointError)

    no_config = tmp_path / "no-config"
    no_config.mkdir()
    save_file({"w": torch.zeros(2)}, str(no_config / "model.safetensors"))
    with pytest.raises(ModelLoadError, match="has no config.json"):
        load_checkpoint(str(no_config), device="cpu")

    encoder_decoder = tmp_path / "t5"
    encoder_decoder.mkdir()
    (encoder_decoder / "config.json").write_text(json.dumps({"model_type": "t5"}))
    save_file({"w": torch.zeros(2)}, str(encoder_decoder / "model.safetensors"))
    with pytest.raises(ModelLoadError, match="'t5' is not a causal language model"):
        check_checkpoint_dir(encoder_decoder)

    with pytest.raises(ModelLoadError, match="does not exist"):
        load_checkpoint(str(tmp_path / "nowhere"), device="cpu")


def test_links_out_of_the_folder_and_missing_shards_are_refused(tmp_path, tiny_dir):
    outside = tmp_path / "outside.safetensors"
    shutil.copyfile(tiny_dir / "model.safetensors", outside)
    linked = tmp_path / "linked"
    linked.mkdir()
    shutil.copyfile(tiny_dir / "config.json", linked / "config.json")
    os.symlink(outside, linked / "model.safetensors")
    with pytest.raises(UnsafeCheckpointError, match="points outside the checkpoint folder"):
        check_checkpoint_dir(linked)

    sharded = tmp_path / "sharded"
    shutil.copytree(tiny_dir, sharded)
    (sharded / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"lm_head.weight": "model-00002-of-00002.safetensors"}}))
    with pytest.raises(ModelLoadError, match="lists model-00002-of-00002.safetensors but the file is missing"):
        check_checkpoint_dir(sharded)
    (sharded / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"lm_head.weight": "../outside.safetensors"}}))
    with pytest.raises(UnsafeCheckpointError, match="outside the folder"):
        check_checkpoint_dir(sharded)


def test_window_larger_than_the_model_allows(tiny_dir):
    ckpt = load_checkpoint(str(tiny_dir), dtype="float32", device="cpu")
    assert ckpt.max_positions == 64
    with pytest.raises(SpecError, match="window 128 is larger than the model's maximum positions 64"):
        ScoringSpec(max_context=128).resolve(ckpt.max_positions)
    assert ScoringSpec().resolve(ckpt.max_positions).window == 64


def test_max_positions_sources():
    assert max_positions_from_config({"max_position_embeddings": 4096}) == 4096
    assert max_positions_from_config({"n_positions": 1024, "n_ctx": 2048}) == 1024
    assert max_positions_from_config({"text_config": {"max_position_embeddings": 8192}}) == 8192
    assert max_positions_from_config({}) is None
    # the tokenizer's model_max_length caps, unless it is the "unknown" sentinel
    assert max_positions_from_config({"max_position_embeddings": 4096}, {"model_max_length": 512}) == 512
    assert max_positions_from_config({"max_position_embeddings": 4096},
                                     {"model_max_length": 1000000000000000019884624838656}) == 4096
    assert max_positions_from_config({}, {"model_max_length": 2048}) == 2048


def test_local_hash_is_the_documented_formula_and_stable(tmp_path, tiny_dir):
    copy = tmp_path / "copy"
    shutil.copytree(tiny_dir, copy)
    (copy / "README.md").write_text("not part of the identity")
    expected = hashlib.sha256()
    for name in sorted(["config.json", "generation_config.json", "model.safetensors", "special_tokens_map.json",
                        "tokenizer.json", "tokenizer_config.json"]):
        expected.update(f"{name}\t{hashlib.sha256((tiny_dir / name).read_bytes()).hexdigest()}\n".encode())
    assert checkpoint_hash(tiny_dir) == checkpoint_hash(copy) == expected.hexdigest()
    assert checkpoint_hash(tiny_dir) == checkpoint_hash(tiny_dir)
    data = bytearray((copy / "model.safetensors").read_bytes())
    data[-1] ^= 1
    (copy / "model.safetensors").write_bytes(bytes(data))
    assert checkpoint_hash(copy) != expected.hexdigest()


def test_loaded_checkpoint_records_its_provenance(tiny_dir):
    ckpt = load_checkpoint(str(tiny_dir), dtype="float32", device="cpu")
    info = ckpt.as_model_info()
    assert info["source"] == "local" and info["sha"] == checkpoint_hash(tiny_dir)
    assert info["repo"] == str(tiny_dir.resolve())
    assert info["architecture"] == "LlamaForCausalLM" and info["vocab_size"] == 50257
    assert info["n_params"] == sum(p.numel() for p in ckpt.model.parameters())
    assert (info["dtype"], info["device"], info["tied_embeddings"], info["lm_head_bias"]) == \
        ("float32", "cpu", False, False)
    assert not ckpt.model.training and info["ignored_weights"] == []
    assert json.dumps(info)  # serialisable as is


@pytest.mark.parametrize("arch,file_key", [("llama", "lm_head.bias"), ("gpt_neox", "embed_out.bias")])
def test_lm_head_bias_the_architecture_lacks_is_attached(tmp_path, shared_dir, arch, file_key):
    out = build_tiny_model(tmp_path / arch, shared_dir / "tokenizers" / "gpt2", arch=arch, lm_head_bias=True)
    with safe_open(str(out / "model.safetensors"), framework="pt") as f:
        stored = f.get_tensor(file_key)
    # transformers itself drops the key: the architecture has no bias
    from transformers import AutoModelForCausalLM
    plain, info = AutoModelForCausalLM.from_pretrained(str(out), output_loading_info=True)
    assert plain.get_output_embeddings().bias is None and info["unexpected_keys"]

    ckpt = load_checkpoint(str(out), dtype="float32", device="cpu")
    head = ckpt.model.get_output_embeddings()
    assert ckpt.lm_head_bias and torch.equal(head.bias, stored)
    assert ckpt.as_model_info()["ignored_weights"] == []        # the bias was used, not ignored
    ids = torch.tensor([[464, 3290, 318, 257]])
    with torch.no_grad():
        with_bias = ckpt.model(input_ids=ids).logits
        without = plain(input_ids=ids).logits
    torch.testing.assert_close(with_bias, without + stored, rtol=1e-5, atol=1e-5)


def test_hub_references():
    assert parse_hub_ref("HuggingFaceTB/SmolLM2-135M@v1.0") == ("HuggingFaceTB/SmolLM2-135M", "v1.0")
    assert parse_hub_ref("EleutherAI/pythia-70m@step1000") == ("EleutherAI/pythia-70m", "step1000")
    assert parse_hub_ref("org/name") == ("org/name", "main")
    assert parse_hub_ref("/abs/path") is None
    assert parse_hub_ref("./rel/path") is None
    assert parse_hub_ref("just-a-name") is None


def test_unreachable_hub_is_one_clear_error():
    with pytest.raises(HubError, match=r"cannot reach the Hub for org/name@main: .*refused"):
        resolve_hub_revision("org/name", "main", endpoint="http://127.0.0.1:9")   # nothing listens
    with pytest.raises(HubError, match="no local folder org/name either"):
        load_checkpoint("org/name", device="cpu", endpoint="http://127.0.0.1:9")


def _repo_files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


def test_hub_reference_is_pinned_to_the_commit_sha(tmp_path, tiny_dir, shared_dir):
    from monitor.demo.fakehub import FakeHub

    files = _repo_files(tiny_dir)
    files["pytorch_model.bin"] = b"not fetched: only safetensors, config and tokenizer files are"
    files["modeling_extra.py"] = b"raise SystemExit('never imported')\n"
    with FakeHub() as hub:
        first = hub.add_repo("org/tiny", files)
        newer = build_tiny_model(tmp_path / "newer", shared_dir / "tokenizers" / "gpt2", arch="llama",
                                 max_positions=64, seed=9)
        second = hub.add_commit("org/tiny", _repo_files(newer))
        hub.add_tag("org/tiny", "v1", first)

        latest = load_checkpoint("org/tiny", dtype="float32", device="cpu", cache_dir=tmp_path / "hub",
                                 endpoint=hub.url)
        assert (latest.source, latest.sha, latest.revision, latest.repo) == ("hub", second, "main", "org/tiny")
        pinned = load_checkpoint("org/tiny@v1", dtype="float32", device="cpu", cache_dir=tmp_path / "hub",
                                 endpoint=hub.url)
        assert (pinned.sha, pinned.revision) == (first, "v1")
        assert pinned.model_dir.name == first                     # snapshots/<sha>/
        fetched = sorted(p.name for p in pinned.model_dir.iterdir())
        assert "pytorch_model.bin" not in fetched and "modeling_extra.py" not in fetched
        assert "model.safetensors" in fetched and "tokenizer.json" in fetched
        w_first = pinned.model.get_output_embeddings().weight
        w_latest = latest.model.get_output_embeddings().weight
        assert not torch.equal(w_first, w_latest)
        local = load_checkpoint(str(tiny_dir), dtype="float32", device="cpu")
        assert torch.equal(w_first, local.model.get_output_embeddings().weight)
        assert pinned.as_model_info()["sha"] == first
        with pytest.raises(HubError, match="has no revision 'v9'"):
            load_checkpoint("org/tiny@v9", device="cpu", cache_dir=tmp_path / "hub", endpoint=hub.url)
        with pytest.raises(HubError, match="org/missing not found"):
            load_checkpoint("org/missing@main", device="cpu", cache_dir=tmp_path / "hub", endpoint=hub.url)


@pytest.mark.parametrize("case, message", [
    ("remote-code", r"refused: remote code: config.json has auto_map for model_type 'evil_arch'"),
    ("truncated", r"refused: safetensors file model.safetensors is truncated")])
def test_a_hub_repo_the_gate_refuses_costs_no_weight_byte(tmp_path, tiny_dir, case, message):
    """`lstar score org/repo@rev` runs the watcher's gate first: a remote-code repo is refused
    from its config.json, a truncated one from its header read by a range request; the fake
    Hub's log shows no download of the weights (no HEAD, no GET of the whole file)."""
    from monitor.demo.fakehub import FakeHub
    from monitor.demo.hub_repos import remote_code_files

    files = _repo_files(tiny_dir)
    weights = files["model.safetensors"]
    if case == "remote-code":
        files.update(remote_code_files(tmp_path / "canary", json.loads(files["config.json"])))
    else:
        files["model.safetensors"] = weights = weights[:-10]
    with FakeHub(cdn_redirect=True) as hub:
        hub.add_repo(f"org/{case}", files)
        with pytest.raises(UnsafeCheckpointError, match=message):
            load_checkpoint(f"org/{case}@main", device="cpu", cache_dir=tmp_path / "hub", endpoint=hub.url)
        on_weights = [r for r in hub.requests if r.path.endswith("/model.safetensors") or r.path.startswith("/cdn/")]
    if case == "remote-code":
        assert on_weights == []
    else:
        assert on_weights and all(r.method == "GET" and r.headers.get("range", "").startswith("bytes=0-")
                                  for r in on_weights)
        ranges = {int(r.headers["range"].rsplit("-", 1)[1]) for r in on_weights}
        assert max(ranges) < len(weights) - 1             # a header prefix, never the whole file
    assert not (tmp_path / "canary").exists()
    assert not list((tmp_path / "hub").rglob("model.safetensors"))


def test_tensors_the_architecture_does_not_use_are_recorded(tmp_path, tiny_dir):
    from safetensors.torch import load_file

    extra = tmp_path / "extra"
    shutil.copytree(tiny_dir, extra)
    tensors = load_file(str(extra / "model.safetensors"))
    tensors["model.extra_projection.weight"] = torch.ones(4)
    save_file(tensors, str(extra / "model.safetensors"), metadata={"format": "pt"})
    ckpt = load_checkpoint(str(extra), dtype="float32", device="cpu")
    assert ckpt.as_model_info()["ignored_weights"] == ["model.extra_projection.weight"]
    assert not ckpt.lm_head_bias


# -- weights covered exactly, configs within budget ---------------------------------------------
def _copy_with(tiny_dir: Path, dest: Path, *, weights: bytes | None = None, config: dict | None = None) -> Path:
    shutil.copytree(tiny_dir, dest)
    if weights is not None:
        (dest / "model.safetensors").write_bytes(weights)
    if config is not None:
        (dest / "config.json").write_text(json.dumps({**json.loads((tiny_dir / "config.json").read_text()),
                                                      **config}))
    return dest


@pytest.mark.parametrize("case, message", [
    ("truncated", r"is truncated: the header and tensors need [\d,]+ bytes but the file has"),
    ("padded", r"is padded: the file has [\d,]+ bytes, 16 after the last tensor")])
def test_truncated_or_padded_weights_are_one_clear_error_naming_the_file(tmp_path, tiny_dir, case, message):
    data = (tiny_dir / "model.safetensors").read_bytes()
    weights = data[:-10] if case == "truncated" else data + bytes(16)
    ckpt = _copy_with(tiny_dir, tmp_path / case, weights=weights)
    with pytest.raises(ModelLoadError, match=message) as failure:
        load_checkpoint(str(ckpt), dtype="float32", device="cpu")
    assert str(ckpt / "model.safetensors") in failure.value.message
    assert "\n" not in failure.value.one_line()


def test_a_safetensors_error_while_loading_is_a_model_load_error_naming_the_file(tmp_path, tiny_dir):
    from monitor.scoring.loader import _load_model

    # The second line of defence, past the layout check: what the safetensors library refuses.
    ckpt = _copy_with(tiny_dir, tmp_path / "short", weights=(tiny_dir / "model.safetensors").read_bytes()[:-10])
    with pytest.raises(ModelLoadError, match=r"safetensors cannot read .*model\.safetensors: .*not fully covered"):
        _load_model(ckpt, "float32", "cpu")


def test_a_library_that_cannot_be_mapped_while_loading_is_out_of_memory_not_a_missing_package(tiny_dir,
                                                                                             monkeypatch):
    import transformers

    from monitor.scoring.loader import _load_model

    # What a model class's extension library says when it does not fit the address-space
    # limit, and what torch's CPU allocator says when a tensor does not.
    for failure, said in (
            (ImportError("libextension.so: failed to map segment from shared object"), "failed to map segment"),
            (RuntimeError("[enforce fail at alloc_cpu.cpp:117] . DefaultCPUAllocator: can't allocate memory: "
                          "you tried to allocate 1073741824 bytes."), "can't allocate memory")):
        def unloadable(*args, failure=failure, **kwargs):
            raise failure

        monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", unloadable)
        with pytest.raises(MemoryError, match=f"loading .*: .*{said}"):
            _load_model(tiny_dir, "float32", "cpu")


@pytest.mark.parametrize("config, message", [
    ({"num_hidden_layers": 10**6}, "over budget: config.json num_hidden_layers 1,000,000 > max_layers 1,024"),
    ({"hidden_size": 4096, "intermediate_size": 11008, "num_attention_heads": 32},
     r"implies about [\d,]+ parameters .* but the safetensors weights hold [\d,]+: the config does not "
     "describe these weights"),
    ({"vocab_size": 10**9}, "over budget: config.json vocab_size 1,000,000,000 > max_vocab")])
def test_a_config_claiming_more_than_its_weights_is_refused_before_anything_is_built(tmp_path, tiny_dir, config,
                                                                                    message):
    ckpt = _copy_with(tiny_dir, tmp_path / "claims", config=config)
    with pytest.raises(ModelLoadError, match=message):
        check_checkpoint_dir(ckpt)
    with pytest.raises(ModelLoadError, match=message):
        load_checkpoint(str(ckpt), dtype="float32", device="cpu")


def test_the_truncated_shard_of_a_sharded_checkpoint_is_named(tmp_path, tiny_dir):
    from monitor.demo.hub_repos import shard_safetensors

    sharded = tmp_path / "sharded"
    shutil.copytree(tiny_dir, sharded)
    shards = shard_safetensors((sharded / "model.safetensors").read_bytes(), 2)
    (sharded / "model.safetensors").unlink()
    shards["model-00002-of-00002.safetensors"] = shards["model-00002-of-00002.safetensors"][:-4]
    for name, data in shards.items():
        (sharded / name).write_bytes(data)
    with pytest.raises(ModelLoadError, match=r"model-00002-of-00002\.safetensors is truncated"):
        check_checkpoint_dir(sharded)
