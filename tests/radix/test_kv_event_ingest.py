"""KV events, from the bundled engine and from vLLM, turned into kvgate hashes in the index."""

import random

from radix.hashing import block_hashes, hash_to_bytes
from radix.kv_event_format import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch
from radix.kv_event_ingest import KVEventApplier
from radix.prefix_index import PrefixIndex

BLOCK = 16
MODEL = "smollm2-135m"


def make_applier(speculative: PrefixIndex | None = None) -> tuple[PrefixIndex, KVEventApplier]:
    index = PrefixIndex()
    index.add_replica("r")
    if speculative is not None:
        speculative.add_replica("r")
    return index, KVEventApplier(index, "r", MODEL, BLOCK, speculative, clock=lambda: 1.0)


def tokens(count: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(50000) for _ in range(count)]


def kvgate_stored(prompt: list[int], first: int, last: int, salt: str | None = None) -> BlockStored:
    """What the bundled engine publishes for blocks first..last-1 of ``prompt``."""
    hashes = block_hashes(prompt, BLOCK, MODEL, salt)
    return BlockStored(
        block_hashes=[hash_to_bytes(h) for h in hashes[first:last]],
        parent_block_hash=hash_to_bytes(hashes[first - 1]) if first else None,
        token_ids=prompt[first * BLOCK : last * BLOCK],
        block_size=BLOCK,
    )


def test_bundled_engine_hashes_are_used_as_is_salt_included() -> None:
    index, applier = make_applier()
    prompt = tokens(100)
    applier.apply(EventBatch(0.0, [kvgate_stored(prompt, 0, 2, "tenant-a"), kvgate_stored(prompt, 2, 6, "tenant-a")]))
    assert index.match(block_hashes(prompt, BLOCK, MODEL, "tenant-a")) == {"r": 6}
    assert index.match(block_hashes(prompt, BLOCK, MODEL)) == {}
    applier.apply(EventBatch(0.0, [BlockRemoved([hash_to_bytes(block_hashes(prompt, BLOCK, MODEL, "tenant-a")[3])])]))
    assert index.match(block_hashes(prompt, BLOCK, MODEL, "tenant-a")) == {"r": 3}
    assert applier.counters.blocks_stored == 6 and applier.counters.blocks_removed == 1


def test_vllm_blocks_of_twice_our_size_are_rederived_and_split() -> None:
    index, applier = make_applier()
    prompt = tokens(160, seed=1)
    first = BlockStored([11, 12], None, prompt[:64], 32)
    second = BlockStored([13], 12, prompt[64:96], 32)
    applier.apply(EventBatch(0.0, [first, second]))
    assert index.match(block_hashes(prompt, BLOCK, MODEL)) == {"r": 6}
    applier.apply(EventBatch(0.0, [BlockRemoved([12])]))
    assert index.match(block_hashes(prompt, BLOCK, MODEL)) == {"r": 2}
    assert index.blocks("r") == 4


def test_unknown_parent_bad_sizes_and_unknown_removals_are_counted_not_applied() -> None:
    index, applier = make_applier()
    prompt = tokens(64, seed=2)
    applier.apply(
        EventBatch(
            0.0,
            [
                BlockStored([21], 999, prompt[:32], 32),
                BlockStored([22], None, prompt[:30], 32),
                BlockStored([23], None, prompt[:24], 24),
                BlockRemoved([404]),
            ],
        )
    )
    assert len(index) == 0
    assert applier.counters.orphans == 1
    assert applier.counters.malformed == 2
    assert applier.counters.unknown_removals == 1


def test_clear_forgets_index_and_speculative_entries() -> None:
    speculative = PrefixIndex()
    index, applier = make_applier(speculative)
    prompt = tokens(64, seed=3)
    hashes = block_hashes(prompt, BLOCK, MODEL)
    speculative.insert("r", hashes, 0.5)
    applier.apply(EventBatch(0.0, [kvgate_stored(prompt, 0, 2)]))
    assert speculative.match(hashes) == {}, "stored blocks are no longer speculative"
    speculative.insert("r", hashes, 0.5)
    applier.apply(EventBatch(0.0, [AllBlocksCleared()]))
    assert len(index) == 0 and len(speculative) == 0


def test_the_engines_own_block_size_is_remembered_from_its_events() -> None:
    _, applier = make_applier()
    assert applier.engine_block_size == BLOCK
    prompt = tokens(128, seed=3)
    applier.apply(EventBatch(0.0, [BlockStored([21], None, prompt, 128)]))
    assert applier.engine_block_size == 128
