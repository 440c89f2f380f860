"""What one GPU of a replica holds under tensor parallelism (TP) and pipeline parallelism (PP).

As vLLM splits a model: TP shards every layer's attention heads and MLP over ``tensor``
ranks, each rank holding ``max(kv_heads // tensor, 1)`` KV heads (so once there are fewer KV
heads than ranks, KV heads are replicated and the per-GPU KV per token stops shrinking). An
MLA latent is not split by head: every TP rank caches the whole latent. PP splits the layers
into ``pipeline`` contiguous stages; the first stage holds the embedding, the last the output
head and final norm. A replica's KV capacity is that of its tightest GPU.
"""

from collections.abc import Callable
from dataclasses import dataclass, replace

from planner.arch import ModelArch
from planner.kv_math import bits_per_element, bits_to_bytes, blocks_for_memory
from planner.params import ParamCounts


class ParallelismError(ValueError):
    """A TP or PP degree this model cannot be split into."""


@dataclass(frozen=True)
class Parallelism:
    """``tensor`` x ``pipeline`` GPUs serve one replica."""

    tensor: int = 1
    pipeline: int = 1

    @property
    def gpus(self) -> int:
        return self.tensor * self.pipeline

    def check(self, arch: ModelArch) -> None:
        """Raise ``ParallelismError`` unless ``arch`` splits this way (vLLM's conditions)."""
        if self.tensor < 1 or self.pipeline < 1:
            raise ParallelismError("tensor and pipeline parallel sizes must be >= 1")
        if arch.num_attention_heads % self.tensor:
            raise ParallelismError(
                f"tensor parallel {self.tensor} does not divide the {arch.num_attention_heads} attention heads"
            )
        kv_heads = arch.num_kv_heads
        if not arch.is_mla and (kv_heads % self.tensor if kv_heads >= self.tensor else self.tensor % kv_heads):
            raise ParallelismError(
                f"tensor parallel {self.tensor} and {kv_heads} KV heads: one must be a multiple of the other"
            )
        if self.pipeline > arch.num_layers:
            raise ParallelismError(f"pipeline parallel {self.pipeline} exceeds the {arch.num_layers} layers")


SINGLE_GPU = Parallelism()


def valid_tensor_parallel_sizes(arch: ModelArch) -> list[int]:
    """The TP degrees ``arch`` can be split into, smallest first."""
    sizes = []
    for size in range(1, arch.num_attention_heads + 1):
        try:
            Parallelism(tensor=size).check(arch)
        except ParallelismError:
            continue
        sizes.append(size)
    return sizes


def stage_layers(num_layers: int, pipeline: int) -> list[range]:
    """The layers of each pipeline stage: as even as possible, with the remainder going to the
    stages before the last one (the last also holds the output head), as vLLM's default split."""
    sizes = [num_layers // pipeline] * pipeline
    for offset in range(2, num_layers % pipeline + 2):
        sizes[-offset] += 1
    starts = [sum(sizes[:stage]) for stage in range(pipeline)]
    return [range(start, start + size) for start, size in zip(starts, sizes, strict=True)]


def kv_heads_per_gpu(arch: ModelArch, tensor: int) -> int:
    """KV heads one TP rank caches: a 1/tensor share, but never fewer than one."""
    return max(arch.num_kv_heads // tensor, 1)


def gpu_shard(arch: ModelArch, parallel: Parallelism, stage: int) -> ModelArch:
    """What one GPU of pipeline stage ``stage`` caches, as a ModelArch the per-token and
    per-sequence KV functions take (its ``params`` are the whole model's: see weights_bytes_per_gpu)."""
    layers = stage_layers(arch.num_layers, parallel.pipeline)[stage]
    return replace(
        arch,
        num_layers=len(layers),
        num_attention_heads=arch.num_attention_heads // parallel.tensor,
        num_kv_heads=kv_heads_per_gpu(arch, parallel.tensor),
        layer_windows=arch.layer_windows[layers.start : layers.stop],
    )


def params_per_gpu(arch: ModelArch, params: ParamCounts, parallel: Parallelism, stage: int) -> int:
    """Parameters one GPU of pipeline stage ``stage`` holds: sharded ones / tensor, K and V
    projections by KV head held, replicated ones whole. With PP and tied embeddings the last
    stage holds its own copy of the embedding as output head."""
    tensor, last = parallel.tensor, parallel.pipeline - 1
    kv_share = kv_heads_per_gpu(arch, tensor)
    held = 0
    for layer in stage_layers(arch.num_layers, parallel.pipeline)[stage]:
        counts = params.layers[layer]
        held += _ceil_div(counts.sharded, tensor) + counts.kv_projection * kv_share // arch.num_kv_heads
        held += counts.replicated
    if stage == 0:
        held += _ceil_div(params.embedding, tensor)
    if stage == last:
        head = params.lm_head or (params.embedding if parallel.pipeline > 1 else 0)
        held += _ceil_div(head, tensor) + params.final_norm
    return held


def weights_bytes_per_gpu(arch: ModelArch, weights_dtype: str, parallel: Parallelism, stage: int) -> int:
    """Weight memory of one GPU of stage ``stage``; raises ValueError when the config lacks the
    fields the weights estimate needs (``arch.params_missing`` says which)."""
    if arch.params is None:
        raise ValueError(f"no weights estimate: {arch.params_missing}")
    return bits_to_bytes(params_per_gpu(arch, arch.params, parallel, stage) * bits_per_element(weights_dtype))


def _ceil_div(count: int, parts: int) -> int:
    return -(-count // parts)


def replica_blocks(
    arch: ModelArch, kv_dtype: str, block_size: int, parallel: Parallelism, kv_memory_per_gpu: Callable[[int], int]
) -> int:
    """Paged-KV blocks of ``block_size`` tokens one replica holds, given the KV memory of a GPU
    of each pipeline stage. Every GPU holds its slice of every block, so the GPU with the fewest
    blocks bounds the replica (as vLLM takes the minimum over its workers)."""
    return min(
        blocks_for_memory(gpu_shard(arch, parallel, stage), kv_dtype, kv_memory_per_gpu(stage), block_size)
        for stage in range(parallel.pipeline)
    )
