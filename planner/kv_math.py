"""KV-cache arithmetic: bytes per token, per sequence and per block budget.

The one implementation used by ``kvgate plan``, the engine's start-up line and (through the
engine's reported blocks) the gateway's per-replica KV budget; planner.parallel gives the
per-GPU share of a replica that spans several GPUs. Dtype names are resolved ones ('auto' is
the caller's to resolve).
"""

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
    return bits_to_bytes(arch.num_layers * arch.kv_elements_per_token_per_layer * bits_per_element(kv_dtype))


def kv_bytes_per_sequence(arch: ModelArch, tokens: int, kv_dtype: str) -> int:
    """KV bytes of one sequence of ``tokens`` tokens; a windowed layer holds at most its window."""
    if tokens < 0:
        raise ValueError(f"tokens must be >= 0, got {tokens}")
    held = sum(tokens if window is None else min(tokens, window) for window in arch.layer_windows)
    return bits_to_bytes(held * arch.kv_elements_per_token_per_layer * bits_per_element(kv_dtype))


def blocks_for_memory(arch: ModelArch, kv_dtype: str, memory_bytes: int, block_size: int) -> int:
    """How many paged-KV blocks of ``block_size`` tokens fit in ``memory_bytes``."""
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    return max(memory_bytes, 0) // (kv_bytes_per_token(arch, kv_dtype) * block_size)


def bits_to_bytes(bits: int) -> int:
    """Whole bytes that hold ``bits`` bits."""
    return -(-bits // 8)
