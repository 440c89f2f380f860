"""A Llama-family decoder (Llama, Qwen2, Mistral, SmolLM2) over the paged KV cache.

Numerics follow transformers' own modeling code op for op (RMSNorm in float32, rotate-half RoPE
with cos/sin from the same inverse frequencies), so float32 greedy output matches it token for
token. Q/K/V and gate/up projections are fused into one matmul each; the rope table is computed
once for every position. LoRA adapters add their deltas after each projection, on their own rows
only (``engine/model/lora_batch.py``). On CPU, where oneDNN works in the compute dtype
(``engine/model/kernel_choice.py``), every weight matrix is reordered once, at load, into oneDNN's
blocked layout (``Linear``).
"""

import torch
import torch.nn.functional as F
from transformers import PretrainedConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from engine.model.attention import AttentionMetadata, paged_attention
from engine.model.kernel_choice import KernelChoice
from engine.model.kv_cache import PagedKVCache
from engine.model.lora_batch import LoRABatch
from engine.model.onednn import matmul_nt, pack_weight

Weights = dict[str, torch.Tensor]


class RMSNorm:
    def __init__(self, weight: torch.Tensor, eps: float) -> None:
        self.weight = weight
        self.eps = eps

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        hidden = x.to(torch.float32)
        variance = hidden.pow(2).mean(-1, keepdim=True)
        normed = hidden * variance.add_(self.eps).rsqrt_()
        return self.weight * normed.to(x.dtype)


class RotaryEmbedding:
    """cos/sin for every position up to ``max_position_embeddings``, in the compute dtype.

    ``sin`` is stored with its first half negated, so that rotate-half's ``cat(-x2, x1) * sin``
    becomes ``cat(x2, x1) * sin``: one elementwise op less per call, and bit-identical (negating is
    exact, and so is moving the sign from one factor to the other).
    """

    def __init__(self, config: PretrainedConfig, head_dim: int, dtype: torch.dtype, device: torch.device) -> None:
        rope = config.rope_parameters
        rope_type = rope.get("rope_type", "default")
        if rope_type == "dynamic":
            raise ValueError("dynamic NTK rope changes with sequence length; a precomputed table cannot serve it")
        if rope_type == "default":
            inv_freq = 1.0 / (rope["rope_theta"] ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
            scaling = 1.0
        else:
            inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](config)
        positions = torch.arange(config.max_position_embeddings, dtype=torch.float)
        freqs = positions[:, None] * inv_freq[None, :]
        angles = torch.cat((freqs, freqs), dim=-1)
        self.cos = (angles.cos() * scaling).to(device=device, dtype=dtype)
        sin = (angles.sin() * scaling).to(device=device, dtype=dtype)
        half = head_dim // 2
        self.sin = torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)

    def at(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and signed sin ``[tokens, 1, head_dim]`` (broadcast over heads)."""
        return self.cos[positions][:, None, :], self.sin[positions][:, None, :]


class Linear:
    """``x @ weight.T + bias`` for ``x`` ``[tokens, in]``.

    With ``packed`` (CPU, oneDNN working in the weight's dtype) the weight is reordered once into
    oneDNN's blocked layout and multiplied by ``mkldnn._linear_pointwise``; ``F.linear`` goes to MKL
    (float32) or reorder on every call (bfloat16). Measured on the 2-core AMD EPYC dev VM, one
    thread, CPU time (``bench/VLLM.md``): float32 2.2-2.8x faster, bfloat16 1.1x (prefill) to
    1.45x (16-token decode) faster and bit-identical to ``F.linear``.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, packed: bool) -> None:
        self.bias = bias
        self.out_features = weight.shape[0]
        self.packed = packed
        self.weight = pack_weight(weight) if packed else weight

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed:
            return matmul_nt(x, self.weight, self.bias)
        return F.linear(x, self.weight, self.bias)


def _rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE; ``signed_sin`` has its first half negated (``RotaryEmbedding``)."""
    half = x.shape[-1] // 2
    swapped = torch.cat((x[..., half:], x[..., :half]), dim=-1)
    rotated = x * cos
    return rotated.add_(swapped.mul_(signed_sin))


def _fused(weights: Weights, names: list[str]) -> torch.Tensor | None:
    parts = [weights[name] for name in names if name in weights]
    if not parts:
        return None
    if len(parts) != len(names):
        raise ValueError(f"some but not all of {names} are in the checkpoint")
    return torch.cat(parts).contiguous()


def _required(weights: Weights, projections: list[str]) -> torch.Tensor:
    """The projections' weights stacked into one matrix."""
    fused = _fused(weights, [f"{name}.weight" for name in projections])
    if fused is None:
        raise ValueError(f"the checkpoint has none of {projections}")
    return fused


class DecoderLayer:
    def __init__(self, config: PretrainedConfig, weights: Weights, prefix: str, head_dim: int, packed: bool) -> None:
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = head_dim
        attn, mlp = f"{prefix}.self_attn", f"{prefix}.mlp"
        self.input_norm = RMSNorm(weights[f"{prefix}.input_layernorm.weight"], config.rms_norm_eps)
        self.post_attention_norm = RMSNorm(weights[f"{prefix}.post_attention_layernorm.weight"], config.rms_norm_eps)
        qkv = [f"{attn}.{name}_proj" for name in ("q", "k", "v")]
        self.qkv = Linear(_required(weights, qkv), _fused(weights, [f"{name}.bias" for name in qkv]), packed)
        self.o_proj = Linear(weights[f"{attn}.o_proj.weight"], weights.get(f"{attn}.o_proj.bias"), packed)
        gate_up = [f"{mlp}.gate_proj", f"{mlp}.up_proj"]
        gate_up_bias = _fused(weights, [f"{name}.bias" for name in gate_up])
        self.gate_up = Linear(_required(weights, gate_up), gate_up_bias, packed)
        self.down = Linear(weights[f"{mlp}.down_proj.weight"], weights.get(f"{mlp}.down_proj.bias"), packed)

    def __call__(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        cache: PagedKVCache,
        layer: int,
        metadata: AttentionMetadata,
        lora: LoRABatch | None = None,
    ) -> torch.Tensor:
        tokens = x.shape[0]
        normed = self.input_norm(x)
        qkv = self.qkv(normed)
        if lora is not None:
            lora.add(qkv, normed, layer, "qkv")
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        query_key = qkv[:, : q_size + kv_size].view(tokens, self.num_heads + self.num_kv_heads, self.head_dim)
        query, key = _rotate(query_key, *rope).split([self.num_heads, self.num_kv_heads], dim=1)
        value = qkv[:, q_size + kv_size :].view(tokens, self.num_kv_heads, self.head_dim)
        attended = paged_attention(query, key, value, cache, layer, metadata).view(tokens, q_size)
        attention_out = self.o_proj(attended)
        if lora is not None:
            lora.add(attention_out, attended, layer, "o")
        x = x + attention_out
        normed = self.post_attention_norm(x)
        gate_up = self.gate_up(normed)
        if lora is not None:
            lora.add(gate_up, normed, layer, "gate_up")
        gate, up = gate_up.chunk(2, dim=-1)
        activated = F.silu(gate).mul_(up)
        mlp_out = self.down(activated)
        if lora is not None:
            lora.add(mlp_out, activated, layer, "down")
        return x + mlp_out


class LlamaForPagedLM:
    """The whole model: embed, decoder layers over the paged cache, final norm, LM head, on ``kernels``."""

    def __init__(
        self,
        config: PretrainedConfig,
        weights: Weights,
        dtype: torch.dtype,
        device: torch.device,
        kernels: KernelChoice,
    ) -> None:
        if config.hidden_act != "silu":
            raise ValueError(f"unsupported hidden_act {config.hidden_act!r}: Llama-family models use silu")
        weights = {name: tensor.to(device=device, dtype=dtype) for name, tensor in weights.items()}
        self.kernels = kernels
        self.num_layers = config.num_hidden_layers
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.sliding_window: int | None = (
            getattr(config, "sliding_window", None) if getattr(config, "use_sliding_window", True) else None
        )
        self.embed = weights["model.embed_tokens.weight"]
        lm_head = self.embed if config.tie_word_embeddings else weights["lm_head.weight"]
        self.lm_head = Linear(lm_head, None, kernels.packed_linear)
        self.norm = RMSNorm(weights["model.norm.weight"], config.rms_norm_eps)
        self.rope = RotaryEmbedding(config, self.head_dim, dtype, device)
        self.layers = [
            DecoderLayer(config, weights, f"model.layers.{index}", self.head_dim, kernels.packed_linear)
            for index in range(self.num_layers)
        ]

    def hidden_states(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        cache: PagedKVCache,
        metadata: AttentionMetadata,
        lora: LoRABatch | None = None,
    ) -> torch.Tensor:
        """Final-norm hidden states ``[tokens, hidden]``; writes every token's KV into ``cache``.

        ``lora`` adds its adapters' deltas to their rows' projections (None: base model only).
        """
        x = F.embedding(input_ids, self.embed)
        rope = self.rope.at(positions)
        for index, layer in enumerate(self.layers):
            x = layer(x, rope, cache, index, metadata, lora)
        return self.norm(x)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()
