"""Reading architectures from HF config dicts: head_dim, attention kind, windows, errors."""

import pytest

from planner.arch import ModelArch
from planner.config_fields import ConfigFieldError
from planner.kv_math import blocks_for_memory, kv_bytes_per_sequence, kv_bytes_per_token
from planner.load import load_arch

BASE = {
    "model_type": "llama",
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 4,
    "num_attention_heads": 16,
    "max_position_embeddings": 4096,
    "vocab_size": 1000,
}


def test_head_dim_field_wins_over_hidden_size_over_heads() -> None:
    assert ModelArch.from_hf_config(BASE).head_dim == 128
    assert ModelArch.from_hf_config(BASE | {"head_dim": 256}).head_dim == 256


@pytest.mark.parametrize(("kv_heads", "kind"), [(None, "MHA"), (16, "MHA"), (4, "GQA"), (1, "MQA")])
def test_attention_kind(kv_heads: int | None, kind: str) -> None:
    config = BASE if kv_heads is None else BASE | {"num_key_value_heads": kv_heads}
    arch = ModelArch.from_hf_config(config)
    assert arch.attention_kind == kind
    assert kv_bytes_per_token(arch, "bf16") == 2 * 4 * (kv_heads or 16) * 128 * 2


def test_deepseek_v3_is_mla() -> None:
    arch = load_arch("deepseek-v3")
    assert arch.attention_kind == "MLA"
    assert arch.kv_elements_per_token_per_layer == 512 + 64


@pytest.mark.parametrize("field", ["num_hidden_layers", "num_attention_heads", "max_position_embeddings"])
def test_missing_field_is_named(field: str) -> None:
    config = {key: value for key, value in BASE.items() if key != field}
    with pytest.raises(ConfigFieldError, match=field):
        ModelArch.from_hf_config(config)


def test_missing_hidden_size_is_named_when_head_dim_absent() -> None:
    config = {key: value for key, value in BASE.items() if key != "hidden_size"}
    with pytest.raises(ConfigFieldError, match="hidden_size"):
        ModelArch.from_hf_config(config)


def test_mla_without_rope_dim_is_named() -> None:
    with pytest.raises(ConfigFieldError, match="qk_rope_head_dim"):
        ModelArch.from_hf_config(BASE | {"kv_lora_rank": 512})


def test_layer_types_window_only_the_sliding_layers() -> None:
    types = ["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"]
    arch = ModelArch.from_hf_config(BASE | {"layer_types": types, "sliding_window": 512})
    assert arch.layer_windows == (512, 512, 512, None)
    per_layer_token = 2 * 16 * 128 * 2
    assert kv_bytes_per_sequence(arch, 4096, "bf16") == (3 * 512 + 4096) * per_layer_token


def test_sliding_layers_without_window_size_is_named() -> None:
    with pytest.raises(ConfigFieldError, match="sliding_window"):
        ModelArch.from_hf_config(BASE | {"layer_types": ["sliding_attention"] * 4})


def test_qwen_max_window_layers_keeps_the_first_layers_full() -> None:
    config = BASE | {"model_type": "qwen2", "use_sliding_window": True, "sliding_window": 1024, "max_window_layers": 3}
    assert ModelArch.from_hf_config(config).layer_windows == (None, None, None, 1024)


def test_gemma2_alternates_sliding_and_full_layers() -> None:
    config = BASE | {"model_type": "gemma2", "sliding_window": 4096}
    assert ModelArch.from_hf_config(config).layer_windows == (4096, None, 4096, None)


def test_nested_text_config_is_read() -> None:
    assert ModelArch.from_hf_config({"model_type": "llava", "text_config": BASE}).num_layers == 4


@pytest.mark.parametrize(
    ("preset", "published_params_billion"),
    [("llama-2-7b", 6.74), ("llama-3-8b", 8.03), ("qwen2-7b", 7.62), ("mistral-7b-v0.1", 7.24), ("deepseek-v3", 671.0)],
)
def test_parameter_count_matches_published_size(preset: str, published_params_billion: float) -> None:
    assert load_arch(preset).param_count == pytest.approx(published_params_billion * 1e9, rel=0.001)


def test_blocks_for_memory() -> None:
    arch = load_arch("smollm2-135m")
    block_bytes = 22.5 * 1024 * 16
    assert blocks_for_memory(arch, "bf16", 1024**3, 16) == int(1024**3 // block_bytes)
    assert blocks_for_memory(arch, "fp32", 1024**3, 16) == int(1024**3 // (2 * block_bytes))
