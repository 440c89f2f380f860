"""Offline hit-rate bounds on hand-checkable prompt sequences."""

from bench.harness.bounds import compute_bounds, infinite_cache_hit_rate, lru_hit_rate

A = tuple(range(100, 132))
B = tuple(range(200, 232))


def test_infinite_cache_counts_full_blocks_of_the_longest_seen_prefix() -> None:
    prompts = [A + (1, 2, 3, 4), A + (5, 6, 7, 8), A + (5, 6, 7, 8)]
    assert infinite_cache_hit_rate(prompts, block_size=16) == (0 + 32 + 32) / 108


def test_last_token_is_always_computed() -> None:
    assert infinite_cache_hit_rate([A, A], block_size=16) == 16 / 64


def test_lru_capacity_evicts_least_recent_prefix() -> None:
    prompts = [A + (1,), B + (1,), A + (2,)]
    assert lru_hit_rate(prompts, 16, capacity_blocks=4) == 32 / 99
    assert lru_hit_rate(prompts, 16, capacity_blocks=2) == 0.0


def test_lru_evicts_a_prompts_tail_before_its_head() -> None:
    prompts = [A + (1,), B[:16] + (1,), A + (2,)]
    assert lru_hit_rate(prompts, 16, capacity_blocks=2) == 16 / 83


def test_compute_bounds_orders_infinite_above_pooled() -> None:
    prompts = [A + (1,), B + (1,), A + (2,), B + (2,)]
    bounds = compute_bounds(prompts, 16, pooled_capacity_blocks=2)
    assert bounds.infinite_cache == 64 / 132
    assert bounds.pooled_lru == 0.0
    assert bounds.pooled_capacity_blocks == 2
