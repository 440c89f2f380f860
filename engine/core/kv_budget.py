"""How many KV blocks a replica gets, and the start-up line that shows the arithmetic."""

from collections.abc import Callable
from dataclasses import dataclass

from engine.core.config import (
    DEFAULT_CPU_KV_CACHE_GIB,
    DEFAULT_GPU_MEMORY_UTILIZATION,
    MAX_DEFAULT_MODEL_LEN,
    EngineConfig,
)
from planner.arch import ModelArch
from planner.kv_math import kv_bytes_per_token
from planner.parallel import SINGLE_GPU, Parallelism, gpu_shard, replica_blocks, weights_bytes_per_gpu
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
    parallel: Parallelism = SINGLE_GPU
    """The GPUs of the replica; ``bytes_per_token`` is then one GPU's share (its largest stage's)."""

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
        where = (
            "" if self.parallel.gpus == 1 else f" per GPU of TP {self.parallel.tensor} x PP {self.parallel.pipeline}"
        )
        return (
            f"KV cache{where}: {self.bytes_per_token:,} bytes/token ({self.kv_dtype}) x {self.num_blocks:,} blocks x "
            f"{self.block_size} tokens = {self.tokens:,} tokens = {self.gib:.2f} GiB; "
            f"max concurrency at max-model-len {self.max_model_len:,}: {self.max_concurrency:.2f}x"
        )


def plan_kv_budget(
    config: EngineConfig,
    arch: ModelArch,
    cuda_memory: Callable[[], tuple[int, int]] | None = None,
    parallel: Parallelism = SINGLE_GPU,
) -> KVBudget:
    """Size the pool from --num-blocks, --kv-cache-gib or --gpu-memory-utilization.

    ``cuda_memory`` returns (free, total) bytes of the GPU; it is only called when sizing by
    utilization. For a replica over ``parallel`` GPUs (identical cards), --kv-cache-gib and the
    utilization are per GPU, each GPU holds its share of the weights and of every block, and
    the tightest GPU sets the block count. Raises ``KVBudgetError`` if one request of
    ``max_model_len`` tokens cannot fit.
    """
    if config.gpu_memory_utilization is not None and config.device != "cuda":
        raise KVBudgetError(
            "--gpu-memory-utilization applies to --device cuda; on CPU size the cache with --kv-cache-gib or --num-blocks"
        )
    parallel.check(arch)
    bytes_per_token = max(
        kv_bytes_per_token(gpu_shard(arch, parallel, stage), config.kv_dtype) for stage in range(parallel.pipeline)
    )
    max_model_len = resolve_max_model_len(config, arch)
    if config.num_blocks is not None:
        num_blocks = config.num_blocks
    elif config.kv_cache_gib is not None or config.device != "cuda":
        gib = config.kv_cache_gib if config.kv_cache_gib is not None else DEFAULT_CPU_KV_CACHE_GIB
        num_blocks = replica_blocks(arch, config.kv_dtype, config.block_size, parallel, lambda stage: int(gib * GIB))
    else:
        if cuda_memory is None:
            raise KVBudgetError("--gpu-memory-utilization needs a CUDA device")
        if arch.params is None:
            raise KVBudgetError(f"{arch.params_missing}; size the cache with --kv-cache-gib or --num-blocks")
        free, total = cuda_memory()
        utilization = config.gpu_memory_utilization or DEFAULT_GPU_MEMORY_UTILIZATION
        before_weights = int(total * utilization) - (total - free) - CUDA_ACTIVATION_RESERVE_BYTES

        def kv_memory(stage: int) -> int:
            return before_weights - weights_bytes_per_gpu(arch, config.model_dtype, parallel, stage)

        num_blocks = replica_blocks(arch, config.kv_dtype, config.block_size, parallel, kv_memory)
    budget_plan = KVBudget(bytes_per_token, num_blocks, config.block_size, config.kv_dtype, max_model_len, parallel)
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
