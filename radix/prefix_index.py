"""Which replicas hold which prompt prefixes: a radix tree over chained block hashes.

Structure, and why not pygtrie. A block hash already names its whole prefix (it chains its
parent's hash), so a tree node is fully identified by its hash: the child of node ``p`` for the
next block is simply the node whose key is that block's hash. The tree is therefore stored flat,
one hash-table entry per node (``hash -> node id``), and a longest-prefix match walks the
request's own hash chain, at most one O(1) lookup per block, for all replicas at once (the
bitmask of replicas holding each node narrows as replicas drop out). pygtrie (pure Python) would key each
node by the *path* of hashes and keep a child dict plus a node object per block: several times
the memory and a slower walk, for parent/child links this index never needs. pygtrie is not used.

Nodes by id. ``radix.node_store.NodeStore`` gives each node a small integer id and keeps, per
id, the replica bitmask, the hash and the replicas' LRU stamps (one holder's inline in numpy
arrays, others' in small per-replica dicts), so that a chain's stamps are read and written at
once by numpy fancy indexing. This module keeps what the stamps mean: the touch log, LRU order,
eviction, compaction, host tiers and the match walk.

Leaves-first LRU eviction without child links. Blocks are only ever inserted or touched as
whole chains from the root, leaf to root, so every block is more recently used than all its
descendants held by the same replica (invariant I1): evicting the least recently used block
always removes a leaf of that replica's subtree, like an engine's free-block queue.

The LRU order is kept as a touch log, not by moving entries. Each (replica, node) has a stamp,
the sequence number of the replica's latest touch of it (0: not held), and each replica has a
log of touches in order, each ``(seq, now, node ids leaf first)``. A block's place in the order
is its entry in the touch that last stamped it; its older log entries are stale and skipped.
Eviction walks the log from its oldest touch. Stale references are dropped as eviction passes
them, and the log is compacted when it holds more than ``COMPACT_RATIO`` times as many
references as the replica holds blocks, so memory stays bounded for a replica that never fills
up. Compaction visits only the touches that hold stale references (``insert`` and ``remove``
note whose blocks they re-stamp or drop), not the whole log: each request leaves a touch holding
its own tail, so the log holds thousands of small touches (bench/RESULTS.md, issue 12).
Eviction works in batches, down to ``capacity - capacity // 64`` blocks (``eviction_target``).

Cost: a lookup into a million-entry table misses the CPU cache, so the hot paths run as chains
of C-level iterators (map/accumulate/zip) and numpy array operations rather than Python loops:
``match_prefix`` one node-table ``get`` per run of consecutive ids, ``insert`` one
``setdefault`` per block it did not see held. ``match_prefix`` returns a handle
(``PrefixMatch``, with the runs of node ids it found) with which ``insert`` skips the node-table
lookups for the prefix the match saw the replica hold; it is trusted only while no replica bit
has left a node since (``_generation``) and for the same chain. numpy's fixed cost per call
(about half a microsecond) makes a small, cache-resident index a few microseconds dearer per
request than plain dicts were; at a million blocks the saved cache misses win by far
(bench/RESULTS.md).

Tiers. A replica with a host-memory KV tier (vLLM's CPU offload, the bundled engine's host
tier) holds some blocks only in host memory: a hit on them is a copy, not free. ``insert`` and
``remove`` take the tier; a block a replica holds only on host has its bit in ``_host_only``
(and in ``_on_host``, which also has the bits of blocks held on both). ``match`` counts blocks
in any tier; ``host_blocks`` says how many of each match are host-only. Both masks are sparse:
without host tiers they stay empty and cost nothing.

Invariants (``check_integrity``, with the node store's own):
- a node exists iff at least one replica holds it, and its mask has exactly the bits of the
  replicas whose LRU order contains it;
- each replica holds at most its capacity; the index holds at most ``max_blocks`` nodes;
- each replica's blocks are in order of last use (I1 follows when ``now`` never decreases);
- ``_host_only`` bits are ``_on_host`` bits, and ``_on_host`` bits are holder bits.
"""

from bisect import bisect_left
from collections import deque
from collections.abc import Iterator, Sequence
from itertools import accumulate, repeat, takewhile
from operator import and_, eq

import numpy as np
import numpy.typing as npt

from radix.node_store import BYTES_PER_NODE, BlockHash, NodeIds, NodeStore

BYTES_PER_ENTRY = 8
"""Touch-log references (4 B each, about two per held block). bench/micro/index_cost.py measures
156 B per block at 1.03 entries per block."""
COMPACT_RATIO = 2
"""A replica's touch log is compacted when it references more than this many times its blocks."""
COMPACT_FLOOR = 1024
"""References a replica's touch log may hold beyond ``COMPACT_RATIO`` times its blocks."""


class _Touch:
    """One insert of a chain under a replica: the nodes it stamped with ``seq``, leaf first."""

    __slots__ = ("seq", "now", "chain")

    def __init__(self, seq: int, now: float, chain: NodeIds) -> None:
        self.seq = seq
        self.now = now
        self.chain = chain


class PrefixMatch:
    """What ``match_prefix`` found, for ``insert`` to reuse: how far each replica holds the chain.

    ``insert`` trusts it only while the index has dropped no block since (``generation``) and the
    chain still starts with ``prefix``; otherwise it does the full lookups, so a stale handle
    costs time, never correctness. ``runs``: the node ids of ``prefix``, as (first id, count)
    runs of consecutive ids.
    """

    __slots__ = ("depths", "prefix", "runs", "generation")

    def __init__(
        self, depths: dict[str, int], prefix: list[BlockHash], runs: list[tuple[int, int]], generation: int
    ) -> None:
        self.depths = depths
        self.prefix = prefix
        self.runs = runs
        self.generation = generation


class PrefixIndex:
    """Per-replica prefix index with bounded memory; all methods are synchronous and O(blocks)."""

    __slots__ = (
        "_store",
        "_slot",
        "_names",
        "_bits",
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
        self._store = NodeStore()
        """The nodes, their holders (slot numbers) and stamps; ``_store.held``: blocks per slot."""
        self._slot: dict[str, int] = {}
        self._names: list[str | None] = []
        self._bits: list[int] = []
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
            self._store.add_slot()
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
        return len(self._store.nodes)

    @property
    def entries(self) -> int:
        """(replica, block) pairs: blocks counted once per replica holding them."""
        return sum(self._store.held)

    def approx_bytes(self) -> int:
        """Memory held, from the per-node and per-entry costs that bench/micro/index_cost.py measures."""
        return len(self._store.nodes) * BYTES_PER_NODE + self.entries * BYTES_PER_ENTRY

    def blocks(self, replica: str) -> int:
        """Number of blocks ``replica`` holds."""
        return self._store.held[self._slot[replica]]

    def node_masks(self) -> dict[BlockHash, int]:
        """Every node's hash and replica bitmask (bit ``1 << slot``); for tests, O(nodes)."""
        return self._store.node_masks()

    def match(self, hashes: Sequence[BlockHash]) -> dict[str, int]:
        """Longest cached prefix, in blocks, per replica holding at least the first block."""
        return self.match_prefix(hashes).depths

    def match_prefix(self, hashes: Sequence[BlockHash]) -> PrefixMatch:
        """``match``, as a handle that ``insert`` can reuse to skip the lookups of the held prefix.

        One walk down the chain for all replicas: the running AND of the blocks' masks (stopping
        at the first block nobody holds) is the set of replicas still matching at each depth.
        Those sets only shrink, so a replica's match length is a binary search.

        The walk looks up a block in the node table only where a run of consecutive node ids
        ends: a chain's blocks created by one insert get consecutive ids, so from a block's id
        the next blocks' ids are guessed and checked against the store's ``hash`` (a list slice compared in
        C, reading memory in order) instead of probing the hash table once per block. A run whose
        nodes all have the same holders (one replica, say) is taken whole instead of ANDed block by block.
        """
        store = self._store
        nodes, node_hash, node_mask = store.nodes, store.hash, store.mask
        total = len(hashes)
        runs: list[tuple[int, int]] = []
        running: list[int] = []
        depth = 0
        last = -1
        while depth < total:
            node = nodes.get(hashes[depth], 0)
            if not node:
                break
            same = _run_length(node_hash, node, hashes, depth)
            masks = node_mask[node : node + same]
            if masks.count(masks[0]) == same:
                run = [masks[0] & last] * same if masks[0] & last else []
            else:
                run = list(takewhile(bool, accumulate(masks, and_, initial=last)))
                del run[0]
            running += run
            runs.append((node, len(run)))
            if len(run) < same:
                break
            depth += same
            last = run[-1]
        matched: dict[str, int] = {}
        if not running:
            return PrefixMatch(matched, [], [], self._generation)
        names = self._names
        mask = running[0]
        last = running[-1]
        while mask:
            bit = mask & -mask
            mask ^= bit
            depth = len(running) if last & bit else bisect_left(running, True, key=lambda held: not held & bit)
            name = names[bit.bit_length() - 1]
            assert name is not None, "a mask bit of a free slot"
            matched[name] = depth
        return PrefixMatch(matched, list(hashes[: len(running)]), runs, self._generation)

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
        store = self._store
        got, created = store.intern(hashes[held:] if held else hashes, bit)
        if found is not None and held:
            chain = np.empty(len(hashes), np.int32)
            _fill_runs(chain, found.runs, held)
            chain[held:] = got
        else:
            chain = np.array(got, np.int32)
        leaf_first = chain[::-1]
        self._seq += 1
        old = store.restamp(slot, leaf_first, self._seq, created)
        if on_host:
            self._mark_on_host(hashes[::-1], (old == 0).tolist(), bit)
        elif self._host_only:
            self._mark_on_device(hashes[::-1], bit)
        self._note_stale(slot, old)
        touch = _Touch(self._seq, now, leaf_first)
        self._log[slot].append(touch)
        self._touch_of[slot][touch.seq] = touch
        self._log_refs[slot] += len(leaf_first)
        self._evict_to_capacity(slot)
        if self.max_blocks is not None and len(store.nodes) > self.max_blocks:
            self._evict_to_global_cap()
        if self._log_refs[slot] > COMPACT_RATIO * store.held[slot] + COMPACT_FLOOR:
            self._compact(slot)

    def remove(self, replica: str, hashes: Sequence[BlockHash], on_host: bool | None = None) -> None:
        """``replica`` no longer holds these blocks (unknown ones are ignored).

        ``on_host`` None: in no tier; False: no longer on its device (a block also on host stays,
        host-only); True: no longer on host (a block also on device stays).
        """
        slot = self._slot[replica]
        bit = self._bits[slot]
        nodes, mask = self._store.nodes, self._store.mask
        dropped: dict[int, None] = {}
        for block_hash in hashes:
            node = nodes.get(block_hash, 0)
            if not mask[node] & bit:
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
            dropped[node] = None
        if dropped:
            ids = np.fromiter(dropped, np.int32, len(dropped))
            self._stale[slot].update(self._store.stamp(slot, ids).tolist())
            self._drop(slot, ids)

    def clear(self, replica: str) -> None:
        """``replica`` holds nothing any more (its cache was reset)."""
        slot = self._slot[replica]
        self._drop(slot, self._store.held_ids(slot))
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
        node = self._store.nodes.get(block_hash, 0)
        if not self._store.mask[node] & self._bits[slot]:
            return None
        seq = int(self._store.stamp(slot, np.array([node], np.int32))[0])
        log = self._log[slot]
        return log[bisect_left(log, seq, key=lambda touch: touch.seq)].now

    def lru_order(self, replica: str) -> Iterator[BlockHash]:
        """``replica``'s blocks, least recently used first (the eviction order)."""
        slot = self._slot[replica]
        hashes = self._store.hash
        return (hashes[node] for touch in list(self._log[slot]) for node in self._live(slot, touch).tolist())

    def check_integrity(self) -> None:
        """Assert the invariants in the module docstring and the node store's; for tests."""
        store = self._store
        store.check_integrity(self._slot.values())
        expected: dict[BlockHash, int] = {}
        for replica, slot in self._slot.items():
            capacity = self._capacity[slot]
            log = self._log[slot]
            held = [store.hash[node] for node in store.held_ids(slot).tolist()]
            assert capacity is None or len(held) <= capacity, f"{replica} holds {len(held)} > {capacity}"
            order = list(self.lru_order(replica))
            assert sorted(order) == sorted(held), f"{replica}'s touch log and stamps disagree"
            times = [touch.now for touch in log]
            assert times == sorted(times), f"{replica}'s LRU order is not ordered by time"
            assert [touch.seq for touch in log] == sorted({touch.seq for touch in log}), "touch order"
            assert self._log_refs[slot] == sum(len(touch.chain) for touch in log)
            assert self._touch_of[slot] == {touch.seq: touch for touch in log}, "touches by sequence number"
            stale = [touch.seq for touch in log if len(self._live(slot, touch)) != len(touch.chain)]
            assert self._stale[slot].issuperset(stale), "a touch with stale references is not noted"
            for block_hash in order:
                expected[block_hash] = expected.get(block_hash, 0) | self._bits[slot]
        for slot, name in enumerate(self._names):
            assert name is not None or not store.held[slot], f"free slot {slot} holds blocks"
        assert expected == self.node_masks(), "replica masks disagree with the replicas' blocks"
        for block_hash, mask in self._on_host.items():
            assert mask and mask & ~expected.get(block_hash, 0) == 0, "a host bit without a holder bit"
        for block_hash, mask in self._host_only.items():
            assert mask and mask & ~self._on_host.get(block_hash, 0) == 0, "a host-only bit without a host bit"
        assert self.max_blocks is None or len(store.nodes) <= self.max_blocks

    def _note_stale(self, slot: int, old: npt.NDArray[np.int64]) -> None:
        """Note the touches that stamped ``old`` (0: none) as holding stale references now.

        A chain's old stamps come in runs (the blocks one touch stamped), so only each run's
        last value is noted.
        """
        ends = np.flatnonzero(old[1:] != old[:-1])
        self._stale[slot].update(old[ends].tolist())
        self._stale[slot].add(int(old[-1]))

    def _live(self, slot: int, touch: _Touch) -> NodeIds:
        """The nodes ``touch`` is still the latest touch of, in LRU order."""
        return touch.chain[self._store.stamp(slot, touch.chain) == touch.seq]

    def _drop(self, slot: int, ids: NodeIds) -> None:
        """The replica no longer holds nodes ``ids`` (all held by it), in any tier."""
        if not len(ids):
            return
        self._generation += 1
        if self._on_host:
            bit, node_hash = self._bits[slot], self._store.hash
            for node in ids.tolist():
                _clear_bit(self._on_host, node_hash[node], bit)
                _clear_bit(self._host_only, node_hash[node], bit)
        self._store.drop(slot, ids)

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
        held = self._store.held[slot]
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
        live = self._live(slot, touch)
        victims = live if limit is None else live[:limit]
        self._drop(slot, victims)
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
        touch_of = self._touch_of[slot]
        emptied = False
        for seq in self._stale[slot]:
            touch = touch_of.get(seq)
            if touch is None:
                continue
            self._log_refs[slot] -= len(touch.chain)
            touch.chain = self._live(slot, touch)
            self._log_refs[slot] += len(touch.chain)
            if not len(touch.chain):
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
        store = self._store
        while len(store.nodes) > target:
            slot = max(self._slot.values(), key=lambda s: store.held[s])
            self._evict_oldest(slot, len(store.nodes) - target)


def _fill_runs(chain: NodeIds, runs: list[tuple[int, int]], count: int) -> None:
    """Write the first ``count`` node ids of ``runs`` (first id, length) into ``chain``."""
    position = 0
    for first, length in runs:
        take = min(length, count - position)
        chain[position : position + take] = np.arange(first, first + take, dtype=np.int32)
        position += take
        if position == count:
            return


def _run_length(node_hash: list[BlockHash | None], node: int, hashes: Sequence[BlockHash], depth: int) -> int:
    """How many of ``hashes[depth:]`` are the hashes of nodes ``node``, ``node + 1``, ... (at least
    one: ``node`` is the node of ``hashes[depth]``). Compared in windows growing from 8 blocks, so
    that a short run copies little of ``node_hash``."""
    same, window, total = 1, 8, len(hashes)
    while depth + same < total:
        stop = min(total - depth, same + window)
        if node_hash[node + same : node + stop] == hashes[depth + same : depth + stop]:
            same = stop
            window *= 8
            continue
        same += sum(takewhile(bool, map(eq, node_hash[node + same : node + stop], hashes[depth + same : depth + stop])))
        if same < stop:
            break
        window *= 8
    return same


def _has_blocks(touch: _Touch) -> bool:
    return bool(len(touch.chain))


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
