"""The prefix index's nodes: one small integer id per indexed block, and per id who holds it.

A block hash names its whole prefix, so a node is found by its hash alone: the node table
(``nodes``) maps a block hash to its node id (ids start at 1; 0 means none). Everything else
about a node lives in arrays indexed by that id: ``mask`` (replica bitmask, a list of Python
ints, so any number of replicas; bit ``1 << slot``), ``hash`` (for deleting it), and one
holder's LRU stamp inline (``inline_slot``, ``inline_seq``: numpy arrays). A block therefore
costs at most one hash-table lookup per match and insert; the stamp of the replica that holds
it (the common case: the first holder of a node keeps its stamp inline) is read and written for
a whole chain at once by numpy fancy indexing, not by one more hash-table lookup per block.
Other holders' stamps live in one small dict per replica slot keyed by block hash
(``other_seq``: the node table's own key objects, so an entry costs one dict slot). Ids of
dropped nodes are reused; a reused id cannot revive a stale touch-log reference because
sequence numbers are never reused.

A stamp is the sequence number of a replica's latest touch of a node (0: not held); what the
numbers mean (the touch log, LRU order, eviction) is ``radix.prefix_index``'s business. The
store keeps the node side consistent (``check_integrity``): a node exists iff some replica holds
it, its inline stamp is one of its holders' (a free id has mask 0, no hash and inline slot
``NO_SLOT`` with sequence number 0), and ``held`` counts each slot's stamps.
"""

from collections.abc import Iterable
from itertools import compress, repeat
from operator import eq, ne, not_

import numpy as np
import numpy.typing as npt

BlockHash = int
NodeIds = npt.NDArray[np.int32]

BYTES_PER_NODE = 148
"""A 128-bit int key (48 B), its node-table slot (~42 B), the node id int (28 B), the id's slots
in ``mask``, ``hash``, ``inline_slot`` and ``inline_seq`` (28 B) and array headroom."""
NO_SLOT = -1
"""``inline_slot`` of a node whose inline stamp belongs to no replica."""


class NodeStore:
    """Node ids for block hashes, each node's holders and their stamps; replicas are slots 0, 1, ..."""

    __slots__ = ("nodes", "mask", "hash", "inline_slot", "inline_seq", "free", "other_seq", "held")

    def __init__(self) -> None:
        self.nodes: dict[BlockHash, int] = {}
        """Node table: block hash -> node id."""
        self.mask: list[int] = [0]
        """Node id -> bitmask of the slots holding it (0: a free id)."""
        self.hash: list[BlockHash | None] = [None]
        self.inline_slot = np.full(1, NO_SLOT, np.int32)
        """Node id -> the slot whose stamp is kept inline (``NO_SLOT``: none)."""
        self.inline_seq = np.zeros(1, np.int64)
        self.free: list[int] = []
        """Free node ids, reused before new ones."""
        self.other_seq: list[dict[BlockHash, int]] = []
        """Per slot, its stamps of the nodes whose inline stamp is another slot's."""
        self.held: list[int] = []
        """Per slot, how many nodes it holds (stamps it has)."""

    def add_slot(self) -> None:
        """Room for one more slot (the next number), holding nothing."""
        self.other_seq.append({})
        self.held.append(0)

    def __len__(self) -> int:
        return len(self.nodes)

    def node_masks(self) -> dict[BlockHash, int]:
        """Every node's hash and holder bitmask; O(nodes)."""
        mask = self.mask
        return {block_hash: mask[node] for block_hash, node in self.nodes.items()}

    def intern(self, hashes: list[BlockHash], bit: int) -> tuple[list[int], int]:
        """The node ids of ``hashes`` and how many were created, held by the slot of ``bit``
        only, once ``restamp`` stamps them (one ``setdefault`` per hash)."""
        candidates = self._allocate(len(hashes))
        got = list(map(self.nodes.setdefault, hashes, candidates))
        if got == candidates:
            self._create(candidates, hashes, bit)
            return got, len(candidates)
        is_new = list(map(eq, got, candidates))
        self._create(list(compress(candidates, is_new)), list(compress(hashes, is_new)), bit)
        self.free.extend(compress(candidates, map(ne, got, candidates)))
        return got, sum(is_new)

    def stamp(self, slot: int, ids: NodeIds) -> npt.NDArray[np.int64]:
        """The slot's stamps of nodes ``ids`` (0: not held)."""
        inline_slot = self.inline_slot[ids]
        mine = inline_slot == slot
        seqs = np.where(mine, self.inline_seq[ids], 0)
        other = self.other_seq[slot]
        if other:
            elsewhere = np.flatnonzero(~mine & (inline_slot != NO_SLOT))
            if len(elsewhere):
                node_hash = self.hash
                seqs[elsewhere] = [other.get(node_hash[node], 0) for node in ids[elsewhere].tolist()]
        return seqs

    def restamp(self, slot: int, ids: NodeIds, seq: int, created: int) -> npt.NDArray[np.int64]:
        """Stamp nodes ``ids`` (live, ``created`` of them just now) with ``seq`` for the slot,
        which now holds them all; returns their old stamps (0: newly held).

        The stamp goes inline where it is already (or the node is new: no inline stamp, and a
        free id's inline stamp is 0), in the slot's dict where another slot's stamp is inline;
        a node the slot joins gets its bit.
        """
        inline_slot = self.inline_slot[ids]
        mine = inline_slot == slot
        self.held[slot] += created
        if np.count_nonzero(mine) + created == len(ids):
            old = self.inline_seq[ids]
            self.inline_slot[ids] = slot
            self.inline_seq[ids] = seq
            return old
        old = np.where(mine, self.inline_seq[ids], 0)
        inline = mine | (inline_slot == NO_SLOT)
        claimed = ids[inline]
        self.inline_slot[claimed] = slot
        self.inline_seq[claimed] = seq
        elsewhere = ~inline
        nodes = ids[elsewhere].tolist()
        other = self.other_seq[slot]
        keys = [self.hash[node] for node in nodes]
        seqs = list(map(other.get, keys, repeat(0)))
        old[elsewhere] = seqs
        other.update(zip(keys, repeat(seq)))
        bit = 1 << slot
        mask = self.mask
        for node in compress(nodes, map(not_, seqs)):
            mask[node] |= bit
            self.held[slot] += 1
        return old

    def drop(self, slot: int, ids: NodeIds) -> None:
        """The slot no longer holds nodes ``ids`` (all held by it, at least one); nodes nobody
        holds are freed.

        Where the slot's stamp was inline and others still hold the node, the lowest of them
        moves its stamp inline, so that only free nodes have no inline stamp.
        """
        self.held[slot] -= len(ids)
        nodes, mask, node_hash = self.nodes, self.mask, self.hash
        inline = self.inline_slot[ids] == slot
        if not inline.all():
            other = self.other_seq[slot]
            for node in ids[~inline].tolist():
                del other[node_hash[node]]
        node_list = ids.tolist()
        freed: list[int] = []
        not_bit = ~(1 << slot)
        for node in node_list:
            left = mask[node] & not_bit
            if left:
                mask[node] = left
            else:
                del nodes[node_hash[node]]
                mask[node] = 0
                node_hash[node] = None
                freed.append(node)
        self.inline_slot[freed] = NO_SLOT
        self.inline_seq[freed] = 0
        self.free += freed
        if len(freed) < len(node_list):
            for node in ids[inline].tolist():
                left = mask[node]
                if left:
                    heir = (left & -left).bit_length() - 1
                    self.inline_slot[node] = heir
                    self.inline_seq[node] = self.other_seq[heir].pop(node_hash[node])

    def held_ids(self, slot: int) -> NodeIds:
        """Every node the slot holds, in no particular order."""
        inline = np.flatnonzero(self.inline_slot == slot).astype(np.int32)
        other = self.other_seq[slot]
        others = np.fromiter(map(self.nodes.__getitem__, other), np.int32, len(other))
        return np.concatenate([inline, others])

    def check_integrity(self, slots: Iterable[int]) -> None:
        """Assert the invariants in the module docstring for the live ``slots``; for tests."""
        for slot in slots:
            inline = np.flatnonzero(self.inline_slot == slot).tolist()
            others = [self.nodes[block_hash] for block_hash in self.other_seq[slot]]
            assert not set(inline) & set(others), f"slot {slot} has a node stamped inline and in its dict"
            assert all(self.inline_seq[inline] > 0) and all(map(bool, self.other_seq[slot].values()))
            assert self.held[slot] == len(inline) + len(others), f"slot {slot}'s block count is off"
            assert all(self.mask[node] >> slot & 1 for node in inline + others), f"slot {slot} stamps a node not its"
        for node in self.nodes.values():
            assert self.hash[node] is not None and self.nodes[self.hash[node]] == node  # type: ignore[index]
            owner = int(self.inline_slot[node])
            assert owner != NO_SLOT and self.mask[node] >> owner & 1, "a live node's inline stamp is no holder's"
        free = set(self.free)
        assert len(free) == len(self.free) and not free & set(self.nodes.values()), "a free id is in use"
        for node in free:
            assert not self.mask[node] and self.hash[node] is None, f"free id {node} in use"
            assert self.inline_slot[node] == NO_SLOT and self.inline_seq[node] == 0, f"free id {node} stamped"
        assert len(self.nodes) + len(free) == len(self.mask) - 1, "an id is neither in use nor free"

    def _allocate(self, count: int) -> list[int]:
        """``count`` free node ids, the arrays grown to hold them; the caller uses or frees them."""
        free = self.free
        if len(free) < count:
            first = len(self.mask)
            grown = first + count - len(free)
            self.mask.extend(repeat(0, grown - first))
            self.hash.extend(repeat(None, grown - first))
            if grown > len(self.inline_slot):
                size = max(grown, 2 * len(self.inline_slot))
                inline_slot = np.full(size, NO_SLOT, np.int32)
                inline_slot[: len(self.inline_slot)] = self.inline_slot
                inline_seq = np.zeros(size, np.int64)
                inline_seq[: len(self.inline_seq)] = self.inline_seq
                self.inline_slot, self.inline_seq = inline_slot, inline_seq
            free.extend(range(grown - 1, first - 1, -1))
        taken = free[len(free) - count :]
        del free[len(free) - count :]
        taken.reverse()
        return taken

    def _create(self, ids: list[int], hashes: list[BlockHash], bit: int) -> None:
        """New nodes ``ids`` for ``hashes``, held by the slot of ``bit`` once ``restamp`` stamps them."""
        mask, node_hash = self.mask, self.hash
        for node, block_hash in zip(ids, hashes, strict=True):
            mask[node] = bit
            node_hash[node] = block_hash
