"""The gate before any weight byte.

`gate_checkpoint` decides from the Hub's metadata alone (plus config.json, a small file,
and the safetensors headers read by range requests) whether a (repo, commit) may be
fetched: safetensors weights only, no remote code, a tokenizer present, file names that
stay inside the cache, and budgets: parameters and bytes of the weights, every config
field that sizes an allocation (`monitor.hub.config_budget`), and a byte limit on every other
file it would fetch. Each weight file must be covered exactly by its header
(`monitor.hub.safetensors_layout`): a truncated or padded file is refused with the numbers.
Repos the Hub will not serve (gated, private, disabled, missing) are skipped with the
Hub's reason. What passes is downloaded by `monitor.hub.fetch`.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from monitor.errors import GateRefusedError, HubError, IntegrityError
from monitor.events import event
from monitor.hub.client import HubClient, describe_error, refusal_reason
from monitor.hub.adapter import (ADAPTER_CONFIG, ADAPTER_CONFIG_MAX_BYTES, ADAPTER_WEIGHTS, adapter_base,
                                 check_adapter_config, check_adapter_shapes)
from monitor.hub.lineage import DeclaredBase, Lineage, declared_base
from monitor.hub.model_types import known_model_types
from monitor.hub.config_budget import ConfigBudgetError, ConfigShape, check_against_weights, config_shape
from monitor.hub.rules import Budgets, WatchRule
from monitor.hub.safetensors_layout import LayoutError, SafetensorsHeader, check_file_size, tensor_layout
from monitor.store import Store, utcnow

WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"
CONFIG_FILE = "config.json"
TOKENIZER_FILE = "tokenizer.json"
# Small files a transformers checkpoint may need besides weights, config and tokenizer.json.
OPTIONAL_FILES = ("generation_config.json", "tokenizer_config.json", "special_tokens_map.json",
                  "added_tokens.json")
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle", ".joblib")
CONFIG_MAX_BYTES = 1 << 20
TOKENIZER_MAX_BYTES = 64 << 20
# The most bytes each file besides the weights may have (the weights are under
# Budgets.max_bytes). Checked against the Hub's listing before a download, and enforced
# while downloading in case the server sends more than it announced.
FILE_BYTE_LIMITS = {CONFIG_FILE: CONFIG_MAX_BYTES, TOKENIZER_FILE: TOKENIZER_MAX_BYTES,
                    WEIGHTS_INDEX: 16 << 20, "generation_config.json": 1 << 20,
                    "tokenizer_config.json": 16 << 20, "special_tokens_map.json": 1 << 20,
                    "added_tokens.json": 16 << 20, "adapter_config.json": 1 << 20}
COMMIT_RE = re.compile(r"[0-9a-f]{40}")


def unsafe_name_reason(name: str) -> str | None:
    """Why a repo file name could escape the snapshot folder, or None if it is safe."""
    if not name or "\x00" in name or any(ord(ch) < 32 for ch in name):
        return "empty or control characters"
    if "\\" in name:
        return "backslash"
    if name.startswith("/") or re.match(r"^[A-Za-z]:", name):
        return "absolute path"
    parts = name.split("/")
    if ".." in parts:
        return "parent-directory component '..'"
    if any(part in ("", ".") for part in parts):
        return "empty or '.' path component"
    return None


@dataclass(frozen=True)
class ExpectedFile:
    """A file of the pinned snapshot and what the Hub announced about it."""

    name: str
    size: int
    sha256: str | None = None   # LFS files
    blob_id: str | None = None  # git blob sha1 (regular files)


@dataclass
class Verdict:
    """The gate's decision for one (repo, commit)."""

    status: str                 # gated | skipped
    reason: str | None
    meta: dict[str, Any] = field(default_factory=dict)


def _siblings(info: Any) -> dict[str, Any]:
    return {s.rfilename: s for s in (info.siblings or [])}


def _announced(name: str, sibling: Any) -> ExpectedFile:
    lfs = sibling.lfs
    size = lfs.size if lfs is not None else sibling.size
    if size is None:
        raise GateRefusedError(f"the Hub announced no size for {name}; it cannot be verified")
    return ExpectedFile(name, int(size), sha256=(lfs.sha256 if lfs is not None else None),
                        blob_id=(None if lfs is not None else sibling.blob_id))


def check_file_names(names: Sequence[str], cache_dir: Path) -> None:
    """Refuse the repo if any file name could land outside the snapshot folder."""
    root = cache_dir.resolve()
    probe = root / "models--probe" / "snapshots" / ("0" * 40)
    for name in names:
        why = unsafe_name_reason(name)
        if why is None and not Path(os.path.normpath(probe / name)).is_relative_to(probe):
            why = "resolves outside the cache"
        if why is not None:
            raise GateRefusedError(f"unsafe file path {name!r} ({why})")


def weight_files(info: Any) -> list[str]:
    """Root-level safetensors weights the model loads from; refuses pickle-only repos."""
    names = _siblings(info)
    if WEIGHTS_FILE in names:
        return [WEIGHTS_FILE]
    if WEIGHTS_INDEX in names:
        return [WEIGHTS_INDEX]  # shards are read from the index
    pickles = sorted(n for n in names if n.lower().endswith(PICKLE_SUFFIXES))
    if pickles:
        raise GateRefusedError(f"pickle weights refused ({', '.join(pickles[:3])}); "
                               "only safetensors are ever loaded")
    raise GateRefusedError(f"no {WEIGHTS_FILE} or {WEIGHTS_INDEX} in the repo")


def check_file_budgets(files: Sequence[ExpectedFile]) -> None:
    """Refuse any file besides the weights that the Hub announces over its byte limit."""
    for f in files:
        limit = FILE_BYTE_LIMITS.get(f.name)
        if limit is not None and f.size > limit:
            raise GateRefusedError(f"{f.name} is {f.size:,} bytes (limit {limit:,})")


def check_config(config: Any, budgets: Budgets) -> tuple[dict[str, Any], ConfigShape]:
    """Remote code, architecture, quantization and every allocation-driving field of config.json.

    Returns the facts to record and the fields found, which `check_against_weights`
    later compares with the safetensors headers.
    """
    if not isinstance(config, dict):
        raise GateRefusedError("config.json is not a JSON object")
    model_type = config.get("model_type")
    known = known_model_types()
    if config.get("auto_map") and model_type not in known:
        raise GateRefusedError(f"remote code: config.json has auto_map for model_type {model_type!r}, "
                               "which transformers does not implement (trust_remote_code is never set)")
    if model_type not in known:
        raise GateRefusedError(f"unknown model_type {model_type!r} in config.json")
    quantization = config.get("quantization_config")
    if quantization is not None and not isinstance(quantization, dict):
        raise GateRefusedError("config.json: quantization_config is not a JSON object")
    try:
        shape = config_shape(config, budgets)
    except ConfigBudgetError as exc:
        raise GateRefusedError(str(exc)) from None
    facts = {"model_type": model_type, "vocab_size": shape.get("vocab"),
             "max_positions": shape.get("positions"), "auto_map_ignored": bool(config.get("auto_map")),
             "quantization": quantization.get("quant_method") if quantization else None,
             "config_fields": {shape.keys[name]: value for name, value in shape.values.items()
                               if value is not None}}
    return facts, shape


def read_headers(client: HubClient, repo: str, sha: str, weights: list[str], siblings: dict[str, Any],
                 cache_dir: Path) -> dict[str, SafetensorsHeader]:
    """{file: SafetensorsHeader} for the model's weight files, by range requests.

    Only the header bytes are read (bounded by the file size the Hub announced); the
    sharded index goes into our cache.
    """
    names = weights
    if weights == [WEIGHTS_INDEX]:
        names = _index_shards(client, repo, sha, siblings, cache_dir)
    headers = {}
    for name in names:
        try:
            headers[name] = client.safetensors_header(repo, name, sha,
                                                      file_size=_announced(name, siblings[name]).size)
        except LayoutError as exc:
            raise GateRefusedError(f"malformed safetensors header in {name}: {exc}") from None
    return headers


def _index_shards(client: HubClient, repo: str, sha: str, siblings: dict[str, Any],
                  cache_dir: Path) -> list[str]:
    """The shard files the weight index names, each checked to be a safe repo file."""
    announced = _announced(WEIGHTS_INDEX, siblings[WEIGHTS_INDEX])
    check_file_budgets([announced])
    index_path = client.download(repo, WEIGHTS_INDEX, sha, cache_dir=cache_dir, max_bytes=announced.size)
    try:
        weight_map = json.loads(index_path.read_text(encoding="utf-8"))["weight_map"]
        shards = sorted(set(weight_map.values()))
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError) as exc:
        raise GateRefusedError(f"{WEIGHTS_INDEX} is malformed: {exc}") from exc
    if not shards or not all(isinstance(s, str) for s in shards):
        raise GateRefusedError(f"{WEIGHTS_INDEX} names no shard files")
    check_file_names(shards, cache_dir)
    missing = [name for name in shards if name not in siblings]
    if missing:
        raise GateRefusedError(f"{WEIGHTS_INDEX} names shards not in the repo: {', '.join(missing)}")
    return shards


def check_safetensors(headers: dict[str, SafetensorsHeader], announced: dict[str, ExpectedFile],
                      budgets: Budgets) -> dict[str, Any]:
    """Validate every tensor entry of the headers, count parameters, apply the budgets, and
    check that each file is exactly 8 bytes + its header + its tensor data.

    The parameter budget is checked before the file sizes, so a header declaring a huge
    model is reported as over budget rather than as merely inconsistent.
    """
    n_params = 0
    dtypes: dict[str, int] = {}
    layouts = {}
    for filename, header in headers.items():
        if filename not in announced:
            raise GateRefusedError(f"malformed safetensors index: {filename} is not in the repo")
        try:
            layout = layouts[filename] = tensor_layout(header)
        except LayoutError as exc:
            raise GateRefusedError(f"malformed safetensors header in {filename}: {exc}") from None
        n_params += layout.n_params
        for dtype, count in layout.dtypes.items():
            dtypes[dtype] = dtypes.get(dtype, 0) + count
    if n_params > budgets.max_params:
        raise GateRefusedError(f"over budget: {n_params:,} parameters > max_params "
                               f"{budgets.max_params:,}")
    # What loading would need: the larger of the declared files and the files' sizes.
    n_bytes = max(sum(layouts[name].file_size(headers[name].header_len) for name in layouts),
                  sum(announced[name].size for name in layouts))
    if n_bytes > budgets.max_bytes:
        raise GateRefusedError(f"over budget: {n_bytes:,} bytes of weights > max_bytes "
                               f"{budgets.max_bytes:,}")
    for filename, layout in layouts.items():
        try:
            check_file_size(headers[filename], layout, announced[filename].size)
        except LayoutError as exc:
            raise GateRefusedError(f"safetensors file {filename} is {exc}") from None
    return {"n_params": n_params, "dtypes": dtypes, "n_bytes": n_bytes,
            "tensor_bytes": sum(layout.data_end for layout in layouts.values())}


def _read_config(client: HubClient, repo: str, sha: str, cache_dir: Path, size: int | None) -> Any:
    if size is not None and size > CONFIG_MAX_BYTES:
        raise GateRefusedError(f"config.json is {size:,} bytes (limit {CONFIG_MAX_BYTES:,})")
    path = client.download(repo, CONFIG_FILE, sha, cache_dir=cache_dir,
                           max_bytes=min(size, CONFIG_MAX_BYTES) if size is not None else CONFIG_MAX_BYTES)
    if not path.resolve().is_relative_to(cache_dir.resolve()):
        raise GateRefusedError("config.json resolved outside the cache")
    try:
        return json.loads(path.read_bytes()[:CONFIG_MAX_BYTES + 1])
    except (ValueError, UnicodeDecodeError) as exc:
        raise GateRefusedError(f"config.json is not valid JSON: {exc}") from exc


def _read_small_json(client: HubClient, repo: str, sha: str, cache_dir: Path, name: str, size: int | None,
                     limit: int) -> Any:
    if size is not None and size > limit:
        raise GateRefusedError(f"{name} is {size:,} bytes (limit {limit:,})")
    path = client.download(repo, name, sha, cache_dir=cache_dir, max_bytes=min(size, limit) if size is not None else limit)
    if not path.resolve().is_relative_to(cache_dir.resolve()):
        raise GateRefusedError(f"{name} resolved outside the cache")
    try:
        return json.loads(path.read_bytes()[:limit + 1])
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise GateRefusedError(f"{name} is not valid JSON: {type(exc).__name__}") from exc


def _gate_adapter(client: HubClient, repo: str, sha: str, info: Any, siblings: dict[str, Any], budgets: Budgets,
                  rule: WatchRule | None, cache_dir: Path) -> dict[str, Any]:
    """Gate a LoRA adapter repo (`monitor.hub.adapter`): its config and header, its pinned
    base through the whole gate, and every adapter shape against the base's headers."""
    if ADAPTER_WEIGHTS not in siblings:
        pickles = sorted(n for n in siblings if n.lower().endswith(PICKLE_SUFFIXES))
        raise GateRefusedError(f"pickle adapter weights refused ({', '.join(pickles[:3])}); only safetensors "
                               "are ever loaded" if pickles else f"an adapter without {ADAPTER_WEIGHTS}")
    config_sibling = siblings[ADAPTER_CONFIG]
    adapter = check_adapter_config(_read_small_json(client, repo, sha, cache_dir, ADAPTER_CONFIG,
                                                    config_sibling.size, ADAPTER_CONFIG_MAX_BYTES))
    declared = declared_base(getattr(info, "card_data", None), siblings, None)
    declared = adapter_base(declared, adapter["base_model_name_or_path"])
    base_repo = declared.base_repo
    assert base_repo is not None
    lineage = pin_base(client, declared)
    assert lineage is not None
    if lineage.base_sha is None:
        raise GateRefusedError(f"the adapter's base {base_repo} could not be pinned ({lineage.problem})")
    base_sha = lineage.base_sha
    try:
        base_facts = _gate(client, base_repo, base_sha, budgets, None, cache_dir, adapters=False)
    except GateRefusedError as exc:
        raise GateRefusedError(f"base {base_repo}@{base_sha[:12]} refused: {exc.message}") from None
    base_info = client.model_info(base_repo, base_sha, files_metadata=True)
    base_siblings = _siblings(base_info)
    base_headers = read_headers(client, base_repo, base_sha, weight_files(base_info), base_siblings, cache_dir)
    announced = _announced(ADAPTER_WEIGHTS, siblings[ADAPTER_WEIGHTS])
    try:
        header = client.safetensors_header(repo, ADAPTER_WEIGHTS, sha, file_size=announced.size)
        check_file_size(header, tensor_layout(header), announced.size)
    except LayoutError as exc:
        raise GateRefusedError(f"malformed safetensors in {ADAPTER_WEIGHTS}: {exc}") from None
    shapes = check_adapter_shapes(header, base_headers, adapter["r"], adapter["target_modules"])
    total = base_facts["n_bytes"] + announced.size
    if total > budgets.max_bytes:
        raise GateRefusedError(f"over budget: {total:,} bytes of base and adapter weights > max_bytes "
                               f"{budgets.max_bytes:,}")
    if rule is not None and not rule.params_in_range(base_facts["n_params"]):
        raise GateRefusedError(f"{base_facts['n_params']:,} parameters is outside rule "
                               f"{rule.name!r}'s range [{rule.min_params}, {rule.max_params}]")
    own = [ADAPTER_CONFIG, ADAPTER_WEIGHTS, *(n for n in (TOKENIZER_FILE, *OPTIONAL_FILES) if n in siblings)]
    check_file_budgets([_announced(n, siblings[n]) for n in own if n in FILE_BYTE_LIMITS])
    files = [_announced(n, siblings[n]) for n in own]
    unverifiable = [f.name for f in files if f.sha256 is None and f.blob_id is None]
    if unverifiable:
        raise GateRefusedError(f"the Hub announced no hash for {', '.join(unverifiable)}")
    committed = client.commit_date(repo, sha)
    base_lineage = {k: v for k, v in base_facts.items() if k != "lineage"}
    return {**base_lineage, "files": [asdict(f) for f in files],
            "adapter": {**adapter, **shapes, "base_repo": base_repo, "base_sha": base_sha,
                        "base_files": base_facts["files"], "adapter_bytes": announced.size,
                        "tokenizer_from": "adapter" if TOKENIZER_FILE in siblings else "base"},
            "n_bytes": total, "commit_date": committed.isoformat() if committed is not None else None,
            "lineage": lineage.as_dict()}


def _gate(client: HubClient, repo: str, sha: str, budgets: Budgets, rule: WatchRule | None,
          cache_dir: Path, *, adapters: bool = True) -> dict[str, Any]:
    info = client.model_info(repo, sha, files_metadata=True)
    if info.sha and info.sha != sha:
        raise GateRefusedError(f"the Hub answered for commit {info.sha} instead of {sha}")
    if getattr(info, "disabled", False):
        raise GateRefusedError("the Hub reports the repo as disabled")
    siblings = _siblings(info)
    check_file_names(list(siblings), cache_dir)
    if ADAPTER_CONFIG in siblings:
        if not adapters:  # the base of an adapter must be a model itself
            raise GateRefusedError("it is itself an adapter; an adapter's base must be a model")
        return _gate_adapter(client, repo, sha, info, siblings, budgets, rule, cache_dir)
    weights = weight_files(info)
    if TOKENIZER_FILE not in siblings:
        raise GateRefusedError(f"no {TOKENIZER_FILE}: a tokenizer is required to score")
    if CONFIG_FILE not in siblings:
        raise GateRefusedError(f"no {CONFIG_FILE}")
    # Every file it would fetch besides the weights, within its byte limit before any download.
    check_file_budgets([_announced(n, s) for n, s in siblings.items() if n in FILE_BYTE_LIMITS])
    config = _read_config(client, repo, sha, cache_dir, siblings[CONFIG_FILE].size)
    config_facts, shape = check_config(config, budgets)
    headers = read_headers(client, repo, sha, weights, siblings, cache_dir)
    announced = {name: _announced(name, siblings[name]) for name in headers}
    header_facts = check_safetensors(headers, announced, budgets)
    try:
        estimates = check_against_weights(shape, header_facts["n_params"], header_facts["tensor_bytes"],
                                          budgets)
    except ConfigBudgetError as exc:
        raise GateRefusedError(str(exc)) from None
    if rule is not None and not rule.params_in_range(header_facts["n_params"]):
        raise GateRefusedError(f"{header_facts['n_params']:,} parameters is outside rule "
                               f"{rule.name!r}'s range [{rule.min_params}, {rule.max_params}]")
    files = [_announced(n, s) for n, s in sorted(siblings.items())
             if n in announced or n in (CONFIG_FILE, TOKENIZER_FILE, WEIGHTS_INDEX, *OPTIONAL_FILES)]
    unverifiable = [f.name for f in files if f.name in announced and f.sha256 is None and f.blob_id is None]
    if unverifiable:
        raise GateRefusedError(f"the Hub announced no hash for {', '.join(unverifiable)}")
    # The date of this very commit, from the commit listing (the revision's lastModified may
    # be the repo's last change): reports order lineages without step names by it
    # (monitor.reports.present).
    committed = client.commit_date(repo, sha)
    base = pin_base(client, declared_base(getattr(info, "card_data", None), siblings, config))
    return {**config_facts, **header_facts, **estimates, "files": [asdict(f) for f in files],
            "commit_date": committed.isoformat() if committed is not None else None,
            **({"lineage": base.as_dict()} if base is not None else {})}


def pin_base(client: HubClient, declared: DeclaredBase | None) -> Lineage | None:
    """Pin a declared base to a commit: the one its reference names, else the commit its main
    points at now. A base the Hub will not serve (missing, gated, private) is recorded with
    the Hub's reason and no commit; an outage raises HubError (the row is gated again later)."""
    if declared is None:
        return None
    problems = list(declared.problems)
    sha = declared.pinned_sha
    repo = declared.base_repo
    if repo is not None and sha is None:
        try:
            sha = client.model_info(repo, None, files_metadata=False).sha
        except HubError:
            raise
        except Exception as exc:
            reason = refusal_reason(exc)
            if reason is None and client.classify(exc) != "answer":
                raise
            problems.append(f"base {repo} could not be pinned: {reason or describe_error(exc)}")
            sha = None
        if sha is not None and not COMMIT_RE.fullmatch(str(sha)):
            problems.append(f"the Hub answered {str(sha)[:50]!r} as the commit of base {repo}; not pinned")
            sha = None
    if repo is None and len(declared.bases) > 1:
        problems.append(f"a merge of {len(declared.bases)} bases has no single base to compare with")
    return Lineage(base_repo=repo, base_sha=sha, relation=declared.relation,
                   relation_source=declared.relation_source, bases=list(declared.bases),
                   problem="; ".join(problems) or None)


def gate_checkpoint(client: HubClient, repo: str, sha: str, *, rule: WatchRule | None = None,
                    budgets: Budgets | None = None, cache_dir: str | Path | None = None) -> Verdict:
    """Decide whether (repo, sha) may be fetched, from metadata and config only.

    Returns `gated` when every check passes, `skipped` with a readable reason when the
    repo is refused or unavailable. Raises HubError when the Hub could not be asked (the
    row stays `discovered` and the next poll tries again).
    """
    budgets = budgets or (rule.budgets if rule is not None else Budgets())
    cache_dir = resolve_cache_dir(cache_dir)
    try:
        facts = _gate(client, repo, sha, budgets, rule, cache_dir)
    except (GateRefusedError, IntegrityError) as exc:
        return Verdict("skipped", f"refused: {exc.message}", {"gate": {"verdict": "refused"}})
    except HubError:
        raise
    except Exception as exc:
        from huggingface_hub.errors import HfHubHTTPError

        reason = refusal_reason(exc)
        if reason is None and isinstance(exc, HfHubHTTPError):  # any other "no" from the Hub
            reason = f"refused by the Hub: {describe_error(exc)}"
        if reason is None:
            raise
        return Verdict("skipped", reason, {"gate": {"verdict": "unavailable"}})
    return Verdict("gated", None, {"gate": {"verdict": "passed", **facts}})


def resolve_cache_dir(cache_dir: str | Path | None) -> Path:
    """The Hub cache folder: the argument, else huggingface_hub's HF_HUB_CACHE."""
    if cache_dir is None:
        from huggingface_hub import constants

        cache_dir = constants.HF_HUB_CACHE
    return Path(cache_dir)


@dataclass
class GateOutcome:
    """One row the gate looked at."""

    id: int
    repo: str
    sha: str
    status: str
    reason: str | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def gate_pending(store: Store, client: HubClient, rules: Sequence[WatchRule], *,
                 cache_dir: str | Path | None = None,
                 now_fn: Callable[[], datetime] = utcnow, limit: int | None = None) -> list[GateOutcome]:
    """Gate every `discovered` Hub row; stop at the first Hub outage (rows stay discovered)."""
    by_name = {rule.name: rule for rule in rules}
    outcomes: list[GateOutcome] = []
    for row in store.list_checkpoints(status="discovered", limit=limit):
        if row.source != "hub":
            continue
        try:
            verdict = gate_checkpoint(client, row.repo, row.sha, rule=by_name.get(row.rule),
                                      cache_dir=cache_dir)
        except HubError as exc:
            outcomes.append(GateOutcome(row.id, row.repo, row.sha, "discovered", exc.one_line()))
            break
        store.set_checkpoint_verdict(row.id, expect_status="discovered", status=verdict.status,
                                     reason=verdict.reason, meta=verdict.meta, now=now_fn(),
                                     base=verdict.meta.get("gate", {}).get("lineage"))
        outcomes.append(GateOutcome(row.id, row.repo, row.sha, verdict.status, verdict.reason))
        if verdict.status == "gated":
            event("gated", checkpoint=row.id, repo=row.repo, commit=row.sha, rule=row.rule)
        else:
            event("refused", checkpoint=row.id, repo=row.repo, commit=row.sha, rule=row.rule,
                  status=verdict.status, reason=verdict.reason)
    store.checkpoint()
    return outcomes
