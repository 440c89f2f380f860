"""KV admission: how many cache blocks a request will need on a replica, and whether they fit.

A request needs its uncached prompt blocks plus the blocks its completion may fill. The
gateway reserves them on the replica it sends the request to until the answer ends; a
replica's capacity is the `kv_capacity_blocks` of its config, else the `num_blocks` its
/stats reports, else unbounded (engines that report nothing are bounded by concurrency only).

A request that generates nothing (embeddings, ``max_tokens`` 0) keeps no KV once its forward
pass ends, so it reserves none. A request whose prompt and completion together need more
blocks than the largest replica of its model holds could never run, so it is refused with a
400 before it is charged or queued, instead of waiting for a replica it can never fit.
"""

from gateway.errors import bad_request
from radix.blocks import blocks_for


def blocks_needed(uncached_prompt_tokens: int, max_tokens: int, block_size: int) -> int:
    """Blocks to reserve: none for a request that generates nothing."""
    if max_tokens == 0:
        return 0
    return blocks_for(max(uncached_prompt_tokens, 0) + max_tokens, block_size)


def fits(reserved: int, needed: int, capacity: int | None) -> bool:
    """Whether ``needed`` more blocks fit beside ``reserved``."""
    return capacity is None or reserved + needed <= capacity


def check_fits_some_replica(
    model: str, prompt_tokens: int, max_tokens: int, block_size: int, capacities: list[int | None]
) -> None:
    """400 ``kv_capacity_exceeded`` when the whole request (every prompt block, cached or not, plus
    every sample's completion) needs more blocks than any of ``capacities`` holds. A replica of
    unknown capacity (or none at all) may hold it, so nothing is refused then."""
    if not capacities or any(capacity is None for capacity in capacities):
        return
    largest = max(capacity for capacity in capacities if capacity is not None)
    needed = blocks_needed(prompt_tokens, max_tokens, block_size)
    if needed > largest:
        raise bad_request(
            f"This request needs {needed} KV cache blocks ({prompt_tokens} prompt tokens and {max_tokens} "
            f"completion tokens over all samples, {block_size} tokens a block); the largest replica of "
            f"'{model}' holds {largest}. Reduce max_tokens, n or the prompt.",
            param="max_tokens",
            code="kv_capacity_exceeded",
        )
