"""Load a checkpoint safely: a local directory, or `org/name@revision` from the Hub.

Every check that can refuse a checkpoint runs on the files, before any weight is read or
any tensor allocated: safetensors only (pickle weights would run code when unpickled), no
remote code, a known causal-LM architecture, no file or link that escapes the checkpoint
folder, every weight file covered exactly by its header (`monitor.hub.safetensors_layout`), and
a config.json whose allocation-driving fields are within budget and describe the weights
(`monitor.hub.config_budget`). Loading then goes through transformers with
`use_safetensors=True`, `trust_remote_code=False` and `DISABLE_SAFETENSORS_CONVERSION=1`
(else transformers may ask an external service to convert a pickle repo and load the
result). A `SafetensorError` from the library becomes a ModelLoadError naming the file; an
ImportError (a quantization backend that is not installed) an UnsupportedCheckpointError;
any of them that says an allocation or a library's mapping failed (the address-space limit)
a MemoryError.
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from monitor.environment import disable_safetensors_conversion
from monitor.errors import (HubError, ModelLoadError, SpecError, UnsafeCheckpointError,
                            UnsupportedCheckpointError)
from monitor.hub import (Budgets, ConfigBudgetError, HubClient, LayoutError, check_against_weights,
                         check_file_size, config_shape, fetch_pinned, read_local_header, tensor_layout)
from monitor.hub.gate import gate_checkpoint
from monitor.hub.model_types import causal_model_types, known_model_types
from monitor.scoring.memory_limit import is_memory_failure

disable_safetensors_conversion()

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
# Files that define what a checkpoint computes: hashed for a local directory's identity,
# and the only files fetched from the Hub.
CHECKPOINT_FILE_PATTERNS = ("*.safetensors", "*.safetensors.index.json", "config.json",
                            "generation_config.json", "tokenizer*", "special_tokens_map.json", "*.jinja")
# Config keys that hold the longest sequence a model was built for, most specific first.
MAX_POSITION_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "max_seq_len",
                     "seq_length", "n_ctx")
# Tokenizers that do not know their model's context store a huge sentinel here.
_TOKENIZER_LENGTH_SENTINEL = 10_000_000
_HUB_REF = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?:@(?P<revision>[^\s@]+))?$")
_SHA = re.compile(r"^[0-9a-f]{40}$")


@dataclass
class LoadedCheckpoint:
    """A loaded model and everything a score must record about where it came from."""

    model: Any
    model_dir: Path
    repo: str
    sha: str
    source: str                      # "local" | "hub"
    config: dict[str, Any]
    max_positions: int | None
    n_params: int
    dtype: str
    device: str
    vocab_size: int = 0
    tied_embeddings: bool = False
    lm_head_bias: bool = False
    revision: str | None = None
    ignored_weights: tuple[str, ...] = ()      # checkpoint tensors the architecture does not use
    adapter: dict[str, Any] | None = None     # a merged LoRA adapter's facts (rank, modules)

    def as_model_info(self) -> dict[str, Any]:
        """The `model{}` object of a score."""
        architectures = self.config.get("architectures") or [type(self.model).__name__]
        return {"repo": self.repo, "sha": self.sha, "source": self.source, "revision": self.revision,
                "path": str(self.model_dir), "architecture": architectures[0],
                "model_type": self.config.get("model_type"), "n_params": self.n_params,
                "max_positions": self.max_positions, "vocab_size": self.vocab_size,
                "tied_embeddings": self.tied_embeddings, "lm_head_bias": self.lm_head_bias,
                "dtype": self.dtype, "device": self.device,
                "ignored_weights": list(self.ignored_weights[:20]),
                **({"adapter": {k: v for k, v in self.adapter.items() if k != "modules"}
                    | {"modules": list(self.adapter.get("modules", []))[:50]}} if self.adapter else {})}


# --------------------------------------------------------------------------- checks on files


def _read_json(path: Path, what: str) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"cannot read {what} {path}: {exc}") from exc
    if not isinstance(value, dict):
        raise ModelLoadError(f"{what} {path} is not a JSON object")
    return value


def _check_inside(path: Path, root: Path) -> None:
    """Refuse any entry (link or not) whose real location is outside `root`."""
    for entry in [path, *path.rglob("*")]:
        real = entry.resolve()
        if real != root and root not in real.parents:
            raise UnsafeCheckpointError(f"{entry} points outside the checkpoint folder (to {real})",
                                        hint="copy the checkpoint into one folder without links out of it")


def _inspect_checkpoint_dir(path: Path, allowed_root: Path | None = None) -> dict[str, Any]:
    path = Path(path)
    if not path.is_dir():
        raise ModelLoadError(f"checkpoint folder {path} does not exist",
                             hint="pass a local checkpoint folder or a Hub reference org/name@revision")
    root = (allowed_root or path).resolve()
    _check_inside(path, root)
    config_path = path / "config.json"
    if not config_path.is_file():
        raise ModelLoadError(f"{path} has no config.json",
                             hint="a checkpoint folder needs config.json and *.safetensors")
    names = [p.name for p in path.iterdir() if p.is_file()]
    safetensors = [n for n in names if n.endswith(".safetensors")]
    pickles = [n for n in names if n.endswith(PICKLE_SUFFIXES)]
    if not safetensors and pickles:
        raise UnsafeCheckpointError(
            f"{path} has only pickle weights ({', '.join(sorted(pickles))}); loading them could run code",
            hint="use a checkpoint with *.safetensors weights")
    if not safetensors:
        raise ModelLoadError(f"{path} has no *.safetensors weights")
    shards: set[str] = set()
    for index in [n for n in names if n.endswith(".safetensors.index.json")]:
        weight_map = _read_json(path / index, "weight index").get("weight_map", {})
        for shard in sorted(set(weight_map.values())):
            shard_path = path / shard
            if "/" in shard or "\\" in shard or shard.startswith("."):
                raise UnsafeCheckpointError(f"{path / index} names shard {shard!r} outside the folder")
            if not shard_path.is_file():
                raise ModelLoadError(f"{path / index} lists {shard} but the file is missing")
            shards.add(shard)

    config = _read_json(config_path, "config")
    model_type = config.get("model_type")
    known, causal = known_model_types(), causal_model_types()
    if model_type not in known:
        if config.get("auto_map") or any(n.endswith(".py") for n in names):
            raise UnsafeCheckpointError(
                f"{config_path} needs remote code (auto_map, model_type {model_type!r} unknown to transformers)",
                hint="only architectures built into transformers are loaded; remote code is never run")
        raise ModelLoadError(f"{config_path}: unknown architecture, model_type {model_type!r}",
                             hint="upgrade transformers or score a supported architecture")
    if model_type not in causal:
        raise ModelLoadError(f"{config_path}: model_type {model_type!r} is not a causal language model")
    # The weights transformers loads: model.safetensors, else the indexed shards.
    loaded = ["model.safetensors"] if "model.safetensors" in safetensors else sorted(shards or safetensors)
    _check_weights_and_budgets(path, loaded, config)
    return config


def _check_weights_and_budgets(path: Path, safetensors: list[str], config: dict[str, Any]) -> None:
    """Exact layout of every weight file, then config.json's fields against budgets and weights."""
    n_params = n_bytes = 0
    for name in safetensors:
        file = path / name
        try:
            header = read_local_header(file)
            layout = tensor_layout(header)
        except LayoutError as exc:
            raise ModelLoadError(f"malformed safetensors header in {file}: {exc}",
                                 hint="the file is damaged or not safetensors; fetch it again") from None
        except OSError as exc:
            raise ModelLoadError(f"cannot read {file}: {exc}") from None
        try:
            check_file_size(header, layout, file.stat().st_size)
        except LayoutError as exc:
            raise ModelLoadError(f"safetensors file {file} is {exc}",
                                 hint="the file is damaged or incomplete; fetch it again") from None
        n_params += layout.n_params
        n_bytes += layout.data_end
    budgets = Budgets()
    try:
        check_against_weights(config_shape(config, budgets), n_params, n_bytes, budgets)
    except ConfigBudgetError as exc:
        raise ModelLoadError(f"{path}: {exc}", hint="refused before anything was allocated") from None


def check_checkpoint_dir(path: str | Path, *, allowed_root: str | Path | None = None) -> None:
    """Refuse a checkpoint folder before anything is loaded from it.

    Raises UnsafeCheckpointError for pickle-only weights, remote code, or an entry that
    resolves outside the folder (outside `allowed_root` when given, e.g. a Hub cache repo
    folder whose snapshots link to its blobs); ModelLoadError for a missing config.json,
    missing weights or shards, or an architecture transformers does not know.
    """
    _inspect_checkpoint_dir(Path(path), Path(allowed_root) if allowed_root else None)


def checkpoint_hash(path: str | Path) -> str:
    """Identity of a local checkpoint: sha256 over `relative path \\t file sha256 \\n` of its
    config, weight and tokenizer files in sorted path order (stable across copies)."""
    path = Path(path)
    files = sorted(p for p in path.rglob("*")
                   if p.is_file() and any(fnmatch.fnmatch(p.name, pat) for pat in CHECKPOINT_FILE_PATTERNS))
    roll = hashlib.sha256()
    for file in files:
        digest = hashlib.sha256()
        with file.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
        roll.update(f"{file.relative_to(path).as_posix()}\t{digest.hexdigest()}\n".encode("utf-8"))
    return roll.hexdigest()


def max_positions_from_config(config: dict[str, Any], tokenizer_config: dict[str, Any] | None = None) -> int | None:
    """Longest sequence the model takes: the config's position limit, capped by the
    tokenizer's `model_max_length` when that is a real length rather than a sentinel."""
    found = None
    for scope in (config, config.get("text_config") or {}):
        for key in MAX_POSITION_KEYS:
            value = scope.get(key)
            if isinstance(value, int) and value > 0:
                found = value
                break
        if found is not None:
            break
    limit = (tokenizer_config or {}).get("model_max_length")
    if isinstance(limit, (int, float)) and 0 < limit < _TOKENIZER_LENGTH_SENTINEL:
        found = int(limit) if found is None else min(found, int(limit))
    return found


# --------------------------------------------------------------------------- Hub


def _transport_errors() -> tuple[type[BaseException], ...]:
    """Connection-level failures of whichever HTTP client huggingface_hub uses."""
    errors: list[type[BaseException]] = [OSError]
    for name in ("httpx2", "httpx"):
        try:
            module = __import__(name)
        except ImportError:
            continue
        errors.append(module.TransportError)
    return tuple(errors)


def parse_hub_ref(ref: str) -> tuple[str, str] | None:
    """`org/name@revision` → (repo, revision); revision defaults to 'main'. None when `ref`
    is not a Hub reference."""
    match = _HUB_REF.match(ref)
    if match is None:
        return None
    return match["repo"], match["revision"] or "main"


def resolve_hub_revision(repo: str, revision: str, *, endpoint: str | None = None) -> str:
    """The 40-hex commit sha that `revision` (branch, tag or sha) of `repo` points at now.
    `endpoint` defaults to the client's configured one (`HF_ENDPOINT` when it was imported)."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import (GatedRepoError, HfHubHTTPError, RepositoryNotFoundError,
                                        RevisionNotFoundError)

    try:
        info = HfApi(endpoint=endpoint).model_info(repo, revision=revision)
    except GatedRepoError as exc:
        raise HubError(f"{repo} is gated", hint="accept its terms on the Hub and set HF_TOKEN") from exc
    except RevisionNotFoundError as exc:
        raise HubError(f"{repo} has no revision {revision!r}", hint="check the branch, tag or sha") from exc
    except RepositoryNotFoundError as exc:
        raise HubError(f"{repo} not found on the Hub (or private)", hint="check the repo id or set HF_TOKEN") from exc
    except HfHubHTTPError as exc:
        raise HubError(f"the Hub refused model_info for {repo}@{revision}: {exc}") from exc
    except _transport_errors() as exc:
        raise HubError(f"cannot reach the Hub for {repo}@{revision}: {exc}",
                       hint="check the network or HF_ENDPOINT") from exc
    sha = getattr(info, "sha", None)
    if not isinstance(sha, str) or not _SHA.match(sha):
        raise HubError(f"the Hub gave no commit sha for {repo}@{revision}")
    return sha


def download_hub_checkpoint(repo: str, sha: str, cache_dir: str | Path | None = None, *,
                            endpoint: str | None = None) -> tuple[Path, Path]:
    """Fetch the checkpoint files of `repo` pinned at commit `sha` through the gate's verified
    download (sizes and LFS sha256 checked, paths kept inside the cache).

    The watcher's gate runs first (`monitor.hub.gate`: file list, config.json within its
    budget and without remote code, the safetensors headers by range requests), so a repo
    it refuses costs no weight byte: UnsafeCheckpointError with the gate's reason, or
    HubError when the Hub will not serve the repo.

    Returns (snapshot folder, repo cache folder its links may point into).
    """
    client = HubClient(endpoint)
    verdict = gate_checkpoint(client, repo, sha, cache_dir=cache_dir)
    if verdict.status != "gated":
        where = f"{repo}@{sha}"
        if verdict.meta.get("gate", {}).get("verdict") == "refused":
            raise UnsafeCheckpointError(f"{where}: {verdict.reason}",
                                        hint="nothing but config.json and the safetensors headers was fetched")
        raise HubError(f"{where}: {verdict.reason}", hint="check the repo id, its access, or HF_TOKEN")
    snapshot = fetch_pinned(repo, sha, cache_dir=cache_dir, client=client)
    # snapshots/<sha>/ links into the repo's blobs/: both live under the repo cache folder
    return snapshot, snapshot.parent.parent


# --------------------------------------------------------------------------- loading


def _attach_unloaded_head_bias(model: Any, model_dir: Path, unexpected: set[str]) -> bool:
    """Give the output layer the bias the checkpoint stores but the architecture lacks.

    transformers drops such a key as 'unexpected' (e.g. `lm_head.bias` on Llama); scoring
    without it would give the wrong distribution. The file key may carry the checkpoint's
    own module name (`embed_out.bias` for GPT-NeoX), so it is found by shape among the
    bias tensors that no model parameter took.
    """
    import torch
    from safetensors import safe_open

    head = model.get_output_embeddings()
    if getattr(head, "bias", None) is not None or not any(k.endswith(".bias") for k in unexpected):
        return getattr(head, "bias", None) is not None
    vocab = int(head.weight.shape[0])
    taken = set(model.state_dict())
    found: list[tuple[Path, str]] = []
    for file in sorted(model_dir.glob("*.safetensors")):
        with _safetensors_errors(file), safe_open(str(file), framework="pt") as handle:
            for key in handle.keys():
                if key.endswith(".bias") and key not in taken and list(handle.get_slice(key).get_shape()) == [vocab]:
                    found.append((file, key))
    if not found:
        return False
    if len(found) > 1:
        raise ModelLoadError(f"{model_dir}: several unloaded vocabulary-sized biases "
                             f"({', '.join(k for _, k in found)}); cannot tell which belongs to the output layer")
    file, key = found[0]
    with _safetensors_errors(file), safe_open(str(file), framework="pt") as handle:
        bias = handle.get_tensor(key)
    head.bias = torch.nn.Parameter(bias.to(dtype=head.weight.dtype, device=head.weight.device), requires_grad=False)
    return True


@contextlib.contextmanager
def _safetensors_errors(file: Path):
    """A SafetensorError while reading `file` as one ModelLoadError naming it."""
    from safetensors import SafetensorError

    try:
        yield
    except SafetensorError as exc:
        raise ModelLoadError(f"safetensors cannot read {file}: {' '.join(str(exc).split())[:300]}",
                             hint="the file is damaged or incomplete; fetch it again") from None


def _unreadable_safetensors(model_dir: Path, exc: BaseException) -> ModelLoadError:
    """The ModelLoadError for a SafetensorError during loading, naming the file at fault."""
    from safetensors import SafetensorError, safe_open

    for file in sorted(model_dir.glob("*.safetensors")):
        try:
            with safe_open(str(file), framework="pt"):
                pass
        except SafetensorError as probe:
            exc = probe
            break
    else:
        file = model_dir
    return ModelLoadError(f"safetensors cannot read {file}: {' '.join(str(exc).split())[:300]}",
                          hint="the file is damaged or incomplete; fetch it again")


def _missing_backend(model_dir: Path, exc: ImportError) -> UnsupportedCheckpointError:
    """The error for an ImportError while loading: a package the checkpoint needs is missing."""
    config = _read_json(model_dir / "config.json", "config")
    quantization = config.get("quantization_config")
    method = quantization.get("quant_method") if isinstance(quantization, dict) else None
    what = (f"its quantization_config (quant_method {method!r}) needs a package that is not installed"
            if quantization is not None else "it needs a package that is not installed")
    return UnsupportedCheckpointError(f"{model_dir / 'config.json'}: {what}: {' '.join(str(exc).split())[:300]}",
                                      hint="install that backend to score it; it is skipped, not retried")


def device_map_options(device_map: str | None, device: str) -> dict[str, Any]:
    """The `from_pretrained` options that place the model: none (it is moved to `device`
    after loading), or `device_map` to spread its layers over the GPUs of this machine
    (accelerate decides; "auto" fills them in order). Only on CUDA: on a CPU there is
    nothing to spread over."""
    if device_map is None:
        return {}
    if device_map != "auto":
        raise SpecError(f"device_map {device_map!r} is not supported", hint="use device_map 'auto' or none")
    if not device.startswith("cuda"):
        raise SpecError(f"device_map 'auto' spreads a model over GPUs but the device is {device}",
                        hint="score with --device cuda, or leave device_map unset")
    return {"device_map": "auto"}


def _load_model(model_dir: Path, dtype: str, device: str,
                device_map: str | None = None) -> tuple[Any, bool, tuple[str, ...]]:
    import torch
    from safetensors import SafetensorError
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    from monitor.scoring.forward import torch_dtype

    placement = device_map_options(device_map, device)
    disable_safetensors_conversion()
    assert os.environ.get("DISABLE_SAFETENSORS_CONVERSION") == "1"
    # transformers' own bar and load report would interleave with ours; what its report
    # says (missing / unexpected keys) is checked and recorded below instead
    verbosity, bar_enabled = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        model, info = AutoModelForCausalLM.from_pretrained(
            str(model_dir), use_safetensors=True, trust_remote_code=False, local_files_only=True,
            dtype=torch_dtype(dtype), output_loading_info=True, **placement)
    except (ImportError, SafetensorError, OSError, ValueError, KeyError, RuntimeError, TypeError) as exc:
        if is_memory_failure(str(exc)):
            # An allocation, or a library that no longer fits the address-space limit: not the
            # checkpoint's fault, and not a missing package.
            raise MemoryError(f"loading {model_dir}: {' '.join(str(exc).split())[:300]}") from exc
        if isinstance(exc, ImportError):
            raise _missing_backend(model_dir, exc) from exc
        if isinstance(exc, SafetensorError):
            raise _unreadable_safetensors(model_dir, exc) from exc
        raise ModelLoadError(f"transformers cannot load {model_dir}: {' '.join(str(exc).split())[:400]}") from exc
    finally:
        hf_logging.set_verbosity(verbosity)
        if bar_enabled:
            hf_logging.enable_progress_bar()
    missing = set(info.get("missing_keys") or ())
    if missing:
        raise ModelLoadError(f"{model_dir} lacks weights for {', '.join(sorted(missing)[:5])}"
                             + (" ..." if len(missing) > 5 else ""),
                             hint="the checkpoint is incomplete or of another architecture")
    model.eval()
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    unexpected = set(info.get("unexpected_keys") or ())
    has_bias = _attach_unloaded_head_bias(model, model_dir, unexpected)
    head_name = next(name for name, module in model.named_modules() if module is model.get_output_embeddings())
    ignored = tuple(sorted(unexpected - ({f"{head_name}.bias"} if has_bias else set())))
    if not placement:  # with a device_map, accelerate has placed every layer already
        model.to(torch.device(device))
    return model, has_bias, ignored


def check_adapter_dir(path: Path, allowed_root: Path | None = None) -> dict[str, Any]:
    """The checks of `monitor.hub.adapter` on a local adapter folder, before peft reads it:
    files inside the folder (or `allowed_root`), no pickle file, a bounded LoRA config and
    safetensors weights covered exactly by their header."""
    from monitor.hub.adapter import ADAPTER_CONFIG, ADAPTER_CONFIG_MAX_BYTES, ADAPTER_WEIGHTS, check_adapter_config

    path = path.expanduser()
    if not path.is_dir():
        raise ModelLoadError(f"no adapter folder at {path}")
    root = (allowed_root or path).resolve()
    for entry in path.rglob("*"):
        _check_inside(entry, root)
        if entry.name.lower().endswith(PICKLE_SUFFIXES):
            raise UnsafeCheckpointError(f"{entry}: pickle files are never loaded (adapter)")
    config_file = path / ADAPTER_CONFIG
    if not config_file.is_file() or config_file.stat().st_size > ADAPTER_CONFIG_MAX_BYTES:
        raise ModelLoadError(f"{path} has no {ADAPTER_CONFIG} of at most {ADAPTER_CONFIG_MAX_BYTES:,} bytes")
    try:
        facts = check_adapter_config(_read_json(config_file, "adapter config"))
    except Exception as exc:  # GateRefusedError: the same refusal the gate makes
        raise UnsafeCheckpointError(f"{config_file}: {getattr(exc, 'message', exc)}") from None
    weights = path / ADAPTER_WEIGHTS
    if not weights.is_file():
        raise ModelLoadError(f"{path} has no {ADAPTER_WEIGHTS}")
    try:
        header = read_local_header(weights)
        check_file_size(header, tensor_layout(header), weights.stat().st_size)
    except LayoutError as exc:
        raise ModelLoadError(f"{weights}: {exc}") from None
    return {**facts, "header": header}


def _merge_adapter(model: Any, adapter_dir: Path, allowed_root: Path | None) -> tuple[Any, dict[str, Any]]:
    """The loaded base with the adapter merged in, after its shapes are checked against the
    base's parameters (the same check the gate made against the base's headers)."""
    from monitor.hub.adapter import check_adapter_shapes, merge_lora
    from monitor.hub.safetensors_layout import SafetensorsHeader

    facts = check_adapter_dir(adapter_dir, allowed_root)
    params = SafetensorsHeader(header_len=0, tensors={name: {"shape": list(t.shape)}
                                                       for name, t in model.state_dict().items()})
    try:
        shapes = check_adapter_shapes(facts.pop("header"), {"base": params}, facts["r"], facts["target_modules"])
    except Exception as exc:  # GateRefusedError
        raise UnsafeCheckpointError(f"{adapter_dir}: {getattr(exc, 'message', exc)}") from None
    from monitor.hub.adapter import ADAPTER_WEIGHTS

    try:
        merged = merge_lora(model, str(adapter_dir / ADAPTER_WEIGHTS), {**facts, **shapes})
    except ValueError as exc:
        raise ModelLoadError(f"{adapter_dir}: {exc}") from None
    return merged, {**facts, **shapes}


def load_checkpoint(ref: str, *, dtype: str = "auto", device: str = "auto",
                    cache_dir: str | Path | None = None, endpoint: str | None = None,
                    allowed_root: str | Path | None = None, device_map: str | None = None,
                    adapter: str | Path | None = None, adapter_root: str | Path | None = None) -> LoadedCheckpoint:
    """Load `ref` (a local checkpoint folder, or `org/name[@revision]` from the Hub, pinned to
    the commit sha the revision resolves to) in the resolved dtype on the resolved device.

    `device_map="auto"` (CUDA only) spreads a model larger than one GPU over the GPUs of this
    machine instead of moving it whole to `device`; it is checked before anything is read.

    A local folder's files must resolve inside it, or inside `allowed_root` when given (a Hub
    cache snapshot links into its repo's `blobs/`). With `adapter` (a LoRA adapter folder, its
    files inside it or `adapter_root`), `ref` is its base and the adapter is merged into it
    before anything is scored."""
    from monitor.scoring.forward import resolve_device, resolve_dtype

    device = resolve_device(device)
    dtype = resolve_dtype(dtype, device)
    device_map_options(device_map, device)   # refuse a bad placement before any download
    local = Path(ref).expanduser()
    hub_ref = None if local.exists() else parse_hub_ref(ref)
    if hub_ref is None:
        config = _inspect_checkpoint_dir(local, Path(allowed_root) if allowed_root else None)
        model_dir, source, revision = local.resolve(), "local", None
        repo, sha = str(model_dir), checkpoint_hash(local)
    else:
        repo, revision = hub_ref
        try:
            sha = resolve_hub_revision(repo, revision, endpoint=endpoint)
        except HubError as exc:
            if "@" in ref:
                raise
            raise HubError(exc.message, hint=f"there is no local folder {ref} either; "
                           "pass an existing folder or a Hub repo id") from exc
        model_dir, repo_cache = download_hub_checkpoint(repo, sha, cache_dir, endpoint=endpoint)
        config = _inspect_checkpoint_dir(model_dir, repo_cache)
        source = "hub"
    tokenizer_config_path = model_dir / "tokenizer_config.json"
    tokenizer_config = (_read_json(tokenizer_config_path, "tokenizer config")
                        if tokenizer_config_path.is_file() else None)
    model, has_bias, ignored = _load_model(model_dir, dtype, device, device_map)
    adapter_info = None
    if adapter is not None:
        model, adapter_info = _merge_adapter(model, Path(adapter), Path(adapter_root) if adapter_root else None)
    head, embed = model.get_output_embeddings(), model.get_input_embeddings()
    tied = embed is not None and head.weight.data_ptr() == embed.weight.data_ptr()
    return LoadedCheckpoint(
        model=model, model_dir=model_dir, repo=repo, sha=sha, source=source, config=config,
        max_positions=max_positions_from_config(config, tokenizer_config),
        n_params=sum(p.numel() for p in model.parameters()), dtype=dtype, device=device,
        vocab_size=int(head.weight.shape[0]), tied_embeddings=tied, lm_head_bias=has_bias, revision=revision,
        ignored_weights=ignored, adapter=adapter_info)
