"""LoRA adapters: what the gate checks before any weight byte, and what the scoring child merges.

An adapter repo holds `adapter_config.json` and `adapter_model.safetensors`: low-rank updates
B·A to some linear layers of a base model it names. It is scored as the model it makes: the
base at its pinned commit with the update merged in (`merge_lora` in the scoring child, through
the `peft` library). Before anything is downloaded the gate checks, from the config and the
safetensors headers of both repos (range requests):

- the config is a bounded JSON object of a plain LoRA adapter (`peft_type` LORA; other adapter
  kinds, DoRA, initialisations that rewrite the base (PiSSA, OLoRA, ...) and regular-expression
  `target_modules` are refused with the reason), without code: an `auto_mapping` that points
  outside transformers' own model classes is refused as remote code;
- the weights are safetensors (`adapter_model.bin` would be unpickled: refused);
- the base is declared (model card or `base_model_name_or_path`; two different ones are
  refused; a card naming several bases is overruled by the config's, one of them, and that
  recorded as a lineage problem), pinned, and passes the gate itself (safetensors only,
  budgets, no remote code);
- every adapter tensor is a `lora_A`/`lora_B` weight of a module the base has and the config
  targets, with shapes [r, in] and [out, r] for the base's [out, in] weight and r the
  configured rank.

The repo's config is never handed to peft: the merge builds its own `LoraConfig` from the
checked facts (rank, alpha, rsLoRA, the exact modules the weights update, no initialisation),
so what is scored is W + scale·B·A for the checked tensors and nothing a config key could
change (a PiSSA iteration count, a pathological regular expression, DoRA magnitudes).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from monitor.errors import GateRefusedError
from monitor.hub.lineage import DeclaredBase
from monitor.hub.safetensors_layout import SafetensorsHeader

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG_MAX_BYTES = 1 << 20
# Far above any published LoRA rank; a larger one is not a low-rank update.
MAX_RANK = 4096
_PREFIX = "base_model.model."
_LORA_KEY = re.compile(r"^base_model\.model\.(?P<module>[A-Za-z0-9_.]+)\.lora_(?P<part>[AB])\.weight$")
_REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}$")


def check_adapter_config(config: Any) -> dict[str, Any]:
    """The facts of a LoRA adapter config; GateRefusedError naming what is wrong."""
    if not isinstance(config, dict):
        raise GateRefusedError(f"{ADAPTER_CONFIG} is not a JSON object")
    peft_type = config.get("peft_type")
    if peft_type != "LORA":
        raise GateRefusedError(f"{ADAPTER_CONFIG}: peft_type {str(peft_type)[:40]!r} is not supported "
                               "(only LoRA adapters are merged and scored)")
    mapping = config.get("auto_mapping")
    if mapping is not None:
        library = mapping.get("parent_library") if isinstance(mapping, dict) else None
        if not (isinstance(library, str) and library.startswith("transformers.models.")):
            raise GateRefusedError(f"remote code: {ADAPTER_CONFIG} has auto_mapping to {str(library)[:80]!r}, "
                                   "outside transformers (trust_remote_code is never set)")
    rank = config.get("r")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 1 <= rank <= MAX_RANK:
        raise GateRefusedError(f"{ADAPTER_CONFIG}: r = {str(rank)[:20]} is not a rank in [1, {MAX_RANK}]")
    alpha = config.get("lora_alpha", rank)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 < alpha < 1e6:
        raise GateRefusedError(f"{ADAPTER_CONFIG}: lora_alpha {str(alpha)[:20]} is not a positive number")
    for key in ("modules_to_save", "trainable_token_indices", "layer_replication"):
        if config.get(key):
            raise GateRefusedError(f"{ADAPTER_CONFIG}: {key} is not supported (it replaces or adds "
                                   "whole modules, not a low-rank update)")
    if config.get("rank_pattern") or config.get("alpha_pattern"):
        raise GateRefusedError(f"{ADAPTER_CONFIG}: per-module rank_pattern/alpha_pattern is not supported")
    if config.get("use_dora"):
        raise GateRefusedError(f"{ADAPTER_CONFIG}: use_dora is not supported (a DoRA adapter is not W + B·A)")
    init = config.get("init_lora_weights", True)
    if init not in (True, False, "gaussian"):
        raise GateRefusedError(f"{ADAPTER_CONFIG}: init_lora_weights {str(init)[:40]!r} is not supported "
                               "(it rewrites the base's weights, so the adapter is not W + B·A of this base)")
    if config.get("lora_bias") or config.get("bias", "none") != "none":
        raise GateRefusedError(f"{ADAPTER_CONFIG}: bias terms are not supported")
    if config.get("fan_in_fan_out"):
        raise GateRefusedError(f"{ADAPTER_CONFIG}: fan_in_fan_out (Conv1D bases) is not supported")
    targets = config.get("target_modules")
    if isinstance(targets, str) and targets != "all-linear":
        raise GateRefusedError(f"{ADAPTER_CONFIG}: target_modules as a regular expression is not supported; "
                               "list the module names")
    if isinstance(targets, list):
        if len(targets) > 4096 or not all(isinstance(t, str) and 0 < len(t) <= 256 for t in targets):
            raise GateRefusedError(f"{ADAPTER_CONFIG}: target_modules is not a list of module names")
    elif targets not in (None, "all-linear"):
        raise GateRefusedError(f"{ADAPTER_CONFIG}: target_modules is not a list of module names")
    base = config.get("base_model_name_or_path")
    if base is not None and (not isinstance(base, str) or not _REPO.match(base)):
        base = None  # a local path at training time: the model card must name the base
    return {"peft_type": peft_type, "r": rank, "lora_alpha": float(alpha),
            "use_rslora": bool(config.get("use_rslora")), "target_modules": targets,
            "base_model_name_or_path": base}


def _targeted(module: str, targets: Any) -> bool:
    """Whether the config's `target_modules` names `module` (as peft matches a list: the whole
    name or its last components); `all-linear` and no list name every module."""
    if not isinstance(targets, list):
        return True
    return any(module == t or module.endswith("." + t) for t in targets)


def adapter_base(declared: DeclaredBase | None, config_base: str | None) -> DeclaredBase:
    """The one base an adapter applies to, as its lineage records it.

    An adapter updates one model's weights, so it has one base: the model card's, else its
    config's (`base_model_name_or_path`). A card naming another base than the config is
    refused. A card naming several bases (a merge's card copied onto an adapter, or an owner's
    guess) gives no single one: the adapter applies to its config's base, which must be one of
    them (else refused), and the card's list is recorded as a lineage problem beside any the
    card already had, so the report's derivatives section and the checkpoint listings show
    that the card was overruled.
    """
    card_bases = declared.bases if declared is not None else ()
    problems = list(declared.problems) if declared is not None else []
    if len(card_bases) > 1:
        named = ", ".join(card_bases)
        if config_base is None:
            raise GateRefusedError(f"the model card names {len(card_bases)} bases ({named}) and {ADAPTER_CONFIG} "
                                   "names none; an adapter applies to one base")
        if config_base not in card_bases:
            raise GateRefusedError(f"the model card names bases {named} but {ADAPTER_CONFIG} names {config_base}")
        problems.append(f"the model card names {len(card_bases)} bases ({named}); an adapter applies to one, "
                        f"so its {ADAPTER_CONFIG} base {config_base} is used")
        card_base = None
    else:
        card_base = card_bases[0] if card_bases else None
    if card_base and config_base and card_base != config_base:
        raise GateRefusedError(f"the model card names base {card_base} but {ADAPTER_CONFIG} names {config_base}")
    base = card_base or config_base
    if not base:
        raise GateRefusedError("the adapter names no base model (model card base_model or "
                               f"{ADAPTER_CONFIG} base_model_name_or_path)")
    if declared is not None and declared.bases == (base,):
        return declared           # the card's own declaration (its relation, a pinned commit) stands
    source = "declared" if declared is not None and declared.relation == "adapter" else "inferred"
    return DeclaredBase((base,), "adapter", source, None, tuple(problems))


def check_adapter_shapes(adapter: SafetensorsHeader, base: Mapping[str, SafetensorsHeader], rank: int,
                         targets: Any = None) -> dict[str, Any]:
    """Every adapter tensor against the base's headers: A [r, in] and B [out, r] of a module
    whose weight is [out, in]. Returns the modules and the adapter's parameter count."""
    shapes: dict[str, list[int]] = {}
    for header in base.values():
        for name, entry in header.tensors.items():
            shapes[name] = list(entry.get("shape") or [])
    parts: dict[str, dict[str, list[int]]] = {}
    n_params = 0
    for name, entry in adapter.tensors.items():
        match = _LORA_KEY.match(name)
        if match is None:
            raise GateRefusedError(f"adapter tensor {name[:120]!r} is not a LoRA A/B weight")
        shape = list(entry.get("shape") or [])
        if len(shape) != 2:
            raise GateRefusedError(f"adapter tensor {name[:120]} has shape {shape}, not a matrix")
        parts.setdefault(match["module"], {})[match["part"]] = shape
        n_params += shape[0] * shape[1]
    if not parts:
        raise GateRefusedError(f"{ADAPTER_WEIGHTS} holds no LoRA weights")
    for module, pair in sorted(parts.items()):
        target = shapes.get(f"{module}.weight")
        if target is None:
            raise GateRefusedError(f"the adapter updates {module}, which the base does not have")
        if not _targeted(module, targets):
            raise GateRefusedError(f"the adapter's weights update {module}, which its target_modules do not name")
        if set(pair) != {"A", "B"}:
            raise GateRefusedError(f"the adapter has only lora_{''.join(pair)} for {module}")
        if len(target) != 2:
            raise GateRefusedError(f"the base's {module}.weight has shape {target}, not a matrix")
        out_f, in_f = target
        want_a, want_b = [rank, in_f], [out_f, rank]
        if pair["A"] != want_a or pair["B"] != want_b:
            raise GateRefusedError(f"adapter shapes for {module} do not match the base: lora_A {pair['A']}, "
                                   f"lora_B {pair['B']}; the base's [{out_f}, {in_f}] weight at r = {rank} "
                                   f"needs {want_a} and {want_b}")
    return {"modules": sorted(parts), "n_adapter_params": n_params}


def merge_lora(model: Any, weights_file: str, facts: Mapping[str, Any]) -> Any:
    """The base model with the checked LoRA weights in `weights_file` merged in, by peft.

    peft gets a `LoraConfig` built here from the checked facts (`check_adapter_config`,
    `check_adapter_shapes`): the rank, alpha, rsLoRA, exactly the modules the weights update,
    no initialisation; never the repo's own config. Every weight must load into the model.
    """
    from peft import LoraConfig, get_peft_model, set_peft_model_state_dict
    from safetensors.torch import load_file

    config = LoraConfig(r=int(facts["r"]), lora_alpha=float(facts["lora_alpha"]),
                        use_rslora=bool(facts["use_rslora"]), target_modules=list(facts["modules"]),
                        lora_dropout=0.0, bias="none", init_lora_weights=False)
    wrapped = get_peft_model(model, config)
    loaded = set_peft_model_state_dict(wrapped, load_file(weights_file))
    missing = [k for k in loaded.missing_keys if "lora_" in k]
    if loaded.unexpected_keys or missing:
        raise ValueError(f"adapter weights do not load into the model: unexpected {loaded.unexpected_keys[:3]}, "
                         f"missing {missing[:3]}")
    return wrapped.merge_and_unload()
