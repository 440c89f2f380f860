"""Block manager: prefix hits, eviction order, events, and invariants under random operations."""

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.block_manager import BlockManager
from engine.core.sequence import Sequence
from radix.hashing import block_hashes, hash_to_bytes
from radix.kv_event_format import AllBlocksCleared, BlockRemoved, BlockStored
from tests.engine.sequences import make_seq

BLOCK = 4
MODEL = "test-model"


def compute_all(manager: BlockManager, seq: Sequence) -> None:
    """What a step that computes every remaining token does to the block manager."""
    seq.num_computed_tokens = len(seq.token_ids)
    manager.register_computed_blocks(seq)


def test_second_prompt_hits_cached_full_blocks() -> None:
    manager = BlockManager(16, BLOCK, MODEL)
    first = make_seq(0, list(range(10)))
    assert manager.allocate(first)
    assert first.num_computed_tokens == 0 and len(first.block_table) == 3
    compute_all(manager, first)
    manager.free(first)
    second = make_seq(1, list(range(9)) + [99, 98])
    assert manager.allocate(second)
    assert second.num_computed_tokens == 8
    assert second.block_table[:2] == first_blocks(manager, list(range(8)))
    manager.assert_invariants()


def cached(manager: BlockManager, seq_id: int, tokens: list[int]) -> None:
    """A prompt that ran and left: its full blocks are cached-free."""
    seq = make_seq(seq_id, tokens)
    assert manager.allocate(seq)
    compute_all(manager, seq)
    manager.free(seq)


def first_blocks(manager: BlockManager, tokens: list[int]) -> list[int]:
    return [manager._cached[block_hash] for block_hash in block_hashes(tokens, BLOCK, MODEL)]


def test_fully_cached_prompt_still_computes_its_last_token() -> None:
    manager = BlockManager(16, BLOCK, MODEL)
    first = make_seq(0, list(range(8)))
    manager.allocate(first)
    compute_all(manager, first)
    manager.free(first)
    again = make_seq(1, list(range(8)))
    manager.allocate(again)
    assert again.num_computed_tokens == 4
    assert again.num_uncomputed_tokens == 4


def test_cache_salt_isolates_prefixes() -> None:
    manager = BlockManager(16, BLOCK, MODEL)
    first = make_seq(0, list(range(9)), salt="tenant-a")
    manager.allocate(first)
    compute_all(manager, first)
    other = make_seq(1, list(range(9)), salt="tenant-b")
    manager.allocate(other)
    assert other.num_computed_tokens == 0
    same = make_seq(2, list(range(9)), salt="tenant-a")
    manager.allocate(same)
    assert same.num_computed_tokens == 8
    manager.assert_invariants()


def test_hash_collision_is_not_a_hit() -> None:
    manager = BlockManager(16, BLOCK, MODEL)
    first = make_seq(0, [1, 2, 3, 4, 5])
    manager.allocate(first)
    compute_all(manager, first)
    impostor = make_seq(1, [9, 9, 9, 9, 9])
    impostor.block_hashes = list(first.block_hashes)
    assert manager.allocate(impostor)
    assert impostor.num_computed_tokens == 0
    assert impostor.block_table[0] != first.block_table[0]


def test_shared_blocks_are_ref_counted() -> None:
    manager = BlockManager(16, BLOCK, MODEL)
    first = make_seq(0, list(range(9)))
    manager.allocate(first)
    compute_all(manager, first)
    second = make_seq(1, list(range(9)))
    manager.allocate(second)
    shared = second.block_table[:2]
    assert shared == first.block_table[:2]
    assert [manager.blocks[block_id].ref_count for block_id in shared] == [2, 2]
    manager.free(first)
    assert [manager.blocks[block_id].ref_count for block_id in shared] == [1, 1]
    manager.assert_invariants()


def test_eviction_is_lru_and_takes_a_sequence_tail_before_its_head() -> None:
    manager = BlockManager(4, BLOCK, MODEL)
    seq = make_seq(0, list(range(16)))
    assert manager.allocate(seq)
    compute_all(manager, seq)
    head, tail = seq.block_table[0], seq.block_table[3]
    manager.free(seq)
    manager.drain_events()
    newcomer = make_seq(1, [100, 101])
    assert manager.allocate(newcomer)
    assert newcomer.block_table == [tail]
    assert manager.blocks[head].block_hash is not None
    removed = manager.drain_events()
    assert removed == [BlockRemoved([hash_to_bytes(seq.block_hashes[3])])]
    manager.assert_invariants()


def test_a_queued_prompts_prefix_is_evicted_last() -> None:
    """Without the touch, the older prompt's blocks go first and the queued follow-up misses."""
    manager = BlockManager(8, BLOCK, MODEL)
    older, newer = make_seq(0, list(range(16))), make_seq(1, list(range(100, 116)))
    for seq in (older, newer):
        assert manager.allocate(seq)
        compute_all(manager, seq)
        manager.free(seq)
    follow_up = make_seq(2, [*range(16), 50, 51])
    manager.want_prefix(follow_up)
    one_shot = make_seq(3, list(range(200, 216)))
    assert manager.allocate(one_shot)
    manager.free(one_shot)
    assert manager.allocate(follow_up) and follow_up.num_computed_tokens == 16
    manager.free(follow_up)
    newer_again = make_seq(4, [*range(100, 116), 9])
    assert manager.allocate(newer_again) and newer_again.num_computed_tokens == 0
    manager.assert_invariants()


def test_allocation_fails_without_changes_when_the_pool_is_short() -> None:
    manager = BlockManager(3, BLOCK, MODEL)
    assert manager.allocate(make_seq(0, list(range(8))))
    big = make_seq(1, list(range(50, 59)))
    assert not manager.allocate(big)
    assert big.block_table == [] and manager.num_free_blocks == 1
    manager.assert_invariants()


def test_block_stored_events_chain_parents_and_carry_tokens() -> None:
    manager = BlockManager(8, BLOCK, MODEL)
    seq = make_seq(0, list(range(6)))
    manager.allocate(seq)
    compute_all(manager, seq)
    for token in (6, 7, 8):
        seq.token_ids.append(token)
        manager.append_slots(seq)
        seq.num_computed_tokens += 1
        manager.register_computed_blocks(seq)
    events = manager.drain_events()
    hashes = block_hashes(list(range(9)), BLOCK, MODEL)
    assert events == [
        BlockStored([hash_to_bytes(hashes[0])], None, [0, 1, 2, 3], BLOCK),
        BlockStored([hash_to_bytes(hashes[1])], hash_to_bytes(hashes[0]), [4, 5, 6, 7], BLOCK),
    ]


def test_reset_prefix_cache_forgets_every_hash() -> None:
    manager = BlockManager(8, BLOCK, MODEL)
    running = make_seq(0, list(range(9)))
    manager.allocate(running)
    compute_all(manager, running)
    done = make_seq(1, list(range(20, 29)))
    manager.allocate(done)
    compute_all(manager, done)
    manager.free(done)
    manager.reset_prefix_cache()
    assert manager.num_cached_blocks == 0 and manager.drain_events()[-1] == AllBlocksCleared()
    manager.assert_invariants()
    manager.free(running)
    assert manager.num_free_blocks == 8 and manager.num_cached_free_blocks == 0
    manager.assert_invariants()


operations = st.lists(
    st.tuples(
        st.sampled_from(["admit", "compute", "decode", "free", "reset", "touch"]), st.integers(0, 7), st.integers(1, 40)
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(operations)
def test_invariants_hold_under_random_operations(ops: list[tuple[str, int, int]]) -> None:
    manager = BlockManager(12, BLOCK, MODEL)
    live: dict[int, Sequence] = {}
    prompts = [[slot % 3] * 8 + list(range(slot, slot + 32)) for slot in range(8)]
    for op, slot, size in ops:
        seq = live.get(slot)
        if op == "admit" and seq is None:
            candidate = make_seq(slot, prompts[slot][:size])
            if manager.allocate(candidate):
                live[slot] = candidate
        elif op == "compute" and seq is not None:
            compute_all(manager, seq)
        elif op == "decode" and seq is not None and seq.num_uncomputed_tokens == 0:
            seq.token_ids.append(size)
            if manager.can_append(seq):
                manager.append_slots(seq)
            else:
                seq.token_ids.pop()
        elif op == "free" and seq is not None:
            manager.free(live.pop(slot))
        elif op == "reset":
            manager.reset_prefix_cache()
        elif op == "touch":
            manager.want_prefix(make_seq(slot, prompts[slot][:size]))
        manager.assert_invariants()
        for other in live.values():
            assert len(other.block_table) * BLOCK >= len(other.token_ids)
            assert all(manager.blocks[block_id].ref_count > 0 for block_id in other.block_table)
    for seq in list(live.values()):
        manager.free(seq)
    manager.assert_invariants()
    assert manager.num_free_blocks == manager.num_blocks


def test_a_queued_prefix_outlives_blocks_freed_after_it_was_queued() -> None:
    """The wanted prefix goes after every other cached-free block, even ones freed later."""
    manager = BlockManager(8, BLOCK, MODEL)
    cached(manager, 0, list(range(16)))
    follow_up = make_seq(1, [*range(16), 50, 51])
    manager.want_prefix(follow_up)
    cached(manager, 2, list(range(100, 116)))
    cached(manager, 3, list(range(200, 216)))
    manager.assert_invariants()
    assert manager.allocate(follow_up) and follow_up.num_computed_tokens == 16
    manager.assert_invariants()


def test_wanted_blocks_go_tail_first_when_nothing_else_is_free() -> None:
    manager = BlockManager(5, BLOCK, MODEL)
    cached(manager, 0, list(range(16)))
    follow_up = make_seq(1, [*range(16), 50])
    manager.want_prefix(follow_up)
    one_shot = make_seq(2, list(range(200, 208)))
    assert manager.allocate(one_shot), "a want never blocks an allocation"
    manager.free(one_shot)
    manager.assert_invariants()
    assert manager.allocate(follow_up) and follow_up.num_computed_tokens == 12, "the head survived"


def test_a_released_want_returns_the_prefix_to_the_lru() -> None:
    manager = BlockManager(9, BLOCK, MODEL)
    cached(manager, 0, list(range(16)))
    aborted = make_seq(1, [*range(16), 50])
    manager.want_prefix(aborted)
    manager.release_wants(aborted)
    manager.assert_invariants()
    cached(manager, 2, list(range(100, 116)))
    assert manager.allocate(make_seq(3, list(range(200, 216))))
    manager.assert_invariants()
    assert manager.num_cached_blocks == 1 + 4, "three of the released prefix's blocks went, tail first"
    probe = make_seq(4, [*range(100, 116), 9])
    assert manager.allocate(probe) and probe.num_computed_tokens == 16, "the later prompt stayed"
