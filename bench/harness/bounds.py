"""Offline upper bounds on the prefix-cache hit rate of a request sequence.

Both replay the prompts in arrival order at block granularity, as the engine caches them (full
blocks only, at least the last prompt token always computed): ``infinite`` never evicts; ``pooled
LRU`` is one cache as large as all replicas together, the best any router over separate replicas
with that much memory could hope for (up to LRU's own choices). A prompt's blocks are touched tail
first, as the engine frees them, so a prefix's head outlives its tail.
"""

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from radix.hashing import block_hashes

BOUND_MODEL = "bench-bound"
"""Root seed of the hashes here; only equality between prompts matters, not the engine's values."""


@dataclass(frozen=True)
class Bounds:
    infinite_cache: float
    pooled_lru: float
    pooled_capacity_blocks: int


def compute_bounds(prompts: Sequence[Sequence[int]], block_size: int, pooled_capacity_blocks: int) -> Bounds:
    return Bounds(
        infinite_cache=infinite_cache_hit_rate(prompts, block_size),
        pooled_lru=lru_hit_rate(prompts, block_size, pooled_capacity_blocks),
        pooled_capacity_blocks=pooled_capacity_blocks,
    )


def infinite_cache_hit_rate(prompts: Sequence[Sequence[int]], block_size: int) -> float:
    return lru_hit_rate(prompts, block_size, capacity_blocks=None)


def lru_hit_rate(prompts: Sequence[Sequence[int]], block_size: int, capacity_blocks: int | None) -> float:
    """Cached prompt tokens / prompt tokens with one LRU block cache (unbounded when capacity is None)."""
    cache: OrderedDict[int, None] = OrderedDict()
    hit_tokens = 0
    total_tokens = 0
    for prompt in prompts:
        total_tokens += len(prompt)
        hashes = block_hashes(prompt, block_size, BOUND_MODEL)
        usable = (len(prompt) - 1) // block_size
        hits = 0
        while hits < min(usable, len(hashes)) and hashes[hits] in cache:
            hits += 1
        hit_tokens += hits * block_size
        for block_hash in reversed(hashes):
            cache[block_hash] = None
            cache.move_to_end(block_hash)
        while capacity_blocks is not None and len(cache) > capacity_blocks:
            cache.popitem(last=False)
    return hit_tokens / total_tokens if total_tokens else 0.0
