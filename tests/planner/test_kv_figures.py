"""Published KV-cache figures, from the bundled presets."""

import pytest

from planner.kv_math import kv_bytes_per_sequence, kv_bytes_per_token
from planner.load import load_arch

KIB = 1024
GIB = 1024**3


@pytest.mark.parametrize(
    ("preset", "bf16_bytes_per_token"),
    [
        ("llama-2-7b", 512 * KIB),
        ("llama-2-13b", 800 * KIB),
        ("llama-2-70b", 320 * KIB),
        ("llama-3-8b", 128 * KIB),
        ("llama-3-70b", 320 * KIB),
        ("mistral-7b-v0.1", 128 * KIB),
        ("qwen2-7b", 56 * KIB),
        ("qwen2-72b", 320 * KIB),
        ("smollm2-135m", 22.5 * KIB),
        # MLA: 61 layers x (512 + 64) latent elements x 2 bytes = 70,272 B
        ("deepseek-v3", 70_272),
    ],
)
def test_bytes_per_token_bf16(preset: str, bf16_bytes_per_token: float) -> None:
    assert kv_bytes_per_token(load_arch(preset), "bf16") == bf16_bytes_per_token


def test_deepseek_v3_rounds_to_the_published_68_6_kib() -> None:
    assert round(kv_bytes_per_token(load_arch("deepseek-v3"), "bfloat16") / KIB, 1) == 68.6


def test_per_sequence_at_4k_tokens() -> None:
    assert kv_bytes_per_sequence(load_arch("llama-2-7b"), 4096, "fp16") == 2 * GIB
    assert kv_bytes_per_sequence(load_arch("llama-3-70b"), 4096, "bf16") == 1.25 * GIB


@pytest.mark.parametrize(
    ("dtype", "ratio_to_bf16"), [("fp32", 2), ("float16", 1), ("fp8", 0.5), ("int8", 0.5), ("int4", 0.25)]
)
def test_dtype_scales_bytes_per_token(dtype: str, ratio_to_bf16: float) -> None:
    arch = load_arch("llama-3-8b")
    assert kv_bytes_per_token(arch, dtype) == ratio_to_bf16 * kv_bytes_per_token(arch, "bf16")


def test_mistral_sliding_window_caps_every_layer_at_4096_tokens() -> None:
    arch = load_arch("mistral-7b-v0.1")
    at_window = kv_bytes_per_sequence(arch, 4096, "bf16")
    assert at_window == 4096 * 128 * KIB
    assert kv_bytes_per_sequence(arch, 32768, "bf16") == at_window
    assert kv_bytes_per_sequence(arch, 1000, "bf16") == 1000 * 128 * KIB


def test_qwen2_window_is_off_unless_use_sliding_window() -> None:
    arch = load_arch("qwen2-7b")
    assert arch.sliding_layers == 0
    assert kv_bytes_per_sequence(arch, 131072, "bf16") == 131072 * 56 * KIB


def test_unknown_dtype_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown dtype 'auto'.*bf16"):
        kv_bytes_per_token(load_arch("llama-2-7b"), "auto")
