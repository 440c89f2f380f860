"""Block arithmetic: how many KV blocks hold a number of tokens (the last block may be partial)."""


def blocks_for(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)
