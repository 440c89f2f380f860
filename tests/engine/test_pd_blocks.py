"""The block manager's side of a KV transfer: pinned holds, installing pulled blocks, invariants
and KV events on both engines; and the real pool's block bytes surviving a transfer bit for bit."""

import pytest
import torch

from engine.core.block_manager import BlockManager
from engine.core.scheduler import Scheduler
from engine.core.sequence import Sequence
from engine.model.kv_cache import Fp8PagedKVCache, KVCacheShape, PagedKVCache
from engine.server.kv_transfer_torch import TorchBlockIO
from radix.hashing import hash_to_bytes
from radix.kv_event_format import MEDIUM_CPU, BlockRemoved, BlockStored
from tests.engine.sequences import make_seq

BLOCK = 4
MODEL = "test-model"


def prefilled(manager: BlockManager, seq: Sequence) -> None:
    assert manager.allocate(seq)
    seq.num_computed_tokens = len(seq.token_ids)
    manager.register_computed_blocks(seq)


def test_a_pinned_hold_outlives_its_sequence_and_is_never_evicted() -> None:
    manager = BlockManager(8, BLOCK, MODEL)
    seq = make_seq(0, list(range(13)))
    prefilled(manager, seq)
    held = seq.block_table[:3]
    manager.pin(held)
    manager.free(seq)
    manager.assert_invariants()
    assert manager.num_free_blocks == 5
    other = make_seq(1, [100 + i for i in range(20)])
    assert manager.allocate(other), "the five unpinned blocks are enough"
    assert set(other.block_table).isdisjoint(held)
    assert not manager.allocate(make_seq(2, [200 + i for i in range(5)])), "pinned blocks are not free"
    manager.free(other)
    manager.unpin(held)
    manager.assert_invariants()
    assert manager.num_free_blocks == 8
    again = make_seq(3, list(range(13)))
    assert manager.allocate(again) and again.num_computed_tokens == 12, "the held prefix is still cached"


def decode_engine_install(manager: BlockManager, seq: Sequence, first: int, count: int) -> list[tuple[int, int]]:
    """What LLMEngine does with pulled blocks: install, queue the sequence, drop the install's hold."""
    scheduler = Scheduler(manager, max_num_seqs=4, max_num_batched_tokens=64)
    manager.want_prefix(seq)
    taken = manager.install_remote(seq, first, count)
    manager.release_wants(seq)
    scheduler.add(seq)
    manager.unpin([block_id for _, block_id in taken])
    scheduler.assert_invariants()
    return taken


def test_installed_blocks_are_hit_and_published_and_local_ones_skipped() -> None:
    prompt = list(range(17))
    manager = BlockManager(16, BLOCK, MODEL)
    prefilled(manager, local := make_seq(0, prompt[:9]))
    manager.free(local)
    manager.drain_events()
    seq = make_seq(1, prompt)
    assert manager.num_prefix_hit_blocks(seq) == 2
    taken = decode_engine_install(manager, seq, 2, 2)
    assert [index for index, _ in taken] == [2, 3]
    events = manager.drain_events()
    assert events == [
        BlockStored(
            block_hashes=[hash_to_bytes(seq.block_hashes[2]), hash_to_bytes(seq.block_hashes[3])],
            parent_block_hash=hash_to_bytes(seq.block_hashes[1]),
            token_ids=prompt[8:16],
            block_size=BLOCK,
            lora_id=None,
        )
    ]
    assert manager.allocate(seq) and seq.num_computed_tokens == 16, "local + installed blocks are one prefix hit"


def test_install_never_evicts_a_wanted_prefix_and_skips_what_is_cached() -> None:
    manager = BlockManager(4, BLOCK, MODEL)
    prefilled(manager, local := make_seq(0, list(range(9))))
    manager.free(local)
    seq = make_seq(1, list(range(21)))
    taken = decode_engine_install(manager, seq, 0, 5)
    assert [index for index, _ in taken] == [2, 3], "blocks 0-1 were cached, and only two blocks were free"
    manager.assert_invariants()


def test_uninstall_forgets_the_blocks() -> None:
    manager = BlockManager(8, BLOCK, MODEL)
    seq = make_seq(0, list(range(13)))
    manager.want_prefix(seq)
    taken = manager.install_remote(seq, 0, 3)
    manager.release_wants(seq)
    manager.drain_events()
    manager.uninstall(taken)
    assert [type(event) for event in manager.drain_events()] == [BlockRemoved] * 3
    manager.assert_invariants()
    assert manager.num_prefix_hit_blocks(make_seq(1, list(range(13)))) == 0


def test_a_host_tier_copy_gives_way_to_the_installed_block() -> None:
    manager = BlockManager(3, BLOCK, MODEL, host_blocks=4)
    prefilled(manager, first := make_seq(0, list(range(9))))
    manager.free(first)
    prefilled(manager, other := make_seq(1, [50 + i for i in range(9)]))
    manager.free(other)
    manager.take_transfers()
    seq = make_seq(2, list(range(13)))
    assert manager.num_prefix_hit_blocks(seq) == 2, "the first prompt's blocks went to the host tier"
    manager.drain_events()
    taken = manager.install_remote(seq, 0, 3)
    assert [index for index, _ in taken] == [0, 1, 2]
    removed = [event for event in manager.drain_events() if isinstance(event, BlockRemoved)]
    assert [event.block_hashes for event in removed if event.medium == MEDIUM_CPU][:2] == [
        [hash_to_bytes(seq.block_hashes[0])],
        [hash_to_bytes(seq.block_hashes[1])],
    ]
    manager.take_transfers()
    manager.unpin([block_id for _, block_id in taken])
    manager.assert_invariants()
    assert not set(seq.block_hashes[:3]) & set(manager.host.hashes())


LAYERS, BLOCKS, HEADS, DIM = 2, 6, 2, 8
SHAPE = KVCacheShape(LAYERS, BLOCKS, BLOCK, HEADS, DIM)
CPU = torch.device("cpu")


@pytest.mark.parametrize("fp8", [False, True])
def test_block_bytes_move_between_pools_bit_for_bit(fp8: bool) -> None:
    def pool() -> PagedKVCache:
        if fp8:
            return Fp8PagedKVCache(SHAPE, torch.float32, CPU)
        return PagedKVCache(SHAPE, torch.bfloat16, torch.float32, CPU)

    source, target = pool(), pool()
    for layer in range(LAYERS):
        slots = torch.arange(BLOCKS * BLOCK)
        source.write(layer, slots, torch.randn(len(slots), HEADS, DIM), torch.randn(len(slots), HEADS, DIM) * 3)
    sent, received = TorchBlockIO(source), TorchBlockIO(target)
    assert sent.layout == received.layout
    payload = sent.read([4, 1, 2])
    assert len(payload) == 3 * sent.bytes_per_block
    received.write([0, 5], payload, [2, 0])
    for layer in range(LAYERS):
        for src, dst in ((2, 0), (4, 5)):
            expected_k, expected_v = source.read(layer, torch.tensor([src]))
            got_k, got_v = target.read(layer, torch.tensor([dst]))
            assert torch.equal(expected_k, got_k) and torch.equal(expected_v, got_v)


def test_layouts_differ_across_dtypes() -> None:
    assert TorchBlockIO(PagedKVCache(SHAPE, torch.float32, torch.float32, CPU)).layout != (
        TorchBlockIO(PagedKVCache(SHAPE, torch.bfloat16, torch.float32, CPU)).layout
    )
