"""Parameter counts of a decoder-only transformer, from its HF config, split the way tensor
parallelism splits them.

Counts embeddings (and the output head unless tied), attention (standard or MLA), a gated
(SwiGLU-style) MLP or mixture of experts per layer, and RMSNorm weights. Biases other than the
QKV bias of Qwen2-style attention are left out: the count is for memory planning, not audit.

Each layer's count is kept in three parts, as vLLM shards them over tensor-parallel ranks:
``sharded`` (column/row-parallel projections, experts, shared experts), ``kv_projection``
(K and V projections, split by KV head, so replicated once there are fewer KV heads than
ranks) and ``replicated`` (norms, the MoE router, MLA's latent down-projections).
"""

from dataclasses import dataclass
from typing import Any

from planner.config_fields import optional_int, require_int

_QKV_BIAS_MODEL_TYPES = frozenset({"qwen2", "qwen2_moe"})
_WEIGHTS = "the weights estimate"


@dataclass(frozen=True)
class LayerParams:
    """One decoder layer's parameters by how tensor parallelism splits them."""

    sharded: int
    kv_projection: int
    replicated: int

    @property
    def total(self) -> int:
        return self.sharded + self.kv_projection + self.replicated


@dataclass(frozen=True)
class ParamCounts:
    """A model's parameters: the embedding table, the output head (0 when tied to the embedding),
    the final norm and each decoder layer."""

    embedding: int
    lm_head: int
    final_norm: int
    layers: tuple[LayerParams, ...]

    @property
    def total(self) -> int:
        return self.embedding + self.lm_head + self.final_norm + sum(layer.total for layer in self.layers)


def count_parameters(config: dict[str, Any]) -> ParamCounts:
    """The parameters of the model described by ``config``; raises ``ConfigFieldError`` naming the
    first field the estimate lacks."""
    hidden = require_int(config, "hidden_size", _WEIGHTS)
    layers = require_int(config, "num_hidden_layers", _WEIGHTS)
    vocab = require_int(config, "vocab_size", _WEIGHTS)
    sharded_attention, kv_projection, replicated_attention = _attention_parameters(config, hidden)
    layer_params = []
    for layer in range(layers):
        sharded_mlp, router = _mlp_parameters(config, hidden, layer)
        norms = 2 * hidden
        layer_params.append(
            LayerParams(sharded_attention + sharded_mlp, kv_projection, replicated_attention + router + norms)
        )
    tied = bool(config.get("tie_word_embeddings", False))
    return ParamCounts(
        embedding=vocab * hidden, lm_head=0 if tied else vocab * hidden, final_norm=hidden, layers=tuple(layer_params)
    )


def _attention_parameters(config: dict[str, Any], hidden: int) -> tuple[int, int, int]:
    """(sharded, K/V projection, replicated) parameters of one attention block."""
    heads = require_int(config, "num_attention_heads", _WEIGHTS)
    if optional_int(config, "kv_lora_rank") is not None:
        return _mla_parameters(config, hidden, heads)
    kv_heads = optional_int(config, "num_key_value_heads") or heads
    head_dim = optional_int(config, "head_dim") or hidden // heads
    has_qkv_bias = config.get("attention_bias", config.get("model_type") in _QKV_BIAS_MODEL_TYPES)
    query_and_output = 2 * hidden * heads * head_dim + (heads * head_dim if has_qkv_bias else 0)
    key_and_value = 2 * hidden * kv_heads * head_dim + (2 * kv_heads * head_dim if has_qkv_bias else 0)
    return query_and_output, key_and_value, 0


def _mla_parameters(config: dict[str, Any], hidden: int, heads: int) -> tuple[int, int, int]:
    """DeepSeek-V2/V3 multi-head latent attention: low-rank Q and a shared KV latent. The
    down-projections to the latents (and their norms) are replicated under TP; the per-head
    up-projections and the output projection are sharded."""
    rank = require_int(config, "kv_lora_rank", "MLA")
    rope = require_int(config, "qk_rope_head_dim", "MLA")
    nope = require_int(config, "qk_nope_head_dim", "the MLA weights estimate")
    v_dim = require_int(config, "v_head_dim", "the MLA weights estimate")
    q_rank = optional_int(config, "q_lora_rank")
    q_out = heads * (nope + rope)
    query_down = hidden * q_rank + q_rank if q_rank else 0
    query_up = q_rank * q_out if q_rank else hidden * q_out
    latent_down = hidden * (rank + rope) + rank
    expand = rank * heads * (nope + v_dim)
    return query_up + expand + heads * v_dim * hidden, 0, query_down + latent_down


def _mlp_parameters(config: dict[str, Any], hidden: int, layer: int) -> tuple[int, int]:
    """(sharded, replicated) parameters of layer ``layer``'s MLP: a dense gated MLP, or routed
    experts (each split over TP ranks, as vLLM's fused MoE without expert parallelism), shared
    experts and a replicated router."""
    experts = _routed_experts(config)
    dense_layers = config.get("first_k_dense_replace") or 0
    if experts == 0 or layer < dense_layers or layer in config.get("mlp_only_layers", ()):
        needed_for = _WEIGHTS
        if experts:
            needed_for = f"the dense MLP of layer {layer} of this mixture-of-experts model, for {_WEIGHTS}"
        return 3 * hidden * require_int(config, "intermediate_size", needed_for), 0
    expert_size = optional_int(config, "moe_intermediate_size") or require_int(
        config, "intermediate_size", f"the expert size when 'moe_intermediate_size' is absent, for {_WEIGHTS}"
    )
    shared_size = (optional_int(config, "n_shared_experts") or 0) * expert_size + (
        optional_int(config, "shared_expert_intermediate_size") or 0
    )
    return 3 * hidden * (experts * expert_size + shared_size), experts * hidden


def _routed_experts(config: dict[str, Any]) -> int:
    for field in ("n_routed_experts", "num_local_experts", "num_experts"):
        count = optional_int(config, field)
        if count is not None:
            return count
    return 0
