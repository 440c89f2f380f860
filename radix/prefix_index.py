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

Leaves-first LRU eviction without child links. Blocks are only ever inserted or touched as
whole chains from the root, leaf to root, so every block is more recently used than all its
descendants held by the same replica (invariant I1): evicting the least recently used block
always removes a leaf of that replica's subtree, like an engine's free-block queue.

The LRU order is kept as a touch log, not by moving entries. Each replica has ``stamp: hash ->
sequence number of its latest touch`` and a log of touches in order, each ``(seq, now, chain
leaf first)``. A block's place in the order is its entry in the touch that last stamped it;
its older log entries are stale and skipped. Touching a held block is then one in-place dict
store instead of a delete and a re-insert (a third of the dict operations of ``insert``, and
the ones that missed the CPU cache most). Eviction walks the log from its oldest touch. Stale
references are dropped as eviction passes them, and the log is compacted when it holds more
than ``COMPACT_RATIO`` times as many references as the replica holds blocks, so memory stays
bounded for a replica that never fills up. Compaction visits only the touches that hold stale
references (``insert`` and ``remove`` note whose blocks they re-stamp or drop), not the whole
log: each request leaves a touch holding its own tail, so the log holds thousands of small
touches, and walking them all every hundred requests cost ~70 us a request on the overhead
workload (bench/RESULTS.md, issue 12). Eviction works in batches, down to ``capacity -
capacity // 64`` blocks (``eviction_target``).

Cost: a lookup into a million-entry table misses the CPU cache, so the hot paths (match,
insert) run as chains of C-level iterators (map/accumulate/zip) rather than Python loops, and
``insert`` takes one ``setdefault`` per block in the node table (a lookup and, for a new block,
its insertion in one probe). ``match_prefix`` returns a handle (``PrefixMatch``) with which
``insert`` skips the node-table lookups for the prefix the match saw the replica hold; it is
trusted only while no replica bit has left a node since (``_generation``) and for the same chain.

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
from itertools import accumulate, compress, repeat, takewhile
from operator import and_, eq, not_, or_

BlockHash = int

BYTES_PER_NODE = 90
"""A 128-bit int key (48 B) and its slot in the node table (~42 B)."""
BYTES_PER_ENTRY = 58
"""A slot in a replica's stamp dict (~42 B), its touch-log reference (8 B) and a share of a mask int."""
COMPACT_RATIO = 2
COMPACT_FLOOR = 1024
"""References a replica's touch log may hold beyond ``COMPACT_RATIO`` times its blocks."""
"""A replica's touch log is compacted when it references more than this many times its blocks."""


class _Touch:
    """One insert of a chain under a replica: the blocks it stamped with ``seq``, leaf first."""

    __slots__ = ("seq", "now", "chain")

    def __init__(self, seq: int, now: float, chain: list[BlockHash]) -> None:
        self.seq = seq
        self.now = now
        self.chain = chain

    def live(self, stamp: dict[BlockHash, int]) -> list[BlockHash]:
        """The blocks this touch is still the latest touch of, in LRU order."""
        return list(compress(self.chain, map(eq, map(stamp.get, self.chain), repeat(self.seq))))


class PrefixMatch:
    """What ``match_prefix`` found, for ``insert`` to reuse: how far each replica holds the chain.

    ``insert`` trusts it only while the index has dropped no block since (``generation``) and the
    chain still starts with ``prefix``; otherwise it does the full lookups, so a stale handle
    costs time, never correctness.
    """

    __slots__ = ("depths", "prefix", "generation")

    def __init__(self, depths: dict[str, int], prefix: list[BlockHash], generation: int) -> None:
        self.depths = depths
        self.prefix = prefix
        self.generation = generation


class PrefixIndex:
    """Per-replica prefix index with bounded memory; all methods are synchronous and O(blocks)."""

    __slots__ = (
        "_holders",
        "_slot",
        "_names",
        "_bits",
        "_stamp",
        "_log",
        "_log_refs",
        "_touch_of",
        "_stale",
        "_capacity",
        "_on_host",
        "_host_only",
        "_seq",
        "_generation",
        "max_blocks",
        "evictions",
    )

    def __init__(self, max_blocks: int | None = None) -> None:
        self._holders: dict[BlockHash, int] = {}
        self._slot: dict[str, int] = {}
        self._names: list[str | None] = []
        self._bits: list[int] = []
        self._stamp: list[dict[BlockHash, int]] = []
        self._log: list[deque[_Touch]] = []
        self._log_refs: list[int] = []
        """Block references in each replica's touch log, stale ones included."""
        self._touch_of: list[dict[int, _Touch]] = []
        """Each replica's touches by sequence number."""
        self._stale: list[set[int]] = []
        """Per replica, the sequence numbers of touches holding stale references (0: none)."""
        self._capacity: list[int | None] = []
        self._on_host: dict[BlockHash, int] = {}
        """Replicas holding the block in host memory (perhaps on device too)."""
        self._host_only: dict[BlockHash, int] = {}
        """Replicas holding the block in host memory only: a hit there is a copy back."""
        self._seq = 0
        self._generation = 0
        """Bumped whenever a replica's bit leaves a node: a ``PrefixMatch`` from before may be wrong."""
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
            self._stamp.append({})
            self._log.append(deque())
            self._log_refs.append(0)
            self._touch_of.append({})
            self._stale.append(set())
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
        return sum(len(stamp) for stamp in self._stamp)

    def approx_bytes(self) -> int:
        """Memory held, from the per-node and per-entry costs that bench/index_cost.py measures."""
        return len(self._holders) * BYTES_PER_NODE + self.entries * BYTES_PER_ENTRY

    def blocks(self, replica: str) -> int:
        """Number of blocks ``replica`` holds."""
        return len(self._stamp[self._slot[replica]])

    def match(self, hashes: Sequence[BlockHash]) -> dict[str, int]:
        """Longest cached prefix, in blocks, per replica holding at least the first block."""
        return self.match_prefix(hashes).depths

    def match_prefix(self, hashes: Sequence[BlockHash]) -> PrefixMatch:
        """``match``, as a handle that ``insert`` can reuse to skip the lookups of the held prefix.

        One walk down the chain for all replicas, in C: the running AND of the blocks' masks
        (stopping at the first block nobody holds) is the set of replicas still matching at
        each depth. Those sets only shrink, so a replica's match length is a binary search.
        """
        running = list(takewhile(bool, accumulate(map(self._holders.get, hashes, repeat(0)), and_)))
        matched: dict[str, int] = {}
        if not running:
            return PrefixMatch(matched, [], self._generation)
        names = self._names
        mask = running[0]
        last = running[-1]
        while mask:
            bit = mask & -mask
            mask ^= bit
            depth = len(running) if last & bit else bisect_left(running, True, key=lambda held: not held & bit)
            matched[names[bit.bit_length() - 1]] = depth
        return PrefixMatch(matched, list(hashes[: len(running)]), self._generation)

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

    def insert(
        self, replica: str, hashes: list[BlockHash], now: float, on_host: bool = False, found: PrefixMatch | None = None
    ) -> None:
        """Record that ``replica`` holds the chain ``hashes`` (from the root), used at ``now``.

        Blocks are touched leaf to root (invariant I1). A chain longer than the replica's
        capacity keeps its first ``capacity`` blocks, as the engine's cache would. ``on_host``:
        the blocks are (also) in the replica's host-memory tier, not (only) on its device.
        ``found``: ``match_prefix(hashes)`` from before; the prefix it saw ``replica`` hold
        is not looked up in the node table again (a stale one is ignored).
        """
        slot = self._slot[replica]
        capacity = self._capacity[slot]
        if capacity is not None and len(hashes) > capacity:
            hashes = hashes[:capacity]
        if not hashes:
            return
        held = 0
        if found is not None and found.generation == self._generation and not on_host:
            held = min(found.depths.get(replica, 0), len(hashes))
            if held and hashes[:held] != found.prefix[:held]:
                held = 0
        bit = self._bits[slot]
        holders = self._holders
        leaf_first = hashes[::-1]
        fresh = leaf_first[: len(leaf_first) - held] if held else leaf_first
        masks = list(map(holders.setdefault, fresh, repeat(bit)))
        if not all(map(and_, masks, repeat(bit))):
            joining = list(map(not_, map(and_, masks, repeat(bit))))
            joined = map(or_, compress(masks, joining), repeat(bit))
            holders.update(zip(compress(fresh, joining), joined, strict=True))
        stamp = self._stamp[slot]
        if on_host:
            self._mark_on_host(leaf_first, [block not in stamp for block in leaf_first], bit)
        elif self._host_only:
            self._mark_on_device(leaf_first, bit)
        self._stale[slot].update(map(stamp.get, leaf_first, repeat(0)))
        self._seq += 1
        stamp.update(zip(leaf_first, repeat(self._seq)))
        touch = _Touch(self._seq, now, leaf_first)
        self._log[slot].append(touch)
        self._touch_of[slot][touch.seq] = touch
        self._log_refs[slot] += len(leaf_first)
        self._evict_to_capacity(slot)
        if self.max_blocks is not None and len(holders) > self.max_blocks:
            self._evict_to_global_cap()
        if self._log_refs[slot] > COMPACT_RATIO * len(self._stamp[slot]) + COMPACT_FLOOR:
            self._compact(slot)

    def remove(self, replica: str, hashes: Sequence[BlockHash], on_host: bool | None = None) -> None:
        """``replica`` no longer holds these blocks (unknown ones are ignored).

        ``on_host`` None: in no tier; False: no longer on its device (a block also on host stays,
        host-only); True: no longer on host (a block also on device stays).
        """
        slot = self._slot[replica]
        stamp = self._stamp[slot]
        bit = self._bits[slot]
        for block_hash in hashes:
            if block_hash not in stamp:
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
            self._stale[slot].add(stamp.pop(block_hash))
            self._drop(block_hash, bit)

    def clear(self, replica: str) -> None:
        """``replica`` holds nothing any more (its cache was reset)."""
        slot = self._slot[replica]
        bit = self._bits[slot]
        for block_hash in self._stamp[slot]:
            self._drop(block_hash, bit)
        self._stamp[slot].clear()
        self._log[slot].clear()
        self._log_refs[slot] = 0
        self._touch_of[slot].clear()
        self._stale[slot].clear()

    def expire(self, replica: str, older_than: float) -> int:
        """Drop ``replica``'s blocks last used before ``older_than``; returns how many."""
        slot = self._slot[replica]
        log = self._log[slot]
        dropped = 0
        while log and log[0].now < older_than:
            dropped += self._evict_touch(slot, log[0], None)
        return dropped

    def last_used(self, replica: str, block_hash: BlockHash) -> float | None:
        slot = self._slot[replica]
        seq = self._stamp[slot].get(block_hash)
        if seq is None:
            return None
        log = self._log[slot]
        return log[bisect_left(log, seq, key=lambda touch: touch.seq)].now

    def lru_order(self, replica: str) -> Iterator[BlockHash]:
        """``replica``'s blocks, least recently used first (the eviction order)."""
        slot = self._slot[replica]
        stamp = self._stamp[slot]
        return (block for touch in list(self._log[slot]) for block in touch.live(stamp))

    def check_integrity(self) -> None:
        """Assert the invariants in the module docstring; for tests."""
        expected: dict[BlockHash, int] = {}
        for replica, slot in self._slot.items():
            stamp = self._stamp[slot]
            capacity = self._capacity[slot]
            log = self._log[slot]
            assert capacity is None or len(stamp) <= capacity, f"{replica} holds {len(stamp)} > {capacity}"
            order = list(self.lru_order(replica))
            assert sorted(order) == sorted(stamp), f"{replica}'s touch log and stamps disagree"
            times = [touch.now for touch in log]
            assert times == sorted(times), f"{replica}'s LRU order is not ordered by time"
            assert [touch.seq for touch in log] == sorted({touch.seq for touch in log}), "touch order"
            assert self._log_refs[slot] == sum(len(touch.chain) for touch in log)
            assert self._touch_of[slot] == {touch.seq: touch for touch in log}, "touches by sequence number"
            stale = [touch.seq for touch in log if touch.live(stamp) != touch.chain]
            assert self._stale[slot].issuperset(stale), "a touch with stale references is not noted"
            for block_hash in stamp:
                expected[block_hash] = expected.get(block_hash, 0) | self._bits[slot]
        for slot, name in enumerate(self._names):
            assert name is not None or not self._stamp[slot], f"free slot {slot} holds blocks"
        assert expected == self._holders, "replica masks disagree with the replicas' blocks"
        for block_hash, mask in self._on_host.items():
            assert mask and mask & ~self._holders.get(block_hash, 0) == 0, "a host bit without a holder bit"
        for block_hash, mask in self._host_only.items():
            assert mask and mask & ~self._on_host.get(block_hash, 0) == 0, "a host-only bit without a host bit"
        assert self.max_blocks is None or len(self._holders) <= self.max_blocks

    def _drop(self, block_hash: BlockHash, bit: int) -> None:
        self._generation += 1
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
        held = len(self._stamp[slot])
        if capacity is not None and held > capacity:
            self._evict_oldest(slot, held - eviction_target(capacity))

    def _evict_oldest(self, slot: int, count: int) -> None:
        log = self._log[slot]
        evicted = 0
        while evicted < count and log:
            evicted += self._evict_touch(slot, log[0], count - evicted)
        self.evictions += evicted

    def _evict_touch(self, slot: int, touch: _Touch, limit: int | None) -> int:
        """Evict up to ``limit`` (None: all) live blocks of ``touch``, the replica's oldest; how many."""
        stamp = self._stamp[slot]
        bit = self._bits[slot]
        live = touch.live(stamp)
        victims = live if limit is None else live[:limit]
        for block_hash in victims:
            del stamp[block_hash]
            self._drop(block_hash, bit)
        self._log_refs[slot] -= len(touch.chain)
        if len(victims) < len(live):
            touch.chain = live[len(victims) :]
            self._log_refs[slot] += len(touch.chain)
        else:
            self._log[slot].popleft()
            del self._touch_of[slot][touch.seq]
            self._stale[slot].discard(touch.seq)
        return len(victims)

    def _compact(self, slot: int) -> None:
        """Cut the touches holding stale references to their live blocks; drop those left empty."""
        stamp = self._stamp[slot]
        touch_of = self._touch_of[slot]
        emptied = False
        for seq in self._stale[slot]:
            touch = touch_of.get(seq)
            if touch is None:
                continue
            self._log_refs[slot] -= len(touch.chain)
            touch.chain = touch.live(stamp)
            self._log_refs[slot] += len(touch.chain)
            if not touch.chain:
                del touch_of[touch.seq]
                emptied = True
        self._stale[slot].clear()
        if emptied:
            self._log[slot] = deque(filter(_has_blocks, self._log[slot]))

    def _evict_to_global_cap(self) -> None:
        """Evict LRU blocks of the replica holding the most, down to ``eviction_target``.

        A block held by several replicas frees its node only when the last one drops it,
        hence the loop.
        """
        assert self.max_blocks is not None
        target = eviction_target(self.max_blocks)
        while len(self._holders) > target:
            slot = max(self._slot.values(), key=lambda s: len(self._stamp[s]))
            self._evict_oldest(slot, len(self._holders) - target)


def _has_blocks(touch: _Touch) -> bool:
    return bool(touch.chain)


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
