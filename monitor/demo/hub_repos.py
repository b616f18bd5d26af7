"""Repos for the fake Hub: tiny real models, step-branch lineages, and hostile repos.

Shared by the fake-Hub tests, the hub/gate tests, the daemon tests and `lstar demo`. Every
builder returns plain `{path: bytes}` trees (or adds them to a `FakeHub` through the `HubState`
it extends), so the same content can be served, written to disk or compared byte for byte.

The hostile repos are live: the pickle payload really touches its canary file when
unpickled, and the remote-code modules really write theirs when imported. A test proving
that a gate refused them checks that the canary never appears.
"""

from __future__ import annotations

import functools
import gc
import importlib
import json
import pickle
import struct
import tempfile
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

if TYPE_CHECKING:   # only named in annotations: the repos are added to the fake Hub's state
    from monitor.demo.fakehub_state import HubState

SHARED_TOKENIZERS = Path(__file__).resolve().parents[2].parent / "shared" / "tokenizers"
BASE_TIME = datetime(2024, 1, 1, tzinfo=timezone.utc)
APPROVED_TOKEN = "hf_fake_approved"   # may download the gated repo of populate_standard
STRANGER_TOKEN = "hf_fake_stranger"   # a valid-looking token with no grants
MEMBER_TOKEN = "hf_fake_member"       # may see the private repo of populate_standard
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
ESCAPING_NAMES = ("../../escape.txt", "/etc/evil", "a/../../b")


def tokenizer_dir(name: str, tokenizers_dir: str | Path | None = None) -> Path:
    """The folder of a shared tokenizer (e.g. "gpt-neox"), checked to hold tokenizer.json."""
    path = Path(tokenizers_dir or SHARED_TOKENIZERS) / name
    if not (path / "tokenizer.json").exists():
        raise FileNotFoundError(f"no tokenizer.json in {path}: the fake Hub's models need ../shared/tokenizers")
    return path


# ----------------------------------------------------------------------------- tiny real models

@functools.lru_cache(maxsize=64)
def _built_model(tok_dir: str, arch: str, seed: int, hidden: int, layers: int, heads: int,
                 max_positions: int, init_std: float, build_root: str | None) -> tuple[tuple[str, bytes], ...]:
    from monitor.lab.tiny_models import build_tiny_model

    with tempfile.TemporaryDirectory(dir=build_root) as tmp:
        out = build_tiny_model(Path(tmp) / "model", tok_dir, arch=arch, seed=seed, hidden=hidden, layers=layers,
                               heads=heads, max_positions=max_positions, init_std=init_std)
        return tuple(sorted((p.relative_to(out).as_posix(), p.read_bytes()) for p in out.rglob("*") if p.is_file()))


def model_card(pipeline_tag: str = "text-generation", library_name: str = "transformers") -> bytes:
    """A README.md with the YAML front matter the Hub reads pipeline_tag and library_name from."""
    return f"---\nlibrary_name: {library_name}\npipeline_tag: {pipeline_tag}\n---\n\n# A tiny test model\n".encode()


def tiny_model_files(tokenizer: str = "gpt-neox", *, arch: str = "gpt_neox", seed: int = 0, hidden: int = 16,
                     layers: int = 2, heads: int = 2, max_positions: int = 256, init_std: float = 0.2,
                     tokenizers_dir: str | Path | None = None, build_dir: str | Path | None = None) -> dict[str, bytes]:
    """Files of a tiny real causal LM (model.safetensors, config, real tokenizer, model card).

    Built once per parameter set and process (about 0.5 s after transformers is imported).
    """
    tok_dir = tokenizer_dir(tokenizer, tokenizers_dir)
    if build_dir is not None:
        Path(build_dir).mkdir(parents=True, exist_ok=True)
    files = dict(_built_model(str(tok_dir), arch, seed, hidden, layers, heads, max_positions, init_std,
                              None if build_dir is None else str(build_dir)))
    files["README.md"] = model_card()
    return files


# ----------------------------------------------------------------------------- safetensors bytes

def _pack_header(header: Mapping[str, Any]) -> bytes:
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the format pads the header to 8 bytes
    return struct.pack("<Q", len(raw)) + raw


def header_only_safetensors(tensors: Mapping[str, tuple[str, Sequence[int]]],
                            metadata: Mapping[str, str] | None = None) -> bytes:
    """A safetensors file whose header declares `tensors` {name: (dtype, shape)} and whose data is absent.

    The declared shapes can be arbitrarily large: only the header is written, so the file
    stays a few hundred bytes while `get_safetensors_metadata` reports the declared count.
    """
    item = {"F64": 8, "I64": 8, "F32": 4, "I32": 4, "F16": 2, "BF16": 2, "I16": 2, "U8": 1, "I8": 1, "BOOL": 1}
    header: dict[str, Any] = {"__metadata__": dict(metadata or {"format": "pt"})}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        size = item[dtype]
        for dim in shape:
            size *= dim
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    return _pack_header(header)


def read_safetensors_header(data: bytes) -> dict:
    """The JSON header of a safetensors file held in memory."""
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8:8 + n])


def shard_safetensors(data: bytes, n_shards: int = 2) -> dict[str, bytes]:
    """Split one safetensors file into `n_shards` files plus model.safetensors.index.json, as save_pretrained does."""
    header = read_safetensors_header(data)
    (n,) = struct.unpack("<Q", data[:8])
    body = data[8 + n:]
    names = [k for k in header if k != "__metadata__"]
    groups = [names[i::n_shards] for i in range(n_shards)]
    files: dict[str, bytes] = {}
    weight_map: dict[str, str] = {}
    total = 0
    for index, group in enumerate(groups, start=1):
        shard_name = f"model-{index:05d}-of-{n_shards:05d}.safetensors"
        shard_header: dict[str, Any] = {"__metadata__": header.get("__metadata__", {"format": "pt"})}
        chunks, offset = [], 0
        for name in group:
            start, end = header[name]["data_offsets"]
            chunks.append(body[start:end])
            shard_header[name] = {**header[name], "data_offsets": [offset, offset + end - start]}
            offset += end - start
            weight_map[name] = shard_name
        total += offset
        files[shard_name] = _pack_header(shard_header) + b"".join(chunks)
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    files["model.safetensors.index.json"] = json.dumps(index, indent=2).encode()
    return files


def malformed_safetensors(kind: str) -> bytes:
    """A model.safetensors with a broken header.

    `kind="length"`: the 8-byte length points past the end of the file;
    `kind="json"`: the length is right but the header is not JSON.
    """
    if kind == "length":
        partial = b'{"gpt_neox.embed_in.weight":{"dtype":"F32","shape":[16,16],'
        return struct.pack("<Q", len(partial) + 4096) + partial
    if kind == "json":
        raw = b"{this is not json: [1, 2"
        raw += b" " * (-len(raw) % 8)
        return struct.pack("<Q", len(raw)) + raw + b"\x00" * 64
    raise ValueError(f"unknown malformation {kind!r}; choose 'length' or 'json'")


# ----------------------------------------------------------------------------- hostile payloads

class _TouchOnUnpickle:
    """Unpickling this object calls Path.touch(canary): the shape of a real pickle exploit."""

    def __init__(self, canary: Path) -> None:
        self.canary = Path(canary)

    def __reduce__(self):
        return (Path.touch, (self.canary,))


def pickle_canary_payload(canary: str | Path) -> bytes:
    """A pytorch_model.bin whose unpickling (pickle.load, torch.load(weights_only=False)) creates `canary`."""
    return pickle.dumps({"gpt_neox.embed_in.weight": _TouchOnUnpickle(Path(canary))}, protocol=4)


def remote_code_files(canary: str | Path, base_config: Mapping[str, Any]) -> dict[str, bytes]:
    """config.json needing remote code (auto_map + unknown model_type) and modules that write `canary` on import."""
    config = dict(base_config)
    config.update(model_type="evil_arch", architectures=["EvilForCausalLM"],
                  auto_map={"AutoConfig": "configuration_evil.EvilConfig",
                            "AutoModelForCausalLM": "modeling_evil.EvilForCausalLM"})
    touch = f"import pathlib\npathlib.Path({str(canary)!r}).write_text('remote code ran\\n')\n"
    configuration = ('"""Configuration of a custom architecture (importing it runs repo code)."""\n' + touch
                     + "from transformers import PretrainedConfig\n\n\nclass EvilConfig(PretrainedConfig):\n"
                       "    model_type = 'evil_arch'\n")
    modeling = ('"""Modeling code of a custom architecture (importing it runs repo code)."""\n' + touch
                + "from transformers import PreTrainedModel\n\nfrom .configuration_evil import EvilConfig\n\n\n"
                  "class EvilForCausalLM(PreTrainedModel):\n    config_class = EvilConfig\n")
    return {"config.json": json.dumps(config, indent=2).encode(),
            "configuration_evil.py": configuration.encode(), "modeling_evil.py": modeling.encode()}


# ----------------------------------------------------------------------------- repo builders

def add_lineage(hub: HubState, repo_id: str, steps: Sequence[int] = (1000, 2000, 3000), *,
                tokenizer: str = "gpt-neox", arch: str = "gpt_neox", start: datetime = BASE_TIME,
                interval: timedelta = timedelta(hours=1), init_std: tuple[float, float] = (0.4, 0.1),
                seed: int = 1000, build_dir: str | Path | None = None, **repo_meta: Any) -> dict[str, str]:
    """A Pythia-style repo: one branch `step<N>` per training step, each a different tiny checkpoint.

    `main` points at the last step's commit (as on Pythia). `init_std` goes linearly from its
    first to its second value across the steps: smaller weights give logits closer to uniform,
    so the scored loss falls with the step, like a training run. Returns {branch: sha}.
    """
    refs: dict[str, str] = {}
    for i, step in enumerate(steps):
        frac = i / (len(steps) - 1) if len(steps) > 1 else 1.0
        std = init_std[0] + (init_std[1] - init_std[0]) * frac
        files = tiny_model_files(tokenizer, arch=arch, seed=seed + i, init_std=round(std, 4), build_dir=build_dir)
        when = start + interval * i
        branch = f"step{step}"
        if i == 0:
            refs[branch] = hub.add_repo(repo_id, files, branch=branch, last_modified=when, title=f"Add step {step}",
                                        **{"pipeline_tag": "text-generation", **repo_meta})
        else:
            refs[branch] = hub.add_commit(repo_id, files, branch=branch, replace=True, title=f"Add step {step}",
                                          date=when)
    refs["main"] = hub.add_branch(repo_id, "main", revision=f"step{steps[-1]}")
    return refs


def derivative_card(base_repo: str, relation: str | None, library_name: str = "transformers") -> bytes:
    """A README.md naming `base_repo` as `base_model` (and the relation, when given), as a
    fine-tune's or adapter's card on the Hub does."""
    declared = f"base_model_relation: {relation}\n" if relation else ""
    return (f"---\nbase_model: {base_repo}\n{declared}library_name: {library_name}\n"
            f"pipeline_tag: text-generation\n---\n\n# A tiny derivative of {base_repo}\n").encode()


def finetune_files(base: Mapping[str, bytes], base_repo: str, *, seed: int = 1, scale: float = 0.5) -> dict[str, bytes]:
    """A full fine-tune of a tiny base: every weight moved by seeded noise of `scale` times the
    tensor's own standard deviation (at least 0.02) (safetensors, the base's config and tokenizer), its card
    naming the base (relation `finetune`, declared)."""
    import torch
    from safetensors.torch import load as load_safetensors
    from safetensors.torch import save as save_safetensors

    gen = torch.Generator().manual_seed(seed)
    tuned = {}
    for name, w in sorted(load_safetensors(base["model.safetensors"]).items()):
        # A constant tensor (a layer norm's ones, a zero bias) moves too, by a small absolute step.
        spread = max(float(w.float().std()) if w.numel() > 1 else 0.0, 0.02)
        tuned[name] = (w.float() + torch.randn(w.shape, generator=gen) * spread * scale).to(w.dtype).contiguous()
    return {**base, "model.safetensors": save_safetensors(tuned, metadata={"format": "pt"}),
            "README.md": derivative_card(base_repo, "finetune")}


def lora_adapter_files(base: Mapping[str, bytes], base_repo: str, *, rank: int = 4, alpha: int = 8,
                       module: str = "query_key_value", seed: int = 1) -> dict[str, bytes]:
    """A LoRA adapter of a tiny base as peft writes one (adapter_config.json and
    adapter_model.safetensors only, no weights of its own, no pickle), with non-zero updates;
    its card names the base and leaves the relation for the files to imply (`adapter`)."""
    import torch
    from safetensors.torch import load as load_safetensors
    from safetensors.torch import save as save_safetensors

    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, w in sorted(load_safetensors(base["model.safetensors"]).items()):
        if name.endswith(f"{module}.weight"):
            stem = "base_model.model." + name[: -len(".weight")]
            out_f, in_f = w.shape
            tensors[f"{stem}.lora_A.weight"] = torch.randn(rank, in_f, generator=gen) * 0.5
            tensors[f"{stem}.lora_B.weight"] = torch.randn(out_f, rank, generator=gen) * 0.5
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": alpha, "target_modules": [module], "bias": "none",
              "fan_in_fan_out": False, "lora_dropout": 0.0, "base_model_name_or_path": base_repo,
              "task_type": "CAUSAL_LM", "inference_mode": True}
    return {"adapter_config.json": json.dumps(config, indent=2).encode(),
            "adapter_model.safetensors": save_safetensors(tensors, metadata={"format": "pt"}),
            "README.md": derivative_card(base_repo, None, library_name="peft")}


def add_derivatives(hub: HubState, base_repo: str, *, author: str = "tune-org", revision: str = "main",
                    start: datetime = BASE_TIME) -> dict[str, str]:
    """A full fine-tune (`AUTHOR/NAME-chat`) and a LoRA adapter (`AUTHOR/NAME-lora`) of `base_repo`
    at `revision`, an hour apart from `start`; returns {repo: sha}."""
    base = hub.files(base_repo, revision)
    name = base_repo.split("/", 1)[1]
    finetune, adapter = f"{author}/{name}-chat", f"{author}/{name}-lora"
    return {finetune: hub.add_repo(finetune, finetune_files(base, base_repo), last_modified=start,
                                   title="Fine-tune", pipeline_tag="text-generation"),
            adapter: hub.add_repo(adapter, lora_adapter_files(base, base_repo), last_modified=start + timedelta(hours=1),
                                  title="LoRA adapter", pipeline_tag="text-generation", library_name="peft")}


def _filler_files(repo_id: str) -> dict[str, bytes]:
    config = {"model_type": "gpt_neox", "architectures": ["GPTNeoXForCausalLM"], "vocab_size": 1000,
              "hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
              "max_position_embeddings": 128, "_name_or_path": repo_id}
    return {"config.json": json.dumps(config).encode(), "README.md": model_card()}


def add_filler_repos(hub: HubState, n: int, *, author: str = "filler-org", prefix: str = "filler",
                     start: datetime = datetime(2020, 1, 1, tzinfo=timezone.utc),
                     step: timedelta = timedelta(minutes=1), pipeline_tag: str = "text-generation") -> list[str]:
    """Register `n` cheap config-only repos with increasing lastModified (for pagination and the poll benchmark).

    Content is built only when a repo is first read, so 50,000 repos take about a second.
    """
    ids = []
    # Tens of thousands of long-lived objects would trigger many full garbage collections
    # (half the time of a 50,000-repo hub); none of them form cycles, so pause the collector.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        for i in range(n):
            repo_id = f"{author}/{prefix}-{i:06d}"
            hub.add_lazy_repo(repo_id, functools.partial(_filler_files, repo_id), last_modified=start + step * i,
                              pipeline_tag=pipeline_tag, tags=["transformers", "gpt_neox"],
                              library_name="transformers")
            ids.append(repo_id)
    finally:
        if was_enabled:
            gc.enable()
    return ids


def _without(files: Mapping[str, bytes], *names: str) -> dict[str, bytes]:
    return {p: d for p, d in files.items() if p not in names}


def _tokenizer_only(files: Mapping[str, bytes]) -> dict[str, bytes]:
    return {p: d for p, d in files.items() if p in TOKENIZER_FILES}


def populate_standard(hub: HubState, tmpdir: str | Path, canary_dir: str | Path, *, author: str = "fake-org",
                      start: datetime = BASE_TIME) -> dict[str, Any]:
    """Add every special repo of the hub tests to `hub` and describe them.

    Returns {"author", "lineage", "canaries": [paths], "tokens": {...}, "repos": {repo_id: {
    "kind", "refs": {branch: sha}, "expect": "ok" | "refused" | "skipped", "reason": a word the
    status reason should contain, "canary": path or None, "listed": visible to an anonymous
    listing}}}. Repos get lastModified one minute apart from `start`, in the order below.
    """
    tmpdir, canary_dir = Path(tmpdir), Path(canary_dir)
    canary_dir.mkdir(parents=True, exist_ok=True)
    llama = tiny_model_files("llama-2", arch="llama", seed=1, build_dir=tmpdir)
    pickle_canary = canary_dir / "pickle_payload_ran"
    remote_canary = canary_dir / "remote_code_ran"
    repos: dict[str, dict[str, Any]] = {}
    clock = iter(start + timedelta(minutes=i) for i in range(10_000))

    def add(name: str, kind: str, files: Mapping[str, bytes], expect: str, reason: str | None = None,
            canary: Path | None = None, listed: bool = True, **meta: Any) -> str:
        repo_id = f"{author}/{name}"
        meta.setdefault("pipeline_tag", "text-generation")
        sha = hub.add_repo(repo_id, files, last_modified=next(clock), **meta)
        repos[repo_id] = {"kind": kind, "refs": {"main": sha}, "expect": expect, "reason": reason,
                          "canary": str(canary) if canary else None, "listed": listed}
        return repo_id

    add("tiny-llama", "tiny_model", llama, "ok")
    lineage = f"{author}/pythia-tiny"
    refs = add_lineage(hub, lineage, start=next(clock), interval=timedelta(seconds=10), build_dir=tmpdir)
    for _ in range(2):
        next(clock)
    repos[lineage] = {"kind": "lineage", "refs": refs, "expect": "ok", "reason": None, "canary": None, "listed": True}
    neox = hub.files(lineage, "step1000")  # the hostile repos reuse a real checkpoint: one build fewer
    neox_config = json.loads(neox["config.json"])
    sharded = {**_without(llama, "model.safetensors"), **shard_safetensors(llama["model.safetensors"], 2)}
    add("tiny-llama-sharded", "sharded_model", sharded, "ok")
    add("pickle-only", "pickle_only",
        {**_without(neox, "model.safetensors"), "pytorch_model.bin": pickle_canary_payload(pickle_canary)},
        "refused", "pickle", pickle_canary)
    add("remote-code", "remote_code", {**neox, **remote_code_files(remote_canary, neox_config)},
        "refused", "remote code", remote_canary)
    huge = header_only_safetensors({"gpt_neox.embed_in.weight": ("F32", (100_000, 50_000)),
                                    "embed_out.weight": ("F32", (100_000, 50_000))})
    huge_config = {**neox_config, "vocab_size": 100_000, "hidden_size": 50_000}
    add("over-budget", "over_budget",
        {**_tokenizer_only(neox), "config.json": json.dumps(huge_config).encode(), "model.safetensors": huge,
         "README.md": model_card()}, "refused", "budget")
    absurd_config = {**neox_config, "vocab_size": 10**9, "max_position_embeddings": 10**9}
    add("absurd-config", "absurd_config", {**neox, "config.json": json.dumps(absurd_config).encode()},
        "refused", "vocab")
    add("malformed-header", "malformed_header", {**neox, "model.safetensors": malformed_safetensors("length")},
        "refused", "header")
    add("malformed-header-json", "malformed_header", {**neox, "model.safetensors": malformed_safetensors("json")},
        "refused", "header")
    escaping = {**neox, **{name: b"written outside the cache\n" for name in ESCAPING_NAMES}}
    add("path-escape", "path_escape", escaping, "refused", "path")
    add("no-tokenizer", "no_tokenizer", _without(neox, *TOKENIZER_FILES), "refused", "tokenizer")
    add("gated-model", "gated", neox, "skipped", "gated", gated="manual")
    hub.set_gated(f"{author}/gated-model", "manual", approved_tokens=(APPROVED_TOKEN,))
    add("private-model", "private", neox, "skipped", "not found", listed=False, private=True)
    hub.set_private(f"{author}/private-model", True, member_tokens=(MEMBER_TOKEN,))
    add("disabled-model", "disabled", neox, "skipped", "disabled", disabled=True)
    return {"author": author, "lineage": lineage, "repos": repos,
            "canaries": [str(pickle_canary), str(remote_canary)],
            "tokens": {"approved": APPROVED_TOKEN, "stranger": STRANGER_TOKEN, "member": MEMBER_TOKEN}}


# ----------------------------------------------------------------------------- scenarios

def scenario_empty(hub: HubState, workdir: Path) -> dict[str, Any]:
    """No repos at all."""
    return {}


def scenario_standard(hub: HubState, workdir: Path) -> dict[str, Any]:
    """Every special repo of `populate_standard`, canaries under workdir/canaries."""
    return populate_standard(hub, workdir / "build", workdir / "canaries")


def scenario_demo(hub: HubState, workdir: Path) -> dict[str, Any]:
    """A five-step lineage whose loss falls with the step, a tiny model, and two repos the gate refuses."""
    canaries = workdir / "canaries"
    canaries.mkdir(parents=True, exist_ok=True)
    refs = add_lineage(hub, "demo-org/pythia-tiny", steps=(1000, 2000, 3000, 4000, 5000),
                       build_dir=workdir / "build")
    llama = tiny_model_files("llama-2", arch="llama", seed=1, build_dir=workdir / "build")
    neox = hub.files("demo-org/pythia-tiny", "step1000")
    later = BASE_TIME + timedelta(days=1)
    llama_sha = hub.add_repo("demo-org/tiny-llama", llama, last_modified=later, pipeline_tag="text-generation")
    pickle_canary = canaries / "pickle_payload_ran"
    pickle_sha = hub.add_repo("demo-org/pickle-only",
                              {**_without(neox, "model.safetensors"),
                               "pytorch_model.bin": pickle_canary_payload(pickle_canary)},
                              last_modified=later + timedelta(minutes=1), pipeline_tag="text-generation")
    gated_sha = hub.add_repo("demo-org/gated-model", neox, last_modified=later + timedelta(minutes=2),
                             pipeline_tag="text-generation", gated="manual")
    return {"lineage": "demo-org/pythia-tiny", "refs": refs, "canaries": [str(pickle_canary)],
            "repos": {"demo-org/tiny-llama": llama_sha, "demo-org/pickle-only": pickle_sha,
                      "demo-org/gated-model": gated_sha}}


def scenario_guide(hub: HubState, workdir: Path) -> dict[str, Any]:
    """What docs/guide.md walks through: two reference lineages with different tokenizers
    (`demo-org/neox-ref`, `demo-org/llama-ref`, steps 1000-3000) to score, label and fit a curve
    on, a live lineage (`demo-org/pythia-tiny`, steps 1000-2000) for the daemon to watch, and two
    derivatives of its `main` (`tune-org/pythia-tiny-chat`, a full fine-tune, and
    `tune-org/pythia-tiny-lora`, a LoRA adapter) that name it as their `base_model`."""
    build = workdir / "build"
    refs = {"demo-org/neox-ref": add_lineage(hub, "demo-org/neox-ref", build_dir=build, seed=3000),
            "demo-org/llama-ref": add_lineage(hub, "demo-org/llama-ref", tokenizer="llama-2", arch="llama",
                                              build_dir=build, seed=4000,
                                              start=BASE_TIME + timedelta(hours=6)),
            "demo-org/pythia-tiny": add_lineage(hub, "demo-org/pythia-tiny", steps=(1000, 2000), build_dir=build,
                                                seed=5000, start=BASE_TIME + timedelta(days=1))}
    derivatives = add_derivatives(hub, "demo-org/pythia-tiny", start=BASE_TIME + timedelta(days=2))
    return {"lineages": refs, "derivatives": derivatives}


SCENARIOS: dict[str, Callable[[HubState, Path], dict[str, Any]]] = {
    "empty": scenario_empty, "standard": scenario_standard, "demo": scenario_demo, "guide": scenario_guide}


def load_scenario(spec: str) -> Callable[[HubState, Path], dict[str, Any]]:
    """A built-in scenario by name, or `package.module:function` taking (hub, workdir)."""
    if spec in SCENARIOS:
        return SCENARIOS[spec]
    module_name, sep, func_name = spec.partition(":")
    if not sep:
        raise ValueError(f"unknown scenario {spec!r}: use one of {sorted(SCENARIOS)} or module:function")
    return getattr(importlib.import_module(module_name), func_name)
