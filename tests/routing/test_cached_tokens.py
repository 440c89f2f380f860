"""How a matched prefix turns into the cached tokens an engine will report."""

import pytest

from gateway.routing.context import predicted_cached_tokens


@pytest.mark.parametrize(
    ("matched_blocks", "prompt_tokens", "engine_block_size", "expected"),
    [
        (10, 1000, None, 160),  # engines with the gateway's block size hit every matched block
        (62, 1000, None, 992),  # ... up to the blocks before the last prompt token
        (64, 1024, None, 1008),  # a fully cached prompt still computes its last token
        (62, 1000, 128, 896),  # vLLM on CPU caches whole 128-token blocks: 992 rounds down
        (2, 37, 128, 0),  # a short prompt never fills one of its blocks
        (64, 1024, 128, 896),
    ],
)
def test_cached_tokens_count_whole_engine_blocks(
    matched_blocks: int, prompt_tokens: int, engine_block_size: int | None, expected: int
) -> None:
    assert predicted_cached_tokens(matched_blocks, prompt_tokens, 16, engine_block_size) == expected
