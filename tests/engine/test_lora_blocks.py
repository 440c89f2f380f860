"""An adapter's blocks in the engine's prefix cache and KV events, and the gateway's reading of them."""

from engine.core.block_manager import BlockManager
from engine.core.sequence import Sequence
from engine.model.lora_modules import LoRARef
from engine.model.runner_api import SamplingParams
from radix.hashing import block_hashes
from radix.kv_event_format import MEDIUM_CPU, BlockStored, EventBatch
from radix.kv_event_ingest import KVEventApplier
from radix.prefix_index import PrefixIndex

MODEL = "smollm2-135m"
BLOCK = 4
SQL = LoRARef("sql-lora", 1)
PROMPT = list(range(100, 113))
"""Three full blocks and one token more."""


def computed(manager: BlockManager, seq_id: int, adapter: LoRARef | None, salt: str | None = None) -> Sequence:
    """A sequence of ``PROMPT`` admitted, fully computed and offered to the prefix cache."""
    seq = Sequence(seq_id, PROMPT, SamplingParams(), 64, cache_salt=salt, adapter=adapter)
    assert manager.allocate(seq)
    seq.num_computed_tokens = len(PROMPT)
    manager.register_computed_blocks(seq)
    return seq


def test_adapter_blocks_hit_only_the_same_adapter() -> None:
    manager = BlockManager(32, BLOCK, MODEL)
    base = computed(manager, 0, None)
    adapted = Sequence(1, PROMPT, SamplingParams(), 64, adapter=SQL)
    assert manager.allocate(adapted) and adapted.num_computed_tokens == 0, "base blocks are not the adapter's"
    adapted.num_computed_tokens = len(PROMPT)
    manager.register_computed_blocks(adapted)
    other = Sequence(2, PROMPT, SamplingParams(), 64, adapter=LoRARef("chat-lora", 2))
    assert manager.allocate(other) and other.num_computed_tokens == 0, "nor another adapter's"
    again = Sequence(3, PROMPT, SamplingParams(), 64, adapter=SQL)
    assert manager.allocate(again) and again.num_computed_tokens == 3 * BLOCK, "but the adapter's own"
    assert set(base.block_hashes).isdisjoint(adapted.block_hashes)
    manager.assert_invariants()


def test_stored_events_name_the_adapter_and_the_gateway_predicts_its_hits_exactly() -> None:
    manager = BlockManager(32, BLOCK, MODEL)
    computed(manager, 0, SQL, salt="tenant-a")
    computed(manager, 1, None)
    events = manager.drain_events()
    stored = [event for event in events if isinstance(event, BlockStored)]
    assert [(event.lora_id, event.lora_name) for event in stored] == [(1, "sql-lora"), (None, None)]
    index = PrefixIndex()
    index.add_replica("e0")
    KVEventApplier(index, "e0", MODEL, BLOCK).apply(EventBatch(1.0, events))
    assert index.match(block_hashes(PROMPT, BLOCK, MODEL, "tenant-a", adapter="sql-lora")) == {"e0": 3}
    assert index.match(block_hashes(PROMPT, BLOCK, MODEL, None, adapter="sql-lora")) == {}
    assert index.match(block_hashes(PROMPT, BLOCK, MODEL, "tenant-a")) == {}
    assert index.match(block_hashes(PROMPT, BLOCK, MODEL)) == {"e0": 3}


def test_blocks_moved_to_the_host_tier_keep_their_adapter() -> None:
    manager = BlockManager(4, BLOCK, MODEL, host_blocks=8)
    manager.free(computed(manager, 0, SQL))
    manager.drain_events()
    computed(manager, 1, None)
    host_stored = [event for event in manager.drain_events() if isinstance(event, BlockStored)]
    host_stored = [event for event in host_stored if event.medium == MEDIUM_CPU]
    assert host_stored and all(event.lora_name == "sql-lora" and event.lora_id == 1 for event in host_stored)
    snapshot = [event for event in manager.snapshot() if event.medium == MEDIUM_CPU]
    assert snapshot and all(event.lora_name == "sql-lora" for event in snapshot)
