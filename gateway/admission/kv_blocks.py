"""KV admission: how many cache blocks a request will need on a replica, and whether they fit.

A request needs its uncached prompt blocks plus the blocks its completion may fill. The
gateway reserves them on the replica it sends the request to until the answer ends; a
replica's capacity is the `kv_capacity_blocks` of its config, else the `num_blocks` its
/stats reports, else unbounded (engines that report nothing are bounded by concurrency only).
"""

from radix.blocks import blocks_for


def blocks_needed(uncached_prompt_tokens: int, max_tokens: int, block_size: int) -> int:
    return blocks_for(max(uncached_prompt_tokens, 0) + max_tokens, block_size)


def fits(reserved: int, needed: int, capacity: int | None) -> bool:
    """Whether ``needed`` more blocks fit; a request larger than a whole replica fits an idle one."""
    if capacity is None:
        return True
    return reserved + min(needed, capacity) <= capacity
