"""Runs of one-block removals (what vLLM and the bundled engine send on eviction) are applied as one
index call; the result must equal applying every event on its own, whatever the media and order."""

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from radix.hashing import block_hashes
from radix.kv_event_format import MEDIUM_CPU, MEDIUM_GPU, BlockRemoved, BlockStored, EventBatch, KVEvent
from radix.kv_event_ingest import KVEventApplier
from radix.prefix_index import PrefixIndex

BLOCK = 16
MODEL = "smollm2-135m"
CHAINS = 4
BLOCKS = 6


def chains() -> list[tuple[list[int], list[int]]]:
    """(token ids, kvgate block hashes) of a few distinct prompts."""
    rng = random.Random(7)
    made = []
    for _ in range(CHAINS):
        tokens = [rng.randrange(100, 40000) for _ in range(BLOCKS * BLOCK)]
        made.append((tokens, block_hashes(tokens, BLOCK, MODEL)))
    return made


CHAIN_TOKENS = chains()
event_spec = st.tuples(
    st.sampled_from(["stored", "removed"]),
    st.integers(0, CHAINS - 1),
    st.integers(0, BLOCKS - 1),
    st.sampled_from([MEDIUM_GPU, MEDIUM_CPU]),
)


def event(kind: str, chain: int, block: int, medium: str) -> KVEvent:
    tokens, hashes = CHAIN_TOKENS[chain]
    wire = [hash_.to_bytes(16, "big") for hash_ in hashes]
    if kind == "removed":
        return BlockRemoved([wire[block]], medium)
    return BlockStored(wire[: block + 1], None, tokens[: (block + 1) * BLOCK], BLOCK, medium=medium)


def state(index: PrefixIndex) -> tuple[dict[str, int], list[dict[str, int]]]:
    index.check_integrity()
    return index.node_masks(), [index.host_blocks(hashes, index.match(hashes)) for _, hashes in CHAIN_TOKENS]


@settings(max_examples=200, deadline=None)
@given(st.lists(event_spec, max_size=40))
def test_one_batch_equals_one_event_at_a_time(specs: list[tuple[str, int, int, str]]) -> None:
    events = [event(*spec) for spec in specs]
    whole, single = PrefixIndex(), PrefixIndex()
    whole.add_replica("r")
    single.add_replica("r")
    whole_applier, single_applier = KVEventApplier(whole, "r", MODEL, BLOCK), KVEventApplier(single, "r", MODEL, BLOCK)
    whole_applier.apply(EventBatch(0.0, events))
    for one in events:
        single_applier.apply(EventBatch(0.0, [one]))
    assert state(whole) == state(single)
    assert whole_applier.counters.blocks_removed == single_applier.counters.blocks_removed
    assert whole_applier.counters.unknown_removals == single_applier.counters.unknown_removals
