"""The architecture facts that decide KV-cache size, read from a HF ``config.json`` dict."""

from dataclasses import dataclass
from typing import Any

from planner.config_fields import ConfigFieldError, optional_int, require_int
from planner.params import ParamCounts, count_parameters

# transformers' defaults for models whose config.json states a window but no per-layer pattern:
# every Nth layer is full attention, the others slide.
_DEFAULT_SLIDING_PATTERN = {"gemma2": 2, "gemma3": 6, "gemma3_text": 6}


@dataclass(frozen=True)
class ModelArch:
    """What a model caches per token.

    Standard attention caches K and V: ``2 x num_kv_heads x head_dim`` elements per layer.
    MLA (DeepSeek-V2/V3) caches one latent of ``kv_lora_rank + qk_rope_head_dim`` elements
    per layer instead. ``layer_windows[i]`` is layer i's sliding window (None: full attention).
    """

    name: str
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    max_context: int
    params: ParamCounts | None
    layer_windows: tuple[int | None, ...]
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    params_missing: str | None = None
    """Why ``params`` is None: the config lacks a field the weights estimate needs (the KV
    arithmetic needs only the attention fields, so it runs regardless)."""

    @property
    def param_count(self) -> int | None:
        return None if self.params is None else self.params.total

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank is not None

    @property
    def attention_kind(self) -> str:
        """MLA, MHA (one KV head per query head), MQA (a single KV head) or GQA."""
        if self.is_mla:
            return "MLA"
        if self.num_kv_heads == self.num_attention_heads:
            return "MHA"
        return "MQA" if self.num_kv_heads == 1 else "GQA"

    @property
    def kv_elements_per_token_per_layer(self) -> int:
        if self.kv_lora_rank is not None and self.qk_rope_head_dim is not None:
            return self.kv_lora_rank + self.qk_rope_head_dim
        return 2 * self.num_kv_heads * self.head_dim

    @property
    def sliding_layers(self) -> int:
        return sum(window is not None for window in self.layer_windows)

    @classmethod
    def from_hf_config(cls, config: dict[str, Any], name: str | None = None) -> "ModelArch":
        """Read the architecture; raises ``ConfigFieldError`` naming any missing field."""
        if "num_hidden_layers" not in config and isinstance(config.get("text_config"), dict):
            config = config["text_config"]
        layers = require_int(config, "num_hidden_layers", "the layer count")
        heads = require_int(config, "num_attention_heads", "the head count")
        kv_lora_rank = optional_int(config, "kv_lora_rank")
        rope_dim = require_int(config, "qk_rope_head_dim", "MLA") if kv_lora_rank is not None else None
        try:
            params, params_missing = count_parameters(config), None
        except ConfigFieldError as error:
            params, params_missing = None, str(error)
        return cls(
            name=name or str(config.get("_name_or_path") or config.get("model_type") or "model"),
            num_layers=layers,
            num_attention_heads=heads,
            num_kv_heads=optional_int(config, "num_key_value_heads") or heads,
            head_dim=_head_dim(config, heads),
            max_context=require_int(config, "max_position_embeddings", "the maximum context"),
            params=params,
            layer_windows=_layer_windows(config, layers),
            kv_lora_rank=kv_lora_rank,
            qk_rope_head_dim=rope_dim,
            params_missing=params_missing,
        )


def _head_dim(config: dict[str, Any], heads: int) -> int:
    """``head_dim`` when stated (it need not equal hidden_size / heads), else that quotient."""
    if optional_int(config, "kv_lora_rank") is not None:
        return require_int(config, "qk_nope_head_dim", "MLA") + require_int(config, "qk_rope_head_dim", "MLA")
    stated = optional_int(config, "head_dim")
    if stated is not None:
        return stated
    hidden = require_int(config, "hidden_size", "the head dimension (no 'head_dim' given)")
    if hidden % heads:
        raise ConfigFieldError(f"hidden_size {hidden} is not a multiple of num_attention_heads {heads}: give head_dim")
    return hidden // heads


def _layer_windows(config: dict[str, Any], layers: int) -> tuple[int | None, ...]:
    """Per-layer sliding window, from ``layer_types`` or the older per-family conventions."""
    window = optional_int(config, "sliding_window")
    layer_types = config.get("layer_types")
    if layer_types is not None:
        if len(layer_types) != layers:
            raise ConfigFieldError(f"config 'layer_types' has {len(layer_types)} entries for {layers} layers")
        if window is None and "sliding_attention" in layer_types:
            raise ConfigFieldError("config is missing 'sliding_window' (needed for its sliding_attention layers)")
        return tuple(window if kind == "sliding_attention" else None for kind in layer_types)
    model_type = str(config.get("model_type", ""))
    # Qwen configs switch the window off unless use_sliding_window is true; Mistral's has no switch.
    if window is None or not config.get("use_sliding_window", not model_type.startswith("qwen")):
        return (None,) * layers
    pattern = config.get("sliding_window_pattern") or _DEFAULT_SLIDING_PATTERN.get(model_type)
    if pattern:
        return tuple(window if (layer + 1) % pattern else None for layer in range(layers))
    first_sliding = config.get("max_window_layers", 0)
    return tuple(window if layer >= first_sliding else None for layer in range(layers))
