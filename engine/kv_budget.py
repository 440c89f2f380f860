"""How many KV blocks a replica gets, and the start-up line that shows the arithmetic."""

from collections.abc import Callable
from dataclasses import dataclass

from engine.config import DEFAULT_CPU_KV_CACHE_GIB, DEFAULT_GPU_MEMORY_UTILIZATION, MAX_DEFAULT_MODEL_LEN, EngineConfig
from planner.arch import ModelArch
from planner.kv_math import blocks_for_memory, kv_bytes_per_token, weights_bytes
from radix.blocks import blocks_for

GIB = 1024**3
CUDA_ACTIVATION_RESERVE_BYTES = GIB
"""Kept free on the GPU for activations and allocator slack when sizing by utilization."""


class KVBudgetError(ValueError):
    """The KV cache cannot hold one request of the maximum length."""


@dataclass(frozen=True)
class KVBudget:
    bytes_per_token: int
    num_blocks: int
    block_size: int
    kv_dtype: str
    max_model_len: int

    @property
    def tokens(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def gib(self) -> float:
        return self.tokens * self.bytes_per_token / GIB

    @property
    def max_concurrency(self) -> float:
        """Requests of ``max_model_len`` tokens that fit at once."""
        return self.num_blocks / blocks_for(self.max_model_len, self.block_size)

    def describe(self) -> str:
        return (
            f"KV cache: {self.bytes_per_token:,} bytes/token ({self.kv_dtype}) x {self.num_blocks:,} blocks x "
            f"{self.block_size} tokens = {self.tokens:,} tokens = {self.gib:.2f} GiB; "
            f"max concurrency at max-model-len {self.max_model_len:,}: {self.max_concurrency:.2f}x"
        )


def plan_kv_budget(
    config: EngineConfig, arch: ModelArch, cuda_memory: Callable[[], tuple[int, int]] | None = None
) -> KVBudget:
    """Size the pool from --num-blocks, --kv-cache-gib or --gpu-memory-utilization.

    ``cuda_memory`` returns (free, total) bytes of the GPU; it is only called when sizing by
    utilization. Raises ``KVBudgetError`` if one request of ``max_model_len`` tokens cannot fit.
    """
    if config.gpu_memory_utilization is not None and config.device != "cuda":
        raise KVBudgetError(
            "--gpu-memory-utilization applies to --device cuda; on CPU size the cache with --kv-cache-gib or --num-blocks"
        )
    bytes_per_token = kv_bytes_per_token(arch, config.kv_dtype)
    max_model_len = resolve_max_model_len(config, arch)
    if config.num_blocks is not None:
        num_blocks = config.num_blocks
    elif config.kv_cache_gib is not None or config.device != "cuda":
        gib = config.kv_cache_gib if config.kv_cache_gib is not None else DEFAULT_CPU_KV_CACHE_GIB
        num_blocks = blocks_for_memory(arch, config.kv_dtype, int(gib * GIB), config.block_size)
    else:
        if cuda_memory is None:
            raise KVBudgetError("--gpu-memory-utilization needs a CUDA device")
        free, total = cuda_memory()
        utilization = config.gpu_memory_utilization or DEFAULT_GPU_MEMORY_UTILIZATION
        used_by_others = total - free
        budget = (
            int(total * utilization)
            - used_by_others
            - weights_bytes(arch, config.dtype)
            - CUDA_ACTIVATION_RESERVE_BYTES
        )
        num_blocks = blocks_for_memory(arch, config.kv_dtype, budget, config.block_size)
    budget_plan = KVBudget(bytes_per_token, num_blocks, config.block_size, config.kv_dtype, max_model_len)
    if budget_plan.max_concurrency < 1:
        raise KVBudgetError(
            f"{budget_plan.describe()}: one request of max-model-len {max_model_len} tokens needs "
            f"{blocks_for(max_model_len, config.block_size)} blocks; raise --num-blocks / --kv-cache-gib / "
            "--gpu-memory-utilization or lower --max-model-len"
        )
    return budget_plan


def resolve_max_model_len(config: EngineConfig, arch: ModelArch) -> int:
    if config.max_model_len is None:
        return min(arch.max_context, MAX_DEFAULT_MODEL_LEN)
    if config.max_model_len > arch.max_context:
        raise KVBudgetError(
            f"--max-model-len {config.max_model_len} exceeds the model's context of {arch.max_context} tokens"
        )
    return config.max_model_len
