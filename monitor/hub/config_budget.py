"""What a config.json may make transformers allocate, checked before anything is built.

transformers builds a model from config.json before it reads a single weight, so every
field that sizes a tensor (layers, hidden size, intermediate size, heads, experts,
vocabulary, positions) is an allocation an untrusted repo controls. Each such field must
be an integer under its budget, and the parameters the fields imply must fit what the
safetensors headers actually hold: a config claiming 10^6 layers over a 2-layer
checkpoint is refused here, not discovered by the loader running out of memory.

The parameter estimate is a lower bound for the transformer families transformers ships
(attention, feed-forward and embedding matrices, biases and norms left out), so an honest
config never exceeds its weights by much; `CLAIM_SLACK` leaves room for the families it
counts loosely (state-space layers, experts on every other layer).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# Config keys that hold the longest sequence a model was built for, most specific first.
CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "n_ctx",
                "max_sequence_length")
# Each quantity, the config keys that spell it (most common first) and the budget it is under.
FIELDS: dict[str, tuple[tuple[str, ...], str]] = {
    "layers": (("num_hidden_layers", "n_layer", "num_layers", "n_layers"), "max_layers"),
    "hidden": (("hidden_size", "n_embd", "d_model"), "max_hidden"),
    "head_dim": (("head_dim",), "max_hidden"),
    "intermediate": (("intermediate_size", "n_inner", "ffn_dim", "ffn_hidden_size"), "max_intermediate"),
    "expert_intermediate": (("moe_intermediate_size", "expert_intermediate_size"), "max_intermediate"),
    "heads": (("num_attention_heads", "n_head", "num_heads"), "max_heads"),
    "kv_heads": (("num_key_value_heads", "num_kv_heads", "n_head_kv", "multi_query_group_num"), "max_heads"),
    "experts": (("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts"), "max_experts"),
    "experts_per_token": (("num_experts_per_tok", "moe_topk"), "max_experts"),
    "vocab": (("vocab_size",), "max_vocab"),
    "positions": (CONTEXT_KEYS, "max_context"),
}
# Expert counts may be 0 (a dense model that spells the key out); everything else is >= 1.
ZERO_ALLOWED = frozenset({"experts", "experts_per_token"})
# A config may imply at most this many times the parameters its weights hold (plus a floor).
CLAIM_SLACK = 4
CLAIM_FLOOR = 1_000_000
# The window (tokens) the activation estimate assumes: scoring windows are at most this long.
ACTIVATION_WINDOW = 4096


class ConfigBudgetError(ValueError):
    """A config field that is malformed or over its budget; the message names the key."""


@dataclass(frozen=True)
class ConfigShape:
    """The allocation-driving fields found in a config (None where absent)."""

    values: dict[str, int | None]
    keys: dict[str, str]          # quantity -> the config key it was read from
    quantized: bool

    def get(self, name: str) -> int | None:
        return self.values.get(name)

    def params_estimate(self) -> int | None:
        """A lower bound on the parameters these fields describe; None without a hidden size."""
        h = self.get("hidden")
        if not h:
            return None
        layers = self.get("layers") or 0
        heads = self.get("heads")
        head_dim = self.get("head_dim") or (h // heads if heads else None)
        attn_dim = heads * head_dim if heads and head_dim else h
        kv_heads = self.get("kv_heads")
        kv_dim = kv_heads * head_dim if kv_heads and head_dim else attn_dim
        experts = self.get("experts") or 0
        ffn = (self.get("expert_intermediate") if experts else None) or self.get("intermediate") or 0
        attention = 2 * h * attn_dim + 2 * h * kv_dim            # q, o and k, v projections
        feed_forward = 2 * h * ffn * max(experts, 1)             # at least up and down per expert
        return layers * (attention + feed_forward) + (self.get("vocab") or 0) * h

    def activation_bytes(self) -> int | None:
        """float32 bytes one layer keeps live for a window of up to ACTIVATION_WINDOW tokens."""
        h = self.get("hidden")
        if not h:
            return None
        window = min(self.get("positions") or ACTIVATION_WINDOW, ACTIVATION_WINDOW)
        experts = self.get("experts") or 0
        ffn = (self.get("expert_intermediate") if experts else None) or self.get("intermediate") or 4 * h
        active = max(self.get("experts_per_token") or 1, 1) if experts else 1
        return 4 * window * (4 * h + ffn * active)


def _scopes(config: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    text = config.get("text_config")
    return [("", config), ("text_config.", text)] if isinstance(text, Mapping) else [("", config)]


def config_shape(config: Mapping[str, Any], budgets: Any) -> ConfigShape:
    """Read every allocation-driving field and check it against `budgets` (a `Budgets`).

    A field is looked up at the top level, then in `text_config`; a null value counts as
    absent. Raises ConfigBudgetError naming the key for a value that is not an integer or
    is over its budget.
    """
    values: dict[str, int | None] = {}
    keys: dict[str, str] = {}
    for name, (spellings, budget_name) in FIELDS.items():
        values[name] = None
        for prefix, scope in _scopes(config):
            key = next((k for k in spellings if k in scope and scope[k] is not None), None)
            if key is None:
                continue
            value, label = scope[key], prefix + key
            lowest = 0 if name in ZERO_ALLOWED else 1
            if isinstance(value, bool) or not isinstance(value, int) or value < lowest:
                kind = "a non-negative" if lowest == 0 else "a positive"
                raise ConfigBudgetError(f"config.json: {label} = {value!r} is not {kind} integer")
            limit = getattr(budgets, budget_name)
            if value > limit:
                raise ConfigBudgetError(f"over budget: config.json {label} {value:,} > {budget_name} {limit:,}")
            values[name], keys[name] = value, label
            break
    quantized = config.get("quantization_config") is not None
    return ConfigShape(values, keys, quantized)


def check_against_weights(shape: ConfigShape, n_params: int, n_bytes: int, budgets: Any) -> dict[str, Any]:
    """Compare what the config implies with what the safetensors headers hold.

    Refuses (ConfigBudgetError) a config whose implied parameters exceed `max_params`, or
    exceed what the weights can encode by more than CLAIM_SLACK (quantized weights are
    counted at one bit per parameter, since packed formats store several per element), or
    whose per-layer activations would exceed `max_bytes`. Returns the estimates.
    """
    estimate = shape.params_estimate()
    activations = shape.activation_bytes()
    if estimate is not None:
        fields = ", ".join(f"{shape.keys[n]} {shape.get(n):,}" for n in ("layers", "hidden", "intermediate",
                                                                        "experts", "vocab") if n in shape.keys)
        if estimate > budgets.max_params:
            raise ConfigBudgetError(f"over budget: config.json implies about {estimate:,} parameters "
                                    f"({fields}) > max_params {budgets.max_params:,}")
        capacity = n_bytes * 8 if shape.quantized else n_params
        if estimate > CLAIM_SLACK * capacity + CLAIM_FLOOR:
            raise ConfigBudgetError(
                f"config.json implies about {estimate:,} parameters ({fields}) but the safetensors "
                f"weights hold {n_params:,}: the config does not describe these weights")
    if activations is not None and activations > budgets.max_bytes:
        raise ConfigBudgetError(f"over budget: config.json implies about {activations:,} bytes of "
                                f"activations per layer > max_bytes {budgets.max_bytes:,}")
    return {"params_estimate": estimate, "activation_bytes": activations}
