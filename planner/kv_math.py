"""KV-cache arithmetic: bytes per token, per sequence, per block budget, and per GPU.

The one implementation used by ``kvgate plan``, the engine's start-up line and the gateway's
per-replica KV budget. Dtype names are resolved ones ('auto' is the caller's to resolve).
"""

from dataclasses import dataclass

from planner.arch import ModelArch

BITS_PER_ELEMENT: dict[str, int] = {
    "float32": 32, "fp32": 32,
    "bfloat16": 16, "bf16": 16,
    "float16": 16, "fp16": 16,
    "fp8": 8, "fp8_e4m3": 8, "fp8_e5m2": 8,
    "int8": 8,
    "int4": 4,
}  # fmt: skip


def bits_per_element(dtype: str) -> int:
    """Storage bits of one element of ``dtype`` (case-insensitive names of BITS_PER_ELEMENT)."""
    bits = BITS_PER_ELEMENT.get(dtype.lower())
    if bits is None:
        raise ValueError(f"unknown dtype {dtype!r}; known: {', '.join(BITS_PER_ELEMENT)}")
    return bits


def kv_bytes_per_token(arch: ModelArch, kv_dtype: str) -> int:
    """KV bytes one token adds across all layers (before any sliding window caps it)."""
    return _bits_to_bytes(arch.num_layers * arch.kv_elements_per_token_per_layer * bits_per_element(kv_dtype))


def kv_bytes_per_sequence(arch: ModelArch, tokens: int, kv_dtype: str) -> int:
    """KV bytes of one sequence of ``tokens`` tokens; a windowed layer holds at most its window."""
    if tokens < 0:
        raise ValueError(f"tokens must be >= 0, got {tokens}")
    held = sum(tokens if window is None else min(tokens, window) for window in arch.layer_windows)
    return _bits_to_bytes(held * arch.kv_elements_per_token_per_layer * bits_per_element(kv_dtype))


def weights_bytes(arch: ModelArch, weights_dtype: str) -> int:
    """Weight memory estimated as parameters x bits per weight (quantization scales not counted)."""
    return _bits_to_bytes(arch.param_count * bits_per_element(weights_dtype))


def blocks_for_memory(arch: ModelArch, kv_dtype: str, memory_bytes: int, block_size: int) -> int:
    """How many paged-KV blocks of ``block_size`` tokens fit in ``memory_bytes``."""
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    return max(memory_bytes, 0) // (kv_bytes_per_token(arch, kv_dtype) * block_size)


@dataclass(frozen=True)
class CapacityPlan:
    """How one GPU's memory splits between weights, overhead and KV, and what the KV holds."""

    gpu_memory_bytes: int
    utilization: float
    weights_dtype: str
    kv_dtype: str
    prompt_tokens: int
    output_tokens: int
    usable_bytes: int
    weights_bytes: int
    overhead_bytes: int
    kv_budget_bytes: int
    sequence_bytes: int
    max_sequences: int


def plan_capacity(
    arch: ModelArch,
    *,
    gpu_memory_bytes: int,
    prompt_tokens: int,
    output_tokens: int = 0,
    kv_dtype: str = "bf16",
    weights_dtype: str = "bf16",
    utilization: float = 0.9,
    overhead_bytes: int = 2 * 1024**3,
) -> CapacityPlan:
    """Split ``gpu_memory_bytes x utilization`` (vLLM's gpu_memory_utilization sense) into
    weights, a fixed overhead (activations, CUDA graphs, allocator slack) and KV, then count
    the sequences of ``prompt_tokens + output_tokens`` whose KV fits at once."""
    if not 0 < utilization <= 1:
        raise ValueError(f"utilization must be in (0, 1], got {utilization}")
    if prompt_tokens < 0 or output_tokens < 0:
        raise ValueError("prompt and output tokens must be >= 0")
    usable = int(gpu_memory_bytes * utilization)
    weights = weights_bytes(arch, weights_dtype)
    kv_budget = max(usable - weights - overhead_bytes, 0)
    sequence = kv_bytes_per_sequence(arch, prompt_tokens + output_tokens, kv_dtype)
    return CapacityPlan(
        gpu_memory_bytes=gpu_memory_bytes,
        utilization=utilization,
        weights_dtype=weights_dtype,
        kv_dtype=kv_dtype,
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        usable_bytes=usable,
        weights_bytes=weights,
        overhead_bytes=overhead_bytes,
        kv_budget_bytes=kv_budget,
        sequence_bytes=sequence,
        max_sequences=kv_budget // sequence if sequence else 0,
    )


def _bits_to_bytes(bits: int) -> int:
    return -(-bits // 8)
