"""Which replicas hold which prompt prefixes: a radix tree over chained block hashes.

Structure, and why not pygtrie. A block hash already names its whole prefix (it chains its
parent's hash), so a tree node is fully identified by its hash: the child of node ``p`` for the
next block is simply the node whose key is that block's hash. The tree is therefore stored flat,
one hash-table entry per node (``hash -> bitmask of replicas holding it``), and a
longest-prefix match walks the request's own hash chain, one O(1) lookup per block, for all
replicas at once (the bitmask narrows as replicas drop out). pygtrie (pure Python) would key
each node by the *path* of hashes and keep a child dict plus a node object per block: several
times the memory and a slower walk, for parent/child links this index never needs. pygtrie is
not used.

Leaves-first LRU eviction without child links. Each replica keeps its blocks in a dict in
least-recently-used order (dicts keep insertion order; a touch re-inserts), valued by the time
last used. Blocks are only ever inserted or touched as whole chains from the root, and a chain
is touched leaf to root, so every block is more recently used than all its descendants held by
the same replica (invariant I1). Evicting from the old end of the order therefore always
removes a leaf of that replica's subtree first, like an engine's free-block queue. A plain dict
costs half the memory of an ``OrderedDict``, but finding its oldest entry skips the slots of
entries deleted since the dict was last compacted, so a replica over capacity is evicted in a
batch, down to ``capacity - capacity // 64`` blocks (``eviction_target``).

Cost: a lookup into a million-entry table misses the CPU cache, so the hot paths (match,
insert) run as chains of C-level iterators (map/accumulate/zip) rather than Python loops.

Tiers. A replica with a host-memory KV tier (vLLM's CPU offload, the bundled engine's host
tier) holds some blocks only in host memory: a hit on them is a copy, not free. ``insert`` and
``remove`` take the tier; a block a replica holds only on host has its bit in ``_host_only``
(and in ``_on_host``, which also has the bits of blocks held on both). ``match`` counts blocks
in any tier; ``host_blocks`` says how many of each match are host-only. Both masks are sparse:
without host tiers they stay empty and cost nothing.

Invariants (``check_integrity``):
- a node exists iff at least one replica holds it, and its mask has exactly the bits of the
  replicas whose LRU order contains it;
- each replica holds at most its capacity; the index holds at most ``max_blocks`` nodes;
- each replica's blocks are in order of last use (I1 follows when ``now`` never decreases);
- ``_host_only`` bits are ``_on_host`` bits, and ``_on_host`` bits are holder bits.
"""

from bisect import bisect_left
from collections import deque
from collections.abc import Iterator, Sequence
from itertools import accumulate, compress, islice, repeat, takewhile
from operator import and_, not_, or_

BlockHash = int

BYTES_PER_NODE = 90
"""A 128-bit int key (48 B) and its slot in the node table (~42 B)."""
BYTES_PER_ENTRY = 50
"""A slot in a replica's LRU dict (~42 B) and, on average, a share of a mask int."""


class PrefixIndex:
    """Per-replica prefix index with bounded memory; all methods are synchronous and O(blocks)."""

    __slots__ = (
        "_holders",
        "_slot",
        "_names",
        "_bits",
        "_lru",
        "_capacity",
        "_on_host",
        "_host_only",
        "max_blocks",
        "evictions",
    )

    def __init__(self, max_blocks: int | None = None) -> None:
        self._holders: dict[BlockHash, int] = {}
        self._slot: dict[str, int] = {}
        self._names: list[str | None] = []
        self._bits: list[int] = []
        self._lru: list[dict[BlockHash, float]] = []
        self._capacity: list[int | None] = []
        self._on_host: dict[BlockHash, int] = {}
        """Replicas holding the block in host memory (perhaps on device too)."""
        self._host_only: dict[BlockHash, int] = {}
        """Replicas holding the block in host memory only: a hit there is a copy back."""
        self.max_blocks = max_blocks
        """Global cap on nodes: a memory safety net above the per-replica capacities."""
        self.evictions = 0
        """Blocks dropped to respect a capacity (not counting explicit removals)."""

    def add_replica(self, replica: str, capacity: int | None = None) -> None:
        """Register ``replica`` (idempotent); ``capacity`` in blocks, None for unbounded."""
        if replica in self._slot:
            self.set_capacity(replica, capacity)
            return
        slot = self._names.index(None) if None in self._names else len(self._names)
        if slot == len(self._names):
            self._names.append(None)
            self._bits.append(1 << slot)
            self._lru.append({})
            self._capacity.append(None)
        self._names[slot] = replica
        self._slot[replica] = slot
        self._capacity[slot] = capacity

    def set_capacity(self, replica: str, capacity: int | None) -> None:
        slot = self._slot[replica]
        self._capacity[slot] = capacity
        self._evict_to_capacity(slot)

    def remove_replica(self, replica: str) -> None:
        """Forget ``replica`` and all its blocks, in O(its blocks)."""
        self.clear(replica)
        slot = self._slot.pop(replica)
        self._names[slot] = None

    @property
    def replicas(self) -> list[str]:
        return list(self._slot)

    def __len__(self) -> int:
        """Number of distinct indexed blocks (nodes)."""
        return len(self._holders)

    @property
    def entries(self) -> int:
        """(replica, block) pairs: blocks counted once per replica holding them."""
        return sum(len(lru) for lru in self._lru)

    def approx_bytes(self) -> int:
        """Memory held, from the per-node and per-entry costs that bench/index_cost.py measures."""
        return len(self._holders) * BYTES_PER_NODE + self.entries * BYTES_PER_ENTRY

    def blocks(self, replica: str) -> int:
        """Number of blocks ``replica`` holds."""
        return len(self._lru[self._slot[replica]])

    def match(self, hashes: Sequence[BlockHash]) -> dict[str, int]:
        """Longest cached prefix, in blocks, per replica holding at least the first block.

        One walk down the chain for all replicas, in C: the running AND of the blocks' masks
        (stopping at the first block nobody holds) is the set of replicas still matching at
        each depth. Those sets only shrink, so a replica's match length is a binary search.
        """
        running = list(takewhile(bool, accumulate(map(self._holders.get, hashes, repeat(0)), and_)))
        if not running:
            return {}
        matched: dict[str, int] = {}
        names = self._names
        mask = running[0]
        last = running[-1]
        while mask:
            bit = mask & -mask
            mask ^= bit
            depth = len(running) if last & bit else bisect_left(running, True, key=lambda held: not held & bit)
            matched[names[bit.bit_length() - 1]] = depth
        return matched

    def host_blocks(self, hashes: Sequence[BlockHash], matched: dict[str, int]) -> dict[str, int]:
        """Of each replica's matched prefix (``match``'s result), the blocks it holds only on host.

        Replicas with none are left out; without host tiers this is an empty dict at once.
        """
        if not self._host_only or not matched:
            return {}
        masks = list(map(self._host_only.get, hashes[: max(matched.values())], repeat(0)))
        counts: dict[str, int] = {}
        for replica, depth in matched.items():
            bit = self._bits[self._slot[replica]]
            count = sum(1 for mask in masks[:depth] if mask & bit)
            if count:
                counts[replica] = count
        return counts

    def insert(self, replica: str, hashes: list[BlockHash], now: float, on_host: bool = False) -> None:
        """Record that ``replica`` holds the chain ``hashes`` (from the root), used at ``now``.

        Blocks are touched leaf to root (invariant I1). A chain longer than the replica's
        capacity keeps its first ``capacity`` blocks, as the engine's cache would. ``on_host``:
        the blocks are (also) in the replica's host-memory tier, not (only) on its device.
        """
        slot = self._slot[replica]
        capacity = self._capacity[slot]
        if capacity is not None and len(hashes) > capacity:
            hashes = hashes[:capacity]
        bit = self._bits[slot]
        lru = self._lru[slot]
        holders = self._holders
        leaf_first = hashes[::-1]
        old_masks = list(map(holders.get, leaf_first, repeat(0)))
        held = list(map(and_, old_masks, repeat(bit)))
        joining = list(map(not_, held))
        holders.update(
            zip(compress(leaf_first, joining), map(or_, compress(old_masks, joining), repeat(bit)), strict=False)
        )
        deque(map(lru.pop, compress(leaf_first, held)), maxlen=0)
        lru.update(zip(leaf_first, repeat(now)))
        if on_host:
            self._mark_on_host(leaf_first, joining, bit)
        elif self._host_only:
            self._mark_on_device(leaf_first, bit)
        self._evict_to_capacity(slot)
        if self.max_blocks is not None and len(holders) > self.max_blocks:
            self._evict_to_global_cap()

    def remove(self, replica: str, hashes: Sequence[BlockHash], on_host: bool | None = None) -> None:
        """``replica`` no longer holds these blocks (unknown ones are ignored).

        ``on_host`` None: in no tier; False: no longer on its device (a block also on host stays,
        host-only); True: no longer on host (a block also on device stays).
        """
        slot = self._slot[replica]
        lru = self._lru[slot]
        bit = self._bits[slot]
        for block_hash in hashes:
            if block_hash not in lru:
                continue
            host_mask = self._on_host.get(block_hash, 0)
            if on_host is not None and host_mask & bit:
                if not on_host:
                    self._host_only[block_hash] = self._host_only.get(block_hash, 0) | bit
                    continue
                if not self._host_only.get(block_hash, 0) & bit:
                    _clear_bit(self._on_host, block_hash, bit)
                    continue
            elif on_host:
                continue
            del lru[block_hash]
            self._drop(block_hash, bit)

    def clear(self, replica: str) -> None:
        """``replica`` holds nothing any more (its cache was reset)."""
        slot = self._slot[replica]
        bit = self._bits[slot]
        for block_hash in self._lru[slot]:
            self._drop(block_hash, bit)
        self._lru[slot].clear()

    def expire(self, replica: str, older_than: float) -> int:
        """Drop ``replica``'s blocks last used before ``older_than``; returns how many."""
        slot = self._slot[replica]
        lru = self._lru[slot]
        bit = self._bits[slot]
        expired = list(takewhile(lambda item: item[1] < older_than, lru.items()))
        for block_hash, _ in expired:
            del lru[block_hash]
            self._drop(block_hash, bit)
        return len(expired)

    def last_used(self, replica: str, block_hash: BlockHash) -> float | None:
        return self._lru[self._slot[replica]].get(block_hash)

    def lru_order(self, replica: str) -> Iterator[BlockHash]:
        """``replica``'s blocks, least recently used first (the eviction order)."""
        return iter(self._lru[self._slot[replica]])

    def check_integrity(self) -> None:
        """Assert the invariants in the module docstring; for tests."""
        expected: dict[BlockHash, int] = {}
        for replica, slot in self._slot.items():
            lru = self._lru[slot]
            capacity = self._capacity[slot]
            assert capacity is None or len(lru) <= capacity, f"{replica} holds {len(lru)} > {capacity}"
            times = list(lru.values())
            assert times == sorted(times), f"{replica}'s LRU order is not ordered by time"
            for block_hash in lru:
                expected[block_hash] = expected.get(block_hash, 0) | self._bits[slot]
        for slot, name in enumerate(self._names):
            assert name is not None or not self._lru[slot], f"free slot {slot} holds blocks"
        assert expected == self._holders, "replica masks disagree with the replicas' LRU orders"
        for block_hash, mask in self._on_host.items():
            assert mask and mask & ~self._holders.get(block_hash, 0) == 0, "a host bit without a holder bit"
        for block_hash, mask in self._host_only.items():
            assert mask and mask & ~self._on_host.get(block_hash, 0) == 0, "a host-only bit without a host bit"
        assert self.max_blocks is None or len(self._holders) <= self.max_blocks

    def _drop(self, block_hash: BlockHash, bit: int) -> None:
        mask = self._holders[block_hash] & ~bit
        if mask:
            self._holders[block_hash] = mask
        else:
            del self._holders[block_hash]
        if self._on_host:
            _clear_bit(self._on_host, block_hash, bit)
            _clear_bit(self._host_only, block_hash, bit)

    def _mark_on_host(self, blocks: list[BlockHash], joining: list[bool], bit: int) -> None:
        """Blocks now in the replica's host tier; those it did not hold before are host-only."""
        on_host, host_only = self._on_host, self._host_only
        for block_hash, new in zip(blocks, joining, strict=True):
            on_host[block_hash] = on_host.get(block_hash, 0) | bit
            if new:
                host_only[block_hash] = host_only.get(block_hash, 0) | bit

    def _mark_on_device(self, blocks: list[BlockHash], bit: int) -> None:
        """Blocks now on the replica's device: no longer host-only there."""
        for block_hash in blocks:
            _clear_bit(self._host_only, block_hash, bit)

    def _evict_to_capacity(self, slot: int) -> None:
        capacity = self._capacity[slot]
        lru = self._lru[slot]
        if capacity is not None and len(lru) > capacity:
            self._evict_oldest(slot, len(lru) - eviction_target(capacity))

    def _evict_oldest(self, slot: int, count: int) -> None:
        lru = self._lru[slot]
        bit = self._bits[slot]
        victims = list(islice(lru, count))
        for block_hash in victims:
            del lru[block_hash]
            self._drop(block_hash, bit)
        self.evictions += len(victims)

    def _evict_to_global_cap(self) -> None:
        """Evict LRU blocks of the replica holding the most, down to ``eviction_target``.

        A block held by several replicas frees its node only when the last one drops it,
        hence the loop.
        """
        target = eviction_target(self.max_blocks)
        while len(self._holders) > target:
            slot = max(self._slot.values(), key=lambda s: len(self._lru[s]))
            self._evict_oldest(slot, len(self._holders) - target)


def _clear_bit(masks: dict[BlockHash, int], block_hash: BlockHash, bit: int) -> None:
    mask = masks.get(block_hash, 0)
    if mask & bit:
        if mask == bit:
            del masks[block_hash]
        else:
            masks[block_hash] = mask & ~bit


def eviction_target(capacity: int) -> int:
    """Size a full replica (or index) is cut back to: batches amortize finding the oldest."""
    return capacity - capacity // 64
