"""How the GPUs of one replica split their memory between weights, overhead and KV, and how
many sequences of a given length fit at once; and the smallest TP degree that fits a concurrency."""

from dataclasses import dataclass

from planner.arch import ModelArch
from planner.kv_math import kv_bytes_per_sequence, kv_bytes_per_token
from planner.parallel import SINGLE_GPU, Parallelism, gpu_shard, valid_tensor_parallel_sizes, weights_bytes_per_gpu


@dataclass(frozen=True)
class StageGpu:
    """One GPU of one pipeline stage (every TP rank of a stage holds the same amounts)."""

    stage: int
    layers: int
    weights_bytes: int
    kv_budget_bytes: int
    kv_bytes_per_token: int
    kv_tokens: int
    sequence_bytes: int
    max_sequences: int


@dataclass(frozen=True)
class CapacityPlan:
    """The capacity of one replica of ``parallel.tensor x parallel.pipeline`` identical GPUs.

    ``usable_bytes`` and ``overhead_bytes`` are per GPU. ``weights_given_bytes`` is the
    ``--weights-gib`` total when given (split evenly over the GPUs) instead of the estimate.
    """

    gpu_memory_bytes: int
    utilization: float
    weights_dtype: str
    kv_dtype: str
    prompt_tokens: int
    output_tokens: int
    parallel: Parallelism
    usable_bytes: int
    overhead_bytes: int
    weights_given_bytes: int | None
    stages: tuple[StageGpu, ...]

    @property
    def tightest(self) -> StageGpu:
        """The GPU that bounds the replica: fewest sequences, then fewest tokens."""
        return min(self.stages, key=lambda gpu: (gpu.max_sequences, gpu.kv_tokens))

    @property
    def max_sequences(self) -> int:
        """Sequences the replica holds at once: each needs its slice of KV on every GPU."""
        return self.tightest.max_sequences

    @property
    def kv_tokens(self) -> int:
        return min(gpu.kv_tokens for gpu in self.stages)

    @property
    def replica_weights_bytes(self) -> int:
        return self.parallel.tensor * sum(gpu.weights_bytes for gpu in self.stages)

    @property
    def replica_kv_budget_bytes(self) -> int:
        return self.parallel.tensor * sum(gpu.kv_budget_bytes for gpu in self.stages)

    @property
    def replica_sequence_bytes(self) -> int:
        return self.parallel.tensor * sum(gpu.sequence_bytes for gpu in self.stages)


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
    parallel: Parallelism = SINGLE_GPU,
    weights_given_bytes: int | None = None,
) -> CapacityPlan:
    """Split each GPU's ``gpu_memory_bytes x utilization`` (vLLM's gpu_memory_utilization sense)
    into its weights, a fixed overhead (activations, CUDA graphs, allocator slack) and KV, then
    count the sequences of ``prompt_tokens + output_tokens`` whose KV fits at once. Weights come
    from ``weights_given_bytes`` (the whole model, split evenly) or else from the config's
    estimate, which raises ValueError naming the missing field."""
    if not 0 < utilization <= 1:
        raise ValueError(f"utilization must be in (0, 1], got {utilization}")
    if prompt_tokens < 0 or output_tokens < 0:
        raise ValueError("prompt and output tokens must be >= 0")
    parallel.check(arch)
    usable = int(gpu_memory_bytes * utilization)
    stages = []
    for stage in range(parallel.pipeline):
        shard = gpu_shard(arch, parallel, stage)
        if weights_given_bytes is None:
            weights = weights_bytes_per_gpu(arch, weights_dtype, parallel, stage)
        else:
            weights = -(-weights_given_bytes // parallel.gpus)
        kv_budget = max(usable - weights - overhead_bytes, 0)
        per_token = kv_bytes_per_token(shard, kv_dtype)
        sequence = kv_bytes_per_sequence(shard, prompt_tokens + output_tokens, kv_dtype)
        stages.append(
            StageGpu(
                stage=stage,
                layers=shard.num_layers,
                weights_bytes=weights,
                kv_budget_bytes=kv_budget,
                kv_bytes_per_token=per_token,
                kv_tokens=kv_budget // per_token,
                sequence_bytes=sequence,
                max_sequences=kv_budget // sequence if sequence else 0,
            )
        )
    return CapacityPlan(
        gpu_memory_bytes=gpu_memory_bytes,
        utilization=utilization,
        weights_dtype=weights_dtype,
        kv_dtype=kv_dtype,
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        parallel=parallel,
        usable_bytes=usable,
        overhead_bytes=overhead_bytes,
        weights_given_bytes=weights_given_bytes,
        stages=tuple(stages),
    )


@dataclass(frozen=True)
class TensorParallelAnswer:
    """The smallest TP degree (at the plan's PP) whose replica holds ``concurrency`` sequences,
    or None when no degree the model splits into does; ``tried`` maps each degree tried to its
    sequences."""

    concurrency: int
    tensor: int | None
    tried: dict[int, int]


def smallest_tensor_parallel(arch: ModelArch, plan: CapacityPlan, concurrency: int) -> TensorParallelAnswer:
    """Try each TP degree the model splits into, smallest first, on the plan's card, context
    and pipeline size, until one holds ``concurrency`` sequences at once."""
    tried: dict[int, int] = {}
    for tensor in valid_tensor_parallel_sizes(arch):
        candidate = plan_capacity(
            arch,
            gpu_memory_bytes=plan.gpu_memory_bytes,
            prompt_tokens=plan.prompt_tokens,
            output_tokens=plan.output_tokens,
            kv_dtype=plan.kv_dtype,
            weights_dtype=plan.weights_dtype,
            utilization=plan.utilization,
            overhead_bytes=plan.overhead_bytes,
            parallel=Parallelism(tensor, plan.parallel.pipeline),
            weights_given_bytes=plan.weights_given_bytes,
        )
        tried[tensor] = candidate.max_sequences
        if candidate.max_sequences >= concurrency:
            return TensorParallelAnswer(concurrency, tensor, tried)
    return TensorParallelAnswer(concurrency, None, tried)
