"""The KV pool: slot addressing, gathers by block table, and fp8 storage with per-block scales."""

import torch

from engine.model.kv_cache import Fp8PagedKVCache, KVCacheShape, PagedKVCache

LAYERS, BLOCKS, BLOCK_SIZE, HEADS, DIM = 2, 8, 4, 2, 8
SHAPE = KVCacheShape(LAYERS, BLOCKS, BLOCK_SIZE, HEADS, DIM)
CPU = torch.device("cpu")


def tokens(count: int, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(count, HEADS, DIM) * scale


def test_written_slots_read_back_in_block_table_order() -> None:
    cache = PagedKVCache(SHAPE, torch.float32, torch.float32, CPU)
    key, value = tokens(6), tokens(6)
    table = [5, 2]
    slots = torch.tensor([table[pos // BLOCK_SIZE] * BLOCK_SIZE + pos % BLOCK_SIZE for pos in range(6)])
    cache.write(1, slots, key, value)
    keys, values = cache.read(1, torch.tensor(table))
    assert torch.equal(keys[:6], key) and torch.equal(values[:6], value)
    batched_keys, _ = cache.read(1, torch.tensor([table, [0, 5]]))
    assert batched_keys.shape == (2, 2 * BLOCK_SIZE, HEADS, DIM)
    assert torch.equal(batched_keys[1, BLOCK_SIZE : BLOCK_SIZE + 4], key[:4])
    assert torch.count_nonzero(cache.read(0, torch.tensor(table))[0]) == 0


def test_narrower_storage_dtype_reads_back_in_compute_dtype() -> None:
    cache = PagedKVCache(SHAPE, torch.bfloat16, torch.float32, CPU)
    key = tokens(4)
    cache.write(0, torch.arange(4), key, key)
    keys, _ = cache.read(0, torch.tensor([0]))
    assert keys.dtype == torch.float32
    torch.testing.assert_close(keys, key.to(torch.bfloat16).float())


def test_fp8_appends_grow_the_block_scale_and_stay_close() -> None:
    cache = Fp8PagedKVCache(SHAPE, torch.float32, CPU)
    written = torch.cat([tokens(1, scale=10.0**offset) for offset in range(BLOCK_SIZE)])
    for offset in range(BLOCK_SIZE):
        slot = torch.tensor([3 * BLOCK_SIZE + offset])
        cache.write(0, slot, written[offset : offset + 1], -written[offset : offset + 1])
    keys, values = cache.read(0, torch.tensor([3]))
    block_max = written.abs().max()
    torch.testing.assert_close(cache.scales[0, :, 3], (block_max / 448.0).expand(2))
    assert (keys - written).abs().max() <= block_max / 16
    assert torch.equal(values, -keys)


def test_fp8_stale_contents_of_a_reused_block_do_not_widen_its_scale() -> None:
    cache = Fp8PagedKVCache(SHAPE, torch.float32, CPU)
    cache.write(0, torch.arange(BLOCK_SIZE), tokens(BLOCK_SIZE, 1000.0), tokens(BLOCK_SIZE, 1000.0))
    small = tokens(2)
    cache.write(0, torch.arange(2), small, small)
    keys, _ = cache.read(0, torch.tensor([0]))
    torch.testing.assert_close(keys[:2], small, rtol=0.07, atol=1e-3)
    assert torch.count_nonzero(keys[2:]) == 0
