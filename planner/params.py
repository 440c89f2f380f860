"""Parameter count of a decoder-only transformer, from its HF config.

Counts embeddings (and the output head unless tied), attention (standard or MLA), a gated
(SwiGLU-style) MLP or mixture of experts per layer, and RMSNorm weights. Biases other than the
QKV bias of Qwen2-style attention are left out: the count is for memory planning, not audit.
"""

from typing import Any

from planner.config_fields import optional_int, require_int

_QKV_BIAS_MODEL_TYPES = frozenset({"qwen2", "qwen2_moe"})


def count_parameters(config: dict[str, Any]) -> int:
    """Total parameters of the model described by ``config``."""
    hidden = require_int(config, "hidden_size", "the weights estimate")
    layers = require_int(config, "num_hidden_layers", "the weights estimate")
    vocab = require_int(config, "vocab_size", "the weights estimate")
    embeddings = vocab * hidden * (1 if config.get("tie_word_embeddings", False) else 2)
    attention = _attention_parameters(config, hidden) * layers
    mlp = sum(_mlp_parameters(config, hidden, layer) for layer in range(layers))
    norms = 2 * hidden * layers + hidden
    return embeddings + attention + mlp + norms


def _attention_parameters(config: dict[str, Any], hidden: int) -> int:
    heads = require_int(config, "num_attention_heads", "the weights estimate")
    if optional_int(config, "kv_lora_rank") is not None:
        return _mla_parameters(config, hidden, heads)
    kv_heads = optional_int(config, "num_key_value_heads") or heads
    head_dim = optional_int(config, "head_dim") or hidden // heads
    weights = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim
    has_qkv_bias = config.get("attention_bias", config.get("model_type") in _QKV_BIAS_MODEL_TYPES)
    return weights + ((heads + 2 * kv_heads) * head_dim if has_qkv_bias else 0)


def _mla_parameters(config: dict[str, Any], hidden: int, heads: int) -> int:
    """DeepSeek-V2/V3 multi-head latent attention: low-rank Q and a shared KV latent."""
    rank = require_int(config, "kv_lora_rank", "MLA")
    rope = require_int(config, "qk_rope_head_dim", "MLA")
    nope = require_int(config, "qk_nope_head_dim", "the MLA weights estimate")
    v_dim = require_int(config, "v_head_dim", "the MLA weights estimate")
    q_rank = optional_int(config, "q_lora_rank")
    q_out = heads * (nope + rope)
    query = hidden * q_rank + q_rank + q_rank * q_out if q_rank else hidden * q_out
    latent = hidden * (rank + rope) + rank
    expand = rank * heads * (nope + v_dim)
    return query + latent + expand + heads * v_dim * hidden


def _mlp_parameters(config: dict[str, Any], hidden: int, layer: int) -> int:
    experts = _routed_experts(config)
    dense_layers = config.get("first_k_dense_replace", 0)
    if experts == 0 or layer < dense_layers or layer in config.get("mlp_only_layers", ()):
        return 3 * hidden * require_int(config, "intermediate_size", "the weights estimate")
    expert_size = optional_int(config, "moe_intermediate_size") or require_int(
        config, "intermediate_size", "the weights estimate"
    )
    shared_size = (optional_int(config, "n_shared_experts") or 0) * expert_size + (
        optional_int(config, "shared_expert_intermediate_size") or 0
    )
    router = experts * hidden
    return 3 * hidden * (experts * expert_size + shared_size) + router


def _routed_experts(config: dict[str, Any]) -> int:
    for field in ("n_routed_experts", "num_local_experts", "num_experts"):
        count = optional_int(config, field)
        if count is not None:
            return count
    return 0
