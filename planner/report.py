"""The planner's findings for one model as one JSON-ready dict (``kvgate plan --json``)."""

from dataclasses import asdict
from typing import Any

from planner.arch import ModelArch
from planner.kv_math import CapacityPlan, kv_bytes_per_sequence, kv_bytes_per_token

STANDARD_LENGTHS = (1024, 4096, 8192, 32768, 131072)
DTYPE_GROUPS = {"fp32": "fp32", "bf16/fp16": "bf16", "fp8/int8": "fp8", "int4": "int4"}


def sequence_lengths(arch: ModelArch) -> list[int]:
    """The standard lengths the model can hold, plus its own maximum when that is shorter than 128k."""
    lengths = [tokens for tokens in STANDARD_LENGTHS if tokens <= arch.max_context]
    if arch.max_context < STANDARD_LENGTHS[-1] and arch.max_context not in lengths:
        lengths.append(arch.max_context)
    return lengths


def build_report(arch: ModelArch, kv_dtype: str, capacity: CapacityPlan | None) -> dict[str, Any]:
    """Everything ``kvgate plan`` prints."""
    windows = [window for window in arch.layer_windows if window is not None]
    per_token = kv_bytes_per_token(arch, kv_dtype)
    report: dict[str, Any] = {
        "model": arch.name,
        "architecture": {
            "attention": arch.attention_kind,
            "layers": arch.num_layers,
            "attention_heads": arch.num_attention_heads,
            "kv_heads": arch.num_kv_heads,
            "head_dim": arch.head_dim,
            "kv_lora_rank": arch.kv_lora_rank,
            "qk_rope_head_dim": arch.qk_rope_head_dim,
            "sliding_window_layers": len(windows),
            "sliding_window": max(windows) if windows else None,
            "max_context": arch.max_context,
            "parameters": arch.param_count,
        },
        "formula": formula(arch),
        "bytes_per_token": {group: kv_bytes_per_token(arch, dtype) for group, dtype in DTYPE_GROUPS.items()},
        "kv_dtype": kv_dtype,
        "per_sequence": [_sequence_row(arch, tokens, kv_dtype, per_token) for tokens in sequence_lengths(arch)],
    }
    if capacity is not None:
        report["capacity"] = asdict(capacity)
    return report


def formula(arch: ModelArch) -> str:
    """bytes/token written out with this model's numbers."""
    elements = arch.num_layers * arch.kv_elements_per_token_per_layer
    if arch.is_mla:
        return (
            f"bytes/token = {arch.num_layers} layers x ({arch.kv_lora_rank} kv_lora_rank + "
            f"{arch.qk_rope_head_dim} qk_rope_head_dim) x bytes/element = {elements:,} x bytes/element "
            "(MLA caches one latent per layer, not K and V)"
        )
    return (
        f"bytes/token = 2 (K and V) x {arch.num_layers} layers x {arch.num_kv_heads} kv_heads x "
        f"{arch.head_dim} head_dim x bytes/element = {elements:,} x bytes/element"
    )


def _sequence_row(arch: ModelArch, tokens: int, kv_dtype: str, bytes_per_token: int) -> dict[str, Any]:
    held = kv_bytes_per_sequence(arch, tokens, kv_dtype)
    return {"tokens": tokens, "bytes": held, "window_capped": held < tokens * bytes_per_token}
