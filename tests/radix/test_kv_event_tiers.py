"""KV event fields beyond the block chain: ``lora_name``/``lora_id`` and ``medium``, in vLLM's wire shapes."""

import random
from typing import Any

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from radix.hashing import block_hashes
from radix.kv_event_format import decode_batch
from radix.kv_event_ingest import KVEventApplier
from radix.prefix_index import PrefixIndex

BLOCK = 16
MODEL = "meta-llama/Llama-3.1-8B"


def tokens(count: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(50000) for _ in range(count)]


def make_applier() -> tuple[PrefixIndex, KVEventApplier]:
    index = PrefixIndex()
    index.add_replica("r")
    return index, KVEventApplier(index, "r", MODEL, BLOCK, clock=lambda: 1.0)


def stored_map(
    hashes: list[int], parent: int | None, token_ids: list[int], medium: str | None = "GPU", **lora: Any
) -> dict[str, Any]:
    """A BlockStored as current vLLM encodes it: a map with a ``type`` tag."""
    event = {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent, "token_ids": token_ids}
    return event | {"block_size": BLOCK, "lora_id": None, "medium": medium, "lora_name": None} | lora


def removed_map(hashes: list[int], medium: str | None = "GPU") -> dict[str, Any]:
    return {"type": "BlockRemoved", "block_hashes": hashes, "medium": medium}


def apply(applier: KVEventApplier, *events: Any) -> None:
    """Through the wire: msgpack-encode ``[ts, events, rank]`` and decode it as the gateway does."""
    applier.apply(decode_batch(msgspec.msgpack.encode([1.0, list(events), None])))


def test_blocks_cached_under_a_lora_adapter_match_only_that_adapter() -> None:
    index, applier = make_applier()
    prompt = tokens(64)
    apply(applier, stored_map([101, 102], None, prompt[:32], lora_id=3, lora_name="sql-lora"))
    assert index.match(block_hashes(prompt, BLOCK, MODEL)) == {}
    assert index.match(block_hashes(prompt, BLOCK, MODEL, adapter="sql-lora")) == {"r": 2}
    assert index.match(block_hashes(prompt, BLOCK, MODEL, adapter="other-lora")) == {}
    apply(applier, stored_map([103], 102, prompt[32:48], lora_id=3, lora_name="sql-lora"))
    assert index.match(block_hashes(prompt, BLOCK, MODEL, adapter="sql-lora")) == {"r": 3}
    apply(applier, stored_map([201, 202], None, prompt[:32]))
    assert index.match(block_hashes(prompt, BLOCK, MODEL)) == {"r": 2}
    index.check_integrity()


def test_positional_events_with_only_a_lora_id_never_match_the_base_model() -> None:
    """Older vLLM: events are arrays ``[type, fields...]`` and carry ``lora_id`` without a name."""
    index, applier = make_applier()
    prompt = tokens(48, seed=1)
    apply(applier, ["BlockStored", [7, 8], None, prompt[:32], BLOCK, 5, "GPU"])
    assert index.match(block_hashes(prompt, BLOCK, MODEL)) == {}
    assert index.blocks("r") == 2
    apply(applier, ["BlockStored", [9], None, prompt[:16], BLOCK, None, "GPU"])
    assert index.match(block_hashes(prompt, BLOCK, MODEL)) == {"r": 1}
    apply(applier, ["BlockRemoved", [7, 8], "GPU"])
    assert index.blocks("r") == 1


def test_a_block_offloaded_to_cpu_is_a_host_hit_until_it_comes_back() -> None:
    index, applier = make_applier()
    prompt = tokens(64, seed=2)
    hashes = block_hashes(prompt, BLOCK, MODEL)
    apply(applier, stored_map([1, 2, 3], None, prompt[:48]))
    matched = index.match(hashes)
    assert matched == {"r": 3} and index.host_blocks(hashes, matched) == {}
    # evicted from the GPU pool (tail first) into the CPU tier, as the bundled engine does
    apply(applier, removed_map([3]), stored_map([3], 2, prompt[32:48], medium="CPU"))
    matched = index.match(hashes)
    assert matched == {"r": 3} and index.host_blocks(hashes, matched) == {"r": 1}
    apply(applier, removed_map([2]), stored_map([2], 1, prompt[16:32], medium="CPU"))
    assert index.host_blocks(hashes, index.match(hashes)) == {"r": 2}
    # a host hit copies them back: stored on GPU, removed from CPU
    apply(applier, removed_map([2, 3], medium="CPU"), stored_map([2, 3], 1, prompt[16:48]))
    matched = index.match(hashes)
    assert matched == {"r": 3} and index.host_blocks(hashes, matched) == {}
    index.check_integrity()


def test_write_through_offload_keeps_a_block_until_it_leaves_both_tiers() -> None:
    """vLLM's CPU offload stores a block on CPU while the GPU still holds it."""
    index, applier = make_applier()
    prompt = tokens(48, seed=3)
    hashes = block_hashes(prompt, BLOCK, MODEL)
    apply(applier, stored_map([1, 2], None, prompt[:32]), stored_map([1, 2], None, prompt[:32], medium="CPU"))
    assert index.host_blocks(hashes, index.match(hashes)) == {}, "on GPU too: a device hit"
    apply(applier, removed_map([2]))
    assert index.match(hashes) == {"r": 2} and index.host_blocks(hashes, {"r": 2}) == {"r": 1}
    apply(applier, stored_map([3], 2, prompt[32:48]))  # the CPU-held parent still names its chain
    assert index.match(hashes) == {"r": 3} and index.host_blocks(hashes, {"r": 3}) == {"r": 1}
    apply(applier, removed_map([1], medium="CPU"))
    assert index.match(hashes) == {"r": 3}, "still on the GPU"
    apply(applier, removed_map([2], medium="CPU"))
    assert index.match(hashes) == {"r": 1}
    assert applier.counters.unknown_removals == 0
    index.check_integrity()


def test_a_removal_without_medium_drops_the_block_from_every_tier() -> None:
    index, applier = make_applier()
    prompt = tokens(32, seed=4)
    hashes = block_hashes(prompt, BLOCK, MODEL)
    apply(applier, stored_map([1, 2], None, prompt[:32]), stored_map([1, 2], None, prompt[:32], medium="CPU"))
    apply(applier, removed_map([2], medium=None))
    assert index.match(hashes) == {"r": 1}
    index.check_integrity()


def test_the_index_keeps_tiers_per_replica() -> None:
    index = PrefixIndex()
    for name in ("a", "b"):
        index.add_replica(name)
    chain = [11, 12, 13, 14]
    index.insert("a", chain, 1.0)
    index.insert("b", chain[:3], 1.0, on_host=True)
    index.insert("b", chain[:1], 2.0)
    matched = index.match(chain)
    assert matched == {"a": 4, "b": 3}
    assert index.host_blocks(chain, matched) == {"b": 2}
    index.remove("b", chain[:1], on_host=True)
    assert index.host_blocks(chain, index.match(chain)) == {"b": 2}
    index.check_integrity()
    index.clear("b")
    assert index.match(chain) == {"a": 4} and index.host_blocks(chain, {"a": 4}) == {}
    index.check_integrity()


tier_ops = st.lists(
    st.tuples(
        st.sampled_from(["insert", "remove"]),
        st.sampled_from(["a", "b"]),
        st.integers(1, 5),
        st.sampled_from([None, False, True]),
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(tier_ops)
def test_tiers_agree_with_a_plain_model_under_random_operations(ops: list[tuple[str, str, int, bool | None]]) -> None:
    """Per replica and block, the set of tiers holding it; a match counts a block in any tier and
    ``host_blocks`` those held on host only."""
    chain = [101, 102, 103, 104, 105]
    index = PrefixIndex()
    model: dict[str, dict[int, set[bool]]] = {"a": {}, "b": {}}
    for name in model:
        index.add_replica(name)
    for op, replica, length, on_host in ops:
        held = model[replica]
        if op == "insert":
            index.insert(replica, chain[:length], 1.0, on_host=bool(on_host))
            for block in chain[:length]:
                held.setdefault(block, set()).add(bool(on_host))
        else:
            index.remove(replica, chain[length - 1 : length], on_host)
            block = chain[length - 1]
            if block in held:
                held[block] = set() if on_host is None else held[block] - {on_host}
                if not held[block]:
                    del held[block]
        index.check_integrity()
        matched = index.match(chain)
        for name, blocks in model.items():
            depth = next((i for i, block in enumerate(chain) if block not in blocks), len(chain))
            assert matched.get(name, 0) == depth
            host_only = sum(1 for block in chain[:depth] if blocks[block] == {True})
            assert index.host_blocks(chain, matched).get(name, 0) == host_only
