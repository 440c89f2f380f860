"""The host-memory KV tier's bookkeeping: which cached block sits in which host slot.

Blocks evicted from the device pool land here (the runner copies their K/V into host slot
``slot``); a later prompt whose prefix is here gets them copied back instead of recomputing them.
The pool is bounded and least-recently-stored entries go first. A block lives in one tier at a
time: a hit moves it back to the device and frees its host slot.

A hit is taken in two steps so that no copy reads a slot another copy has already overwritten:
``claim`` takes the entry out of the pool but keeps its slot reserved, and ``release`` frees the
slot only after the device-bound copy has been queued.

Invariants (``assert_invariants``): every slot is exactly one of free, claimed, or holding one
entry; an entry's slot is the one the slot table names.
"""

from collections import OrderedDict
from dataclasses import dataclass

from engine.model.lora_modules import LoRARef
from radix.hashing import BlockHash

GIB = 1024**3


@dataclass(frozen=True)
class HostEntry:
    slot: int
    token_ids: tuple[int, ...]
    parent_hash: BlockHash | None
    lora: LoRARef | None = None
    """The adapter the block was computed under (its KV events name it)."""
    cache_salt: str | None = None
    """A first block's cache salt (its KV events name it too)."""


class HostKVPool:
    def __init__(self, num_slots: int) -> None:
        self.num_slots = num_slots
        self._free: list[int] = list(range(num_slots - 1, -1, -1))
        self._claimed: set[int] = set()
        self._entries: OrderedDict[BlockHash, HostEntry] = OrderedDict()
        """Least recently stored first."""

    def __len__(self) -> int:
        """Blocks held (a prompt can hit them)."""
        return len(self._entries)

    @property
    def usage(self) -> float:
        return len(self._entries) / self.num_slots if self.num_slots else 0.0

    def find(self, block_hash: BlockHash, token_ids: tuple[int, ...]) -> bool:
        """Whether the block is here with these very tokens (a hash collision is no hit)."""
        entry = self._entries.get(block_hash)
        return entry is not None and entry.token_ids == token_ids

    def store(
        self,
        block_hash: BlockHash,
        token_ids: tuple[int, ...],
        parent_hash: BlockHash | None,
        lora: LoRARef | None = None,
        cache_salt: str | None = None,
    ) -> tuple[int, BlockHash | None] | None:
        """A slot for a block leaving the device, and the hash of the entry it displaced (if any).

        None when every slot is claimed (the block is then simply dropped).
        """
        displaced: BlockHash | None = None
        if not self._free:
            if not self._entries:
                return None
            displaced, old = self._entries.popitem(last=False)
            self._free.append(old.slot)
        slot = self._free.pop()
        self._entries[block_hash] = HostEntry(slot, token_ids, parent_hash, lora, cache_salt)
        return slot, displaced

    def claim(self, block_hash: BlockHash) -> HostEntry:
        """Take a hit's entry out of the pool; its slot stays reserved until ``release``."""
        entry = self._entries.pop(block_hash)
        self._claimed.add(entry.slot)
        return entry

    def release(self, slot: int) -> None:
        self._claimed.remove(slot)
        self._free.append(slot)

    def discard(self, block_hash: BlockHash) -> bool:
        """Drop an entry the device has just computed again (the device copy wins); False if absent."""
        entry = self._entries.pop(block_hash, None)
        if entry is None:
            return False
        self._free.append(entry.slot)
        return True

    def hashes(self) -> list[BlockHash]:
        return list(self._entries)

    def entries(self) -> list[tuple[BlockHash, HostEntry]]:
        """Every block held, least recently stored first."""
        return list(self._entries.items())

    def clear(self) -> None:
        """Forget every entry (claimed slots are only ever held inside one allocation)."""
        assert not self._claimed, "clear() while a hit is being copied back"
        self._entries.clear()
        self._free = list(range(self.num_slots - 1, -1, -1))

    def assert_invariants(self) -> None:
        assert not self._claimed, "a claimed host slot was never released"
        held = [entry.slot for entry in self._entries.values()]
        assert len(set(held)) == len(held), "two host entries share a slot"
        assert len(set(self._free)) == len(self._free), "a host slot is twice in the free list"
        assert not set(held) & set(self._free), "a free host slot holds an entry"
        assert len(held) + len(self._free) == self.num_slots, "a host slot is lost"


def host_kv_blocks(num_blocks: int | None, gib: float | None, bytes_per_block: int) -> int:
    """Host slots from ``--host-kv-blocks`` or ``--host-kv-gib`` (0: no host tier)."""
    if num_blocks is not None:
        return num_blocks
    if gib is not None:
        return int(gib * GIB) // bytes_per_block
    return 0
