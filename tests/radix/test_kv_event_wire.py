"""KV events as vLLM puts them on the wire: 64-bit int hashes, the salt in ``extra_keys``, map batches.

The bundled engine publishes what vLLM publishes (issue 31), and the gateway maps those events
back to its own 128-bit block hashes, salted prompts and adapters included.
"""

import random

import msgspec
import pytest

from engine.core.block_manager import BlockManager
from engine.core.sequence import Sequence
from engine.model.runner_api import SamplingParams
from radix.hashing import block_hashes, hash_to_bytes
from radix.kv_event_format import (
    MEDIUM_CPU,
    BlockRemoved,
    BlockStored,
    EventBatch,
    decode_batch,
    encode_batch,
    to_wire,
    wire_block_hash,
)
from radix.kv_event_ingest import KVEventApplier, salt_of
from radix.prefix_index import PrefixIndex

BLOCK = 16
MODEL = "smollm2-135m"


def tokens(count: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(50000) for _ in range(count)]


def applier() -> tuple[PrefixIndex, KVEventApplier]:
    index = PrefixIndex()
    index.add_replica("r")
    return index, KVEventApplier(index, "r", MODEL, BLOCK, clock=lambda: 1.0)


def test_wire_hash_is_vllms_cut_of_the_last_eight_bytes() -> None:
    full = block_hashes(tokens(16, 0), BLOCK, MODEL)[0]
    wire = wire_block_hash(hash_to_bytes(full))
    assert wire == int.from_bytes(hash_to_bytes(full)[-8:], "big") == full & (2**64 - 1)
    assert 0 <= wire < 2**64
    assert wire_block_hash(full) == wire, "the int and its 16 bytes convert alike"


def test_engine_events_on_the_wire_map_back_to_salted_hashes() -> None:
    """Salted and unsalted prompts through the real block manager, converted as the publisher does."""
    manager = BlockManager(num_blocks=64, block_size=BLOCK, model_name=MODEL)
    prompt = tokens(100, 1)
    for seq_id, salt in enumerate(("tenant-a", None)):
        seq = Sequence(seq_id, list(prompt), SamplingParams(max_tokens=1), 128, cache_salt=salt)
        assert manager.allocate(seq)
        seq.num_computed_tokens = len(prompt)
        manager.register_computed_blocks(seq)
    wire = decode_batch(encode_batch(EventBatch(0.0, [to_wire(event) for event in manager.drain_events()], 0)))
    assert all(
        isinstance(h, int) for event in wire.events if isinstance(event, BlockStored) for h in event.block_hashes
    )
    index, ingest = applier()
    ingest.apply(wire)
    assert index.match(block_hashes(prompt, BLOCK, MODEL, "tenant-a")) == {"r": 6}
    assert index.match(block_hashes(prompt, BLOCK, MODEL)) == {"r": 6}
    assert index.match(block_hashes(prompt, BLOCK, MODEL, "tenant-b")) == {}
    assert ingest.counters.orphans == ingest.counters.malformed == 0


def test_a_copy_to_the_host_tier_keeps_the_blocks_derivation() -> None:
    """A host-tier store names the block alone, without its parent or salt: the known mapping holds."""
    prompt = tokens(64, 2)
    hashes = [wire_block_hash(h) for h in block_hashes(prompt, BLOCK, MODEL, "s")]
    index, ingest = applier()
    ingest.apply(EventBatch(0.0, [BlockStored(hashes, None, prompt, BLOCK, extra_keys=[("s",), None, None, None])]))
    ingest.apply(EventBatch(0.0, [BlockStored([hashes[0]], None, prompt[:16], BLOCK, medium=MEDIUM_CPU)]))
    ingest.apply(EventBatch(0.0, [BlockRemoved([hashes[3]])]))
    assert index.match(block_hashes(prompt, BLOCK, MODEL, "s")) == {"r": 3}
    assert index.match(block_hashes(prompt, BLOCK, MODEL)) == {}


@pytest.mark.parametrize(
    ("extra_keys", "lora_name", "salt"),
    [
        (None, None, None),
        ([None], None, None),
        ([("tenant",)], None, "tenant"),
        ([("ad", "tenant")], "ad", "tenant"),
        ([("ad",)], "ad", None),
    ],
)
def test_salt_is_read_from_vllms_extra_keys(extra_keys: list | None, lora_name: str | None, salt: str | None) -> None:
    event = BlockStored([1], None, list(range(16)), BLOCK, lora_name=lora_name, extra_keys=extra_keys)
    assert salt_of(event) == salt


def test_a_batch_encoded_as_a_map_decodes_too() -> None:
    prompt = tokens(32, 3)
    event = {"type": "BlockStored", "block_hashes": [7, 8], "parent_block_hash": None, "token_ids": prompt}
    payload = msgspec.msgpack.encode({"ts": 1.5, "events": [{**event, "block_size": BLOCK}], "data_parallel_rank": 0})
    batch = decode_batch(payload)
    assert batch.ts == 1.5 and batch.data_parallel_rank == 0
    assert batch.events == [BlockStored([7, 8], None, prompt, BLOCK)]
    with pytest.raises(ValueError, match="timestamp"):
        decode_batch(msgspec.msgpack.encode(["soon", []]))


def test_a_snapshot_listing_tails_before_heads_is_learned_whole() -> None:
    """A late gateway's snapshot lists blocks least recently used first, a prompt's tail before its
    head: on the wire each names only its parent's 64-bit hash, so the children wait for it."""
    manager = BlockManager(num_blocks=64, block_size=BLOCK, model_name=MODEL)
    prompts = [tokens(100, 4), tokens(70, 5)]
    for seq_id, prompt in enumerate(prompts):
        seq = Sequence(seq_id, list(prompt), SamplingParams(max_tokens=1), 128, cache_salt="t" if seq_id else None)
        assert manager.allocate(seq)
        seq.num_computed_tokens = len(prompt)
        manager.register_computed_blocks(seq)
        manager.free(seq)
    snapshot = manager.snapshot()
    assert snapshot[0].parent_block_hash is not None, "the snapshot starts with a tail"
    index, ingest = applier()
    ingest.apply(EventBatch(0.0, [to_wire(event) for event in snapshot]))
    assert index.match(block_hashes(prompts[0], BLOCK, MODEL)) == {"r": 6}
    assert index.match(block_hashes(prompts[1], BLOCK, MODEL, "t")) == {"r": 4}, "the salt came with the snapshot"
    assert index.match(block_hashes(prompts[1], BLOCK, MODEL)) == {}
    assert ingest.counters.orphans == 0
    assert index.blocks("r") == 6 + 4
